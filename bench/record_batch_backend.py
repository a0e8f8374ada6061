"""Kernel-mode child backend for the recording harness: many decode jobs in one process.

Job ``{"op": "batch", "jobs": [...], "out": PATH}``: runs each job with the inner backend (the torch
backend, or ``RECORD_INNER_BACKEND``), appends one JSON line per finished job to ``PATH`` (flushed,
so a crash keeps what ran before it) and stops at the first job that does not end ``ok``.
"""
from __future__ import annotations

import importlib
import json
import os
import sys

from validate_batch.flashmla.calls import call_from_record
from validate_batch.kernel_mode import torch_backend as tb
from validate_batch.kernel_mode.vllm_bundle import EXTENSION_OPS, add_to_path
from validate_batch.kernel_mode.worker import execute, load_backend


def run_batch(job, stage, partial):
    inner = load_backend(os.environ.get("RECORD_INNER_BACKEND") or "validate_batch.kernel_mode.torch_backend")
    done = 0
    with open(job["out"], "a") as fh:
        for one in job["jobs"]:
            res = execute(one, inner)
            fh.write(json.dumps(res, separators=(",", ":")) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
            if res.get("status") != "ok":
                break
            done += 1
    return {"message": f"OK {done} of {len(job['jobs'])}"}


def run_padded(job, stage, partial):
    """Job ``{"op": "padded_fp8", "record": {...}, "pad_block": -1 | null}``: vLLM's dense fp8 call
    with the block-table rows of the length-0 requests (or of ``pad_rows``) set to ``pad_block`` (CUDA-graph padding
    writes -1 there); null keeps the valid pages the torch backend builds."""
    add_to_path(sys.path)
    stage("import")
    torch = importlib.import_module("torch")
    importlib.import_module(f"vllm.{EXTENSION_OPS}")
    ops = getattr(torch.ops, EXTENSION_OPS)
    dev = torch.device("cuda", 0)
    call = call_from_record(job["record"])
    ins = tb.build_dense_inputs(torch, call, dev)
    bt = ins["block_table"]
    tb.pad_block_table(torch, call, bt, job)
    stage("metadata")
    md, ns = ops.get_mla_decoding_metadata_dense_fp8(ins["cache_seqlens"], call.s_q * call.h_q // call.h_k, call.h_k)
    torch.cuda.synchronize()
    fp8 = torch.float8_e4m3fn
    one = torch.ones(1, dtype=torch.float32, device=dev)
    stage("call")
    ops.fwd_kvcache_mla_fp8(ins["q"].to(fp8), ins["k_cache"].to(fp8), call.d_v, ins["cache_seqlens"], bt,
                            call.d_qk ** -0.5, call.causal, md, ns, one, one)
    stage("sync")
    torch.cuda.synchronize()
    return {"message": f"OK {md.shape[0]} {int(ns[-1])}", "tile_scheduler_metadata": md.cpu().tolist(),
            "num_splits": ns.cpu().tolist()}


def run(job, stage, partial):
    """The backend's entry point: ``batch`` or ``padded_fp8``."""
    if job.get("op") == "padded_fp8":
        return run_padded(job, stage, partial)
    return run_batch(job, stage, partial)
