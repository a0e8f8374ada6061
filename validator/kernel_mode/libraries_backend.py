"""The child side of kernel mode for FlashInfer's MLA plan and DeepGEMM's paged MQA-logits metadata.

Imported only inside the worker child (through :mod:`.torch_backend`'s job table). Jobs (``op``):

* ``lib_detect`` - import the library (from the folder the parent named, else as installed), report its
  version and file, torch's version and the CUDA device's facts;
* ``fi_mla_plan`` - one ``mla_plan`` call record: a ``BatchMLAPagedAttentionWrapper`` (``backend="fa3"`` on
  SM90) planned with the record's indptrs and lengths (``entry: wrapper``), or, for ``entry: module``, the
  wrapper's JIT module's ``plan`` called directly with them after a plan of a one-request batch has loaded
  it (the path an engine's CUDA-graph replay takes); the 18 numbers of ``plan_info`` and every planned
  integer array read back from the GPU; then the attention (``run``) over a small bf16 cache, outputs
  pre-filled with a value attention cannot produce, and the requests whose rows stayed so;
* ``dg_mqa_metadata`` - ``deep_gemm.get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)`` for the
  record's batch (every request ``context_len`` tokens): the metadata's shape and ends.

Inputs are small and deterministic; a failure comes from the shapes and lengths under test.
"""
from __future__ import annotations

import importlib
import sys
import time

from ..deepgemm.calls import DEFAULT_BLOCK_KV, DEFAULT_CONTEXT_LEN
from ..deepgemm.calls import call_from_record as dg_call
from ..flashinfer.calls import call_from_record as fi_call
from ..flashinfer.mla_schedule import MERGE, PER_WORK, PLAN_INFO
from .child_torch import device_facts, require_cuda, torch_module
from .libraries import DEEPGEMM, FLASHINFER, add_to_path
from .protocol import Unavailable, Unsupported

HEAD_DIM_CKV = 512
HEAD_DIM_KPE = 64
FLOAT_WORKSPACE_BYTES = 128 << 20
MAX_POOL_PAGES = 256
#: what the outputs are filled with before the attention: far outside what softmax-weighted values in
#: [-1, 1] can give
UNWRITTEN = 1000.0


def _torch_cuda():
    torch = torch_module()
    require_cuda(torch)
    return torch


def _import(name: str):
    add_to_path(name, sys.path)
    return importlib.import_module(name)


def op_lib_detect(job, stage, partial) -> dict:
    stage("import-torch")
    torch = torch_module()
    out = {"torch": torch.__version__, "cuda_available": bool(torch.cuda.is_available())}
    if out["cuda_available"]:
        out["device"] = device_facts(torch)
    else:
        out["cuda_reason"] = f"torch {torch.__version__} sees no CUDA GPU"
    name = job.get("library")
    if name not in (FLASHINFER, DEEPGEMM):
        raise Unavailable(f"unknown library {name!r}")
    stage(f"import-{name}")
    started = time.perf_counter()
    try:
        mod = _import(name)
    except Exception as e:  # any import failure means "not usable"
        out["import_error"] = f"{type(e).__name__}: {e}"
        return out
    out.update(version=str(getattr(mod, "__version__", "") or ""), origin=getattr(mod, "__file__", "") or "",
               import_s=round(time.perf_counter() - started, 3))
    return out


# ----------------------------------------------------------------------------- FlashInfer

def _page_size(call) -> int:
    """The record's page size, else the smallest that makes every request's pages hold its tokens."""
    if call.page_size is not None:
        return call.page_size
    if call.kv_len is None:
        return 1
    pages = [int(b) - int(a) for a, b in zip(call.kv_indptr[:-1], call.kv_indptr[1:])]
    for size in (1, 16, 32, 64, 128, 256):
        if all(p * size >= max(int(n), 0) for p, n in zip(pages, call.kv_len) if p >= 0):
            return size
    return 64


def _kv_len(call, page_size: int):
    if call.kv_len is not None:
        return [int(x) for x in call.kv_len]
    return [(int(b) - int(a)) * page_size for a, b in zip(call.kv_indptr[:-1], call.kv_indptr[1:])]


