"""DeepGEMM 54e2261 (SGLang 0.5.23's sgl-deep-gemm keeps its SM90 metadata kernel byte for byte),
built from its public source and run on an H200 through its real ``get_paged_mqa_logits_metadata``.

Ground truth (``fixtures/measured/``):

* ``deepgemm_h200_54e2261_kernel_check.json.gz``: the 19 calls of ``deepgemm_h200_kernel_check_inputs.jsonl``
  through ``kernel-check --deep-gemm --keep-output``;
* ``deepgemm_h200_54e2261_schedule_cases.json.gz``: the 200 random calls of
  ``deepgemm_h200_schedule_inputs.jsonl.gz`` (the ones vLLM 0.33's copy ran), every metadata row kept;
* ``deepgemm_h200_54e2261_empty_probes.jsonl``: every-length-0 calls at batches around multiples of 32,
  in a fresh process each, and compute-sanitizer's report.

The arithmetic written here is the ground truth for the schedule's items per request: ``next_n`` 1 -> 1,
2 -> 1, 4 -> 2 (items of up to two query tokens).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from validate_batch.api import check_calls
from validate_batch.deepgemm.calls import version
from validate_batch.deepgemm.schedule import atoms_for, mqa_metadata
from validate_batch.kernel_mode.check import kernel_check_report
from library_standin import standin_spec, write_standin

MEASURED = Path(__file__).resolve().parents[1] / "fixtures" / "measured"
CHECK_INPUTS = [json.loads(x) for x in (MEASURED / "deepgemm_h200_kernel_check_inputs.jsonl").read_text().splitlines()
                if x.strip()]
CHECK = json.loads(gzip.decompress((MEASURED / "deepgemm_h200_54e2261_kernel_check.json.gz").read_bytes()))
SCHED_INPUTS = [json.loads(x) for x in gzip.decompress((MEASURED / "deepgemm_h200_schedule_inputs.jsonl.gz").read_bytes())
                .decode().splitlines() if x.strip()]
SCHED = json.loads(gzip.decompress((MEASURED / "deepgemm_h200_54e2261_schedule_cases.json.gz").read_bytes()))
PROBES = [json.loads(x) for x in (MEASURED / "deepgemm_h200_54e2261_empty_probes.jsonl").read_text().splitlines()
          if x.strip()]
FACTS = version("deepgemm-54e2261")


def _verdict(rec: dict, name: str = "deepgemm-54e2261"):
    return check_calls([{**{k: v for k, v in rec.items() if k != "label"}, "version": name}], "H200")


def test_the_recordings_are_what_they_say():
    for rec, inputs in ((CHECK, CHECK_INPUTS), (SCHED, SCHED_INPUTS)):
        assert rec["device"]["name"] == "NVIDIA H200" and rec["device"]["num_sms"] == 132
        assert rec["provider"]["version"] == "2.6.1" and rec["provider"]["build"] == "deepgemm-54e2261"
        assert [c["call"] for c in rec["calls"]] == [r["label"] for r in inputs]
        assert "/tmp" not in json.dumps(rec) and "/work" not in json.dumps(rec)
    assert all(p["build"] == "deepgemm-54e2261" and p["device"] == "NVIDIA H200" for p in PROBES)


def test_items_per_request_by_next_n():
    assert [atoms_for(FACTS["schedule"], n) for n in (1, 2, 3, 4, 8)] == [1, 1, 2, 2, 4]
    assert [atoms_for(version("deepgemm-vllm-0.33")["schedule"], n) for n in (1, 2, 4)] == [1, 1, 1]
    # two requests of 2 and 1 splits at next_n 4: 2 items each -> 6 units over 4 SMs (1, 1, 2, 2)
    assert mqa_metadata([512, 256], 4, 256, 2) == [[0, 0], [0, 1], [1, 0], [2, 0], [4, 0]]


@pytest.mark.parametrize("i", range(200))
def test_every_recorded_schedule_is_the_models_bit_for_bit(i):
    rec, k = SCHED_INPUTS[i], SCHED["calls"][i]["kernel"]
    faults = not any(rec["context_lens"]) and rec["batch"] % 32 == 0
    assert k["outcome"] == ("illegal_memory_access" if faults else "ok"), (rec["batch"], rec["next_n"])
    if not faults:
        want = mqa_metadata(rec["context_lens"], 132, FACTS["schedule"]["split_kv"], atoms_for(FACTS["schedule"], rec["next_n"]))
        assert want == k["payload"]["metadata"]


def test_the_next_n_4_schedules_differ_from_vllm_0_33s():
    # the same inputs through vLLM 0.33's copy count one item per request at next_n 4; 54e2261 counts two
    vllm = json.loads(gzip.decompress((MEASURED / "deepgemm_h200_vllm033_schedule_cases.json.gz").read_bytes()))
    differ = [i for i, r in enumerate(SCHED_INPUTS) if SCHED["calls"][i]["kernel"]["outcome"] == "ok"
              and SCHED["calls"][i]["kernel"]["payload"]["metadata"] != vllm["calls"][i]["kernel"]["payload"]["metadata"]]
    assert differ and all(SCHED_INPUTS[i]["next_n"] == 4 for i in differ)


@pytest.mark.parametrize("i", range(19))
def test_the_model_s_verdict_is_the_kernel_s_on_every_recorded_call(i):
    rec, k = CHECK_INPUTS[i], CHECK["calls"][i]["kernel"]
    r = _verdict(rec)
    assert r.legal == (k["outcome"] == "ok"), (rec, r.codes, k["outcome"])
    if k["outcome"] == "python_exception":
        assert r.codes == ["DG001"] and "smem_size <= SM90ArchSpec::smem_capacity" in k["message"]
    elif k["outcome"] == "illegal_memory_access":
        assert r.codes == ["DG002"] and r.errors[0].failure.kind == "illegal_memory_access"


def _probe(batch, next_n, **kw):
    return next(p for p in PROBES if p["batch"] == batch and p["next_n"] == next_n and p["context_lens"] == "all 0"
                and p.get("prefill") is None and p.get("warm_up") is None and "tool" not in p and not kw)


@pytest.mark.parametrize("batch", [1, 31, 32, 33, 63, 64, 65, 96, 192, 4095, 4096, 4097])
@pytest.mark.parametrize("next_n", [1, 2, 4])
def test_dg002_at_every_probed_batch(batch, next_n):
    p = _probe(batch, next_n)
    r = _verdict({"kind": "paged_mqa_logits_metadata", "batch": batch, "next_n": next_n,
                  "context_lens": [0] * batch})
    assert (p["outcome"] == "ok") == r.legal, (batch, next_n)
    assert ("DG002" in r.codes) == (p["outcome"] == "illegal_memory_access")
    if p["outcome"] == "ok":    # the end marker everywhere: batch x items per request
        items = 1 if next_n == 1 else -(-next_n // 2)
        assert p["first_rows"][0] == [batch * items, 0]


@pytest.mark.parametrize("next_n", [3, 8])
def test_items_per_request_measured_at_next_n_3_and_8(next_n):
    # every length 0 at batch 33 writes the end marker batch x items everywhere: ceil(next_n / 2) items
    p = _probe(33, next_n)
    assert p["outcome"] == "ok" and p["first_rows"][0] == [33 * -(-next_n // 2), 0]
    assert atoms_for(FACTS["schedule"], next_n) == -(-next_n // 2)
    assert _probe(32, next_n)["outcome"] == "illegal_memory_access"
    assert _verdict({"kind": "paged_mqa_logits_metadata", "batch": 32, "next_n": next_n, "context_len": 0}).codes == ["DG002"]


def test_dg002_edges_around_each_multiple_of_32():
    for m in (32, 64, 4096):                       # limit - 1, limit, limit + 1
        got = [_verdict({"kind": "paged_mqa_logits_metadata", "batch": b, "context_len": 0}).codes for b in (m - 1, m, m + 1)]
        assert got == [[], ["DG002"], []], m


def test_one_non_zero_length_is_enough_and_the_output_s_contents_do_not_matter():
    for p in PROBES:
        if p["context_lens"].startswith("all 0 but"):
            assert p["outcome"] == "ok"
            lens = [0] * p["batch"]
            lens[p["batch"] // 2] = 1
            assert _verdict({"kind": "paged_mqa_logits_metadata", "batch": p["batch"], "next_n": p["next_n"],
                             "context_lens": lens}).legal
        if p.get("prefill") is not None or p.get("warm_up") is not None:
            assert p["outcome"] == "illegal_memory_access"      # pre-filled memory or a warm process: the same
    san = next(p for p in PROBES if p.get("tool") == "compute-sanitizer --tool memcheck")
    assert "Invalid __shared__ read of size 4 bytes" in san["sanitizer"] and "sm90_paged_mqa_logits_metadata" in san["sanitizer"]


def test_other_versions_and_gpus_do_not_fire():
    rec = {"kind": "paged_mqa_logits_metadata", "batch": 64, "context_len": 0}
    assert _verdict(rec, "deepgemm-vllm-0.33").legal                 # measured: vLLM 0.33's copy runs it
    assert "DG002" not in check_calls([{**rec, "version": "deepgemm-54e2261"}], "B200").codes   # an SM90 kernel
    assert "DG002" not in _verdict({**rec, "context_len": None}).codes                           # lengths not given
    assert "DG002" not in _verdict({**rec, "varlen": True}).codes


def test_the_verdict_says_the_fact_is_measured_on_this_build():
    r = _verdict({"kind": "paged_mqa_logits_metadata", "batch": 64, "context_len": 0})
    doc = r.to_dict()
    rules = doc["provenance"]["rules"]
    assert rules["DG002"]["status"] == "measured", rules["DG002"]


def test_kernel_check_replays_the_recorded_calls_and_agrees(tmp_path):
    # stand-in: a child backend that answers each job with the payload (or the error) the H200 recorded
    pairs = [(MEASURED / "deepgemm_h200_kernel_check_inputs.jsonl", MEASURED / "deepgemm_h200_54e2261_kernel_check.json.gz"),
             (MEASURED / "deepgemm_h200_schedule_inputs.jsonl.gz", MEASURED / "deepgemm_h200_54e2261_schedule_cases.json.gz")]
    recs = CHECK_INPUTS + SCHED_INPUTS[150:]
    report = check_calls(recs, "H200")
    res = kernel_check_report(report, None, timeout=120, max_parallel=2,
                              child=standin_spec(write_standin(tmp_path), "2.6.1", pairs))
    assert res["library"] == "deep_gemm" and res["provider"]["build"] == "deepgemm-54e2261"
    assert res["status"] == "agree", res["summary"]
    assert res["summary"]["agreement"]["agree"] == len(recs)
    md = res["summary"]["metadata"]
    assert md["compared"] == md["identical"] > 0 and md["differing"] == 0
    codes = {e["call"]: e["model"]["codes"] for e in res["calls"]}
    assert codes["batch 64 all lengths 0"] == ["DG002"] and codes["random 190"] == ["DG002"]
