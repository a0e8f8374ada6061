"""What a new user reads at a narrow terminal and in --help: nothing cut off, no Python reprs, no
placeholders that look unfilled."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validate_batch.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
BATCHES = ROOT / "fixtures" / "batches"


def run(args, columns=60):
    r = CliRunner(env={"COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "dumb"}).invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def first_column(text: str) -> str:
    """The first column of a rich table, its folded pieces joined."""
    cells = [ln.split("│")[1].strip() for ln in text.splitlines() if ln.startswith("│") and ln.count("│") >= 3]
    return "".join(cells)


def test_corpus_table_keeps_whole_file_names_at_60_columns():
    r = run(["check", BATCHES])
    files = sorted(str(p) for p in BATCHES.iterdir() if p.suffix in (".yaml", ".json"))
    assert "…" not in r.stdout
    assert first_column(r.stdout) == "".join(files)


def test_across_builds_keeps_the_mark_of_the_judged_build_at_60_columns():
    r = run(["check", "--example", "dsv4-prefill-3x4096", "--across-builds"])
    col = first_column(r.stdout.split("the same input on every known FlashMLA build", 1)[1])
    # the example names sglang-dsv4@pre-25418, which ships FlashMLA 9241ae3
    assert "*flashmla-9241ae3" in col.replace(" ", "") and col.count("*") == 1
    assert "…" not in r.stdout


def test_builds_lists_kernels_without_python_reprs():
    r = run(["builds"], columns=200)
    assert r.exit_code == 0
    assert "{'" not in r.stdout and "'}" not in r.stdout
    assert "sparse (SM90): vllm-0.33-sparse-sm90" in r.stdout and "sparse (SM100): flashmla-2026.09.30" in r.stdout


@pytest.mark.parametrize("command", ["check", "metadata", "bisect", "map", "kernel-check", "explain", "env", "probe-slot"])
def test_help_has_no_placeholder_types(command):
    r = run([command, "--help"], columns=120)
    assert r.exit_code == 0
    assert not re.search(r"<(bool|int|str|float|list\[[a-z]+\])>", r.stdout), r.stdout
    assert not re.search(r"\{[a-z_]+\}", r.stdout.split("\n", 3)[1] if r.stdout.count("\n") > 2 else r.stdout)
    usage = next(ln for ln in r.stdout.splitlines() if "Usage:" in ln)
    assert not re.search(r"\{[a-z_]+\}", usage), usage
