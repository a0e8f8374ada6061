"""The command line's direct path (``validate_batch.cli.main.direct_call``: the common forms of ``check`` and
``metadata`` run without typer's parsing) against typer's own parsing of the same words: the same
stdout, stderr and exit code, in fresh interpreters (as the console script runs)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from validate_batch.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent
ORACLE = str(ROOT / "fixtures" / "oracle" / "flashmla_h200_cases.jsonl")
RECORD = '{"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}'

CASES = [
    (["check", "--example", "dsv4-prefill-3x4096"], None),
    (["check", "--example", "dsv4-prefill-3x4096", "--json"], None),
    (["check", "--example", "pd-decode-slot-96", "-q"], None),
    (["check", "--example", "no-such-example"], None),
    (["check", "--example", "dsv4-prefill-3x4096", "-f", "github"], None),
    (["check", "-", "--json"], RECORD),
    (["check", "/no/such/file.json"], None),
    (["metadata", "--json", ORACLE, "--gpu", "H200"], None),
    (["metadata", ORACLE, "--kernel-gen", "no-such-build"], None),
    (["metadata", "-", "-f", "jsonl"], RECORD),
    (["rules"], None),
    (["rules", "--json"], None),
]


def _run(code: str, argv: list[str], stdin: str | None):
    p = subprocess.run([sys.executable, "-c", code, *argv], input=stdin, capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("argv,stdin", CASES, ids=[" ".join(a[:3]) for a, _ in CASES])
def test_direct_path_equals_typer(argv, stdin):
    assert cli.direct_call(argv) is not None, "this form takes the direct path"
    direct = _run("from validate_batch.cli.main import main; main()", argv, stdin)
    typer_path = _run("from validate_batch.cli.main import app; app()", argv, stdin)
    assert direct == typer_path
    assert direct[0] in (0, 1, 2)


@pytest.mark.parametrize("argv", [
    [], ["rules", "x"], ["rules", "-q"], ["--help"], ["check", "--help"], ["check", "--example=dsv4-prefill-3x4096"],
    ["check", "--example", "a", "--example", "b"], ["check", "--example"], ["check", "--example", "--json"],
    ["check", "a.json", "b.json"], ["check", "--engine", "sglang-dsv4@pre-25418", "--extend", "3x4096"],
    ["metadata"], ["metadata", "--example", "x"], ["check", "--", "x"], ["--debug", "check", "x"],
])
def test_other_forms_go_through_typer(argv):
    assert cli.direct_call(argv) is None


def test_direct_arguments_are_the_commands_defaults_plus_the_words():
    fn, kwargs = cli.direct_call(["check", "--example", "e1", "-q"])
    assert fn is cli.check
    assert kwargs["example"] == "e1" and kwargs["quiet"] is True and kwargs["file"] is None
    assert kwargs["mode"] == "extend" and kwargs["seq_len"] == 1024 and kwargs["server_arg"] == []
    fn, kwargs = cli.direct_call(["metadata", "calls.jsonl", "--json"])
    assert fn is cli.metadata and kwargs["file"] == "calls.jsonl" and kwargs["as_json"] is True and kwargs["rows"] == 16
