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


def test_every_engine_version_name_the_output_uses_is_in_the_readme():
    import json

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    profiles = json.loads((ROOT / "rules" / "engines.json").read_text())["profiles"]
    missing = [f"{n}@{v['name']}" for n, p in profiles.items() for v in p["versions"] if f"`{v['name']}`" not in readme]
    assert not missing, missing


def test_an_empty_extend_says_one_thing():
    r = run(["check", "--engine", "sglang-dsv4@pre-25418", "--extend", "0"], columns=200)
    assert r.exit_code == 1 and "SGL002" in r.stdout
    assert "b = 0 (no new tokens)" in r.stdout and "b = 0 ()" not in r.stdout
    split = r.stdout.split("safe split:", 1)[1]
    assert "no split can help" in split and "need chunking" not in split and "0 step(s)" not in split
    assert "--chunked-prefill-size" not in split
    # one new token: legal, no split
    assert run(["check", "--engine", "sglang-dsv4@pre-25418", "--extend", "1"]).exit_code == 0


def test_probe_slot_without_torch_does_not_quote_torch_as_having_run(monkeypatch):
    from validate_batch.kernel_mode import slot_probe

    monkeypatch.setattr(slot_probe, "torch_installed", lambda: False)
    r = run(["probe-slot", "--rows", "33", "--slot", "96", "--width", "4"], columns=200)
    assert r.exit_code == 3, r.output
    assert "unavailable - torch is not installed" in r.stdout
    assert "says:" not in r.stdout
    assert "would say (its message, written out here: torch did not run): index 96 is out of bounds for dimension 0 with size 33" in r.stdout
    r = run(["probe-slot", "--rows", "33", "--slot", "32", "--width", "4"], columns=200)   # row 32 of 33: in bounds
    assert r.exit_code == 3 and "bounds check" not in r.stdout


def test_the_readme_legality_map_example_runs(monkeypatch, capsys):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "legality_map(Source(" in b]
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    # 3 x 4096 with one running decode: 11622 rows (the limit) legal, 11623 FMLA001
    assert "kind='legal'" in out and "'FMLA001'" in out and out.index("end=11622") < out.index("start=11623")


@pytest.mark.parametrize("command", [[], ["check"], ["metadata"], ["map"], ["kernel-check"], ["probe"]])
def test_help_json_examples_wrap_between_tokens(command):
    """A JSON example wraps at a space between its tokens, never inside one (``"topk": 12`` / ``8}``)."""
    def flat(text: str) -> str:
        return " ".join(text.replace("│", " ").split())

    examples = set(re.findall(r"'(\{\"kind\".*?\})'", flat(run(command + ["--help"], columns=400).stdout)))
    assert examples
    narrow = flat(run(command + ["--help"], columns=60).stdout)
    broken = [e for e in examples if e not in narrow]
    assert not broken, broken


def test_root_help_names_the_module_entry_and_the_settings_order():
    out = " ".join(run(["--help"], columns=200).stdout.split())
    assert "python -m validate_batch" in out and "not python -m validator" in out
    assert "flags, then VALIDATE_BATCH_* variables, then [tool.validate-batch] in pyproject.toml" in out
