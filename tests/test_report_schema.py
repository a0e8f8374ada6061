"""The report's JSON schema and its types agree: every key a typed part of a report writes is in the
schema, every key of the schema is written by some report, and every report written validates."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

import validate_batch
from validate_batch.cli.main import app
from validate_batch.facts.modes import Mode
from validate_batch.legality.report import BatchContext, CallsContext, Finding, Report

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "rules" / "schema" / "report.schema.json").read_text())
PROPS = SCHEMA["$defs"]["report"]["properties"]
ORACLE = ROOT / "fixtures" / "oracle"
# a document's keys that no dataclass field carries: the verdict (derived from the findings) and the
# two arguments of Report.document
DERIVED = {"legal", "schema", "statistics"}
# one small batch per engine profile (and a profile pair), so each profile's part of the context shows
BATCHES = [
    ("sglang-dsv4", {"forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": 100}]}),
    ("sglang-slots", {"forward_mode": "decode", "server_args": {"max_running_requests": 8},
                      "requests": [{"id": "a", "seq_len": 10, "req_pool_idx": 3}]}),
    ("sglang-trtllm-mla", {"forward_mode": "decode", "requests": [{"id": "a", "seq_len": 10}]}),
    ("sglang-dsv4", {"forward_mode": "decode",      # read as target verify: the report notes it
                     "server_args": {"speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4},
                     "requests": [{"id": "a", "seq_len": 10}]}),
    ("vllm-flashmla-sparse", {"forward_mode": "decode", "requests": [{"id": "a", "seq_len": 10}]}),
    ("vllm-dsv4", {"forward_mode": "decode", "requests": [{"id": "a", "seq_len": 10}]}),
    ("vllm-flashmla", {"forward_mode": "decode", "requests": [{"id": "a", "seq_len": 10}]}),
    (["sglang-dsv4", "sglang-slots"], {"forward_mode": "mixed", "server_args": {"max_running_requests": 8},
                                       "requests": [{"id": "a", "extend_tokens": 9000, "req_pool_idx": 3}]}),
]


def typed_keys(cls) -> set:
    """The top-level keys a typed part writes: its fields under their own names (not the inlined
    ones or those for Python callers only), and ``kind`` where the type has one."""
    keys = {"kind"} if isinstance(getattr(cls, "kind", None), str) else set()
    return keys | {f.name for f in fields(cls) if f.metadata.get("json", "key") == "key"}


TYPED = typed_keys(Report) | typed_keys(BatchContext) | typed_keys(CallsContext) | DERIVED


def invoke(args) -> dict:
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"}).invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"validate-batch {args} raised {result.exception!r}") from result.exception
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> list[dict]:
    """Report documents of every kind the commands write: each profile's batch, a chunked forward,
    call records, and a check with every addition asked for."""
    docs = [validate_batch.check({"engine": e, **d}).document("validate-batch/report/1") for e, d in BATCHES]
    chunked = validate_batch.check({"engine": "sglang-dsv4", "server_args": {"chunked_prefill_size": 4096},
                               "forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": 12000}]})
    docs.append(chunked.document("validate-batch/report/1"))
    # a step on a path not modelled (SGLang 0.5.23's small-batch SM100 decode kernel)
    docs.append(validate_batch.check({"engine": "sglang-dsv4@0.5.23", "gpu": "B200", "forward_mode": "decode",
                                      "model": {"model_type": "deepseek_v41", "num_attention_heads": 128},
                                      "server_args": {"tp_size": 8}, "requests": [{"id": "d", "seq_len": 300}]})
                .document("validate-batch/report/1"))
    docs.append(invoke(["check", ORACLE / "flashmla_h200_probes.jsonl", "--json"]))
    docs.append(invoke(["check", "--example", "pd-decode-slot-96", "--json", "--reproduce", "--across-builds",
                        "--statistics"]))
    return docs


@pytest.fixture(scope="module")
def kernel_document() -> dict:
    """A check with kernel mode asked for (its result stubbed: the child process and GPU are not
    what is tested here)."""
    import validate_batch.kernel_mode.check as kc

    mp = pytest.MonkeyPatch()
    mp.setattr(kc, "kernel_check_report", lambda report, console=None: {"available": False, "reason": "stub"})
    try:
        return invoke(["check", "--example", "dsv4-prefill-3x4096", "--json", "--kernel"])
    finally:
        mp.undo()


def test_every_typed_key_is_in_the_schema():
    assert TYPED - set(PROPS) == set()


def test_every_schema_key_is_written_by_some_report(documents, kernel_document):
    written = set().union(*(d.keys() for d in documents), kernel_document.keys())
    assert set(PROPS) - written == set()
    assert {"engine_steps", "kernel", "reproduction", "across_builds", "calls", "slots", "notes"} <= written


def test_every_written_key_is_in_the_schema_and_every_document_validates(documents, kernel_document):
    v = jsonschema.Draft202012Validator(SCHEMA)
    for d in documents + [kernel_document]:
        assert set(d) - set(PROPS) == set(), d.get("kind")
        v.validate(d)
    assert kernel_document["kernel"] == {"available": False, "reason": "stub"}


def test_the_schema_forward_modes_are_the_type_and_idle():
    assert PROPS["forward_mode"]["enum"] == [m.value for m in Mode] + ["idle"]


def test_to_dict_writes_the_typed_parts_in_order():
    f = Finding("X001", "error", "expected <= 1, got 2")
    ctx = BatchContext({"label": "b", "gpu": {}, "requests": 1, "running": 0}, "flashmla-x",
                       {"forward_mode": Mode.DECODE, "versions": {}, "query_rows": 2}, ("read as decode",),
                       {"steps": []})
    r = Report([f], context=ctx, safe_split={"possible": False}, kernel={"available": False})
    assert list(r.to_dict()) == ["legal", "findings", "kind", "batch", "kernel_build", "forward_mode", "versions",
                                 "query_rows", "notes", "engine_steps", "provenance", "safe_split", "kernel"]
    assert r.context["notes"] == ["read as decode"] and r.context["forward_mode"] == "decode"
    d = r.document("validate-batch/report/1", {"X001": 1})
    assert list(d)[0] == "schema" and d["statistics"] == {"X001": 1} and d["legal"] is False
    calls = Report([], context=CallsContext(None, [])).to_dict()
    assert calls.pop("provenance")["status"] == "none"          # no call: no fact behind the verdict
    assert calls == {"legal": True, "findings": [], "kind": "calls", "gpu": None, "calls": []}


def test_engine_steps_belong_to_a_batch_report():
    with pytest.raises(TypeError):
        Report([], context=CallsContext(None, [])).with_engine_steps({})
