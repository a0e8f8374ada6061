"""The torch backend's input building and API handling, on the CPU with a fake provider module.

Marker ``torch``: needs torch (CPU is enough); skipped without it. The fake providers check the
tensors they receive against the facts (q bf16 ``[b, s_q, h_q, d_qk]``; fp8 KV cache
``[blocks, page, 1, bytes_per_token]`` with 656 B/token for d_qk 576 and 584 for 512; int32
``indices [b, s_q, topk]``; int32 per-request lengths ``[b]``) and return a recognisable schedule.
"""
from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

CURRENT_API = '''
import torch


class FlashMLASchedMeta:
    tile_scheduler_metadata = None
    num_splits = None


def get_mla_metadata(*args, **kwargs):
    return FlashMLASchedMeta(), None


SEEN = {}


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    SEEN.update(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=cache_seqlens, indices=indices,
                topk_length=topk_length, extra_k_cache=extra_k_cache, extra_indices=extra_indices_in_kvcache,
                extra_topk_length=extra_topk_length, is_fp8_kvcache=is_fp8_kvcache, head_dim_v=head_dim_v)
    b = q.shape[0]
    md = torch.arange(3 * 8, dtype=torch.int32).view(3, 8)
    tile_scheduler_metadata.tile_scheduler_metadata = md
    tile_scheduler_metadata.num_splits = torch.arange(b + 1, dtype=torch.int32)
    return torch.zeros(1), torch.zeros(1)
'''

OCT2025_API = '''
import torch

SEEN = {}


def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
                     is_fp8_kvcache=False, topk=None):
    SEEN.update(meta_args=(cache_seqlens.clone(), num_q_tokens_per_head_k, num_heads_k, num_heads_q,
                           is_fp8_kvcache, topk))
    b = cache_seqlens.shape[0]
    return torch.full((2, 8), 7, dtype=torch.int32), torch.arange(b + 1, dtype=torch.int32)


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None):
    SEEN.update(q=q, k_cache=k_cache, indices=indices, block_table=block_table)
    return torch.zeros(1), torch.zeros(1)
'''


