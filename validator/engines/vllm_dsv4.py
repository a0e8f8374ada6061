"""``vllm-dsv4``: vLLM's DeepSeek-V4 attention (FlashMLA sparse decode, three layer types).

The decode requests (query length up to ``1 + num_speculative_tokens``, no uniformity required)
come first; their tokens are the decode call's rows: ``b`` = decode tokens (requests x (1 + draft
tokens) in a verify step), ``s_q`` = 1, one call per layer type (SWA only, ratio 4, ratio 128). The
prefill tokens go through ``flash_mla_sparse_fwd``. Numbers and sources in ``rules/engines.json``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError, NotModelled
from ..inputs.batch import Batch
from ..facts.fields import min_max, positive_int
from .base import BatchPlan, DerivedCall
from .shapes import QuietRules, prefill_shape_plan, ratio_lengths, shape_plan, step_plan
from .vllm_steps import (VllmProfile, cache_dtype, draft_slots, num_speculative_tokens, profile_data, request_order,
                         split_step, step_columns)
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())

NAME = "vllm-dsv4"


@dataclass(frozen=True)
class VllmDsv4Setup:
    h_q: int
    threshold: int
    # per layer type: (name, ratio, extra_topk, extra_page, shape plan, the rules its calls skip with
    # per-row lengths, and without)
    calls: tuple
    d_qk: int
    topk: int
    page: int
    kernel: str | None
    max_rows: int
    # per layer type: its sparse-prefill shape plan and the rules its calls skip
    prefill: tuple = ()
    order: str = "v2"          # the model runner's request order
    decode_query_len: int = 1  # 1 + num_speculative_tokens (what the order sorts first)


def _heads(batch: Batch, dflt: dict) -> int:
    """Query heads of the decode call: ``model.h_q`` as given, else the model's heads per rank
    padded to 64 (q arrives padded, models/deepseek_v4/nvidia/flashmla.py:213-215)."""
    m = batch.model
    if "h_q" in m:
        return positive_int(m["h_q"], "model.h_q")
    if "num_attention_heads" in m:
        tp = positive_int(batch.arg("tp_size", 1) or 1, "server_args.tp_size")
        per = -(-positive_int(m["num_attention_heads"], "model.num_attention_heads") // tp)
        return -(-per // 64) * 64
    return dflt["h_q"]


def unmodelled_path(batch: Batch) -> NotModelled | None:
    """The reason this configuration runs attention the profile does not model (vLLM's DeepSeek-V4.1
    model code, FlashInfer's DeepSeek-V4 kernels, its SM120 default), or None. An attention backend
    vLLM refuses for DeepSeek V4 is an :class:`InputError`."""
    spec = profile_data(NAME).get("unmodelled_paths") or {}
    v41 = spec.get("deepseek_v41")
    mt = batch.model.get("model_type")
    if v41 is not None and mt in v41["model_types"]:
        return NotModelled("model.model_type", v41["path"], f"model_type {mt} is DeepSeek-V4.1")
    ab = spec.get("attention_backend")
    if ab is None:
        return None
    backend = str(batch.arg(ab["setting"]) or "").strip().upper()
    if backend in ab["refused"]:
        raise InputError(f"server_args.{ab['setting']}", f"vLLM refuses {backend} for DeepSeek V4 (ValueError: "
                                                         f"not a DeepSeek V4 attention backend; use "
                                                         f"{ab['flashinfer'][0]} or {ab['flashmla'][-1]})")
    sm12 = batch.gpu.cc[0] in ab["default_flashinfer_cc_majors"]
    if backend in ab["flashinfer"]:
        key = "flashinfer_sm120" if sm12 else "flashinfer"
        return NotModelled(f"server_args.{ab['setting']}", ab["paths"][key], f"attention backend {backend}")
    if sm12 and backend not in ab["flashmla"]:
        return NotModelled("gpu", ab["paths"]["flashinfer_sm120"],
                           f"{batch.gpu.name} is SM{batch.gpu.cc[0]}{batch.gpu.cc[1]} and "
                           + (f"attention backend {backend}" if backend else "no attention backend is set")
                           + f" (vLLM's default there is FlashInfer; {ab['flashmla'][-1]} picks FlashMLA)")
    return None


class VllmDsv4Profile(VllmProfile):
    name = NAME

    def setup(self, batch: Batch, version: dict, build: str | None) -> VllmDsv4Setup:
        refused = unmodelled_path(batch)
        if refused is not None:
            raise refused
        prof = profile_data(NAME)
        dflt = prof["defaults"]
        build = build or version.get("kernel_build")
        cache_dtype(batch, dflt, version)          # always an fp8 cache: anything else vLLM refuses
        ctx = positive_int(batch.arg("context_length") or batch.model.get("context_length") or dflt["context_length"],
                           "server_args.context_length")
        c128_width = -(-(-(-ctx // 128)) // 64) * 64
        h_q = _heads(batch, dflt)
        mult = int(version["prefill_topk_multiple"])
        calls, prefill = [], []
        for spec in prof["calls"]:
            r = spec["ratio"]
            extra = {4: (dflt["c4_extra_topk"], dflt["c4_extra_page"]), 128: (c128_width, dflt["c128_extra_page"])}
            extra_topk, extra_page = extra.get(r, (None, None))
            # the decode call's shape: planned once, each step's calls are it with their rows
            shape = shape_plan(batch.gpu, build, h_q, dflt["d_qk"], dflt["swa_topk"], extra_topk, dflt["page"],
                               extra_page, spec["name"])
            calls.append((spec["name"], r, extra_topk, extra_page, shape, QuietRules(shape, True, extra_topk is not None),
                          QuietRules(shape, False, False)))
            # the layer type's prefill call: its index width rounded up to the kernel's multiple
            topk = -(-(dflt["swa_topk"] + (extra_topk or 0)) // mult) * mult
            pre = prefill_shape_plan(batch.gpu, build, h_q, dflt["d_qk"], topk, f"{spec['name']} prefill")
            prefill.append((pre, QuietRules(pre, False, False)))
        dql = 1 + num_speculative_tokens(batch)
        return VllmDsv4Setup(h_q, dql + draft_slots(batch, version), tuple(calls), dflt["d_qk"], dflt["swa_topk"],
                             dflt["page"], build, min(c[4].max_sched_rows for c in calls), tuple(prefill),
                             request_order(batch, version), dql)

    def derive(self, batch: Batch, version: dict, setup: VllmDsv4Setup, bp: BatchPlan, build, memo=None) -> None:
        s = setup
        step = split_step(*step_columns(batch), s.threshold, bool(version["uniform_decodes"]), s.order,
                          s.decode_query_len)
        self.record_step(batch, bp, step, "decode tokens as rows, prefill through flash_mla_sparse_fwd", version,
                         "decode tokens")
        b = step.decode_tokens
        if b:
            if bp.rows_only or b > s.max_rows:  # per-row lengths only matter when the scheduler runs
                for name, _, _, _, shape, _, quiet in s.calls:
                    p = step_plan(shape, b, None, None, memo, None, quiet.at(b))
                    bp.calls.append(DerivedCall(name, p.call, p, "decode_kernel"))
            else:
                lengths = step.decode_row_lengths()
                lo, hi = min_max(lengths)
                tl_range = (min(lo, s.topk), min(hi, s.topk))
                tl = np.minimum(lengths, s.topk)
                for name, r, extra_topk, _, shape, quiet, _ in s.calls:
                    extra_len, ranges = ratio_lengths(lengths, lo, hi, tl_range, r, extra_topk)
                    p = step_plan(shape, b, tl, extra_len, memo, ranges, quiet.at(b))
                    bp.calls.append(DerivedCall(name, p.call, p, "decode_kernel"))
        rows = step.prefill_tokens
        if rows:
            for shape, quiet in s.prefill:
                p = step_plan(shape, rows, None, None, None, None, quiet.at(rows))
                bp.calls.append(DerivedCall(p.call.label, p.call, p, "sparse_prefill"))

    def bound_hints(self, setup: VllmDsv4Setup, bp: BatchPlan) -> dict:
        return {"max_rows": setup.max_rows, "threshold": None}


PROFILE = VllmDsv4Profile()
