"""FMLA021: the dense fp8 scheduler's partition count, on the builds that do not clamp it to one.

The partition count is a per-build fact (``dense_fp8_partitions`` of a build in
``rules/flashmla.json``): the same first-generation formula runs in every copy of the dense fp8
extension, but one copy clamps a count of 0 to 1 and another launches its scheduler with it.
"""
from __future__ import annotations

from ..legality.failure import Failure
from ..facts.knowledge import build_record
from ..legality.registry import rule
from .calls import DecodeCall
from .plan import Plan

PARTS_KEY = "dense_fp8_partitions"


def unclamped_parts(p: Plan) -> int:
    """``num_sms / h_k / ceil(s_q*h_q/h_k / block)`` in C++ integer division, before any clamp."""
    c: DecodeCall = p.call
    per_k = c.s_q * c.h_q // c.h_k
    return p.gpu.num_sms // c.h_k // -(-per_k // p.block_size)


def max_rows_per_head(p: Plan) -> int:
    """The largest ``s_q*h_q/h_k`` that still yields one partition: ``num_sms / h_k * block``."""
    return p.gpu.num_sms // p.call.h_k * p.block_size


@rule("FMLA021", facts=lambda p: ("build.dense_fp8_partitions", "") if p.is_decode and p.call.kind == "dense_fp8" else (), shape_only=True, added=35,
      title="dense fp8 scheduler: s_q*h_q/h_k above num_sms/h_k*64 leaves no partition on builds that do not "
            "clamp the count to 1",
      failure=Failure("device_assert",
                      "the dense fp8 scheduler is launched with 0 partitions; CUDA error: unspecified launch failure "
                      "at the next synchronisation (torch raises; the error is sticky, the CUDA context is lost)",
                      message="unspecified launch failure"),
      source="first-generation dense fp8 scheduler flash_fwd_mla_metadata.cu (num_sm_parts = num_sms / h_k / "
             "ceil(s_q*h_q/h_k / 64), unclamped in sgl-flash-mla 1.0.0, clamped to 1 in vLLM 0.33's extension); "
             "measured on an H200, fixtures/measured/vllm033_h200_probes.jsonl",
      signatures=[
          {"library": "flashmla", "message": "unspecified launch failure", "failure": "device_assert",
           "builds": ["sgl-flash-mla-1.0.0"],
           "source": "measured on an H200 (fixtures/measured/vllm033_h200_probes.jsonl, tag dense_fp8_parts): "
                     "torch's RuntimeError after get_mla_decoding_metadata with 0 partitions"},
      ])
def dense_fp8_no_partition(p: Plan):
    """Dense fp8 scheduler: at most ``num_sms / h_k * 64`` query rows per KV head (``s_q*h_q/h_k``).

    ## What it checks
    The dense fp8 scheduler (``get_mla_decoding_metadata(..., is_fp8_kvcache=True, topk=None)``,
    paired with ``fwd_kvcache_mla_fp8``) splits the GPU into ``num_sms / h_k / ceil(s_q*h_q/h_k / 64)``
    partitions. Past ``num_sms / h_k * 64`` rows per KV head (8448 on an H200: ``s_q`` 67 at
    ``h_q`` 128, 133 at 64, 529 at 16) that count is 0. Builds that clamp it to 1 run; the others
    launch the scheduler with no partition. A short prefill sent through the dense fp8 decode path
    (``s_q`` = its tokens) gets there.

    ## Why it crashes
    With 0 partitions the scheduler's launch fails: ``CUDA error: unspecified launch failure`` at the
    next synchronisation, a sticky error (the CUDA context is lost; torch raises, and the engine's
    process cannot go on using the GPU).

    ## Example
    ``{"kind": "dense_fp8", "b": 2, "s_q": 67, "h_q": 128, "seqlens": [100, 300]}`` on sgl-flash-mla
    1.0.0 (``s_q`` 66 runs). vLLM 0.33's extension runs both, with one partition.

    ## Fix
    Keep ``s_q*h_q/h_k`` at or below the limit: split the query rows over several calls, or send the
    prefill through a prefill kernel instead of the decode path.

    ## Source
    First-generation scheduler ``flash_fwd_mla_metadata.cu``; measured on an H200
    (``fixtures/measured/vllm033_h200_probes.jsonl``, tag ``dense_fp8_parts``).
    """
    c = p.call
    if not isinstance(c, DecodeCall) or c.kind != "dense_fp8" or p.implementation is None:
        return None
    fact = build_record(p.gen["build"]).get(PARTS_KEY)
    if fact is None or fact.get("clamped", True):
        return None
    if unclamped_parts(p) > 0:
        return None
    rows, limit = c.s_q * c.h_q // c.h_k, max_rows_per_head(p)
    max_s_q = limit * c.h_k // c.h_q
    return [dense_fp8_no_partition.rule.finding(
        f"query rows per KV head s_q*h_q/h_k = {rows} leave the dense fp8 scheduler no partition on "
        f"{p.gen['build']} (expected <= {limit} = {p.gpu.num_sms}/{c.h_k}*{p.block_size} on {p.gpu.name}, got {rows})",
        subject=_subject(p), numbers={"rows_per_head": rows, "max_rows_per_head": limit, "max_s_q": max_s_q},
        fix=f"split the call into calls of s_q <= {max_s_q} at h_q {c.h_q}",
        failure=fact["failure"])]


def _subject(p: Plan) -> str:
    return p.call.label or p.call.summary()
