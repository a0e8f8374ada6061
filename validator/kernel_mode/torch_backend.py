"""The real backend of the child process: builds minimal valid inputs with torch and calls FlashMLA.

Imported only inside the worker child. Jobs (``op``):

* ``detect`` - torch version, the CUDA device's facts, and each provider's API read from the live
  functions' signatures;
* ``decode`` - one ``flash_mla_with_kvcache`` call described by an oracle-format record; returns
  ``tile_scheduler_metadata`` and ``num_splits`` as the kernel wrote them;
* ``prefill`` - one ``flash_mla_sparse_fwd`` call;
* ``slot`` - index-write into a slot-indexed buffer (see :mod:`validate_batch.kernel_mode.slot_probe`).

``use_legacy``: a provider whose entry points take a ``use_legacy`` parameter (sgl-flash-mla; told
by signature, not by version) gets it on every call: the job's ``use_legacy`` (from the call record),
else True, the default of SGLang's wrapper and the only value that runs on SM90. A provider without
the parameter runs its only kernels; a record that asks for one explicitly is then ``unsupported``.
The value used is reported (``use_legacy`` in the partial and final results).

Inputs are zeros (no NaN, nothing random); index tensors point inside a small KV cache, so any
failure comes from the shapes and lengths under test, not from the data.
"""
from __future__ import annotations

import importlib
import inspect
import sys
import time

from ..flashmla.calls import DecodeCall, SparsePrefillCall, call_from_record
from ..facts.knowledge import generation
from .builds import LEGACY_PARAM, distribution_of
from .child_torch import device_facts
from .child_torch import require_cuda as _require_cuda
from .child_torch import torch_module as _torch
from .libraries_backend import OPS as LIBRARY_OPS
from .protocol import Unavailable, Unsupported
from .providers import PROVIDER_MODULES, Param, classify_api
from .vllm_bundle import EXTENSION_OPS, add_to_path
from .vllm_bundle import PROVIDER as VLLM_PROVIDER

# fp8 KV cache bytes per token by d_qk (rules/flashmla.json kv_layouts; the first one listed is
# used for a d_qk that has no layout)
SPARSE_BYTES_PER_TOKEN = {d: rec["bytes_per_token"] for d, rec in generation()["kv_layouts"].items()}
KV_CACHE_BLOCKS = 2
PREFILL_DEFAULT_S_KV = 8192


def _params(fn):
    if fn is None:
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return [Param(p.name, p.kind.name, p.default is not inspect.Parameter.empty or
                  p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)) for p in sig.parameters.values()]


def inspect_provider(name: str, module_name: str) -> dict:
    """Import a provider module and classify its API from the live functions."""
    if name == VLLM_PROVIDER:
        add_to_path(sys.path)
    try:
        mod = importlib.import_module(module_name)
    except Exception as e:  # any import failure means "not usable"
        return {"name": name, "module": module_name, "api": None, "features": [],
                "reason": f"import failed: {type(e).__name__}: {e}"}
    meta_fn = getattr(mod, "get_mla_metadata", None)
    # The package may re-export only the functions; the class then lives beside get_mla_metadata.
    has_class = hasattr(mod, "FlashMLASchedMeta") or "FlashMLASchedMeta" in getattr(meta_fn, "__globals__", {})
    shape = classify_api(_params(meta_fn), has_class, _params(getattr(mod, "flash_mla_with_kvcache", None)))
    dist = distribution_of(name)
    top = importlib.import_module(module_name.split(".")[0])
    has_legacy = getattr(top, "has_legacy", None) or getattr(mod, "has_legacy", None)
    out = {"name": name, "module": module_name, "api": shape.api, "features": sorted(shape.features),
           "reason": shape.reason, "origin": getattr(mod, "__file__", "") or "",
           "has_sparse_prefill": hasattr(mod, "flash_mla_sparse_fwd"),
           "distribution": dist.name if dist else "",
           "version": (dist.version if dist else "") or str(getattr(top, "__version__", "") or "")}
    if callable(has_legacy):
        try:
            out["has_legacy"] = bool(has_legacy())
        except Exception as e:  # reported, not fatal
            out["has_legacy_error"] = f"{type(e).__name__}: {e}"
    return out