def _read_arrays(torch, int_ws, plan_info: list, num_sm: int) -> dict:
    """Every planned integer array, read from the integer workspace at the offsets plan_info gives."""
    flat = int_ws.view(torch.int32) if int_ws.dtype != torch.int32 else int_ws
    offsets = dict(zip(PLAN_INFO, plan_info))
    clusters = int(plan_info[1])
    out = {}
    wi = flat[offsets["work_indptr"] // 4: offsets["work_indptr"] // 4 + clusters + 1].tolist()
    out["work_indptr"] = wi
    n = wi[-1] if wi else 0
    for k in PER_WORK:
        at = offsets[k] // 4
        out[k] = flat[at: at + n].tolist()
    for k in MERGE:
        at = offsets[k] // 4
        out[k] = flat[at: at + num_sm].tolist()
    return out


def op_fi_mla_plan(job, stage, partial) -> dict:
    stage("import")
    torch = _torch_cuda()
    fi = _import(FLASHINFER)
    BatchMLAPagedAttentionWrapper = importlib.import_module(f"{FLASHINFER}.mla").BatchMLAPagedAttentionWrapper

    call = fi_call(job["record"])
    dev = torch.device("cuda:0")
    num_sm = torch.cuda.get_device_properties(0).multi_processor_count
    page = _page_size(call)
    kv_len = _kv_len(call, page)
    stage("inputs")
    qo = torch.tensor(call.qo_indptr.tolist(), dtype=torch.int32, device=dev)
    kvp = torch.tensor(call.kv_indptr.tolist(), dtype=torch.int32, device=dev)
    kvl = torch.tensor(kv_len, dtype=torch.int32, device=dev)
    total_pages = max(int(call.kv_indptr.max()), 1)
    pool = max(min(total_pages, MAX_POOL_PAGES), 1)
    kv_indices = (torch.arange(total_pages, dtype=torch.int32, device=dev) % pool)
    ws = torch.empty(FLOAT_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
    backend = "fa3" if torch.cuda.get_device_capability(0)[0] == 9 else "auto"
    wrapper = BatchMLAPagedAttentionWrapper(ws, backend=backend)
    kw = dict(num_heads=call.h_q, head_dim_ckv=HEAD_DIM_CKV, head_dim_kpe=HEAD_DIM_KPE, page_size=page,
              causal=call.causal, sm_scale=(HEAD_DIM_CKV + HEAD_DIM_KPE) ** -0.5, q_data_type=torch.bfloat16,
              kv_data_type=torch.bfloat16)
    out = {"entry": call.entry, "backend": backend, "page_size": page, "flashinfer": str(getattr(fi, "__version__", ""))}
    if call.entry == "module":
        stage("load-module")
        one = torch.tensor([0, 1], dtype=torch.int32, device=dev)
        wrapper.plan(one, one, torch.zeros(1, dtype=torch.int32, device=dev),
                     torch.ones(1, dtype=torch.int32, device=dev), **kw)
        planned = getattr(wrapper, "_planned_backend", None) or wrapper
        module = getattr(planned, "_cached_module", None)
        if module is None:
            raise Unsupported("this FlashInfer's wrapper keeps no JIT module to call directly")
        stage("call")
        started = time.perf_counter()
        plan_info = module.plan(planned._float_workspace_buffer, planned._int_workspace_buffer,
                                planned._pin_memory_int_workspace_buffer, qo.cpu(), kvp.cpu(), kvl.cpu(),
                                call.h_q, HEAD_DIM_CKV, call.causal)
        planned._plan_info = plan_info
        if hasattr(wrapper, "_plan_info"):
            wrapper._plan_info = plan_info
        if hasattr(planned, "_stage_metadata"):
            planned._stage_metadata(qo_indptr=qo, kv_indptr=kvp, kv_indices=kv_indices, kv_len_arr=kvl)
    else:
        stage("call")
        started = time.perf_counter()
        wrapper.plan(qo, kvp, kv_indices, kvl, **kw)
        planned = getattr(wrapper, "_planned_backend", None) or wrapper
        plan_info = getattr(planned, "_plan_info", None) or getattr(wrapper, "_plan_info", None)
    stage("sync")
    torch.cuda.synchronize()
    out["call_s"] = round(time.perf_counter() - started, 6)
    info = [int(x) for x in (plan_info.tolist() if hasattr(plan_info, "tolist") else list(plan_info))]
    out["plan_info"] = info
    stage("readback")
    int_ws = getattr(planned, "_int_workspace_buffer", None)
    if int_ws is not None and len(info) == len(PLAN_INFO):
        out["arrays"] = _read_arrays(torch, int_ws, info, num_sm)
    partial({"plan_info": info})
    if job.get("run_attention", True):
        stage("inputs-run")
        tokens = int(call.qo_indptr[-1]) if call.batch else 0
        g = torch.Generator(device=dev).manual_seed(0)
        q_nope = torch.rand(max(tokens, 1), call.h_q, HEAD_DIM_CKV, device=dev, generator=g).to(torch.bfloat16) * 2 - 1
        q_pe = torch.rand(max(tokens, 1), call.h_q, HEAD_DIM_KPE, device=dev, generator=g).to(torch.bfloat16) * 2 - 1
        ckv = torch.rand(pool, page, HEAD_DIM_CKV, device=dev, generator=g).to(torch.bfloat16) * 2 - 1
        kpe = torch.rand(pool, page, HEAD_DIM_KPE, device=dev, generator=g).to(torch.bfloat16) * 2 - 1
        o = torch.full((max(tokens, 1), call.h_q, HEAD_DIM_CKV), UNWRITTEN, dtype=torch.bfloat16, device=dev)
        stage("run")
        wrapper.run(q_nope, q_pe, ckv, kpe, out=o)
        stage("sync-run")
        torch.cuda.synchronize()
        stage("readback-run")
        untouched = (o == UNWRITTEN).reshape(o.shape[0], -1).all(dim=1).tolist()
        rows = call.qo_indptr.tolist()
        unwritten = [i for i in range(call.batch) if rows[i + 1] > rows[i]
                     and any(untouched[t] for t in range(max(rows[i], 0), min(rows[i + 1], len(untouched))))]
        out["output_checked"] = True
        out["unwritten_requests"] = unwritten
    out["message"] = f"OK plan {info[0] if info else '?'}x{info[1] if len(info) > 1 else '?'}"
    return out


# ----------------------------------------------------------------------------- DeepGEMM

def op_dg_mqa_metadata(job, stage, partial) -> dict:
    stage("import")
    torch = _torch_cuda()
    dg = _import(DEEPGEMM)
    call = dg_call(job["record"])
    if job.get("replaced"):
        raise Unsupported("the caller replaces DeepGEMM's planner for this call: DeepGEMM's metadata is not run")
    fn = getattr(dg, "get_paged_mqa_logits_metadata", None)
    if fn is None:
        raise Unsupported(f"deep_gemm {getattr(dg, '__version__', '')} has no get_paged_mqa_logits_metadata")
    dev = torch.device("cuda:0")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    length = DEFAULT_CONTEXT_LEN if call.context_len is None else call.context_len
    block = DEFAULT_BLOCK_KV if call.block_kv is None else call.block_kv
    stage("inputs")
    if call.context_lens is not None:
        lens = torch.tensor(call.context_lens, dtype=torch.int32, device=dev).view(-1, 1).repeat(1, call.next_n)
        lens = lens.contiguous()
    else:
        lens = torch.full((call.batch, call.next_n), length, dtype=torch.int32, device=dev)
    stage("call")
    started = time.perf_counter()
    try:
        md = fn(lens, block, num_sms)
    except RuntimeError as e:
        # DeepGEMM takes context_lens as [batch, next_n] from 2.8 and as [batch] before: a one-dimensional
        # call is tried only when the two-dimensional one is refused for its shape
        if call.next_n != 1 or "dim()" not in str(e):
            raise
        stage("call-1d")
        md = fn(lens.view(-1), block, num_sms)
    stage("sync")
    torch.cuda.synchronize()
    rows = md.cpu().tolist()
    return {"call_s": round(time.perf_counter() - started, 6), "deep_gemm": str(getattr(dg, "__version__", "")),
            "metadata_shape": list(md.shape), "metadata_head": rows[:3], "metadata_tail": rows[-2:], "metadata": rows,
            "context_len": length, "block_kv": block, "num_sms": num_sms,
            "message": f"OK metadata {list(md.shape)}"}


OPS = {"lib_detect": op_lib_detect, "fi_mla_plan": op_fi_mla_plan, "dg_mqa_metadata": op_dg_mqa_metadata}
