"""``vllm-flashmla-sparse``: vLLM's FlashMLA-sparse MLA backend (DeepSeek V3.2 class models).

Three paths, by the cache dtype and the query heads per rank (numbers in ``rules/engines.json``):

* fp8 cache and fewer heads than ``min_heads_for_separate_prefill``: the whole MQA batch is one
  ``flash_mla_with_kvcache`` call with ``b = 1`` and ``s_q`` = its tokens (mixed batch);
* fp8 cache otherwise: the decode requests in one call with ``b`` = decode requests and
  ``s_q`` = their (uniform) query length; the prefill tokens through ``flash_mla_sparse_fwd``;
* bf16 cache: every MQA token through ``flash_mla_sparse_fwd`` (no decode kernel).

Prefills whose longest sequence is within ``index_topk`` run dense MHA and leave the MQA batch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..inputs.batch import Batch
from ..facts.fields import positive_int
from ..flashmla.calls import MAX_ROWS, DecodeCall, SparsePrefillCall
from ..flashmla.plan import plan
from .base import BatchPlan, DerivedCall
from .vllm_steps import (
    VllmProfile,
    cache_dtype,
    check_arch,
    heads_per_rank,
    num_speculative_tokens,
    profile_data,
    split_step,
    step_columns,
)

NAME = "vllm-flashmla-sparse"


@dataclass(frozen=True)
class SparseSetup:
    heads: int                 # query heads per rank
    fp8: bool
    mode: str                  # "mixed batch" | "separate prefill and decode" | "bf16 sparse prefill"
    threshold: int
    uniform: bool
    decode_heads: int
    prefill_heads: int
    d_qk: int
    topk: int
    page: int
    kernel: str | None
    max_rows: int              # the profile's hint for the decode kernel's row limit


def reorder_threshold(version: dict, heads: int, gpu, spec_tokens: int) -> int:
    """The backend's reorder threshold for ``heads`` query heads per rank on ``gpu``, raised to
    ``1 + spec_tokens`` with speculative decoding."""
    table = version["reorder_threshold"]["sm100" if gpu.arch == 10 else "other"]
    thr = int(table.get(str(heads), table["*"]))
    return max(thr, 1 + spec_tokens) if spec_tokens > 0 else thr


def _pad_decode_heads(version: dict, heads: int) -> int:
    return next((h for h in version["decode_heads_pad"] if heads <= h), version["decode_heads_pad"][-1])


class FlashMLASparseProfile(VllmProfile):
    name = NAME

    def setup(self, batch: Batch, version: dict, build: str | None) -> SparseSetup:
        dflt = profile_data(NAME)["defaults"]
        build = build or version.get("kernel_build")
        check_arch(batch, version, NAME)
        heads = heads_per_rank(batch, dflt)
        fp8 = cache_dtype(batch, dflt, version) in version["fp8_cache_dtypes"]
        if fp8 and heads < version["min_heads_for_separate_prefill"]:
            mode = "mixed batch"
        elif fp8:
            mode = "separate prefill and decode"
        else:
            mode = "bf16 sparse prefill"
        topk = positive_int(batch.model.get("index_topk", dflt["index_topk"]), "model.index_topk")
        mult = version["prefill_heads_multiple"]
        s = SparseSetup(heads, fp8, mode, reorder_threshold(version, heads, batch.gpu, num_speculative_tokens(batch)),
                        bool(version["uniform_decodes"]), _pad_decode_heads(version, heads), -(-heads // mult) * mult,
                        positive_int(batch.model.get("d_qk", dflt["d_qk"]), "model.d_qk"), topk, int(dflt["page"]),
                        build, MAX_ROWS)
        max_rows = MAX_ROWS       # no decode kernel per request: no scheduler row limit per request
        if mode == "separate prefill and decode":
            max_rows = plan(self._decode_call(s, 1, 1, ""), batch.gpu, build).max_sched_rows
        return replace(s, max_rows=max_rows)

    @staticmethod
    def _decode_call(s: SparseSetup, b: int, s_q: int, label: str) -> DecodeCall:
        return DecodeCall(kind="sparse", b=b, s_q=s_q, h_q=s.decode_heads, d_qk=s.d_qk, topk=s.topk, page=s.page,
                          is_fp8=True, label=label)

    def _prefill(self, s: SparseSetup, rows: int, label: str, gpu) -> DerivedCall:
        call = SparsePrefillCall(s_q=rows, h_q=s.prefill_heads, d_qk=s.d_qk, topk=s.topk, label=label)
        return DerivedCall(label, call, plan(call, gpu, s.kernel), "sparse_prefill")

    def derive(self, batch: Batch, version: dict, setup: SparseSetup, bp: BatchPlan, build, memo=None) -> None:
        s = setup
        step = split_step(*step_columns(batch), s.threshold, s.uniform)
        self.record_step(batch, bp, step, s.mode, version, "tokens" if s.mode == "mixed batch" else "decode requests")
        dense_mha = step.num_prefills > 0 and step.longest_prefill <= s.topk
        mqa_prefill = 0 if dense_mha else step.prefill_tokens
        if dense_mha:
            bp.routing["prefill"] = f"prefills up to {step.longest_prefill} tokens <= index_topk {s.topk}: dense MHA"
        if s.mode == "mixed batch":
            rows = step.decode_tokens + mqa_prefill
            if rows:
                c = self._decode_call(s, 1, rows, "mixed batch (b = 1, s_q = tokens)")
                p = plan(c, batch.gpu, s.kernel)
                bp.calls.append(DerivedCall(c.label, p.call, p, "decode_kernel"))
            return
        if s.mode == "separate prefill and decode" and step.num_decodes:
            b = step.decode_tokens // step.decode_len
            c = self._decode_call(s, b, step.decode_len, "decode")
            p = plan(c, batch.gpu, s.kernel)
            bp.calls.append(DerivedCall("decode", p.call, p, "decode_kernel"))
            if mqa_prefill:
                bp.calls.append(self._prefill(s, mqa_prefill, "prefill", batch.gpu))
            return
        if s.mode == "separate prefill and decode":
            if mqa_prefill:
                bp.calls.append(self._prefill(s, mqa_prefill, "prefill", batch.gpu))
            return
        rows = step.decode_tokens + mqa_prefill
        if rows:
            bp.calls.append(self._prefill(s, rows, "all MQA tokens (bf16 cache)", batch.gpu))

    def bound_hints(self, setup: SparseSetup, bp: BatchPlan) -> dict:
        return {"max_rows": setup.max_rows, "threshold": None}


PROFILE = FlashMLASparseProfile()