@pytest.fixture()
def fake_provider(tmp_path, monkeypatch):
    def make(name: str, source: str):
        (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop(name, None)
        import importlib

        return importlib.import_module(name)

    yield make


def _noop(*_):
    return None


def _job(record, module, api):
    return {"op": "decode", "device": "cpu", "record": record, "provider": {"name": module, "module": module, "api": api}}


def test_sparse_model1_inputs_and_readback(fake_provider):
    from validate_batch.kernel_mode import torch_backend as tb

    mod = fake_provider("fake_fmla_current", CURRENT_API)
    rec = {"kind": "sparse", "b": 3, "s_q": 2, "h_q": 64, "d_qk": 512, "topk": 128, "page": 64,
           "topk_length": [0, 5, 128], "extra_topk": 64, "extra_topk_length": [1, 2, 3], "extra_page": 32}
    out = tb.run(_job(rec, "fake_fmla_current", "sched_meta"), _noop, _noop)
    s = mod.SEEN
    assert s["q"].dtype == torch.bfloat16 and tuple(s["q"].shape) == (3, 2, 64, 512)
    assert s["k_cache"].dtype == torch.float8_e4m3fn and tuple(s["k_cache"].shape)[1:] == (64, 1, 584)
    assert s["k_cache"].stride(1) == 584
    assert s["indices"].dtype == torch.int32 and tuple(s["indices"].shape) == (3, 2, 128)
    n_tokens = s["k_cache"].shape[0] * 64
    assert int(s["indices"].min()) >= 0 and int(s["indices"].max()) < n_tokens
    assert s["topk_length"].dtype == torch.int32 and s["topk_length"].tolist() == [0, 5, 128]
    assert tuple(s["extra_k_cache"].shape)[1:] == (32, 1, 584)
    assert tuple(s["extra_indices"].shape) == (3, 2, 64) and s["extra_topk_length"].tolist() == [1, 2, 3]
    assert s["is_fp8_kvcache"] is True and s["block_table"] is None and s["head_dim_v"] == 512
    assert out["num_sm_parts"] == 3 and out["tile_scheduler_metadata"][2] == list(range(16, 24))
    assert out["num_splits"] == [0, 1, 2, 3] and out["api"] == "sched_meta" and out["message"] == "OK 3 3"


def test_sparse_v32_layout_is_656_bytes(fake_provider):
    from validate_batch.kernel_mode import torch_backend as tb

    mod = fake_provider("fake_fmla_current2", CURRENT_API)
    rec = {"kind": "sparse", "b": 2, "s_q": 1, "h_q": 128, "d_qk": 576, "topk": 64, "page": 256}
    tb.run(_job(rec, "fake_fmla_current2", "sched_meta"), _noop, _noop)
    assert tuple(mod.SEEN["k_cache"].shape)[1:] == (256, 1, 656)
    assert mod.SEEN["topk_length"] is None and mod.SEEN["extra_k_cache"] is None


def test_dense_block_table_covers_longest_sequence(fake_provider):
    from validate_batch.kernel_mode import torch_backend as tb

    mod = fake_provider("fake_fmla_current3", CURRENT_API)
    rec = {"kind": "dense", "b": 3, "s_q": 2, "h_q": 16, "seqlens": [10, 0, 129]}
    tb.run(_job(rec, "fake_fmla_current3", "sched_meta"), _noop, _noop)
    s = mod.SEEN
    assert tuple(s["q"].shape) == (3, 2, 16, 576) and s["k_cache"].dtype == torch.bfloat16
    assert s["k_cache"].shape[1] == 64
    assert tuple(s["block_table"].shape) == (3, 3)        # ceil(129 / 64) = 3 blocks per request
    assert int(s["block_table"].max()) < s["k_cache"].shape[0]
    assert s["cache_seqlens"].dtype == torch.int32 and s["cache_seqlens"].tolist() == [10, 0, 129]
    assert s["indices"] is None


def test_oct2025_api_metadata_before_the_call(fake_provider):
    from validate_batch.kernel_mode import torch_backend as tb

    mod = fake_provider("fake_fmla_oct", OCT2025_API)
    partials = []
    rec = {"kind": "sparse", "b": 4, "s_q": 2, "h_q": 128, "d_qk": 576, "topk": 512}
    out = tb.run(_job(rec, "fake_fmla_oct", "tensors"), _noop, partials.append)
    seqlens, per_k, h_k, h_q, fp8, topk = mod.SEEN["meta_args"]
    assert seqlens.tolist() == [512] * 4 and (per_k, h_k, h_q, fp8, topk) == (2 * 128, 1, 128, True, 512)
    assert partials and partials[0]["num_sm_parts"] == 2       # metadata reported before the risky call
    assert out["tile_scheduler_metadata"] == [[7] * 8] * 2 and out["api"] == "tensors"
    assert tuple(mod.SEEN["block_table"].shape) == (4, 1)


def test_feature_missing_is_unsupported(fake_provider):
    from validate_batch.kernel_mode import torch_backend as tb
    from validate_batch.kernel_mode.protocol import Unsupported

    fake_provider("fake_fmla_oct2", OCT2025_API)
    rec = {"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "d_qk": 576, "topk": 64, "topk_length": [1, 2]}
    with pytest.raises(Unsupported, match="topk_length"):
        tb.run(_job(rec, "fake_fmla_oct2", "tensors"), _noop, _noop)


def test_live_detection_when_the_package_reexports_only_functions(tmp_path, monkeypatch):
    """Upstream's package __init__ exports the functions; FlashMLASchedMeta stays in the interface module."""
    from validate_batch.kernel_mode.torch_backend import inspect_provider

    pkg = tmp_path / "fake_fmla_pkg"
    pkg.mkdir()
    (pkg / "interface.py").write_text(CURRENT_API, encoding="utf-8")
    (pkg / "__init__.py").write_text("from fake_fmla_pkg.interface import get_mla_metadata, flash_mla_with_kvcache\n",
                                     encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    info = inspect_provider("flash_mla", "fake_fmla_pkg")
    assert info["api"] == "sched_meta", info


def test_live_signature_detection(fake_provider):
    from validate_batch.kernel_mode.torch_backend import inspect_provider

    fake_provider("fake_fmla_current4", CURRENT_API)
    fake_provider("fake_fmla_oct3", OCT2025_API)
    assert inspect_provider("flash_mla", "fake_fmla_current4")["api"] == "sched_meta"
    assert inspect_provider("sgl_kernel", "fake_fmla_oct3")["api"] == "tensors"
    missing = inspect_provider("flash_mla", "no_such_module_here")
    assert missing["api"] is None and missing["reason"].startswith("import failed")


def test_cpu_slot_write_gives_torch_index_error():
    """Real torch on the CPU: the message the project's slot rules quote."""
    from validate_batch.kernel_mode.slot_probe import probe_slot_index

    res = probe_slot_index(33, 2, 96, "cpu", timeout=120)
    assert res["available"] and res["outcome"] == "python_exception" and res["error_type"] == "IndexError"
    assert res["message"] == "index 96 is out of bounds for dimension 0 with size 33"
    assert probe_slot_index(33, 2, 32, "cpu", timeout=120)["outcome"] == "ok"


@pytest.mark.parametrize("op,record,what", [
    ("op_decode", {"kind": "prefill", "s_q": 4, "h_q": 64}, "decode job needs a sparse or dense call record"),
    ("op_prefill", {"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}, "prefill job needs a prefill call record"),
])
def test_a_job_of_the_wrong_call_kind_is_unavailable(fake_provider, op, record, what):
    from validate_batch.kernel_mode import torch_backend as tb

    fake_provider("fake_fmla_kind", CURRENT_API)
    job = {"device": "cpu", "record": record, "provider": {"name": "fake_fmla_kind", "module": "fake_fmla_kind", "api": "sched_meta"}}
    with pytest.raises(tb.Unavailable) as ei:
        getattr(tb, op)(job, _noop, _noop)
    assert str(ei.value) == f"a {what}"


# ----------------------------------------------------------------------------- use_legacy (sgl-flash-mla)

# The PyPI fork's shape: every entry point names use_legacy (default False upstream-style); on SM90 only
# use_legacy=True runs, use_legacy=False raises.
LEGACY_API = '''
import torch


class FlashMLASchedMeta:
    tile_scheduler_metadata = None
    num_splits = None


def get_mla_metadata(*args, **kwargs):
    SEEN["meta_kwargs"] = dict(kwargs)
    return FlashMLASchedMeta(), None


SEEN = {}


def _arch_check(use_legacy):
    if not use_legacy:
        raise RuntimeError("sparse_decode_fwd is only supported on SM100f architectures")


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=None, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, enable_batch_invariant=False, use_legacy=False, kv_format=None):
    SEEN["use_legacy"] = use_legacy
    _arch_check(use_legacy)
    tile_scheduler_metadata.tile_scheduler_metadata = torch.zeros(2, 8, dtype=torch.int32)
    tile_scheduler_metadata.num_splits = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return torch.zeros(1), torch.zeros(1)


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, use_legacy=False,
                         return_log2_lse=None):
    SEEN["prefill_use_legacy"] = use_legacy
    _arch_check(use_legacy)
    return q, None, None
'''

SPARSE_REC = {"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 64}


def test_legacy_provider_gets_use_legacy_true_by_default(fake_provider):
    from validate_batch.kernel_mode import torch_backend as tb

    mod = fake_provider("fake_sglfm", LEGACY_API)
    partials = []
    out = tb.run(_job(dict(SPARSE_REC), "fake_sglfm", "sched_meta"), _noop, partials.append)
    assert mod.SEEN["use_legacy"] is True and out["use_legacy"] is True
    assert {"use_legacy": True} in partials
    assert mod.SEEN["meta_kwargs"] == {}      # get_mla_metadata(*args, **kwargs) does not name it


def test_record_use_legacy_false_is_passed_as_is(fake_provider):
    from validate_batch.kernel_mode import torch_backend as tb

    mod = fake_provider("fake_sglfm2", LEGACY_API)
    job = _job(dict(SPARSE_REC, use_legacy=False), "fake_sglfm2", "sched_meta")
    partials = []
    with pytest.raises(RuntimeError, match="SM100f"):
        tb.run(job, _noop, partials.append)
    assert mod.SEEN["use_legacy"] is False and {"use_legacy": False} in partials


def test_prefill_entry_point_gets_use_legacy(fake_provider):
    from validate_batch.kernel_mode import torch_backend as tb

    mod = fake_provider("fake_sglfm3", LEGACY_API)
    job = {"op": "prefill", "device": "cpu", "provider": {"name": "fake_sglfm3", "module": "fake_sglfm3",
                                                         "api": "sched_meta"},
           "record": {"kind": "prefill", "s_q": 4, "h_q": 64, "d_qk": 512, "topk": 64, "s_kv": 128}}
    out = tb.run(job, _noop, _noop)
    assert mod.SEEN["prefill_use_legacy"] is True and out["use_legacy"] is True


def test_explicit_use_legacy_on_a_build_without_it_is_unsupported(fake_provider):
    from validate_batch.kernel_mode import torch_backend as tb
    from validate_batch.kernel_mode.protocol import Unsupported

    fake_provider("fake_fmla_noleg", CURRENT_API)
    with pytest.raises(Unsupported, match="use_legacy"):
        tb.run(_job(dict(SPARSE_REC, use_legacy=True), "fake_fmla_noleg", "sched_meta"), _noop, _noop)
    out = tb.run(_job(dict(SPARSE_REC), "fake_fmla_noleg", "sched_meta"), _noop, _noop)
    assert "use_legacy" not in out