def op_detect(job, stage, partial) -> dict:
    stage("import-torch")
    torch = _torch()
    out = {"torch": torch.__version__, "torch_cuda": getattr(torch.version, "cuda", None)}
    out["cuda_available"] = bool(torch.cuda.is_available())
    if out["cuda_available"]:
        out["device"] = device_facts(torch)
    else:
        out["cuda_reason"] = f"torch {torch.__version__} (CUDA {out['torch_cuda']}) sees no CUDA GPU"
    stage("import-providers")
    out["providers"] = [inspect_provider(n, PROVIDER_MODULES[n]) for n in job.get("providers", list(PROVIDER_MODULES))]
    return out


def _device(torch, job):
    """``cuda:0`` unless the job asks for the CPU (used to test the input building without a GPU)."""
    if job.get("device") == "cpu":
        return torch.device("cpu")
    _require_cuda(torch)
    return torch.device("cuda", 0)


def _sync(torch, dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _load_provider(job):
    p = job.get("provider") or {}
    module = p.get("module")
    if not module:
        raise Unavailable("the job names no provider module")
    info = inspect_provider(p.get("name", module), module)
    if info["api"] is None:
        raise Unavailable(f"{module}: {info['reason']}")
    return importlib.import_module(module), info


def job_use_legacy(job) -> bool | None:
    """The ``use_legacy`` a job asks for: the job's own key, else the call record's; None = not said."""
    if job.get("use_legacy") is not None:
        return bool(job["use_legacy"])
    rec = job.get("record") or {}
    return bool(rec["use_legacy"]) if rec.get("use_legacy") is not None else None


def job_legacy(fn, job, partial) -> tuple[dict, dict]:
    """``(keyword arguments, what was used)`` for the job's ``use_legacy`` on entry ``fn``; what was
    used is reported as a partial result first (so a crash still says which half ran)."""
    legacy = legacy_kwargs(fn, job_use_legacy(job))
    used = {LEGACY_PARAM: legacy[LEGACY_PARAM]} if legacy else {}
    if used:
        partial(used)
    return legacy, used


def pad_block_table(torch, call, bt, job) -> None:
    """Overwrite the block-table rows of the job's ``pad_rows`` (default: the length-0 requests) with its
    ``pad_block`` (what CUDA-graph padding writes: -1); nothing when the job names none."""
    if job.get("pad_block") is None:
        return
    rows, lens = job.get("pad_rows"), call.seqlens.tolist()
    pad = torch.tensor([(i in rows) if rows is not None else lens[i] == 0 for i in range(len(lens))], device=bt.device)
    bt[pad] = int(job["pad_block"])


def legacy_kwargs(fn, wanted: bool | None) -> dict:
    """``{"use_legacy": value}`` for an entry point that names the parameter (value: ``wanted``, else
    True); ``{}`` for one that does not, unless the job asks for a value explicitly (unsupported)."""
    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = set()
    if LEGACY_PARAM in names:
        return {LEGACY_PARAM: True if wanted is None else bool(wanted)}
    if wanted is not None:
        raise Unsupported(f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__name__', '?')} takes no "
                          f"{LEGACY_PARAM}: this build has one set of kernels (the call asks for "
                          f"{LEGACY_PARAM}={bool(wanted)})")
    return {}


def _kwargs_for(fn, wanted: dict) -> dict:
    """The subset of ``wanted`` keyword arguments that ``fn`` accepts (None values are dropped)."""
    names = set(inspect.signature(fn).parameters)
    missing = [k for k, v in wanted.items() if v is not None and k not in names]
    if missing:
        raise Unsupported(f"{fn.__module__}.{fn.__name__} takes no {', '.join(missing)}")
    return {k: v for k, v in wanted.items() if v is not None}


def _named_legacy(fn, legacy: dict) -> dict:
    """``legacy`` for an entry point that names ``use_legacy`` (not one that only takes ``**kwargs``)."""
    if not legacy:
        return {}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    p = params.get(LEGACY_PARAM)
    return legacy if p is not None and p.kind is not p.VAR_KEYWORD else {}


def _indices(torch, rows: int, s_q: int, width: int, num_tokens: int, dev):
    """int32 ``[rows, s_q, width]``: entry k is ``k % num_tokens`` (always a valid token)."""
    row = (torch.arange(width, dtype=torch.int32, device=dev) % num_tokens)
    return row.view(1, 1, width).expand(rows, s_q, width).contiguous()


def build_sparse_inputs(torch, call, dev) -> dict:
    """Minimal valid tensors for a sparse decode call (fp8 KV cache in the layout of ``d_qk``)."""
    bpt = call.bytes_per_token or SPARSE_BYTES_PER_TOKEN.get(call.d_qk, next(iter(SPARSE_BYTES_PER_TOKEN.values())))
    q = torch.zeros(call.b, call.s_q, call.h_q, call.d_qk, dtype=torch.bfloat16, device=dev)
    kv = torch.zeros(KV_CACHE_BLOCKS, call.page, call.h_k, bpt, dtype=torch.uint8, device=dev)
    kv = kv.view(torch.float8_e4m3fn)
    ins = {"q": q, "k_cache": kv,
           "indices": _indices(torch, call.b, call.s_q, call.topk, KV_CACHE_BLOCKS * call.page, dev)}
    if call.topk_length is not None:
        ins["topk_length"] = torch.tensor(call.topk_length.tolist(), dtype=torch.int32, device=dev)
    if call.extra_topk is not None:
        epage = call.extra_page or call.page
        ekv = torch.zeros(KV_CACHE_BLOCKS, epage, call.h_k, bpt, dtype=torch.uint8, device=dev)
        ins["extra_k_cache"] = ekv.view(torch.float8_e4m3fn)
        ins["extra_indices_in_kvcache"] = _indices(torch, call.b, call.s_q, call.extra_topk,
                                                   KV_CACHE_BLOCKS * epage, dev)
        if call.extra_topk_length is not None:
            ins["extra_topk_length"] = torch.tensor(call.extra_topk_length.tolist(), dtype=torch.int32, device=dev)
    return ins


def build_dense_inputs(torch, call, dev) -> dict:
    """bf16 q and paged KV cache: the call's ``block_table`` and ``num_blocks`` when it has them, else
    ``ceil(max_len / page)`` blocks per request (pages 0, 1, ... modulo a pool of at most 64)."""
    page = call.page
    lens = call.seqlens.tolist()
    blocks_per_seq = max(1, -(-max(lens, default=1) // page))
    num_blocks = min(blocks_per_seq, 64)
    if call.block_table is not None:        # the call's own pages (and pool), as the engine passes them
        bt = torch.tensor(call.block_table.tolist(), dtype=torch.int32, device=dev)
        num_blocks = call.num_blocks or max(1, int(call.block_table.max()) + 1)
    else:
        bt = (torch.arange(blocks_per_seq, dtype=torch.int32, device=dev) % num_blocks)
        bt = bt.view(1, -1).expand(call.b, blocks_per_seq).contiguous()
    q = torch.zeros(call.b, call.s_q, call.h_q, call.d_qk, dtype=torch.bfloat16, device=dev)
    kc = torch.zeros(num_blocks, page, call.h_k, call.d_qk, dtype=torch.bfloat16, device=dev)
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    return {"q": q, "k_cache": kc, "block_table": bt, "cache_seqlens": sl}


def _readback(torch, md, ns) -> dict:
    md_list = md.cpu().tolist()
    return {"num_sm_parts": len(md_list), "tile_scheduler_metadata": md_list, "num_splits": ns.cpu().tolist()}


def _kernel_job(job, stage, kind: type, what: str):
    """The common start of a kernel job: torch, the device, the FlashMLA provider, and the job's call
    (which must be a ``kind``)."""
    stage("import")
    torch = _torch()
    dev = _device(torch, job)
    mod, info = _load_provider(job)
    record = {k: v for k, v in job["record"].items() if k != LEGACY_PARAM}   # a kernel-mode key
    call = call_from_record(record)
    if not isinstance(call, kind):
        raise Unavailable(f"a {what}")
    return torch, dev, mod, info, call


def op_decode(job, stage, partial) -> dict:
    torch, dev, mod, info, call = _kernel_job(job, stage, DecodeCall, "decode job needs a sparse or dense call record")
    api = info["api"]
    if call.kind == "dense_fp8" and info["name"] == VLLM_PROVIDER:
        return _dense_fp8_extension(torch, dev, call, stage, partial)
    if call.kind == "dense_fp8" and call.entry == "fwd_kvcache_mla_fp8":
        return _dense_fp8_call(torch, dev, mod, info, call, job, stage, partial)
    if call.entry == "get_mla_decoding_metadata":
        return _hoisted(torch, dev, mod, info, call, job, stage, partial)
    if call.entry != "flash_mla_with_kvcache":
        raise Unsupported(f"kernel mode runs the metadata of {call.entry} calls, not the kernel itself")
    if call.is_sparse and "indices" not in info["features"]:
        raise Unsupported(f"{info['module']} has no sparse decode (no indices parameter)")
    stage("inputs")
    ins = build_sparse_inputs(torch, call, dev) if call.is_sparse else build_dense_inputs(torch, call, dev)
    _sync(torch, dev)
    fwd = mod.flash_mla_with_kvcache
    extra = {"causal": call.causal, "is_fp8_kvcache": call.is_fp8 if call.is_sparse else None}
    for key in ("indices", "topk_length", "extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length"):
        extra[key] = ins.get(key)
    if call.is_sparse and "is_fp8_kvcache" not in info["features"]:
        extra["is_fp8_kvcache"] = None
    legacy, used = job_legacy(fwd, job, partial)
    started = time.perf_counter()
    if api == "sched_meta":
        sched = mod.get_mla_metadata(**_named_legacy(mod.get_mla_metadata, legacy))
        sched = sched[0] if isinstance(sched, tuple) else sched
        stage("call")
        fwd(ins["q"], ins["k_cache"], ins.get("block_table"), ins.get("cache_seqlens"), call.d_v, sched, None,
            **_kwargs_for(fwd, extra), **legacy)
        stage("sync")
        _sync(torch, dev)
        stage("readback")
        out = _readback(torch, sched.tile_scheduler_metadata, sched.num_splits)
    else:
        if call.is_sparse:
            seqlens = torch.full((call.b,), call.topk, dtype=torch.int32, device=dev)
            block_table = torch.zeros(call.b, 1, dtype=torch.int32, device=dev)
            stage("metadata")
            md, ns = mod.get_mla_metadata(seqlens, call.s_q * call.h_q // call.h_k, call.h_k, call.h_q, True,
                                          call.topk, **_named_legacy(mod.get_mla_metadata, legacy))
        else:
            seqlens, block_table = ins["cache_seqlens"], ins["block_table"]
            stage("metadata")
            md, ns = mod.get_mla_metadata(seqlens, call.s_q * call.h_q // call.h_k, call.h_k,
                                          **_named_legacy(mod.get_mla_metadata, legacy))
        _sync(torch, dev)
        out = _readback(torch, md, ns)
        partial(out)
        stage("call")
        fwd(ins["q"], ins["k_cache"], block_table, seqlens, call.d_v, md, ns, **_kwargs_for(fwd, extra), **legacy)
        stage("sync")
        _sync(torch, dev)
    out["call_s"] = round(time.perf_counter() - started, 6)
    out.update(used)
    out["api"] = api
    out["provider"] = info["module"]
    out["message"] = f"OK {out['num_sm_parts']} {out['num_splits'][-1] if out['num_splits'] else 0}"
    return out


def _hoisted(torch, dev, mod, info, call, job, stage, partial) -> dict:
    """The hoisted metadata op alone: ``get_mla_decoding_metadata(cache_seqlens, s_q*h_q/h_k, h_k,
    h_q, is_fp8_kvcache, topk)`` (a sparse call's cache_seqlens are its constant topk; the dense fp8
    path passes is_fp8_kvcache=True and no topk)."""
    fn = getattr(mod, "get_mla_decoding_metadata", None)
    if fn is None:
        raise Unsupported(f"{info['module']} has no get_mla_decoding_metadata")
    stage("inputs")
    lens = [call.topk] * call.b if call.is_sparse else call.seqlens.tolist()
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    legacy, used = job_legacy(fn, job, partial)
    stage("metadata")
    started = time.perf_counter()
    md, ns = fn(seqlens, call.s_q * call.h_q // call.h_k, call.h_k, call.h_q, call.kind != "dense",
                call.topk if call.is_sparse else None, **legacy)
    _sync(torch, dev)
    out = _readback(torch, md, ns)
    out.update(used, call_s=round(time.perf_counter() - started, 6), api="get_mla_decoding_metadata",
               provider=info["module"])
    out["message"] = f"OK {out['num_sm_parts']} {out['num_splits'][-1] if out['num_splits'] else 0}"
    return out


def dense_fp8_ones(torch, call, dev, ins):
    """An fp8 q and KV cache (the bf16 inputs cast) and unit descales, as the engines pass them."""
    fp8 = torch.float8_e4m3fn
    one = torch.ones(1, dtype=torch.float32, device=dev)
    return ins["q"].to(fp8), ins["k_cache"].to(fp8), one


def _dense_fp8_call(torch, dev, mod, info, call, job, stage, partial) -> dict:
    """Dense fp8 attention through a FlashMLA build's own interface (sgl-flash-mla): the dense fp8
    scheduler (``get_mla_decoding_metadata(..., is_fp8_kvcache=True, topk=None)``) assigned onto a
    ``FlashMLASchedMeta``, then ``flash_mla_with_kvcache(..., is_fp8_kvcache=True)`` with no indices."""
    fn = getattr(mod, "get_mla_decoding_metadata", None)
    if fn is None or info["api"] != "sched_meta":
        raise Unsupported(f"{info['module']} has no dense fp8 entry (get_mla_decoding_metadata and a "
                          f"scheduler object from get_mla_metadata)")
    stage("inputs")
    ins = build_dense_inputs(torch, call, dev)
    bt = ins["block_table"]
    pad_block_table(torch, call, bt, job)
    _sync(torch, dev)
    legacy = legacy_kwargs(fn, True)
    stage("metadata")
    started = time.perf_counter()
    md, ns = fn(ins["cache_seqlens"], call.s_q * call.h_q // call.h_k, call.h_k, call.h_q, True, None, **legacy)
    _sync(torch, dev)
    out = _readback(torch, md, ns)
    partial(out)
    sched = mod.get_mla_metadata()
    sched = sched[0] if isinstance(sched, tuple) else sched       # an empty scheduler object
    sched.tile_scheduler_metadata, sched.num_splits = md, ns
    q, kc, one = dense_fp8_ones(torch, call, dev, ins)
    stage("call")
    mod.flash_mla_with_kvcache(q, kc, bt, ins["cache_seqlens"], call.d_v, sched, None, causal=call.causal,
                               is_fp8_kvcache=True, descale_q=one, descale_k=one, **legacy_kwargs(mod.flash_mla_with_kvcache, True))
    stage("sync")
    _sync(torch, dev)
    out.update(call_s=round(time.perf_counter() - started, 6), api="flash_mla_with_kvcache(is_fp8_kvcache=True)",
               provider=info["module"], use_legacy=True)
    out["message"] = f"OK {out['num_sm_parts']} {out['num_splits'][-1] if out['num_splits'] else 0}"
    return out


def _dense_fp8_extension(torch, dev, call, stage, partial) -> dict:
    """vLLM's dense fp8 extension: ``get_mla_decoding_metadata_dense_fp8(cache_seqlens, s_q*h_q/h_k,
    h_k)``, then (entry ``fwd_kvcache_mla_fp8``) the attention call on an fp8 q and KV cache with unit
    descales, as vLLM's FlashMLA backend makes it."""
    importlib.import_module(f"vllm.{EXTENSION_OPS}")
    ops = getattr(torch.ops, EXTENSION_OPS)
    stage("inputs")
    ins = build_dense_inputs(torch, call, dev)
    _sync(torch, dev)
    stage("metadata")
    started = time.perf_counter()
    md, ns = ops.get_mla_decoding_metadata_dense_fp8(ins["cache_seqlens"], call.s_q * call.h_q // call.h_k, call.h_k)
    _sync(torch, dev)
    out = _readback(torch, md, ns)
    if call.entry == "fwd_kvcache_mla_fp8":
        partial(out)
        fp8 = torch.float8_e4m3fn
        one = torch.ones(1, dtype=torch.float32, device=dev)
        stage("call")
        ops.fwd_kvcache_mla_fp8(ins["q"].to(fp8), ins["k_cache"].to(fp8), call.d_v, ins["cache_seqlens"],
                                ins["block_table"], call.d_qk ** -0.5, call.causal, md, ns, one, one)
        stage("sync")
        _sync(torch, dev)
    out.update(call_s=round(time.perf_counter() - started, 6), api=f"{EXTENSION_OPS}.{call.entry}",
               provider=f"vllm.{EXTENSION_OPS}")
    out["message"] = f"OK {out['num_sm_parts']} {out['num_splits'][-1] if out['num_splits'] else 0}"
    return out


def op_prefill(job, stage, partial) -> dict:
    torch, dev, mod, info, call = _kernel_job(job, stage, SparsePrefillCall, "prefill job needs a prefill call record")
    fn = getattr(mod, "flash_mla_sparse_fwd", None)
    if fn is None:
        raise Unsupported(f"{info['module']} has no flash_mla_sparse_fwd")
    s_kv = call.s_kv or PREFILL_DEFAULT_S_KV
    stage("inputs")
    q = torch.zeros(call.s_q, call.h_q, call.d_qk, dtype=torch.bfloat16, device=dev)
    kv = torch.zeros(s_kv, call.h_kv, call.d_qk, dtype=torch.bfloat16, device=dev)
    idx = (torch.arange(call.topk, dtype=torch.int32, device=dev) % s_kv)
    idx = idx.view(1, 1, -1).expand(call.s_q, call.h_kv, call.topk).contiguous()
    _sync(torch, dev)
    legacy, used = job_legacy(fn, job, partial)
    stage("call")
    started = time.perf_counter()
    fn(q, kv, idx, call.d_qk ** -0.5, call.d_v, **legacy)
    stage("sync")
    _sync(torch, dev)
    return {"message": f"OK 1 {call.s_q}", "call_s": round(time.perf_counter() - started, 6),
            "provider": info["module"], **used}


def op_slot(job, stage, partial) -> dict:
    """Write one row of a slot-indexed bf16 buffer ``[rows, width, 128]`` at ``slot`` (engine-style)."""
    stage("import")
    torch = _torch()
    device = job.get("device", "cuda")
    if device == "cuda":
        _require_cuda(torch)
    rows, width, slot = int(job["rows"]), int(job["width"]), int(job["slot"])
    stage("alloc")
    buf = torch.zeros(rows, width, 128, dtype=torch.bfloat16, device=device)
    index = torch.tensor([slot], dtype=torch.int64, device=device)
    value = torch.ones(1, width, 128, dtype=torch.bfloat16, device=device)
    stage("index-write")
    buf[index] = value
    if device == "cuda":
        stage("sync")
        torch.cuda.synchronize()
    stage("readback")
    wrote = bool(buf[slot].float().sum().item() == width * 128) if -rows <= slot < rows else None
    return {"message": f"OK wrote slot {slot} of {rows} rows", "wrote": wrote}


OPS = {"detect": op_detect, "decode": op_decode, "prefill": op_prefill, "slot": op_slot, **LIBRARY_OPS}


def run(job: dict, stage, partial) -> dict:
    op = job.get("op")
    if op not in OPS:
        raise Unavailable(f"unknown job op {op!r}; expected one of {', '.join(OPS)}")
    return OPS[op](job, stage, partial)
