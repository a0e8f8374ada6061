"""FI004: FlashInfer's MLAPlan keeps its work items in arrays of 16384 entries (flashinfer-ai/flashinfer 00b1eec
include/flashinfer/attention/scheduler.cuh, max_total_num_works) and copies them in unchecked.

Ground truth from the plan's algorithm, worked out here: one query token per request is ``h_q`` packed rows, one
tile (a tile holds 64 rows, or 128 when the mean packed length is above 64); a KV length of 1 is below the shortest
KV chunk (32 keys), so every request is exactly one work item: ``batch`` requests make ``batch`` work items.
"""
from __future__ import annotations

import pytest

import validate_batch
from validate_batch.ingest.crash_lines import ErrorEvent, classify_error
from validate_batch.ingest.signatures import matching_codes

CAP = 16384


def decode_plan(batch: int, h_q: int, version: str | None = None) -> dict:
    doc = {"kind": "mla_plan", "qo_indptr": list(range(batch + 1)), "kv_indptr": list(range(batch + 1)),
           "kv_len": [1] * batch, "h_q": h_q}
    if version:
        doc["version"] = version
    return doc


@pytest.mark.parametrize("h_q", [16, 128])
@pytest.mark.parametrize("batch,bad", [(CAP - 1, False), (CAP, False), (CAP + 1, True)])
def test_work_items_at_the_capacity(batch, bad, h_q):
    rep = validate_batch.check(decode_plan(batch, h_q))
    f = [x for x in rep.findings if x.code == "FI004"]
    assert bool(f) is bad
    if bad:
        assert f[0].numbers == {"works": batch, "max_works": CAP, "batch": batch}
        assert "expected <= 16384" in f[0].message and str(f[0].failure).startswith("silent_wrong")


def test_the_072_wrapper_refuses_it_and_its_module_does_not():
    wrapper = next(x for x in validate_batch.check(decode_plan(CAP + 1, 128, "flashinfer-python-0.7.2")).findings
                   if x.code == "FI004")
    assert str(wrapper.failure).startswith("python_exception")
    doc = {**decode_plan(CAP + 1, 128, "flashinfer-python-0.7.2"), "entry": "module"}
    module = next(x for x in validate_batch.check(doc).findings if x.code == "FI004")
    assert str(module.failure).startswith("silent_wrong")


def test_a_negative_length_is_fi002s_not_a_work_count():
    doc = {"kind": "mla_plan", "qo_indptr": [0, 4, 3], "kv_indptr": [0, 1, 2], "kv_len": [5, 5], "h_q": 16}
    assert "FI004" not in validate_batch.check(doc).codes


def test_the_wrappers_message_is_fi004s_signature():
    # the wrapper's error as flashinfer-python 0.7.2 printed it on an H200 (fixtures/measured/flashinfer072_h200_kernel_check.json.gz)
    line = ("flashinfer.mla._batch_mla._backends._capabilities._BackendPlanUnsupportedError: No supported planned MLA "
            "backend: fa3: FA MLA needs at least 16385 work items; native capacity is 16384.")
    got = classify_error(line)
    e = ErrorEvent(got[0], 1, line, numbers=got[1])
    assert matching_codes(e) == ["FI004"]
    assert matching_codes(e, "flashinfer-fb28d72") == []      # fb28d72's wrapper has no such check


def test_a_small_plan_is_judged_without_the_schedule(monkeypatch):
    import validate_batch.flashinfer.mla_schedule as ms

    def boom(*a, **k):
        raise AssertionError("the schedule is not needed below the bound")
    monkeypatch.setattr(ms, "mla_schedule", boom)     # (the rule reads the module's function when it runs)
    # 128 requests of one token at h_q 128: at most 128 x 2 tiles + 132 clusters work items, far below 16384
    assert "FI004" not in validate_batch.check(decode_plan(128, 128)).codes
