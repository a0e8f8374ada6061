"""``rules/catalog.json``, the rule catalog written out so that ``validate-batch rules`` starts without
loading the rules: it equals what the definitions generate, a fresh process lists from it only while
every file it was written from is unchanged, and the listing (to a pipe, to a terminal, as JSON)
says the same either way. The definitions, read through the real registry, are the ground truth."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from validate_batch.legality import catalog
from validate_batch.legality.ruleset import all_rules

ROOT = Path(__file__).resolve().parent.parent
FIX = "python -m validate_batch.legality.catalog --write"


def test_the_shipped_catalog_is_what_the_definitions_generate():
    doc = json.loads((ROOT / "rules" / "catalog.json").read_text())
    assert doc["rules"] == [r.to_dict() for r in all_rules()], f"rules/catalog.json is stale: run {FIX}"
    assert catalog.fresh(doc), f"a file the catalog is written from changed: run {FIX}"


def test_the_checksums_cover_every_rule_module_and_knowledge_file():
    doc = json.loads((ROOT / "rules" / "catalog.json").read_text())
    files = set(doc["read_from"])
    for module in {r.func.__module__ for r in all_rules()}:
        rel = module.split(".", 1)[1].replace(".", "/") + ".py"
        assert rel in files, module
    knowledge = {f"rules/{p.name}" for p in (ROOT / "rules").glob("*.json") if p.name != "catalog.json"}
    assert knowledge <= files and "rules/catalog.json" not in files
    for rel, crc in doc["read_from"].items():      # CRC-32 of the file's bytes, as written in the file
        path = ROOT / rel if rel.startswith("rules/") else ROOT / "validator" / rel
        assert zlib.crc32(path.read_bytes()) == crc, rel


def test_a_changed_input_makes_the_file_stale_and_the_listing_live(monkeypatch):
    doc = catalog.shipped()
    assert catalog.fresh(doc)
    first = next(iter(doc["read_from"]))
    stale = {**doc, "read_from": {**doc["read_from"], first: (doc["read_from"][first] + 1) % 2**32}}
    assert not catalog.fresh(stale)
    assert not catalog.fresh({**doc, "read_from": {}}) and not catalog.fresh(None)
    # a fresh process (no rules loaded) with a stale file lists the live registry, not the file
    monkeypatch.setattr(catalog, "shipped", lambda: {**stale, "rules": [{"code": "XX999"}]})
    monkeypatch.delitem(sys.modules, catalog.RULESET)       # (put back when the test ends)
    assert [e["code"] for e in catalog.current()] == sorted(r.code for r in all_rules())


def test_the_check_command_names_what_differs(tmp_path, monkeypatch):
    real = catalog._path()
    monkeypatch.setattr(catalog, "_path", lambda: str(tmp_path / "catalog.json"))
    assert catalog.main(["--check"]) == 1                  # (no file)
    (tmp_path / "catalog.json").write_text(Path(real).read_text())
    doc = json.loads((tmp_path / "catalog.json").read_text())
    doc["rules"][0]["title"] = "changed"
    (tmp_path / "catalog.json").write_text(json.dumps(doc))
    assert catalog.main(["--check"]) == 1
    assert catalog.main(["--bogus"]) == 2


def run(argv, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    e.update(env)
    return subprocess.run([sys.executable, "-m", "validate_batch", *argv], capture_output=True, text=True,
                          cwd=ROOT, env=e, timeout=120)


def test_the_json_listing_is_the_definitions():
    p = run(["rules", "--json"])
    assert p.returncode == 0 and json.loads(p.stdout) == [r.to_dict() for r in all_rules()]


def test_the_piped_listing_is_one_whole_line_per_rule():
    lines = run(["rules"]).stdout.splitlines()
    assert lines[0].split() == ["code", "severity", "crash", "class", "title"]
    rows = lines[1:-1]
    assert len(rows) == len(all_rules())
    for r, line in zip(all_rules(), rows):
        assert line.startswith(r.code + " ") and line.endswith(r.title), line
        assert f" {r.severity} " in line and " or ".join(r.failure.kinds) in line
    # the columns line up: each starts where its header starts
    starts = [lines[0].index(h) for h in ("severity", "crash class", "title")]
    for r, line in zip(all_rules(), rows):
        crash = " or ".join(r.failure.kinds)       # (FMLA015 has no crash class: an empty cell)
        assert [line.index(r.severity, len(r.code)), line.index(crash, starts[1]) if r.failure.kinds else starts[1],
                line.index(r.title, starts[2])] == starts, line
    assert lines[-1] == "`validate-batch explain CODE` prints a rule's page."


def test_a_terminal_gets_the_rich_table():
    p = run(["rules"], FORCE_COLOR="1", COLUMNS="200")
    assert p.returncode == 0 and p.stdout.startswith("┏") and "FMLA001" in p.stdout
