"""YAML batches are read by libyaml (PyYAML's C loader) where PyYAML has it: a 12000-request batch
took seconds in the pure-Python loader, which read it twice (the size and depth pre-check, then the
documents). The C loader gives the same documents and the same errors."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from validate_batch.errors import InputError
from validate_batch.inputs import documents

ROOT = Path(__file__).resolve().parent.parent
needs_libyaml = pytest.mark.skipif(not getattr(yaml, "__with_libyaml__", False), reason="PyYAML without libyaml")


def big_yaml(n: int, forward_mode: bool = True) -> str:
    head = ["engine: sglang-dsv4@pre-25418", "gpu: H200"] + (["forward_mode: decode"] if forward_mode else [])
    return "\n".join(head + ["requests:"] + [f"  - {{id: r{i}, seq_len: {100 + i}}}" for i in range(n)]) + "\n"


@needs_libyaml
def test_the_pure_python_parser_is_not_used(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the pure-Python YAML parser was used")

    monkeypatch.setattr(yaml.parser.Parser, "parse_stream_start", refuse)
    docs = documents.parse_documents(big_yaml(12000), "big.yaml")
    assert len(docs) == 1 and len(docs[0]["requests"]) == 12000
    assert docs[0]["requests"][11999] == {"id": "r11999", "seq_len": 100 + 11999}
    import validate_batch

    with pytest.raises(InputError, match="forward_mode"):
        validate_batch.check(documents.parse_documents(big_yaml(12000, forward_mode=False), "bad.yaml")[0])


@needs_libyaml
def test_same_documents_as_the_python_loader():
    for p in sorted((ROOT / "fixtures" / "batches").glob("*.yaml")) + sorted((ROOT / "rules" / "examples").glob("*.yaml")):
        text = p.read_text()
        assert documents.parse_documents(text, p.name) == [d for d in yaml.safe_load_all(text) if d is not None], p


@needs_libyaml
def test_errors_still_name_the_line():
    with pytest.raises(InputError) as e:
        documents.parse_documents("engine: x\nrequests:\n  - {id: a\n  - b\n", "broken.yaml")
    assert "broken.yaml:" in str(e.value) and "neither JSON nor valid YAML" in str(e.value)
    line = int(str(e.value).split("broken.yaml:")[1].split(":")[0])
    assert 3 <= line <= 5


def test_falls_back_without_libyaml(monkeypatch):
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    assert documents._loader(yaml) is yaml.SafeLoader
    assert documents.parse_documents("a: 1\nb: [1, 2]\n", "x.yaml") == [{"a": 1, "b": [1, 2]}]
