"""The command line's output object and its exit codes.

0 legal, 1 illegal, 2 bad input (one line naming the field), 3 kernel mode unavailable, 4 internal
error: one line on stderr with the exception's type and message and where to report it; the
traceback only with VALIDATE_BATCH_DEBUG=1. ``--quiet`` prints nothing; the exit code is the verdict.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from validate_batch.output import writer as output_mod
from validate_batch.cli.main import app, main
from validate_batch.errors import InputError
from validate_batch.output.writer import EXIT_BAD_INPUT, EXIT_INTERNAL, Output

WIDE = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
ILLEGAL = json.dumps({"kind": "sparse", "b": 11623, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128})
LEGAL = json.dumps({"kind": "sparse", "b": 11622, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128})


def _boom(*_args, **_kwargs):
    raise RuntimeError("schedule walk lost\nits place")


@pytest.fixture
def broken_check(monkeypatch):
    """``check FILE`` raises an unexpected exception inside the pipeline."""
    import validate_batch.cli.session

    monkeypatch.setattr(validate_batch.cli.session, "check_documents", _boom)   # the command reads it when it runs
    monkeypatch.delenv(output_mod.DEBUG_ENV, raising=False)


def _run_main(args, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ei:
        main(args)
    captured = capsys.readouterr()
    return ei.value.code, captured.out, captured.err


# internal error ----------------------------------------------------------------------------------
def test_internal_error_exits_4_with_one_line(broken_check, capsys):
    code, out, err = _run_main(["check", "batch.json"], capsys)
    assert code == EXIT_INTERNAL == 4
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("internal error: RuntimeError: schedule walk lost its place (")
    assert "please report it" in lines[0] and "VALIDATE_BATCH_DEBUG=1" in lines[0]
    assert "Traceback" not in err


def test_internal_error_traceback_with_debug(broken_check, capsys, monkeypatch):
    monkeypatch.setenv(output_mod.DEBUG_ENV, "1")
    code, _out, err = _run_main(["check", "batch.json"], capsys)
    assert code == EXIT_INTERNAL
    assert err.startswith("Traceback (most recent call last)")
    assert "in _boom" in err
    assert err.splitlines()[-1].startswith("internal error: RuntimeError: schedule walk lost its place")


def test_codes_other_than_internal_pass_through_main(capsys, monkeypatch, tmp_path):
    f = tmp_path / "call.json"
    for text, code in ((LEGAL, 0), (ILLEGAL, 1), ('{"kind": "sparse", "b": "x"}', EXIT_BAD_INPUT)):
        f.write_text(text)
        got, _out, err = _run_main(["check", "--quiet", str(f)], capsys)
        assert got == code, err
        assert "internal error" not in err
    got, _out, err = _run_main(["explain", "NOPE"], capsys)
    assert got == EXIT_BAD_INPUT and err.startswith("error: unknown rule code 'NOPE'")


def test_internal_error_from_the_console_script_process():
    script = ("import validate_batch.cli.session as s\n"
              "def boom(*a, **k):\n    raise KeyError('plans')\n"
              "s.check_documents = boom\n"
              "from validate_batch.cli.main import main\nmain()\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != output_mod.DEBUG_ENV}
    r = subprocess.run([sys.executable, "-c", script, "check", "batch.json"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 4, r.stderr
    assert r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("internal error: KeyError: 'plans' (a bug in validate-batch")


def test_exit_codes_are_distinct():
    from validate_batch.cli import main as cli, bisect_cmd as cli_bisect, kernel_cmd as cli_kernel

    assert (cli.EXIT_LEGAL, cli.EXIT_ILLEGAL, cli.EXIT_BAD_INPUT, cli.EXIT_UNAVAILABLE, cli.EXIT_INTERNAL) == (0, 1, 2, 3, 4)
    assert cli_kernel.EXIT_BAD_INPUT == cli_bisect.EXIT_BAD_INPUT == EXIT_BAD_INPUT
    assert EXIT_INTERNAL not in (cli_kernel.EXIT_AGREE, cli_kernel.EXIT_DISAGREE, cli_kernel.EXIT_UNAVAILABLE,
                                 cli_bisect.EXIT_NOTHING_ILLEGAL, cli_bisect.EXIT_EXPLAINED)


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
    with pytest.raises(SystemExit) as ei:
        Output("quiet").error(InputError("requests[2].extend_tokens", "expected >= 0, got -1"))
    assert ei.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr() == ("", "error: requests[2].extend_tokens: expected >= 0, got -1\n")


def test_diagnostics_go_to_stderr(capsys):
    o = Output("json")
    o.err_console.print("progress 1/2")
    assert capsys.readouterr() == ("", "progress 1/2\n")
