"""DeepGEMM's SM90 paged MQA-logits schedule metadata (validator/deepgemm/schedule.py).

Ground truth: hand-worked schedules below (the rule: ceil(len / 256) KV splits per request, dealt out to the
SMs in order, the last ``total % num_sms`` SMs one more), and
``fixtures/measured/deepgemm_h200_vllm033_schedule_cases.json.gz``: 200 random
``get_paged_mqa_logits_metadata`` calls through vLLM 0.33's bundled deep_gemm 2.8.1 on an H200
(``kernel-check --deep-gemm --keep-output``; batch 1..8192, next_n 1 / 2 / 4, lengths 0..131072, ten batches
of all-zero lengths), every metadata row as the kernel wrote it.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from validate_batch.deepgemm.schedule import mqa_metadata
from validate_batch.kernel_mode.check import kernel_check_report

MEASURED = Path(__file__).resolve().parents[1] / "fixtures" / "measured"
INPUTS = [json.loads(x) for x in gzip.decompress((MEASURED / "deepgemm_h200_schedule_inputs.jsonl.gz").read_bytes())
          .decode().splitlines() if x.strip()]
RECORD = json.loads(gzip.decompress((MEASURED / "deepgemm_h200_vllm033_schedule_cases.json.gz").read_bytes()))


def test_one_request_is_split_evenly():
    # 4096 keys = 16 splits of 256 over 4 SMs: 4 each
    assert mqa_metadata([4096], 4) == [[0, 0], [0, 4], [0, 8], [0, 12], [1, 0]]


def test_the_last_sms_take_the_remainder():
    # 3 + 7 = 10 splits over 4 SMs: 2 each, the last 10 % 4 = 2 SMs one more: starts 0, 2, 4, 7
    assert mqa_metadata([3 * 256, 7 * 256], 4) == [[0, 0], [0, 2], [1, 1], [1, 4], [2, 0]]


def test_a_partial_split_counts_whole_and_empty_requests_count_none():
    # 257 keys are 2 splits, 0 keys none: 2 + 0 + 1 = 3 splits over 3 SMs
    assert mqa_metadata([257, 0, 1], 3) == [[0, 0], [0, 1], [2, 0], [3, 0]]


def test_all_empty_is_the_end_marker_everywhere():
    assert mqa_metadata([0] * 5, 4) == [[5, 0]] * 5


def test_the_recording_is_what_it_says():
    assert RECORD["device"]["name"] == "NVIDIA H200" and RECORD["device"]["num_sms"] == 132
    assert RECORD["provider"]["build"] == "deepgemm-vllm-0.33" and RECORD["provider"]["version"] == "2.8.1"
    assert [c["call"] for c in RECORD["calls"]] == [r["label"] for r in INPUTS] and len(INPUTS) == 200
    assert {r["next_n"] for r in INPUTS} == {1, 2, 4} and max(r["batch"] for r in INPUTS) > 4096
    assert sum(1 for r in INPUTS if not any(r["context_lens"])) >= 10


@pytest.mark.parametrize("i", range(200))
def test_every_recorded_schedule_is_the_models_bit_for_bit(i):
    rec, k = INPUTS[i], RECORD["calls"][i]["kernel"]
    assert k["outcome"] == "ok"
    assert mqa_metadata(rec["context_lens"], 132) == k["payload"]["metadata"]


STANDIN = r'''
import gzip, json, os

def run(job, stage, partial):
    if job["op"] == "lib_detect":
        return {"torch": "stand-in", "cuda_available": True, "version": "2.8.1",
                "device": {"name": "NVIDIA H200", "cc": [9, 0], "num_sms": 132, "smem_optin": 232448}}
    rec = json.loads(gzip.decompress(open(os.environ["STANDIN_RECORD"], "rb").read()))
    inputs = [json.loads(x) for x in gzip.decompress(open(os.environ["STANDIN_INPUTS"], "rb").read()).decode().splitlines() if x]
    for i, c in zip(inputs, rec["calls"]):
        if i["context_lens"] == job["record"]["context_lens"] and i["next_n"] == job["record"].get("next_n", 1):
            out = dict(c["kernel"]["payload"])
            if os.environ.get("STANDIN_SHIFT"):
                out["metadata"] = [list(r) for r in out["metadata"]]
                out["metadata"][5][1] += 1
            return out
    raise RuntimeError("not recorded")
'''


@pytest.mark.parametrize("shift", [False, True])
def test_kernel_check_compares_the_schedule_row_by_row(tmp_path, shift):
    from validate_batch.api import check_calls
    from validate_batch.kernel_mode.runner import ChildSpec

    (tmp_path / "s.py").write_text(STANDIN)
    env = [("STANDIN_RECORD", str(MEASURED / "deepgemm_h200_vllm033_schedule_cases.json.gz")),
           ("STANDIN_INPUTS", str(MEASURED / "deepgemm_h200_schedule_inputs.jsonl.gz"))] + ([("STANDIN_SHIFT", "1")] if shift else [])
    picked = [{k: v for k, v in INPUTS[i].items()} for i in (0, 3, 150, 195)]
    res = kernel_check_report(check_calls(picked, "H200"), None, timeout=60,
                              child=ChildSpec(backend=str(tmp_path / "s.py"), env=tuple(env)))
    md = res["summary"]["metadata"]
    if not shift:
        assert res["status"] == "agree" and md["identical"] == 4
    else:
        # the all-zero batch (195) writes only end markers: a shifted split there differs too
        assert res["status"] == "disagree" and md["differing"] == 4
        assert all("row 5 expected" in e["metadata"]["summary"] for e in res["calls"])
