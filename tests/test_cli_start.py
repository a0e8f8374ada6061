"""What each common command line loads: the console script runs ``rules``, ``check`` and
``metadata`` without typer, writes JSON, quiet output and the rules listing without rich, gives help to a pipe as plain
text without rich, and builds no numpy array where no schedule is built and no column read. Each
case runs the console script's entry in a fresh interpreter (as the installed script runs) and
reads ``sys.modules`` when it exits."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("typer", "rich", "numpy", "click", "pydantic", "difflib")

# run main(), then on exit print which heavy modules were loaded (stdout of the command goes to a file)
PROBE = (
    "import atexit, json, sys\n"
    "def report():\n"
    "    loaded = sorted(m for m in %r if m in sys.modules)\n"
    "    sys.__stderr__.write('LOADED ' + json.dumps(loaded) + '\\n')\n"
    "atexit.register(report)\n"
    "from validate_batch.cli.main import main\n"
    "main()\n"
) % (HEAVY,)


def loaded(argv: list[str], stdin: str | None = None) -> tuple[int, str, list[str]]:
    p = subprocess.run([sys.executable, "-c", PROBE, *argv], input=stdin, capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("LOADED "))
    return p.returncode, p.stdout, json.loads(line[len("LOADED "):])


def test_rules_as_json_loads_none_of_them():
    code, out, mods = loaded(["rules", "--json"])
    assert code == 0 and mods == []
    codes = [r["code"] for r in json.loads(out)]
    assert "FMLA001" in codes and "SLOT001" in codes


def test_rules_to_a_pipe_loads_none_of_them():
    code, out, mods = loaded(["rules"])
    assert code == 0 and "FMLA001" in out
    assert mods == []


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["bisect", "--help"]])
def test_help_to_a_pipe_is_plain_text_without_rich_or_numpy(argv):
    code, out, mods = loaded(argv)
    assert code == 0
    assert out.startswith("Usage: ")
    assert not set("┏┃╭│━─") & set(out), "box drawing: rich rendered the help"
    assert "rich" not in mods and "numpy" not in mods
    if argv == ["--help"]:
        assert "pydantic" not in mods       # (a command's own help converts its parameters: typer loads it)
        for command in ("check", "metadata", "rules", "explain", "bisect", "kernel-check", "map", "gpus"):
            assert f"\n  {command} " in out, command


def test_check_json_loads_neither_typer_nor_rich():
    code, out, mods = loaded(["check", "--example", "dsv4-prefill-3x4096", "--json"])
    assert code == 1
    assert json.loads(out)["legal"] is False
    assert "typer" not in mods and "rich" not in mods and "click" not in mods
    assert "numpy" in mods          # the model's columns and schedules are arrays


def test_metadata_quiet_loads_neither_typer_nor_rich():
    record = '{"kind": "sparse", "b": 11623, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}'
    code, out, mods = loaded(["metadata", "-", "-q"], record)
    assert code == 1 and out == ""
    assert "typer" not in mods and "rich" not in mods


def test_the_readme_first_command_loads_neither_typer_nor_rich():
    # the README's first command: its verdict with --exit-zero, to a pipe
    code, out, mods = loaded(["check", "--example", "dsv4-prefill-3x4096", "--exit-zero"])
    assert code == 0 and "verdict: ILLEGAL" in out and "FMLA001" in out
    assert "rich" not in mods and "typer" not in mods and "click" not in mods
    code, out, mods = loaded(["check", "--example", "dsv4-prefill-3x4096", "--select", "SGL", "--statistics", "--json"])
    assert code == 1 and [f["code"] for f in json.loads(out)["findings"]] == ["SGL001"]
    assert "typer" not in mods


def test_a_form_the_direct_path_does_not_read_still_runs_through_typer():
    code, out, mods = loaded(["check", "--example=dsv4-prefill-3x4096", "--json"])
    assert code == 1 and json.loads(out)["legal"] is False
    assert "typer" in mods


def test_a_check_written_to_a_pipe_loads_neither_rich_nor_typer():
    code, out, mods = loaded(["check", "--example", "dsv4-prefill-3x4096"])
    assert code == 1 and "verdict: ILLEGAL" in out and "FMLA001" in out
    assert "rich" not in mods and "typer" not in mods


def test_the_data_files_are_read_without_importlib_resources():
    # (importlib.resources loads tempfile, shutil, zipfile and more: the package's files are read from its folder)
    probe = PROBE.replace(repr(HEAVY), repr(("importlib.resources", "tempfile")))
    assert probe != PROBE
    p = subprocess.run([sys.executable, "-c", probe, "check", "--example", "dsv4-prefill-3x4096", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("LOADED "))
    assert p.returncode == 1 and json.loads(line[len("LOADED "):]) == []


@pytest.mark.parametrize("table, parsed", [("", False), ("[tool.validate-batch]\nselect = ['SGL']\n", True)])
def test_a_project_file_without_the_table_is_not_parsed(tmp_path, table, parsed):
    # run from a project whose pyproject.toml names other tools only: no TOML parser is loaded
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n\n[tool.ruff]\nline-length = 100\n" + table)
    probe = PROBE.replace(repr(HEAVY), repr(("tomllib", "tomli")))
    p = subprocess.run([sys.executable, "-c", probe, "check", "--example", "dsv4-prefill-3x4096", "--json"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("LOADED "))
    codes = {f["code"] for f in json.loads(p.stdout)["findings"]}
    assert p.returncode == 1 and codes == ({"SGL001"} if parsed else {"FMLA001", "SGL001"})
    assert bool(json.loads(line[len("LOADED "):])) is parsed


#: the modules of the kernel families and tensor checks a DeepSeek-V4 batch on FlashMLA derives no call of
OTHER_FAMILIES = ("validate_batch.deepgemm.calls", "validate_batch.flashinfer.calls",
                  "validate_batch.flashinfer.mla_schedule", "validate_batch.flashmla.tensors")


def test_a_check_loads_only_the_kernel_families_it_judges():
    probe = PROBE.replace(repr(HEAVY), repr(OTHER_FAMILIES))
    p = subprocess.run([sys.executable, "-c", probe, "check", "--example", "dsv4-prefill-3x4096", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("LOADED "))
    assert p.returncode == 1 and json.loads(p.stdout)["legal"] is False
    assert json.loads(line[len("LOADED "):]) == []
    # a record of each of those families loads its module (so the probe can see them loaded)
    records = [{"kind": "paged_mqa_logits_metadata", "batch": 4}, {"kind": "mla_plan", "qo_indptr": [0, 1],
               "kv_indptr": [0, 1], "kv_len": [1]},
               {"kind": "decode_indices", "indices": [[0, 1]], "num_kv_tokens": 8}]
    for rec, module in zip(records, OTHER_FAMILIES[:2] + OTHER_FAMILIES[3:]):
        p = subprocess.run([sys.executable, "-c", probe, "check", "-", "--json"], input=json.dumps(rec),
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
        line = next(ln for ln in p.stderr.splitlines() if ln.startswith("LOADED "))
        assert p.returncode in (0, 1), (rec, p.stdout, p.stderr[-400:])
        assert module in json.loads(line[len("LOADED "):]), rec
