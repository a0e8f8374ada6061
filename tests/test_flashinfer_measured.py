"""FlashInfer's MLA ``plan()`` on an H200 (flashinfer-python 0.7.2, SGLang 0.5.23's pin; its SM90 fa3
module JIT-compiled there), against the project's model of the plan and rules FI002 / FI003.

Ground truth: ``fixtures/measured/flashinfer072_h200_plan_cases.jsonl`` (220 random plans: batch
1..512, decode, speculative and prefill query lengths, KV lengths including 0, page sizes 1 and 64,
16 and 128 heads, through the wrapper's ``plan()`` and through the JIT module's ``plan`` that SGLang
calls on CUDA-graph replays; every planned integer read back from the GPU) and
``flashinfer072_h200_probes.jsonl`` (each rule's edge - 1 / edge / edge + 1 on both entries, one child
process each; ``silent``: the call returned but output rows stayed unwritten).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from validate_batch.api import check_calls
from validate_batch.flashinfer.mla_schedule import MERGE, PER_WORK, mla_schedule

MEASURED = Path(__file__).resolve().parents[1] / "fixtures" / "measured"
CASES = [json.loads(x) for x in (MEASURED / "flashinfer072_h200_plan_cases.jsonl").read_text().splitlines() if x.strip()]
PROBES = [json.loads(x) for x in (MEASURED / "flashinfer072_h200_probes.jsonl").read_text().splitlines() if x.strip()]
VERSION = "flashinfer-python-0.7.2"


def test_the_recording_covers_what_it_says():
    assert len(CASES) == 220 and {r["device"] for r in CASES} == {"NVIDIA H200"} and {r["build"] for r in CASES} == {"0.7.2"}
    assert {r["entry"] for r in CASES} == {"wrapper", "module"} and {r["page_size"] for r in CASES} == {1, 64}
    assert {r["heads"] for r in CASES} == {16, 128}
    assert any(0 in r["kv_len"] for r in CASES) and max(len(r["kv_len"]) for r in CASES) > 256


@pytest.mark.parametrize("i", range(len(CASES)))
def test_every_recorded_plan_is_the_models_bit_for_bit(i):
    r = CASES[i]
    assert r["outcome"] == "ok"
    m = mla_schedule(r["qo_indptr"], r["kv_indptr"], r["kv_len"], r["heads"], r["num_sm"], r["causal"],
                     r.get("head_dim_o", 512))
    assert m["plan_info"] == r["plan_info"]
    a = r["arrays"]
    assert m["arrays"]["work_indptr"] == a["work_indptr"]
    n = min(m["total_works"], len(a["q_indptr"]))
    for k in PER_WORK:
        assert m["arrays"][k][:n] == a[k][:n], k
    for k in MERGE:
        assert m["arrays"][k] == a[k], k


def _rule_probes():
    return [p for p in PROBES if p["rule"] in ("FI002", "FI003") and "qo_indptr" in p]


@pytest.mark.parametrize("p", _rule_probes(), ids=[f"{p['rule']}-{p['entry']}-{p['what']}-{p['edge']}" for p in _rule_probes()])
def test_fi002_fi003_at_their_edges(p):
    rec = {"kind": "mla_plan", "qo_indptr": p["qo_indptr"], "kv_indptr": p["kv_indptr"], "kv_len": p["kv_len"],
           "h_q": p["heads"], "entry": p["entry"], "version": VERSION}
    r = check_calls([rec], "H200")
    if p["outcome"] == "ok" and p["edge"] == -1:
        # a decreasing kv_indptr on the module path: the call ran and the rows came back written; which
        # pages they were computed from is not defined, so the model calls it undefined behaviour (a kernel
        # that runs agrees with it), not a certain silent failure
        assert p["entry"] == "module" and p["what"].startswith("pages") and r.codes == ["FI003"]
        assert r.errors[0].failure.kind == "undefined_behaviour"
        return
    assert r.legal == (p["outcome"] == "ok"), (p["what"], p["outcome"], r.codes)
    if not r.legal:
        want = {"python_exception": "python_exception", "silent": "silent_wrong"}[p["outcome"]]
        assert r.errors[0].code == p["rule"] and r.errors[0].failure.kind == want


def test_the_wrapper_refuses_what_the_replay_path_lets_through():
    by = {(p["rule"], p["entry"], p["what"], p["edge"]): p for p in _rule_probes()}
    assert by[("FI003", "wrapper", "kv_len of request 1", -1)]["outcome"] == "python_exception"
    assert by[("FI003", "module", "kv_len of request 1", -1)]["outcome"] == "silent"
    assert by[("FI002", "module", "qo_len of request 1", -1)]["message"].startswith("Error in function 'MLAPlan'")


def test_an_mla_plan_verdict_on_0_7_2_rests_on_measured_facts():
    rec = {"kind": "mla_plan", "qo_indptr": [0, 4, 3], "kv_indptr": [0, 1, 2], "version": VERSION}
    r = check_calls([rec], "H200")
    assert r.codes == ["FI002"] and r.provenance["rules"]["FI002"]["status"] == "measured"
