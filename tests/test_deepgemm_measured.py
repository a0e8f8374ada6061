"""DeepGEMM's paged MQA-logits metadata on an H200, against DG001.

Ground truth: ``fixtures/measured/deepgemm_h200_kernel_probes.jsonl`` (DeepGEMM 7f2a703 and 54e2261:
the library's metadata kernel header compiled for sm_90a with nvcc 13.0 as its JIT compiles it and
launched through the driver API as it launches it, behind its host check; one child process each)
and ``deepgemm_h200_vllm033_probes.jsonl`` (vLLM 0.33.0's bundled deep_gemm 2.8.1 through its real
``get_paged_mqa_logits_metadata``). The limits are derived here: 7f2a703 keeps ``align(b, 32)`` ints
in static shared memory and asks for the same bytes again as dynamic, so ``8*align(b, 32)`` must fit
the opt-in 232448 at launch (b <= 29056); 54e2261's dynamic ``4*align(b, 32)`` meets the host check
``<= 232448`` first (b <= 58112).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from validate_batch.api import check_calls
from validate_batch.deepgemm.calls import plan
from validate_batch.legality.registry import run_rules

MEASURED = Path(__file__).resolve().parents[1] / "fixtures" / "measured"
OPTIN = 232448


def _read(name: str) -> list[dict]:
    return [json.loads(x) for x in (MEASURED / name).read_text().splitlines() if x.strip()]


KERNEL = _read("deepgemm_h200_kernel_probes.jsonl")
VLLM = _read("deepgemm_h200_vllm033_probes.jsonl")


def _align(b: int) -> int:
    return -(-b // 32) * 32


def _largest(fits) -> int:
    b = 1
    while fits(b + 1):
        b += 1
    return b


def test_the_limits_from_first_principles_match_the_probes():
    static_plus_dynamic = _largest(lambda b: 8 * _align(b) <= OPTIN)
    host = _largest(lambda b: 4 * _align(b) <= OPTIN)
    assert (static_plus_dynamic, host) == (29056, 58112)
    got = {(r["commit"], r["b"]): r["outcome"] for r in KERNEL}
    for b in (static_plus_dynamic - 1, static_plus_dynamic, 12287, 12288, 12289):
        assert got[("7f2a703", b)] == "ok", b        # the 48 KiB static limit does not bind on sm_90a
    assert got[("7f2a703", static_plus_dynamic + 1)] == "python_exception"
    assert {got[("54e2261", b)] for b in (host - 1, host)} == {"ok"} and got[("54e2261", host + 1)] == "python_exception"
    assert {r["b"]: r["outcome"] for r in VLLM}[host + 1] == "python_exception"
    assert all(r["outcome"] == "ok" for r in VLLM if r["b"] <= host)


@pytest.mark.parametrize("rec", KERNEL + VLLM, ids=[f"{r['commit']}-{r['b']}" for r in KERNEL + VLLM])
def test_every_probe_agrees_with_dg001(rec):
    version = "deepgemm-vllm-0.33" if rec["commit"] == "vllm033" else f"deepgemm-{rec['commit']}"
    assert rec["device"] == "NVIDIA H200" and rec["date"] == "2026-12-01"
    found = run_rules("call", plan({"kind": "paged_mqa_logits_metadata", "batch": rec["b"]}, "H200", version))
    assert bool(found) == (rec["outcome"] != "ok"), (version, rec["b"], rec["outcome"])
    if found:
        assert found[0].code == "DG001" and found[0].failure.kind == rec["outcome"] == "python_exception"
        stage = rec.get("stage") or "host_check"
        assert ("launch" in str(found[0].failure)) == (stage == "launch"), (stage, str(found[0].failure))


def test_the_verdict_on_vllms_deep_gemm_rests_on_a_measured_layout():
    r = check_calls([{"kind": "paged_mqa_logits_metadata", "batch": 58113, "version": "deepgemm-vllm-0.33"}], "H200")
    assert r.codes == ["DG001"]
    assert r.provenance["rules"]["DG001"]["status"] == "measured"
