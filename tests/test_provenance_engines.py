"""Every ``source`` / ``<name>_source`` of rules/engines.json, rules/engine_args.json and
rules/settings.json carries its provenance (``provenance`` / ``<name>_provenance``) of a known kind
with that kind's fields; a "tested" label names test functions that exist, and a "measured" one
fixtures that exist."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ["rules/engines.json", "rules/engine_args.json", "rules/settings.json"]
NEEDS = {"measured": {"device", "package", "date", "fixture"}, "tested": {"package", "test"},
         "read": {"from", "at"}, "inferred": {"from", "at", "note"}}


def labelled(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str) and (k == "source" or k.endswith("_source")):
                yield f"{path}/{k}", obj.get("provenance" if k == "source" else k[: -len("_source")] + "_provenance")
            yield from labelled(v, f"{path}/{k}")
    elif isinstance(obj, list):
        for i, x in enumerate(obj):
            yield from labelled(x, f"{path}[{i}]")


def _as_list(v):
    return v if isinstance(v, list) else [v]


@pytest.mark.parametrize("name", FILES)
def test_every_source_has_an_honest_label(name):
    data = json.loads((ROOT / name).read_text())
    found = list(labelled(data))
    assert found
    for where, value in found:
        assert isinstance(value, (dict, list)) and value, f"{name}{where}: no provenance"
        for prov in _as_list(value):
            check_entry(name, where, prov)


def check_entry(name, where, prov):
    kind = prov.get("kind")
    assert kind in NEEDS, f"{name}{where}: kind {kind!r}"
    assert NEEDS[kind] <= set(prov), f"{name}{where}: {kind} needs {NEEDS[kind] - set(prov)}"
    if kind == "read":
        assert prov["from"] in ("source", "binary", "docs") and ("package" in prov or "commit" in prov), where
    if kind == "tested":
        for t in _as_list(prov["test"]):
            file, _, fn = t.partition("::")
            src = (ROOT / file).read_text()
            assert re.search(rf"^def {re.escape(fn)}\(", src, re.M), f"{name}{where}: no test {t}"
    if kind == "measured":
        for f in _as_list(prov["fixture"]):
            assert (ROOT / f).exists(), f"{name}{where}: no fixture {f}"
