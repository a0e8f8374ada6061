"""The command line's output object: human, json and quiet modes; results on stdout, diagnostics
on stderr; bad input is one line naming the field, exit 2. ``--quiet`` prints nothing; the exit code
is the verdict.
"""
from __future__ import annotations

import json
import pytest
from typer.testing import CliRunner

from validator.cli import app
from validator.errors import InputError
from validator.output import EXIT_BAD_INPUT, Output

WIDE = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
ILLEGAL = json.dumps({"kind": "sparse", "b": 11623, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128})
LEGAL = json.dumps({"kind": "sparse", "b": 11622, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128})


# quiet -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, code", [(LEGAL, 0), (ILLEGAL, 1), ('{"kind": "sparse", "b": -1}', 2)])
@pytest.mark.parametrize("cmd", ["check", "metadata"])
def test_quiet_prints_nothing_on_stdout(cmd, text, code):
    for flag in ("--quiet", "-q"):
        r = CliRunner(env=WIDE).invoke(app, [cmd, flag, "-"], input=text)
        assert r.exit_code == code, r.output
        assert r.stdout == ""
    # the same input without --quiet does print the verdict
    r = CliRunner(env=WIDE).invoke(app, [cmd, "-"], input=text)
    assert r.exit_code == code and (r.stdout != "") == (code != 2)


def test_bad_input_is_one_line_on_stderr_in_quiet_mode():
    r = CliRunner(env=WIDE).invoke(app, ["check", "-q", "-"], input='{"kind": "sparse", "b": -1}')
    assert r.exit_code == 2 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line == "error: calls[0].b: expected >= 1, got -1"


# the object itself --------------------------------------------------------------------------------
def test_modes_from_flags():
    assert Output.for_flags().mode == "human"
    assert Output.for_flags(quiet=True).mode == "quiet"
    assert Output.for_flags(as_json=True, quiet=True).mode == "json"     # --json wins, as it always has
    with pytest.raises(ValueError):
        Output("yaml")


def test_result_and_json_per_mode(capsys):
    for mode, expected in (("human", "text\n"), ("json", '"text"\n'), ("quiet", "")):
        Output(mode).result("text")
        assert capsys.readouterr() == (expected, "")
    Output("json").json({"a": [1, 2]})
    assert capsys.readouterr().out == '{"a":[1,2]}\n'
    Output("quiet").json({"a": 1})
    assert capsys.readouterr().out == ""


def test_error_names_the_field_and_exits_2(capsys):
    import typer

    with pytest.raises(typer.Exit) as ei:
        Output("quiet").error(InputError("requests[2].extend_tokens", "expected >= 0, got -1"))
    assert ei.value.exit_code == EXIT_BAD_INPUT
    assert capsys.readouterr() == ("", "error: requests[2].extend_tokens: expected >= 0, got -1\n")


def test_diagnostics_go_to_stderr(capsys):
    o = Output("json")
    o.err_console.print("progress 1/2")
    assert capsys.readouterr() == ("", "progress 1/2\n")
