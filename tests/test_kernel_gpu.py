"""Kernel mode on a real GPU with a FlashMLA build (marker ``gpu``; skipped cleanly otherwise).

Expected values are the oracle's records (metadata and outcomes measured on an H200 with FlashMLA
9241ae3) or first-principles arithmetic. Run with ``pytest -m gpu tests/test_kernel_gpu.py``.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO_ROOT = Path(__file__).resolve().parents[1]
ORACLE_DIRS = (REPO_ROOT / "fixtures" / "oracle", REPO_ROOT.parent / "shared" / "oracle")
SCHED_SITE = "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:111"
TIMEOUT_S = 180.0
PARALLEL = 4


@lru_cache(maxsize=1)
def _detection():
    from validate_batch.kernel_mode.providers import detect

    return detect("auto", timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def gpu_detection():
    det = _detection()
    if not det.available:
        pytest.skip(f"kernel mode unavailable: {det.reason}")
    return det


@pytest.fixture(scope="module")
def upstream_9241ae3(gpu_detection):
    """The oracle files flashmla_h200_* were recorded with upstream 9241ae3."""
    if gpu_detection.provider.build != "flashmla-9241ae3":
        pytest.skip(f"recorded with flashmla-9241ae3; this build is {gpu_detection.provider.build}")
    return gpu_detection


@pytest.fixture(scope="module")
def sgl_flash_mla(gpu_detection):
    if not (gpu_detection.provider.build or "").startswith("sgl-flash-mla"):
        pytest.skip(f"needs sgl-flash-mla; this build is {gpu_detection.provider.build}")
    return gpu_detection


def _oracle(name: str) -> list[dict]:
    for d in ORACLE_DIRS:
        if (d / name).is_file():
            return [json.loads(line) for line in (d / name).read_text().splitlines() if line.strip()]
    pytest.skip(f"{name} not found in {', '.join(map(str, ORACLE_DIRS))}")


def _run(records, max_parallel=PARALLEL):
    from validate_batch.api import check_calls
    from validate_batch.kernel_mode.check import run_calls

    report = check_calls(records, "H200")
    return run_calls(report.plans, _detection(), timeout=TIMEOUT_S, max_parallel=max_parallel)


def test_device_is_the_oracle_device(gpu_detection):
    header = _oracle("flashmla_h200_cases.jsonl")[0]
    dev = gpu_detection.device
    if (dev["num_sms"], list(dev["cc"])) != (header["num_sms"], header["cc"]):
        pytest.skip(f"the oracle was recorded on {header['device']}; this is {dev['name']}")
    assert dev["smem_optin"] == header["smem_optin"]


def test_seed_calls(upstream_9241ae3):
    res = _run([{"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512},
                {"kind": "sparse", "b": 4096, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}])
    big, small = res["calls"]
    assert big["kernel"]["outcome"] == "process_exit" and big["kernel"]["exit_code"] == 1
    assert big["kernel"]["cuda_error"]["site"] == SCHED_SITE
    assert small["kernel"]["outcome"] == "ok"
    assert small["metadata"]["identical"], small["metadata"]
    assert small["metadata"]["kernel_parts"] == 132 // 1 // (64 // 64)
    assert res["agreement"] is True


def test_oracle_cases_metadata_bit_for_bit(upstream_9241ae3):
    """Kernel metadata today equals what the oracle recorded (columns 0..6) and what the model says."""
    from validate_batch.kernel_mode.check import diff_metadata

    cases = [r for r in _oracle("flashmla_h200_cases.jsonl")[1:] if "tile_scheduler_metadata" in r]
    picked = cases[:: max(1, len(cases) // 16)][:16]
    res = _run(picked)
    for rec, e in zip(picked, res["calls"]):
        assert e["kernel"]["outcome"] == "ok", e
        assert e["metadata"]["identical"], e["metadata"]
    # The same kernel outputs against the oracle's recorded outputs (not the model's).
    from validate_batch.api import check_calls
    from validate_batch.kernel_mode.check import job_for
    from validate_batch.kernel_mode.runner import run_job

    for rec in picked[:4]:
        call = check_calls([rec], "H200").plans[0].call
        r = run_job(job_for(call, upstream_9241ae3.provider), TIMEOUT_S)
        d = diff_metadata(rec["tile_scheduler_metadata"], rec["num_splits"], r.payload["tile_scheduler_metadata"],
                          r.payload["num_splits"])
        assert d.identical, d.describe()


PROBE_KEYS = ("kind", "b", "s_q", "h_q", "d_qk", "topk", "topk_length", "extra_topk", "extra_topk_length",
              "extra_page", "seqlens")


def _lengths_out_of_range(p: dict) -> bool:
    for lengths, width in (("topk_length", "topk"), ("extra_topk_length", "extra_topk")):
        if p.get(lengths) is not None and any(not 0 <= x <= p[width] for x in p[lengths]):
            return True
    return False


def test_oracle_probe_outcomes(upstream_9241ae3):
    """Outcome classes (and the OK line) of a spread of the recorded limit probes."""
    probes = _oracle("flashmla_h200_probes.jsonl")
    wanted = [p for p in probes if p["b"] <= 4700 and p.get("note") is None]
    wanted += [p for p in probes if p["b"] in (11622, 11623) and p["kind"] == "sparse" and p["topk"] == 128
               and "extra_topk" not in p]
    records = [{k: p[k] for k in PROBE_KEYS if k in p} for p in wanted]
    res = _run(records)
    mismatches = []
    for p, e in zip(wanted, res["calls"]):
        k = e["kernel"]
        if _lengths_out_of_range(p):
            # Undefined behaviour: whether reading past the row faults depends on the data around it
            # (the recorded run faulted). The verdict must still be "illegal" and never disagree.
            assert e["model"]["verdict"] == "illegal" and e["agreement"] in ("agree", "agree_ub"), e
            continue
        if k["oracle_outcome"] != p["outcome"]:
            mismatches.append((p["b"], p.get("h_q"), p.get("topk"), p["outcome"], k["outcome"], k["message"]))
        elif p["outcome"] == "process_exit":
            assert k["cuda_error"]["site"] in p["message"], (k, p["message"])
    assert not mismatches, mismatches


def test_sparse_prefill_probes(upstream_9241ae3):
    recs = [{"kind": "prefill", "s_q": s, "h_q": 64, "d_qk": 512, "topk": 512} for s in (0, 1, 11700)]
    res = _run(recs, max_parallel=3)
    got = [e["kernel"]["oracle_outcome"] for e in res["calls"]]
    assert got == ["process_crash", "ok", "ok"]   # oracle: s_q=0 SIGSEGV, 1 and 11700 run


def test_slot_index_out_of_bounds_on_the_device(gpu_detection):
    from validate_batch.kernel_mode.slot_probe import probe_slot_index

    bad = probe_slot_index(33, 4, 96, "cuda", timeout=TIMEOUT_S)
    assert bad["available"] and bad["outcome"] in ("device_assert", "illegal_memory_access", "python_exception",
                                                   "process_crash", "process_exit")
    assert bad["cpu"]["message"] == "index 96 is out of bounds for dimension 0 with size 33"
    good = probe_slot_index(33, 4, 32, "cuda", timeout=TIMEOUT_S, with_cpu=False)
    assert good["outcome"] == "ok"


# ----------------------------------------------------------------------------- sgl-flash-mla 1.0.0 (PyPI)

SGLFM_FAST_PATH_ROWS = (232448 - 4) // 12        # 4*(3b+1) bytes of scheduler shared memory -> 19370


def test_sglfm_legacy_runs_past_the_upstream_limit_and_notes_the_fallback(sgl_flash_mla):
    base = {"kind": "sparse", "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
    res = _run([dict(base, b=12288), dict(base, b=SGLFM_FAST_PATH_ROWS), dict(base, b=SGLFM_FAST_PATH_ROWS + 1)],
               max_parallel=3)
    assert [e["kernel"]["outcome"] for e in res["calls"]] == ["ok", "ok", "ok"]
    assert [e["kernel"]["use_legacy"] for e in res["calls"]] == [True, True, True]
    assert [e["fallback_used"] for e in res["calls"]] == [False, False, True]
    assert res["calls"][2]["kernel"]["fallback"]["batch_size"] == SGLFM_FAST_PATH_ROWS + 1


def test_sglfm_current_kernels_on_sm90_are_inconclusive(sgl_flash_mla):
    from validate_batch.api import check_calls
    from validate_batch.kernel_mode.check import job_for
    from validate_batch.kernel_mode.runner import run_job

    if sgl_flash_mla.device.get("cc", [0])[0] != 9:
        pytest.skip("the refusal is SM90's")
    call = check_calls([{"kind": "sparse", "b": 8, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}], "H200").plans[0].call
    r = run_job(job_for(call, sgl_flash_mla.provider, use_legacy=False), TIMEOUT_S)
    assert r.outcome == "unsupported" and "SM100" in r.message and r.use_legacy is False


def test_sglfm_legacy_cases_metadata(sgl_flash_mla):
    cases = [r for r in _oracle("sglfm_h200_legacy_cases.jsonl") if "tile_scheduler_metadata" in r]
    picked = [{k: v for k, v in r.items() if k in PROBE_KEYS + ("page",)} for r in cases[:: max(1, len(cases) // 12)][:12]]
    res = _run(picked)
    for e in res["calls"]:
        assert e["kernel"]["outcome"] == "ok", e
        assert e["metadata"] is None or e["metadata"]["identical"], e["metadata"]
