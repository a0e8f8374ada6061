"""The FlashMLA kernel facts are read from rules/flashmla.json, not written in the code.

Each test changes one fact in a copy of the loaded data and checks that the rule's verdict, or the
plan, moves the way the changed fact says it must. The expected numbers are worked out here from
the changed fact; the unchanged data gives the other side of each comparison.
"""
from __future__ import annotations

import copy
import importlib

import numpy as np
import pytest

from validate_batch.facts import knowledge
from validate_batch.api import check_calls
from validate_batch.flashmla.plan import plan
from validate_batch.kernel_mode import providers, torch_backend
from validate_batch.kernel_mode.outcome import RunResult
from validate_batch.kernel_mode.runner import ChildSpec

DEFAULT = "flashmla-9241ae3"
OCT2025 = "flashmla-1408756"
H200_SMS = 132


def _clear():
    knowledge.generation.cache_clear()
    knowledge.decode_archs.cache_clear()


@pytest.fixture
def data(monkeypatch):
    """A private copy of rules/flashmla.json that generation() reads for the rest of the test."""
    real = knowledge.load
    raw = copy.deepcopy(real("flashmla"))
    monkeypatch.setattr(knowledge, "load", lambda name: raw if name == "flashmla" else real(name))
    _clear()
    yield raw
    _clear()


def gen_of(raw: dict, name: str = DEFAULT) -> dict:
    return raw["generations"][name]


def impl_row(raw: dict, name: str, gen: str = DEFAULT) -> dict:
    return next(r for r in gen_of(raw, gen)["implementations"] if r["name"] == name)


def codes(rec: dict, code: str, gpu="H200", build=None):
    _clear()                      # generation() is cached; read the data as the test left it
    return [f for f in check_calls([rec], gpu, build).findings if f.code == code]


def plan_of(rec: dict, gpu="H200"):
    _clear()
    return plan(rec, gpu)


