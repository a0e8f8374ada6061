"""``sglang-trtllm-mla``: SGLang's ``trtllm_mla`` attention backend (DeepSeek V3/R1 class MLA models, Blackwell).

Decode, target-verify and draft-extend forwards run FlashInfer's trtllm-gen MLA decode
(``trtllm_batch_decode_with_kv_cache_mla``) once per layer with a query of
``[batch, q_len_per_request, heads, 576]``: ``batch`` is the forward's batch size (CUDA-graph
padding included), ``q_len_per_request`` is 1 for decode, the draft tokens for target verify and
the (padded) tokens per request for draft extend. Extend and mixed forwards run the trtllm-gen
ragged prefill (or FlashInfer's MLA prefill wrapper), which no rule here judges. Numbers and
sources in ``rules/engines.json`` (``sglang-trtllm-mla``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..inputs.batch import Batch, request_arrays
from ..errors import InputError
from ..facts.fields import positive_int
from ..flashinfer.calls import TRTLLM_RULE_KIND, TrtllmGenCall
from ..flashinfer.calls import plan as flashinfer_plan
from .forward import draft_tokens, forward_rows
from ..facts.knowledge import grid_limits, load
from ..facts.modes import Mode
from .base import BatchPlan, DerivedCall, Profile

NAME = "sglang-trtllm-mla"


def _data() -> dict:
    return load("engines")["profiles"][NAME]


@dataclass(frozen=True)
class TrtllmMlaSetup:
    h_q: int
    draft: int
    flashinfer: str | None
    decode_modes: tuple
    max_batch: int          # the profile's hint for the bound: CUDA's gridDim.z limit (checked by the rules)


def heads_per_rank(batch: Batch, defaults: dict) -> int:
    """Query heads of one attention rank: ``model.h_q``, else the model's heads (default DeepSeek
    V3's 128) over the attention tensor-parallel degree (``tp_size`` / attention-DP ranks)."""
    m = batch.model
    if "h_q" in m:
        return positive_int(m["h_q"], "model.h_q")
    n = positive_int(m.get("num_attention_heads", defaults["num_attention_heads"]), "model.num_attention_heads")
    tp = positive_int(batch.arg("tp_size", 1) or 1, "server_args.tp_size")
    return max(n // max(tp // batch.attn_dp_size(), 1), 1)


def decode_shape(batch: Batch, draft: int) -> tuple[int, int]:
    """``(batch, q_len_per_request)`` of the trtllm-gen decode call of a decode-like forward.

    Decode: one query token per request. Target verify: the draft tokens of every request. Draft
    extend: each request's tokens (the draft tokens when it gives none); when they differ the query
    is padded to the longest. CUDA-graph padding (``padded_rows``, query rows) raises the batch to
    the padded rows over the tokens per request."""
    mode = batch.forward_mode
    n = len(batch.requests)
    if mode.is_decode():
        q_len = 1
    elif mode.is_target_verify():
        if draft <= 0:
            raise InputError("server_args.speculative_num_draft_tokens",
                             "missing: a target_verify forward has that many query tokens per request")
        q_len = draft
    else:
        ext = request_arrays(batch.requests)[0]
        per = [int(e) if e > 0 else draft for e in ext]
        if any(p <= 0 for p in per):
            raise InputError("server_args.speculative_num_draft_tokens",
                             "missing: a draft_extend request without extend_tokens has that many tokens")
        q_len = max(per) if per else 1
    b = n
    if batch.padded_rows is not None:
        b = max(b, -(-batch.padded_rows // q_len))
    return b, q_len


class SglangTrtllmMlaProfile(Profile):
    name = NAME
    provides = frozenset({"rows"})
    call_kinds = frozenset({TRTLLM_RULE_KIND})

    def setup(self, batch: Batch, version: dict, build: str | None) -> TrtllmMlaSetup:
        archs = version["archs"]
        if batch.gpu.arch not in archs:
            raise InputError("gpu", f"{NAME} runs on compute capability {' or '.join(f'{a}.x' for a in archs)} "
                                    f"(Blackwell: SGLang refuses the backend elsewhere); {batch.gpu.name} is "
                                    f"{batch.gpu.arch}.x")
        return TrtllmMlaSetup(heads_per_rank(batch, _data()["defaults"]), draft_tokens(batch),
                              version.get("flashinfer"), tuple(version["decode_kernel_modes"]), grid_limits()["z"])

    def derive(self, batch: Batch, version: dict, setup: TrtllmMlaSetup, bp: BatchPlan, build: str | None,
               memo=None) -> None:
        mode = batch.forward_mode
        rows, bd = forward_rows(batch)
        bp.rows, bp.row_breakdown = rows, bd
        if mode not in setup.decode_modes:
            bp.routing = {"threshold": None, "routed": False, "version": version["name"],
                          "reason": f"{mode} forwards run the trtllm-gen ragged prefill, not the decode kernel "
                                    f"(not judged by these rules)"}
            return
        b, q_len = decode_shape(batch, setup.draft)
        bp.routing = {"threshold": None, "routed": False, "version": version["name"],
                      "reason": f"{mode}: trtllm-gen MLA decode, batch {b} x {q_len} query token(s) per request",
                      "trtllm_batch": b, "q_len_per_request": q_len}
        call = TrtllmGenCall("trtllm_gen_mla", b, q_len, setup.h_q, label=f"{mode} attention")
        p = flashinfer_plan(call, batch.gpu, setup.flashinfer)
        bp.calls.append(DerivedCall("decode", call, p, "trtllm_gen_decode"))

    def bound_hints(self, setup: TrtllmMlaSetup, bp: BatchPlan) -> dict:
        # the limit is on the kernel's batch: the query rows of a decode, but only at most the rows of a
        # verify or draft-extend forward (several tokens per request), whose steps take the full check
        return {"max_rows": setup.max_batch, "threshold": None, "row_modes": (Mode.DECODE,)}

    def prevention(self, batch: Batch, bp: BatchPlan, bounds) -> list[dict]:
        b = bp.routing.get("trtllm_batch")
        if b is None or bounds.max_rows is None:
            return []
        L = bounds.max_rows
        dp = batch.attn_dp_size()
        out = [{"flag": "--max-running-requests", "value": L * dp,
                "why": f"bounds the requests of a decode-like forward: the trtllm-gen MLA decode takes at most "
                       f"{L} requests per call" + (f" ({dp} attention-DP ranks share the limit)" if dp > 1 else "")}]
        if batch.padded_rows is not None:
            out.append({"flag": "--cuda-graph-max-bs", "value": L,
                        "why": "a replayed CUDA graph runs the captured batch size, padding included"})
        return out

    def context(self, bp: BatchPlan) -> dict:
        return self.rows_context(bp)

    def summary_lines(self, bp: BatchPlan) -> list[str]:
        if bp.rows is None:
            return []
        lines = [f"  SGLang trtllm_mla: {bp.rows} query rows; {bp.routing.get('reason', '')}"]
        for c in bp.calls:
            lines.append(f"    {c.name}: FlashInfer {c.kernel} {c.call.summary()}")
        return lines


PROFILE = SglangTrtllmMlaProfile()
