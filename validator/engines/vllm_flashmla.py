"""``vllm-flashmla``: vLLM's dense FlashMLA MLA backend (DeepSeek V2/V3 class models).

The requests run in the model runner's order (:func:`validate_batch.engines.vllm_steps.split_step`);
the leading ones of one query length, at most ``reorder_threshold`` tokens (raised to
``1 + num_speculative_tokens`` with speculative decoding), are the decode requests, run as one
``flash_mla_with_kvcache`` call with ``b`` = decode requests and ``s_q`` = that length (fp8 cache:
the dense fp8 kernels). Prefills run MLA's prefill backend (no FlashMLA call). Numbers and sources
in ``rules/engines.json``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..inputs.batch import Batch
from ..flashmla.calls import DecodeCall
from ..flashmla.plan import plan
from .base import BatchPlan, DerivedCall
from .vllm_steps import (
    VllmProfile,
    cache_dtype,
    check_arch,
    draft_slots,
    heads_per_rank,
    num_speculative_tokens,
    profile_data,
    request_order,
    split_step,
    step_columns,
)

NAME = "vllm-flashmla"


@dataclass(frozen=True)
class DenseSetup:
    heads: int
    fp8: bool
    threshold: int
    d_qk: int
    page: int
    kernel: str | None
    max_rows: int
    order: str = "v2"              # the model runner's request order
    decode_query_len: int = 1      # 1 + num_speculative_tokens


class VllmFlashMLAProfile(VllmProfile):
    name = NAME

    def setup(self, batch: Batch, version: dict, build: str | None) -> DenseSetup:
        dflt = profile_data(NAME)["defaults"]
        build = build or version.get("kernel_build")
        check_arch(batch, version, NAME)
        k = num_speculative_tokens(batch)
        thr = int(version["reorder_threshold"])
        thr = max(thr, 1 + k + draft_slots(batch, version)) if k > 0 else thr
        fp8 = cache_dtype(batch, dflt, version) in version["fp8_cache_dtypes"]
        s = DenseSetup(heads_per_rank(batch, dflt), fp8, thr,
                       int(dflt["d_qk"]), int(dflt["page"]), build, 0, request_order(batch, version), 1 + k)
        probe = plan(self._call(s, 1, 1, None), batch.gpu, build)
        return DenseSetup(**{**s.__dict__, "max_rows": probe.max_sched_rows})

    @staticmethod
    def _call(s: DenseSetup, b: int, s_q: int, seqlens) -> DecodeCall:
        return DecodeCall(kind="dense_fp8" if s.fp8 else "dense", b=b, s_q=s_q, h_q=s.heads, d_qk=s.d_qk, page=s.page,
                          seqlens=seqlens, is_fp8=s.fp8, causal=True, label="decode")

    def derive(self, batch: Batch, version: dict, setup: DenseSetup, bp: BatchPlan, build, memo=None) -> None:
        s = setup
        step = split_step(*step_columns(batch), s.threshold, bool(version["uniform_decodes"]), s.order,
                          s.decode_query_len)
        self.record_step(batch, bp, step, "decode requests through flash_mla_with_kvcache, prefills through MLA "
                                          "prefill", version)
        if not step.num_decodes:
            return
        b = step.decode_tokens // step.decode_len
        seqlens = None
        if not bp.rows_only and b <= s.max_rows:
            seqlens = step.computed[:b] + step.query[:b]
        p = plan(self._call(s, b, step.decode_len, seqlens), batch.gpu, s.kernel)
        bp.calls.append(DerivedCall("decode", p.call, p, "decode_kernel"))

    def bound_hints(self, setup: DenseSetup, bp: BatchPlan) -> dict:
        return {"max_rows": setup.max_rows, "threshold": None}


PROFILE = VllmFlashMLAProfile()
