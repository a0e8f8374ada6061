"""The limits beyond FlashMLA's scheduler, each at limit-1, limit and limit+1, per build or version.

Expected values are first-principles arithmetic written here from the kernels' source (cited per
test): CUDA's grid limits (x < 2^31, y and z <= 65535), the combine kernel's 8 heads per CTA, the
shared-memory formulas of DeepGEMM's metadata kernel, FlashInfer's plan checks. No expected value
is read from the code under test.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from validate_batch.api import check, check_calls, check_decode_indices, check_sched_meta_reuse
from validate_batch.inputs.batch import batch_from_dict
from validate_batch.cli.main import app
from validate_batch.deepgemm.calls import plan as dg_plan
from validate_batch.errors import InputError
from validate_batch.flashmla.plan import plan
from validate_batch.flashmla.rules import combine_grid
from validate_batch.facts.knowledge import build_names, load
from validate_batch.legality.ruleset import all_rules

ROOT = Path(__file__).resolve().parents[1]
GRID_Y = 65535                     # CUDA: maximum y- and z-dimension of a grid
GRID_X = 2**31 - 1                 # CUDA: maximum x-dimension
HEADS_PER_CTA = 8                  # query heads per combine CTA (mla_combine.cu:182, combine.cu:193)
B200 = {"name": "B200-like", "num_sms": 148, "cc": [10, 0], "smem_optin": 232448}


def codes(report) -> set[str]:
    return {f.code for f in report.findings}


def sparse(b, s_q, h_q, **kw):
    rec = {"kind": "sparse", "b": b, "s_q": s_q, "h_q": h_q, "d_qk": kw.pop("d_qk", 576), "topk": kw.pop("topk", 128)}
    rec.update(kw)
    return rec


# --------------------------------------------------------------------------- FMLA017 combine grid
# 1408756 (before PR #182): gridDim.y = ceil(s_q*h_q/8) <= 65535 (csrc/smxx/mla_combine.cu:192)
@pytest.mark.parametrize("h_q", [64, 128])
def test_combine_grid_y_on_1408756(h_q):
    limit = GRID_Y * HEADS_PER_CTA // h_q          # 4095 at h_q 128, 8191 at h_q 64
    assert limit == {128: 4095, 64: 8191}[h_q]
    for s_q in (limit - 1, limit, limit + 1):
        r = check(sparse(1, s_q, h_q), gpu="H200", build="flashmla-1408756")
        assert ("FMLA017" in codes(r)) == (s_q > limit), s_q
    f = next(f for f in check(sparse(1, limit + 1, h_q), build="flashmla-1408756").findings if f.code == "FMLA017")
    assert f.numbers["axis"] == "y" and f.numbers["value"] == -(-(limit + 1) * h_q // HEADS_PER_CTA)
    assert f.failure.startswith("process_exit") and "mla_combine.cu:201" in f.failure


def test_combine_grid_9241ae3_moves_rows_to_x():
    # PR #182 (9241ae3): grid (b*s_q, 1, ceil(h_q/8)) - s_q 4096 at h_q 128 is fine there
    assert "FMLA017" not in codes(check(sparse(1, 4096, 128), build="flashmla-9241ae3"))
    s_q = 65536
    limit_b = GRID_X // s_q                        # 32767
    for b in (limit_b - 1, limit_b, limit_b + 1):
        found = combine_grid(plan(sparse(b, s_q, 64), "H200", "flashmla-9241ae3")) or []
        assert bool(found) == (b > limit_b), b
        if found:
            assert found[0].numbers["axis"] == "x" and found[0].numbers["value"] == b * s_q


def test_combine_grid_current_kernels_s_q_on_y():
    # 2026.09.30 (binary): grid (b, s_q, ceil(h_q/8)); combine runs only when topk + extra > 640
    for s_q in (GRID_Y - 1, GRID_Y, GRID_Y + 1):
        found = combine_grid(plan(sparse(1, s_q, 64, d_qk=512, topk=1024), B200, "flashmla-2026.09.30")) or []
        assert bool(found) == (s_q > GRID_Y), s_q
    assert not combine_grid(plan(sparse(1, GRID_Y + 1, 64, d_qk=512, topk=512), B200, "flashmla-2026.09.30"))


def test_combine_grid_sgl_kernel_fork_s_q_on_y():
    # sgl-project/FlashMLA 9804b12 combine.cu:202: grid (b, s_q, ceil(h_q/8)) - not yet PR #182's layout
    for s_q in (GRID_Y - 1, GRID_Y, GRID_Y + 1):
        found = combine_grid(plan(sparse(1, s_q, 64), "H200", "sgl-kernel-flashmla")) or []
        assert bool(found) == (s_q > GRID_Y), s_q
    assert not combine_grid(plan(sparse(1, 4096, 128), "H200", "sgl-kernel-flashmla"))


# sgl-flash-mla 1.0.0, legacy kernels: ground truth is the H200 measurement in fixtures/measured/ (launch
# grids from the CUDA kernel trace of torch.profiler, outcomes from kernel-check, one child per call)
MEASURED_GRID = ROOT / "fixtures" / "measured" / "sglfm_h200_combine_grid_measured.json"
RECORD_KEYS = ("kind", "b", "s_q", "h_q", "d_qk", "topk")


def measured_grid_calls() -> list[dict]:
    return json.loads(MEASURED_GRID.read_text(encoding="utf-8"))["calls"]


def measured_record(row: dict) -> dict:
    return {k: row[k] for k in RECORD_KEYS}


def test_combine_grid_sgl_flash_mla_legacy_is_the_measured_grid():
    launched = [c for c in measured_grid_calls() if c.get("combine_launched")]
    assert len(launched) >= 6 and {c["b"] for c in launched} >= {1, 2, 3}
    for c in launched:
        # the measured layout: b*s_q CTAs on x, ceil(h_q/8) on z, whether or not a request is split
        assert c["combine_grid"] == [c["b"] * c["s_q"], 1, -(-c["h_q"] // HEADS_PER_CTA)], c
        assert plan(measured_record(c), "H200", "sgl-flash-mla-1.0.0").combine_grid == tuple(c["combine_grid"]), c
    assert any(c["message"] == "OK 1 1" for c in launched)        # one partition, no split: combine still ran


@pytest.mark.parametrize("h_q", [64, 128])
def test_combine_grid_sgl_flash_mla_legacy_has_no_y_limit_of_1408756(h_q):
    # measured at 1408756's gridDim.y limit and just past it (limit + 1, + 2): the legacy kernels ran them
    limit = GRID_Y * HEADS_PER_CTA // h_q
    rows = {c["s_q"]: c for c in measured_grid_calls() if c["h_q"] == h_q and c["b"] == 1}
    for s_q in (limit, limit + 1, limit + 2):
        row = rows[s_q]
        assert row["outcome"] == "ok", row
        assert "FMLA017" not in codes(check(measured_record(row), gpu="H200", build="sgl-flash-mla-1.0.0")), s_q
        on_1408756 = codes(check(measured_record(row), gpu="H200", build="flashmla-1408756"))
        assert ("FMLA017" in on_1408756) == (s_q > limit), s_q


def test_combine_grid_sgl_flash_mla_legacy_measured_outcomes():
    # every measured call: FMLA017 silent; the ones the library refused are its int32 stride check (FMLA009)
    rows = measured_grid_calls()
    assert any(c["outcome"] != "ok" for c in rows) and any(c["s_q"] == GRID_Y and c["outcome"] == "ok" for c in rows)
    for c in rows:
        found = codes(check(measured_record(c), gpu="H200", build="sgl-flash-mla-1.0.0"))
        assert "FMLA017" not in found, c
        refused = c["outcome"] == "python_exception" and "Stride exceeds int32 limit" in c["message"]
        assert refused == (c["outcome"] != "ok"), c
        assert ("FMLA009" in found) == refused, c


def test_combine_grid_sgl_flash_mla_legacy_x_limit():
    # the measured layout puts b*s_q on gridDim.x (< 2^31): at s_q = 65535 (the largest that runs at h_q 64)
    s_q = GRID_Y
    limit_b = GRID_X // s_q                        # 32768
    for b in (limit_b - 1, limit_b, limit_b + 1):
        found = combine_grid(plan(sparse(b, s_q, 64, d_qk=512), "H200", "sgl-flash-mla-1.0.0")) or []
        assert bool(found) == (b > limit_b), b
        if found:
            f = found[0]
            assert f.numbers["axis"] == "x" and f.numbers["value"] == b * s_q and f.numbers["max"] == GRID_X
            assert "sgl-flash-mla-1.0.0" in f.message and f.failure.startswith("process_exit")


def test_builds_without_a_recorded_combine_grid_are_not_judged():
    # the grid of vLLM 0.33's bundled copy is not recorded (neither read from source nor measured)
    assert plan(sparse(1, 4096, 128), "H200", "vllm-0.33").combine_grid is None
    assert "FMLA017" not in codes(check(sparse(1, 8192, 128), gpu="H200", build="vllm-0.33"))


# --------------------------------------------------------------------------- FMLA008 splits per build
@pytest.mark.parametrize("kernel,cc,parts_of,limit", [
    # 9241ae3 sparse SM90: P = num_sms / s_q / (h_q/64) = num_sms at s_q 1, h_q 64; dispatch up to 160
    ("flashmla-9241ae3", [9, 0], lambda p: p, 160),
    # 1408756 sparse SM90: P = (num_sms/2) / h_k / (ceil(h_q/128) * s_q) = num_sms/2; up to 160
    ("flashmla-1408756", [9, 0], lambda p: 2 * p, 160),
    # sgl-kernel's fork (sgl-project/FlashMLA 9804b12 combine.cu:178-182): the same dispatch up to 160
    ("sgl-kernel-flashmla", [9, 0], lambda p: p, 160),
    # current kernels SM100 head64: P = num_sms / s_q = num_sms; up to 256
    ("flashmla-2026.09.30", [10, 0], lambda p: p, 256),
])
def test_max_splits_per_build(kernel, cc, parts_of, limit):
    for parts in (limit - 1, limit, limit + 1):
        gpu = {"name": "custom", "num_sms": parts_of(parts), "cc": cc, "smem_optin": 232448}
        rec = sparse(1, 1, 64, d_qk=512, topk=1024) if cc[0] == 10 else sparse(1, 1, 64)
        p = plan(rec, gpu, kernel)
        assert p.num_sm_parts == parts
        assert ("FMLA008" in codes(check(rec, gpu=gpu, build=kernel))) == (parts > limit), (kernel, parts)


# --------------------------------------------------------------------------- FMLA014 empty sparse prefill
@pytest.mark.parametrize("kernel,failure", [
    ("flashmla-9241ae3", "process_crash"),                     # measured: SIGSEGV after a TMA dump
    ("sgl-flash-mla-1.0.0", "python_exception"),               # measured: RuntimeError at phase1.cuh:621
    ("flashmla-1408756", "process_crash"),                     # inferred: the same Q TMA step (fwd.cu:650)
])
def test_empty_sparse_prefill_per_build(kernel, failure):
    for s_q in (0, 1, 2):                                      # the limit is s_q >= 1
        r = check({"kind": "prefill", "s_q": s_q, "h_q": 64, "d_qk": 512, "topk": 512}, gpu="H200", build=kernel)
        assert ("FMLA014" in codes(r)) == (s_q == 0)
    f = check({"kind": "prefill", "s_q": 0, "h_q": 64, "d_qk": 512, "topk": 512}, build=kernel).findings[0]
    assert f.failure.startswith(failure)


# --------------------------------------------------------------------------- FMLA018 schedule reuse
def test_reuse_with_lengths_in_the_same_64_token_blocks_is_fine():
    # the schedule counts blocks ceil(len/64): planned at 64 (1 block); 63 and 64 need the same, 65 two
    planned = sparse(4, 1, 64, d_qk=512, topk=512, topk_length=[64] * 4)
    for n, stale in ((63, False), (64, False), (65, True)):
        r = check_sched_meta_reuse(planned, {**planned, "topk_length": [n] * 4}, "H200", "flashmla-9241ae3")
        assert ("FMLA018" in codes(r)) == stale, n
        if stale:
            assert r.findings[0].failure.startswith("silent_wrong")


def test_reuse_on_the_current_kernels_is_silently_stale():
    # 2026.09.30 (B200, split-KV needs topk + extra > 640): lengths are not compared on reuse
    planned = sparse(4, 1, 64, d_qk=512, topk=1024, topk_length=[64] * 4)
    for n, stale in ((63, False), (64, False), (65, True)):
        r = check_sched_meta_reuse(planned, {**planned, "topk_length": [n] * 4}, B200, "flashmla-2026.09.30")
        assert ("FMLA018" in codes(r)) == stale, n
    f = check_sched_meta_reuse(planned, {**planned, "topk_length": [65] * 4}, B200, "flashmla-2026.09.30").findings[0]
    assert f.failure.startswith("silent_wrong")
    # enable_batch_invariant turns split-KV off there: a schedule planned with it cannot serve a call without
    r = check_sched_meta_reuse({**planned, "enable_batch_invariant": True}, planned, B200, "flashmla-2026.09.30")
    assert "FMLA018" in codes(r)


def test_reuse_with_another_b_is_the_assertion_on_9241ae3_and_unchecked_on_1408756():
    planned = sparse(4, 1, 64)
    for b in (3, 4, 5):
        r = check_sched_meta_reuse(planned, sparse(b, 1, 64), "H200", "flashmla-9241ae3")
        assert ("FMLA018" in codes(r)) == (b != 4)
        if b != 4:
            f = r.findings[0]
            assert f.numbers == {"field": "b", "planned": 4, "reused": b} and f.failure.startswith("python_exception")
    # 1408756 returns plain tensors: nothing is compared, the stale schedule is used
    f = check_sched_meta_reuse(planned, sparse(5, 1, 64), "H200", "flashmla-1408756").findings[0]
    assert f.code == "FMLA018" and "field" not in f.numbers


# --------------------------------------------------------------------------- FMLA019 decode indices
def test_decode_indices_only_minus_one_is_skipped():
    n = 128                                          # num_blocks * page_size token slots: 0..127 valid
    for v, bad in ((-2, True), (-1, False), (0, False), (n - 1, False), (n, True), (n + 1, True)):
        r = check_decode_indices(np.array([[0, v]], dtype=np.int32), n)
        assert ("FMLA019" in codes(r)) == bad, v
    # positions at or past topk_length are not read (MODEL1): an out-of-range value there is harmless
    idx = [[5, 999], [5, 999]]
    for tl, bad in (([1, 1], False), ([1, 2], True)):
        r = check_decode_indices(idx, n, tl)
        assert ("FMLA019" in codes(r)) == bad
    f = check_decode_indices(idx, n, [1, 2]).findings[0]
    assert (f.numbers["row"], f.numbers["position"], f.numbers["value"]) == (1, 1, 999)


def test_decode_indices_input_errors_name_the_field():
    with pytest.raises(InputError) as e:
        check_decode_indices([[0, 1]], n := 0)
    assert e.value.field == "num_kv_tokens" and n == 0
    with pytest.raises(InputError) as e:
        check_decode_indices([[0, 1], [2, 3]], 8, [1])
    assert e.value.field == "topk_length"


# --------------------------------------------------------------------------- CG001 / CG002 CUDA graphs
def graph_doc(n_decode: int, captured: int, metadata: int | None = None) -> dict:
    g = {"captured_rows": captured} if metadata is None else {"captured_rows": captured, "metadata_rows": metadata}
    return {"engine": "sglang-dsv4@pre-25418", "gpu": "H200", "forward_mode": "decode",
            "requests": [{"id": f"r{i}", "seq_len": 100} for i in range(n_decode)], "cuda_graph": g}


def test_graph_rows_at_the_captured_size():
    for n, bad in ((31, False), (32, False), (33, True)):      # captured 32 rows
        assert ("CG001" in codes(check(graph_doc(n, 32)))) == bad, n


def test_graph_metadata_rows_at_the_captured_size():
    for m, bad in ((63, True), (64, False), (65, False)):      # captured 64 rows
        assert ("CG002" in codes(check(graph_doc(40, 64, m)))) == bad, m


def test_graph_pads_the_flashmla_calls_to_the_captured_rows():
    # 40 real decodes replayed in a 64-row graph: FlashMLA is called with b = 64, the padding rows have
    # length 0 and still count one 64-token block each (flashmla-facts 3)
    r = check(graph_doc(40, 64))
    assert r.context["query_rows"] == 64 and r.context["row_breakdown"]["padding_rows"] == 24
    sch = r.plans[0].schedule
    assert sch is not None and sch.b == 64


@pytest.mark.parametrize("kernel", ["sgl-flash-mla-1.0.0", "vllm-0.33"])
def test_dense_fp8_padding_row_of_length_zero(kernel):
    # first-generation dense fp8 kernel: a length-0 row starts at block ceil(0/64) - 1 = -1 and reads
    # block_table[row][-1] (flash_fwd_mla_kernel.h:292, :414-415); the limit is cache_seqlens >= 1
    for pad, bad in ((0, True), (1, False), (2, False)):
        rec = {"kind": "dense_fp8", "entry": "fwd_kvcache_mla_fp8", "b": 4, "s_q": 1, "h_q": 128,
               "seqlens": [900, 12, pad, pad]}
        r = check(rec, gpu="H200", build=kernel)
        assert ("FMLA020" in codes(r)) == bad, pad
    rec = {"kind": "dense_fp8", "entry": "fwd_kvcache_mla_fp8", "b": 4, "s_q": 1, "h_q": 128, "seqlens": [900, 12, 0, 0]}
    f = next(f for f in check(rec, gpu="H200", build=kernel).findings if f.code == "FMLA020")
    # without the block table the page it reads is unknown: -1 there is the out-of-bounds read memcheck reports
    # while the call returns (measured: vllm033_h200_densefp8_padding_memcheck_probes.jsonl)
    assert f.numbers == {"request": 2, "count": 2} and f.failure.startswith("undefined_behaviour")
    # the metadata op alone takes empty requests (measured: sglfm_h200_densefp8_cases has them and ran)
    meta = {k: v for k, v in rec.items() if k != "entry"}
    assert "FMLA020" not in codes(check(meta, gpu="H200", build=kernel))


def test_tma_dense_kernels_take_length_zero_padding():
    # the TMA-based dense SM90 kernels hand the page to a TMA load (zero-filled out of range): no FMLA020
    for kernel in ("flashmla-9241ae3", "flashmla-1408756"):
        r = check({"kind": "dense", "b": 4, "s_q": 1, "h_q": 128, "seqlens": [900, 12, 0, 0]}, gpu="H200", build=kernel)
        assert "FMLA020" not in codes(r)


def test_graph_fields_are_validated_by_name():
    with pytest.raises(InputError) as e:
        batch_from_dict({**graph_doc(4, 8), "cuda_graph": {"captured_rows": 0}})
    assert e.value.field == "cuda_graph.captured_rows"
    with pytest.raises(InputError) as e:
        batch_from_dict({**graph_doc(4, 8), "cuda_graph": {"captured_rows": 8, "rows": 3}})
    assert e.value.field == "cuda_graph.rows"


def test_graph_field_in_the_batch_schema():
    jsonschema = pytest.importorskip("jsonschema")    # the test extra (a GPU host may lack it)
    schema = json.loads((ROOT / "rules" / "schema" / "batch.schema.json").read_text())
    jsonschema.validate(graph_doc(4, 8, 8), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**graph_doc(4, 8), "cuda_graph": {"captured_rows": 8, "rows": 3}}, schema)


# --------------------------------------------------------------------------- FI001 trtllm-gen grid
@pytest.mark.parametrize("kind", ["trtllm_gen_mla", "trtllm_gen_fmha"])
def test_trtllm_gen_batch_on_grid_z(kind):
    # fmhaKernels.cuh:579 puts the batch on gridDim.z (CUDA limit 65535)
    for batch in (GRID_Y - 1, GRID_Y, GRID_Y + 1):
        r = check_calls([{"kind": kind, "batch": batch}], "B200")
        assert ("FI001" in codes(r)) == (batch > GRID_Y), batch
    f = check_calls([{"kind": kind, "batch": GRID_Y + 1}], "B200").findings[0]
    assert f.failure.startswith("launch_error_silent") and f.numbers["axis"] == "z"


# --------------------------------------------------------------------------- FI002 / FI003 MLA plan()
def test_mla_plan_query_length_at_zero():
    for qo_len, bad in ((-1, True), (0, False), (1, False)):    # request 1's qo length; the limit is >= 0
        rec = {"kind": "mla_plan", "qo_indptr": [0, 4, 4 + qo_len], "kv_indptr": [0, 1, 2]}
        r = check_calls([rec])
        assert ("FI002" in codes(r)) == bad, qo_len
    f = check_calls([{"kind": "mla_plan", "qo_indptr": [0, 4, 3], "kv_indptr": [0, 1, 2]}]).findings[0]
    assert f.numbers["request"] == 1 and f.numbers["qo_len"] == -1 and f.failure.startswith("python_exception")


def test_mla_plan_kv_lengths_at_zero():
    for kv_len, bad in ((-1, True), (0, False), (1, False)):
        rec = {"kind": "mla_plan", "qo_indptr": [0, 1, 2], "kv_indptr": [0, 1, 2], "kv_len": [7, kv_len]}
        assert ("FI003" in codes(check_calls([rec]))) == bad, kv_len
    for pages, bad in ((-1, True), (0, False), (1, False)):
        rec = {"kind": "mla_plan", "qo_indptr": [0, 1, 2], "kv_indptr": [0, 3, 3 + pages]}
        assert ("FI003" in codes(check_calls([rec]))) == bad, pages
    f = next(f for f in check_calls([{"kind": "mla_plan", "qo_indptr": [0, 1, 2], "kv_indptr": [0, 1, 2],
                                      "kv_len": [7, -1]}]).findings)
    assert f.failure.startswith("silent_wrong")


def test_mla_plan_input_errors_name_the_field():
    with pytest.raises(InputError) as e:
        check_calls([{"kind": "mla_plan", "qo_indptr": [0, 1, 2], "kv_indptr": [0, 1]}])
    assert e.value.field == "calls[0].kv_indptr"


# --------------------------------------------------------------------------- DG001 MQA-logits metadata
def _align32(x):
    return -(-x // 32) * 32


SMEM = 232448                      # DeepGEMM's smem_capacity (heuristics/sm90.hpp:14, sm100.hpp:15)
OPTIN = 227 * 1024                 # CUDA: H200's and B200's opt-in shared memory per block (227 KB)
# ptxas (CUDA 13.0) static __shared__ limits: 0x38c00 for arch-specific targets (the JIT's sm_90a), 0xc000
# for family and generic ones (the JIT's sm_100f with NVCC >= 12.9: device_runtime.hpp:91-96, compiler.hpp:204)
PTXAS_ARCH_SPECIFIC = 0x38C00
PTXAS_FAMILY = 48 * 1024


# (dynamic bytes, static bytes) of the metadata kernel, from DeepGEMM's source
def _dg54_sm90(b):      # 54e2261 sm90_fp8_mqa_logits.hpp:207-211; scheduler/sm90_paged_mqa_logits.cuh:19 (extern)
    return 4 * _align32(b), 0


def _dg54_sm100(b):     # 54e2261 sm100_mqa_logits.hpp:64 (two ints per request); sm100_paged_mqa_logits.cuh:87 (extern)
    return 2 * b * 4, 0


def _dg88(b):           # 88965b0 smxx_fp8_fp4_paged_mqa_logits.hpp:63-68; scheduler/paged_mqa_logits.cuh:19 (extern)
    return 4 * _align32(b), 0


def _dg88_varlen(b):    # the same lines with indices: 3 arrays of align(b, 32) ints and one count
    return 4 * (3 * _align32(b) + 1), 0


def _dg7f(b):           # 7f2a703 smxx_fp8_fp4_paged_mqa_logits.hpp:59-63 (dynamic, launch :77) and
    return 4 * _align32(b), 4 * _align32(b)   # scheduler/paged_mqa_logits.cuh:28 (static prefix_sum[align(b, 32)])


def _first_broken(nbytes, b, static_limit, optin=OPTIN):
    """The first limit broken in the order DeepGEMM meets them: host check, JIT compile, launch."""
    dyn, st = nbytes(b)
    for kind, need, limit in (("host", dyn, SMEM), ("static", st, static_limit), ("launch", dyn + st, optin)):
        if need > limit:
            return kind, need, limit
    return None


DG_CASES = [
    ("deepgemm-54e2261", "H200", False, _dg54_sm90, PTXAS_ARCH_SPECIFIC, 58112),   # 232448 / 4 = 58112 = 1816 * 32
    ("deepgemm-54e2261", B200, False, _dg54_sm100, PTXAS_FAMILY, 29056),           # 232448 / 8
    ("deepgemm-88965b0", B200, True, _dg88_varlen, PTXAS_FAMILY, 19360),           # (232448 - 4) / 12 = 19370 -> 605 * 32
    ("deepgemm-88965b0", "H200", False, _dg88, PTXAS_ARCH_SPECIFIC, 58112),
    ("deepgemm-7f2a703", "H200", False, _dg7f, PTXAS_ARCH_SPECIFIC, 29056),         # 8*align(b, 32) <= 232448 (launch)
    ("deepgemm-7f2a703", B200, False, _dg7f, PTXAS_FAMILY, 12288),                  # 4*align(b, 32) <= 49152 (ptxas)
]
FAILURE_WORDS = {"host": "smem_capacity", "static": "NVCC compilation failed", "launch": "cuFuncSetAttribute"}


@pytest.mark.parametrize("version,gpu,varlen,nbytes,static_limit,expected", DG_CASES)
def test_mqa_metadata_smem_per_version(version, gpu, varlen, nbytes, static_limit, expected):
    limit = max(b for b in range(1, 70000) if _first_broken(nbytes, b, static_limit) is None)
    assert limit == expected
    for b in (limit - 1, limit, limit + 1):
        rec = {"kind": "paged_mqa_logits_metadata", "batch": b, "varlen": varlen, "version": version}
        r = check_calls([rec], gpu)
        assert ("DG001" in codes(r)) == (_first_broken(nbytes, b, static_limit) is not None), (version, b)
    f = check_calls([{"kind": "paged_mqa_logits_metadata", "batch": limit + 1, "varlen": varlen, "version": version}],
                    gpu).findings[0]
    kind, need, cap = _first_broken(nbytes, limit + 1, static_limit)
    assert f.numbers["max_batch"] == limit
    assert (f.numbers["smem_bytes"], f.numbers["smem_limit"]) == (need, cap)
    assert FAILURE_WORDS[kind] in f.failure


@pytest.mark.parametrize("gpu,static_limit", [("H200", PTXAS_ARCH_SPECIFIC), (B200, PTXAS_FAMILY)])
def test_a_static_array_fails_after_the_host_check(gpu, static_limit):
    # 7f2a703: the host assertion (4*align(b, 32) <= 232448) passes up to 58112 and comes first above it;
    # below it a static array breaks the JIT compile (SM100's family target) or the launch (SM90)
    host_limit = SMEM // 4                       # 58112 (a multiple of 32)
    for b in (PTXAS_FAMILY // 4 + 1, OPTIN // 8 + 1, host_limit, host_limit + 1):
        kind = _first_broken(_dg7f, b, static_limit)
        f = check_calls([{"kind": "paged_mqa_logits_metadata", "batch": b, "version": "deepgemm-7f2a703"}], gpu).findings
        assert [x.code for x in f] == ([] if kind is None else ["DG001"]), b
        if kind is not None:
            assert FAILURE_WORDS[kind[0]] in f[0].failure and f[0].numbers["smem_limit"] == kind[2], b
    assert _first_broken(_dg7f, host_limit + 1, static_limit)[0] == "host"
    # the dynamic-array commit passes the same batches below its capacity
    for b in (PTXAS_FAMILY // 4 + 1, OPTIN // 8 + 1):
        assert "DG001" not in codes(check_calls([{"kind": "paged_mqa_logits_metadata", "batch": b,
                                                  "version": "deepgemm-88965b0"}], gpu))


@pytest.mark.parametrize("version,nbytes,optin", [
    ("deepgemm-54e2261", _dg54_sm90, 101376),     # a GPU whose opt-in maximum is below DeepGEMM's capacity
    ("deepgemm-7f2a703", _dg7f, 65536),           # static + dynamic: 8*align(b, 32) <= 65536
])
def test_the_launch_needs_static_plus_dynamic_within_the_gpus_opt_in(version, nbytes, optin):
    gpu = {"name": "small-sm90", "num_sms": 132, "cc": [9, 0], "smem_optin": optin}
    limit = max(b for b in range(1, 70000) if _first_broken(nbytes, b, PTXAS_ARCH_SPECIFIC, optin) is None)
    assert limit == {101376: 25344, 65536: 8192}[optin]          # 101376 / 4 = 25344 = 792 * 32; 65536 / 8
    for b in (limit - 1, limit, limit + 1):
        r = check_calls([{"kind": "paged_mqa_logits_metadata", "batch": b, "version": version}], gpu)
        assert ("DG001" in codes(r)) == (b > limit), (version, b)
    f = check_calls([{"kind": "paged_mqa_logits_metadata", "batch": limit + 1, "version": version}], gpu).findings[0]
    assert f.numbers["smem_limit"] == optin and f.numbers["smem_bytes"] == sum(nbytes(limit + 1))
    assert "cuFuncSetAttribute" in f.failure


def _sourced(node, path=()):
    """(path, object, provenance key) for every string ``source`` / ``<name>_source`` in the data."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, str) and (k == "source" or k.endswith("_source")):
                yield path + (k,), node, "provenance" if k == "source" else k[: -len("source")] + "provenance"
            yield from _sourced(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _sourced(v, path + (i,))


def test_every_deepgemm_source_carries_an_honest_provenance():
    found = list(_sourced(json.loads((ROOT / "rules" / "deepgemm.json").read_text())))
    assert len(found) >= 9
    for path, obj, key in found:
        provs = obj.get(key)
        provs = [provs] if isinstance(provs, dict) else provs
        assert provs, (path, key)
        for prov in provs:
            if prov["kind"] == "measured":     # the H200 runs: fixtures/measured/deepgemm_h200_*
                assert prov["fixture"].startswith("fixtures/measured/deepgemm_h200_") and (ROOT / prov["fixture"]).is_file()
                assert prov["builds"] and all(b.startswith("deepgemm-") for b in prov["builds"]), path
                continue
            if prov["kind"] == "tested":       # held to the released files by a test that exists
                file, _, func = prov["test"].partition("::")
                assert f"def {func}(" in (ROOT / file).read_text(), path
                continue
            assert prov["kind"] in ("read", "inferred") and prov["from"] in ("source", "docs", "binary"), path
            assert prov["at"], path
            if prov["kind"] == "read":
                assert ("commit" in prov) != ("package" in prov), path
            else:
                assert prov["note"], path
            if "commit" in prov:
                assert re.fullmatch(r"deepseek-ai/DeepGEMM@[0-9a-f]{7,40}", prov["commit"]), path


def test_the_engines_deepgemm_builds_name_a_modelled_dynamic_layout():
    data = load("deepgemm")
    builds = {k: v for k, v in data["installed_builds"].items() if not k.startswith("_")}
    assert set(builds) == {"vllm-0.33.0", "vllm-0.34.0", "sgl-deep-gemm-0.2.5"}
    for name, rec in builds.items():
        lay = data["versions"][rec["sm90_layout_of"]]["metadata"]["9"]
        assert lay["array"] == "dynamic" and "static_bytes" not in lay, name


def test_sglang_replaces_the_planner_above_its_threshold():
    # sglang 0.5.23 dsv4/metadata.py:66 and :212-218: its JIT planner runs for one row per request and
    # more than 11673 rows
    threshold = 11673
    for rows, replaced in ((threshold - 1, False), (threshold, False), (threshold + 1, True)):
        p = dg_plan({"kind": "paged_mqa_logits_metadata", "batch": rows, "caller": "sglang-0.5.23"}, "H200")
        assert p.replaced == replaced, rows
    # above DeepGEMM's SM100 limit (8*b <= 232448: 29056): replaced with one row per request, DeepGEMM's
    # planner (and its limit) with two (speculative verify)
    over = SMEM // 8 + 1
    one = {"kind": "paged_mqa_logits_metadata", "batch": over, "caller": "sglang-0.5.23"}
    assert "DG001" not in codes(check_calls([one], B200))
    assert "DG001" in codes(check_calls([{**one, "next_n": 2}], B200))


# --------------------------------------------------------------------------- catalog, CLI, schemas
NEW = ("FMLA017", "FMLA018", "FMLA019", "FMLA020", "CG001", "CG002", "FI001", "FI002", "FI003", "DG001")


# the library each family's signatures name: the kernel library the rule models (CG002's combine.cu is FlashMLA's)
FAMILY_LIBRARY = {"FM": "flashmla", "CG": "flashmla", "FI": "flashinfer", "DG": "deepgemm"}


def test_new_rules_have_pages_sources_and_signatures():
    known_builds = set(build_names()) | set(load("deepgemm")["versions"]) | set(load("flashinfer")["versions"])
    by_code = {r.code: r for r in all_rules()}
    for code in NEW:
        r = by_code[code]
        for section in ("## What it checks", "## Why it crashes", "## Example", "## Fix", "## Source"):
            assert section in r.doc, (code, section)
        assert r.source and r.failure
        assert re.search(r"\.(cu|cuh|hpp|h|py):\d+", r.source) or code == "CG001", code
        for sig in (s.to_definition() for s in r.signatures):
            assert sig.keys() <= {"library", "file", "function", "lines", "message", "failure", "builds", "require",
                                  "source", "note"}
            assert "failure" in sig and "message" in sig and sig["library"] == FAMILY_LIBRARY[code[:2]], sig
            re.compile(sig["message"])
            if "lines" in sig:
                ranges = sig["lines"].items() if isinstance(sig["lines"], dict) else [(None, sig["lines"])]
                for build, (lo, hi) in ranges:
                    assert 0 < lo <= hi and (build is None or build in known_builds), sig
            assert set(sig.get("builds", ())) <= known_builds, sig


def test_cli_lists_the_new_rules_and_checks_their_records(tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["rules", "--json"])
    assert out.exit_code == 0
    listed = {r["code"] for r in json.loads(out.stdout)}
    assert set(NEW) <= listed
    path = tmp_path / "calls.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"kind": "trtllm_gen_mla", "batch": 70000},
        {"kind": "mla_plan", "qo_indptr": [0, 2, 1], "kv_indptr": [0, 1, 2]},
        {"kind": "paged_mqa_logits_metadata", "batch": 60000},
        {"kind": "decode_indices", "indices": [[0, -3]], "num_kv_tokens": 64},
        {"kind": "sched_meta_reuse", "planned": sparse(2, 1, 64), "reused": sparse(3, 1, 64)},
    ]) + "\n")
    out = runner.invoke(app, ["check", str(path), "--json"])
    assert out.exit_code == 1, out.stdout
    d = json.loads(out.stdout)
    schema = json.loads((ROOT / "rules" / "schema" / "report.schema.json").read_text())
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(d, schema)
    assert {f["code"] for f in d["findings"]} == {"FI001", "FI002", "DG001", "FMLA019", "FMLA018"}
    text = runner.invoke(app, ["check", str(path)])
    assert text.exit_code == 1 and "FI001" in text.stdout