def sparse(b: int = 4, **kw) -> dict:
    rec = {"kind": "sparse", "b": b, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
    rec.update(kw)
    return rec


def dense(b: int = 4, **kw) -> dict:
    rec = {"kind": "dense", "b": b, "s_q": 1, "h_q": 64, "seqlens": [100] * b}
    rec.update(kw)
    return rec


# ------------------------------------------------------------------------------------------------
# how generation() assembles a generation
# ------------------------------------------------------------------------------------------------
def test_every_generation_has_the_facts_the_rules_read():
    keys = {"block_size", "sched_smem", "combine", "oaccum", "implementations", "param_int_bits", "topk_block",
            "extra_length_round", "sparse_shapes", "sparse_requires", "kv_layouts", "kv_checks", "dense"}
    for name in knowledge.load("flashmla")["generations"]:
        gen = knowledge.generation(name)
        assert keys <= set(gen), name
        assert all(isinstance(d, int) for d in gen["kv_layouts"])
        assert not any(k.startswith("_") for k in gen)


def test_a_generation_key_replaces_the_shared_one(data):
    """topk_block 128 for the Oct 2025 build only: topk 192 is then misaligned there and nowhere else."""
    gen_of(data, OCT2025)["topk_block"] = 128
    assert codes(sparse(topk=192), "FMLA004") == []
    [f] = codes(sparse(topk=192), "FMLA004", build=OCT2025)
    assert f.numbers["multiple"] == 128 and "pad indices to topk=256" in f.fix


# ------------------------------------------------------------------------------------------------
# FMLA001 / FMLA002 / FMLA009 / FMLA010: byte counts and integer widths
# ------------------------------------------------------------------------------------------------
def test_fmla001_formula_text_and_limit_follow_sched_smem(data):
    """4*(4b+1) bytes: the H200's 232448 B then hold (232448 - 4) // 16 = 14527 rows."""
    gen_of(data)["sched_smem"]["bytes"] = "4*(4b+1)"
    assert codes(sparse(b=14527), "FMLA001") == []
    [f] = codes(sparse(b=14528), "FMLA001")
    assert f.numbers["max_b"] == 14527 and f.numbers["smem_bytes"] == 4 + 16 * 14528
    assert "4*(4b+1)" in f.message


def test_fmla002_offset_width_comes_from_oaccum_offset_bits(data):
    """A 24-bit offset holds 2^23 - 1: at s_q=1, h_q=64 the row stride is 64*512, so rows up to 255."""
    lengths = [64 * (1 + (7 * i) % 40) for i in range(1000)]
    rec = sparse(b=1000, topk=64 * 40, topk_length=lengths, d_qk=512, extra_topk=64)
    row = plan_of(rec, "H200").reference_schedule().max_split_row
    assert row > 255                                  # the schedule splits a request past row 255
    assert codes(rec, "FMLA002") == []                # 32 bits: row * 32768 < 2^31 for row < 65536
    gen_of(data)["oaccum"]["offset_bits"] = 24
    [f] = codes(rec, "FMLA002")
    assert f.numbers["max_row"] == (2**23 - 1) // (64 * 512) == 255 and f.numbers["row"] == row
    assert "< 2^23" in f.message


def test_fmla009_stride_width_comes_from_param_int_bits(data):
    """16-bit strides hold 32767: q's batch stride 1*64*512 = 32768 no longer fits."""
    assert codes(sparse(), "FMLA009") == []
    data["shared"]["param_int_bits"] = 16
    found = {f.numbers["stride"]: f.numbers for f in codes(sparse(), "FMLA009")}
    assert found["q.stride(0) = s_q*h_q*d_qk"] == {"stride": "q.stride(0) = s_q*h_q*d_qk", "value": 32768, "max": 32767}
    assert found["o_accum.stride(0) = s_q*h_q*512"]["value"] == 32768


def test_fmla009_kv_stride_uses_the_layout_bytes_per_token(data):
    """kv.stride(0) = page * bytes_per_token of the d_qk's layout: 2^20 * 584 fits in int32,
    2^20 * 4096 = 2^32 does not."""
    rec = sparse(page=1 << 20)
    assert codes(rec, "FMLA009") == []
    data["shared"]["kv_layouts"]["512"]["bytes_per_token"] = 4096
    [f] = codes(rec, "FMLA009")
    assert f.numbers["stride"] == "kv.stride(0) = page*bytes_per_token" and f.numbers["value"] == 1 << 32


def test_workspace_bytes_use_accum_bytes(data):
    """(b + P) * s_q * h_q * accum_bytes * (1 + d_v): P = 132 for s_q=1, h_q=64 on the H200."""
    b = 10
    assert plan_of(sparse(b=b), "H200").workspace_bytes == (b + H200_SMS) * 64 * 4 * 513
    gen_of(data)["oaccum"]["accum_bytes"] = 2
    assert plan_of(sparse(b=b), "H200").workspace_bytes == (b + H200_SMS) * 64 * 2 * 513


# ------------------------------------------------------------------------------------------------
# FMLA004 topk block and the implementations that align extra_topk
# ------------------------------------------------------------------------------------------------
def test_fmla004_extra_topk_alignment_follows_the_implementation_flag(data):
    rec_b200 = sparse(extra_topk=100)                 # h_q=64 on a B200: sparse-sm100-head64
    assert [f.numbers["field"] for f in codes(rec_b200, "FMLA004", "B200")] == ["extra_topk"]
    assert codes(sparse(extra_topk=100), "FMLA004") == []          # SM90 accepts it (measured)
    impl_row(data, "sparse-sm100-head64").pop("extra_topk_block")
    impl_row(data, "sparse-sm90")["extra_topk_block"] = True
    _clear()
    assert codes(rec_b200, "FMLA004", "B200") == []
    [f] = codes(sparse(extra_topk=100), "FMLA004")
    assert f.numbers == {"field": "extra_topk", "value": 100, "multiple": 64} and "sparse-sm90" in f.message


# ------------------------------------------------------------------------------------------------
# FMLA005 sparse shapes and FMLA007 KV layouts
# ------------------------------------------------------------------------------------------------
def test_fmla005_head_counts_come_from_sparse_shapes(data):
    assert [f.numbers["field"] for f in codes(sparse(h_q=96), "FMLA005")] == ["h_q"]
    data["shared"]["sparse_shapes"]["h_q"] = [64, 96, 128]
    assert codes(sparse(h_q=96), "FMLA005") == []
    [f] = codes(sparse(h_q=80), "FMLA005")
    assert f.numbers["allowed"] == [64, 96, 128] and f.fix == "pad heads to 96"
    assert f.message == "h_q expected 64 or 96 or 128, got 80"


def test_fmla005_kv_heads_value_width_and_failure_text_come_from_sparse_shapes(data):
    shapes = data["shared"]["sparse_shapes"]
    shapes["h_k"], shapes["d_v"] = [1, 2], [256]
    shapes["failures"]["d_v"] = "process_crash: changed"
    fields = {f.numbers["field"]: f for f in codes(sparse(h_k=2, d_v=512), "FMLA005")}
    assert set(fields) == {"d_v"}
    assert fields["d_v"].failure == "process_crash: changed" and fields["d_v"].numbers["allowed"] == [256]
    assert codes(sparse(d_v=256), "FMLA005") == []


def test_fmla005_d_qk_set_is_the_kv_layouts(data):
    del data["shared"]["kv_layouts"]["576"]
    [f] = codes(sparse(d_qk=576), "FMLA005")
    assert f.numbers["allowed"] == [512] and f.fix == "use the MODEL1 (512) KV layout"
    data["shared"]["kv_layouts"]["448"] = {"name": "TEST", "bytes_per_token": 512, "block_stride_multiple": 512}
    _clear()
    assert codes(sparse(d_qk=448), "FMLA005") == []


def test_fmla007_bytes_per_token_and_sm100_checks_come_from_data(data):
    assert codes(sparse(bytes_per_token=584), "FMLA007") == []
    assert codes(sparse(kv_stride=1000), "FMLA007") == []          # block stride is checked on SM100 only
    layouts, checks = data["shared"]["kv_layouts"], data["shared"]["kv_checks"]
    layouts["512"]["bytes_per_token"] = 600
    checks["block_stride_archs"] = [9, 10]
    checks["base_align"] = 32
    by_field = {f.numbers["field"]: f for f in codes(sparse(bytes_per_token=584, kv_stride=1000), "FMLA007")}
    assert by_field["bytes_per_token"].numbers["expected"] == 600
    assert by_field["kv_stride"].numbers["multiple"] == 576 and "on SM90" in by_field["kv_stride"].message
    [f] = codes(sparse(kv_base_align=16), "FMLA007", "B200")       # 16 % 32 != 0
    assert f.numbers == {"field": "kv_base_align", "expected": 32, "got": 16}
    assert codes(sparse(kv_base_align=16), "FMLA007") == []        # base alignment: SM100 only


# ------------------------------------------------------------------------------------------------
# FMLA006 V3.2 layout restrictions per arch
# ------------------------------------------------------------------------------------------------
def test_fmla006_archs_without_lengths_come_from_the_layout(data):
    v32 = sparse(d_qk=576, topk_length=[1, 2, 3, 4])
    [f] = codes(v32, "FMLA006")
    assert f.fix == "use d_qk=512 (MODEL1 layout) or drop topk_length"
    data["shared"]["kv_layouts"]["576"]["no_topk_length_archs"] = []
    assert codes(v32, "FMLA006") == []
    data["shared"]["kv_layouts"]["512"]["no_extra_cache_archs"] = [9]
    _clear()
    [f] = codes(sparse(extra_topk=64), "FMLA006")
    assert f.message == "d_qk=512 (MODEL1 layout) expected no extra KV cache on SM90, got extra_topk=64"
    assert f.fix == "drop the extra cache"        # no layout takes an extra cache on SM90 any more
    assert codes(sparse(extra_topk=64), "FMLA006", "B200") == []


# ------------------------------------------------------------------------------------------------
# FMLA011 / FMLA013 supported archs, FMLA012 sparse requirements, dense page
# ------------------------------------------------------------------------------------------------
def test_fmla011_dense_archs_are_the_dense_implementations(data):
    """A generation whose dense implementation is for arch 10 only: dense on the H200 is refused."""
    assert codes(dense(), "FMLA011") == []
    assert len(codes(dense(), "FMLA011", "B200")) == 1
    impl_row(data, "dense-sm90")["arch"] = 10
    _clear()
    [f] = codes(dense(), "FMLA011")
    assert f.message.startswith("dense decode expected an SM100 GPU, got H200")
    assert codes(dense(), "FMLA011", "B200") == []


def test_fmla011_page_size_comes_from_data(data):
    assert len(codes(dense(page=32), "FMLA011")) == 1
    data["shared"]["dense"]["page_size"] = 32
    assert codes(dense(page=32), "FMLA011") == []
    [f] = codes(dense(page=64), "FMLA011")
    assert f.numbers == {"field": "page", "expected": 32, "got": 64}


def test_fmla013_sparse_archs_are_the_sparse_implementations(data):
    """Without an SM90 sparse row the H200 has no sparse decode implementation."""
    assert codes(sparse(), "FMLA013") == []
    gen_of(data)["implementations"] = [r for r in gen_of(data)["implementations"] if r["name"] != "sparse-sm90"]
    _clear()
    [f] = codes(sparse(), "FMLA013")
    assert f.fix == "use an SM100 GPU and a supported head count"


def test_fmla013_an_arch_with_shape_filters_only_reports_missing_shapes(data):
    """sparse-sm90 limited to h_q=64: h_q=128 on the H200 then has no implementation."""
    assert codes(sparse(h_q=128), "FMLA013") == []
    impl_row(data, "sparse-sm90")["h_q"] = 64
    _clear()
    assert codes(sparse(h_q=64), "FMLA013") == []
    [f] = codes(sparse(h_q=128), "FMLA013")
    assert f.numbers == {"cc": [9, 0], "h_q": 128, "d_qk": 512}


def test_fmla012_requirements_come_from_data(data):
    assert codes(sparse(), "FMLA012") == []
    data["shared"]["sparse_requires"]["is_fp8"] = False
    [f] = codes(sparse(), "FMLA012")
    assert f.message == "is_fp8 expected false for sparse decode, got true"
    assert codes(sparse(is_fp8=False), "FMLA012") == []


# ------------------------------------------------------------------------------------------------
# effective lengths with an extra cache
# ------------------------------------------------------------------------------------------------
def test_extra_length_rounding_comes_from_data(data):
    """topk_length [1, 100] with extra_topk 64: round up to 64 -> [128, 192]; to 128 -> 192 for both."""
    rec = sparse(b=2, topk=128, topk_length=[1, 100], extra_topk=64)
    arr, uni = plan_of(rec, "H200").lengths
    assert uni is None and arr.tolist() == [128, 192]
    data["shared"]["extra_length_round"] = 128
    assert plan_of(rec, "H200").lengths == (None, 192)
    arr, uni = plan_of(sparse(b=2, topk=256, topk_length=[1, 200], extra_topk=64), "H200").lengths
    assert uni is None and np.asarray(arr).tolist() == [192, 320]


# ------------------------------------------------------------------------------------------------
# kernel mode
# ------------------------------------------------------------------------------------------------
def _detect_on(monkeypatch, cc):
    payload = {"cuda_available": True, "torch": "2.x", "device": {"name": "GPU", "cc": list(cc)},
               "providers": [{"name": "flash_mla", "module": "flash_mla", "api": "sched_meta_object"}]}
    monkeypatch.setattr(providers, "run_job", lambda job, timeout, child: RunResult("ok", payload=payload))
    return providers.detect("auto", ChildSpec(backend="unused"), 1)


def test_kernel_detection_archs_are_the_implementations(data, monkeypatch):
    det = _detect_on(monkeypatch, (8, 0))
    assert not det.available and "need an SM90 or SM100 GPU" in det.reason
    assert _detect_on(monkeypatch, (9, 0)).available
    impl_row(data, "dense-sm90")["arch"] = 8
    _clear()
    assert _detect_on(monkeypatch, (8, 0)).available
    data["generations"] = {DEFAULT: gen_of(data)}
    gen_of(data)["implementations"] = [r for r in gen_of(data)["implementations"] if r["arch"] != 9]
    _clear()
    det = _detect_on(monkeypatch, (9, 0))
    assert not det.available and "need an SM80 or SM100 GPU" in det.reason


def test_kernel_inputs_use_the_layout_bytes_per_token(data, monkeypatch):
    torch = pytest.importorskip("torch")
    from validate_batch.flashmla.calls import call_from_record
    call = call_from_record(sparse(b=1))
    assert torch_backend.build_sparse_inputs(torch, call, "cpu")["k_cache"].shape[-1] == 584
    data["shared"]["kv_layouts"]["512"]["bytes_per_token"] = 600
    _clear()
    try:
        importlib.reload(torch_backend)
        assert torch_backend.SPARSE_BYTES_PER_TOKEN == {512: 600, 576: 656}
        assert torch_backend.build_sparse_inputs(torch, call, "cpu")["k_cache"].shape[-1] == 600
    finally:
        monkeypatch.undo()
        _clear()
        importlib.reload(torch_backend)
    assert torch_backend.SPARSE_BYTES_PER_TOKEN == {512: 584, 576: 656}
