"""``vllm-flashmla-sparse``: vLLM's FlashMLA-sparse MLA backend (DeepSeek V3.2 class models).

Three paths, by the cache dtype and the query heads per rank (numbers in ``rules/engines.json``):

* fp8 cache and fewer heads than ``min_heads_for_separate_prefill``: the whole MQA batch is one
  ``flash_mla_with_kvcache`` call with ``b = 1`` and ``s_q`` = its tokens (mixed batch);
* fp8 cache otherwise: the decode requests in one call with ``b`` = decode requests and
  ``s_q`` = their (uniform) query length; the prefill tokens through ``flash_mla_sparse_fwd``;
* bf16 cache: every MQA token through ``flash_mla_sparse_fwd`` (no decode kernel).

Prefills whose longest sequence is within ``index_topk`` run dense MHA and leave the MQA batch.

From vLLM 0.34 (a version's ``shard_q``), a mixed-batch step under tensor parallelism with enough
prefill tokens is sharded by token (ShardQ): the decode tokens run head-sharded in one call, and each
rank runs its zigzag share of the other tokens with every head in a call of its own
(:func:`shard_q_calls`). On SM90 the bf16 sparse prefill runs 8, 16 or 32 heads unpadded above a
token count (``prefill_small_heads``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import InputError
from ..inputs.batch import Batch
from ..facts.fields import positive_int
from ..flashmla.calls import MAX_ROWS, DecodeCall, SparsePrefillCall
from ..flashmla.plan import plan
from .._numpy import numpy_on_first_use
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

np = numpy_on_first_use(globals())

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
    order: str = "v2"          # the model runner's request order
    decode_query_len: int = 1  # 1 + num_speculative_tokens
    shard_q: tuple = ()        # ShardQ on: (tensor-parallel ranks, least prefill tokens, source, every head padded)
    small_heads: tuple = ()    # SM90 bf16 prefill of these heads unpadded: (tokens above which, source)


def reorder_threshold(version: dict, heads: int, gpu, spec_tokens: int, draft_slots: int = 0) -> int:
    """The backend's reorder threshold for ``heads`` query heads per rank on ``gpu``, raised to
    ``1 + spec_tokens`` (plus the drafter's extra slots) with speculative decoding."""
    table = version["reorder_threshold"]["sm100" if gpu.arch == 10 else "other"]
    thr = int(table.get(str(heads), table["*"]))
    return max(thr, 1 + spec_tokens + draft_slots) if spec_tokens > 0 else thr


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
        s = SparseSetup(heads, fp8, mode, reorder_threshold(version, heads, batch.gpu, num_speculative_tokens(batch),
                                                            draft_slots(batch, version)),
                        bool(version["uniform_decodes"]), _pad_decode_heads(version, heads), -(-heads // mult) * mult,
                        positive_int(batch.model.get("d_qk", dflt["d_qk"]), "model.d_qk"), topk, int(dflt["page"]),
                        build, MAX_ROWS, request_order(batch, version), 1 + num_speculative_tokens(batch))
        s = replace(s, shard_q=_shard_q_setting(batch, version, mode), small_heads=_small_heads(batch, version, heads))
        max_rows = MAX_ROWS       # no decode kernel per request: no scheduler row limit per request
        if mode == "separate prefill and decode":
            max_rows = plan(self._decode_call(s, 1, 1, ""), batch.gpu, build).max_sched_rows
        return replace(s, max_rows=max_rows)

    @staticmethod
    def _decode_call(s: SparseSetup, b: int, s_q: int, label: str) -> DecodeCall:
        return DecodeCall(kind="sparse", b=b, s_q=s_q, h_q=s.decode_heads, d_qk=s.d_qk, topk=s.topk, page=s.page,
                          is_fp8=True, label=label)

    def _prefill(self, s: SparseSetup, rows: int, label: str, gpu) -> DerivedCall:
        heads = s.prefill_heads
        if s.small_heads and rows > s.small_heads[0]:
            heads = s.heads        # the SM90 small-head kernel: q sliced to the real heads
        call = SparsePrefillCall(s_q=rows, h_q=heads, d_qk=s.d_qk, topk=s.topk, label=label)
        return DerivedCall(label, call, plan(call, gpu, s.kernel), "sparse_prefill")

    def _shard_q(self, batch: Batch, s: SparseSetup, bp: BatchPlan, decode_tokens: int, per_rank) -> None:
        """The ShardQ step's calls: the decode tokens head-sharded (b = 1, s_q = decode tokens, the rank's
        heads), and the rank with the most of the other tokens (b = 1, s_q = its tokens, every head)."""
        ranks, _, source, heads = s.shard_q
        if decode_tokens:
            c = self._decode_call(s, 1, decode_tokens, "ShardQ decode tokens (b = 1, s_q = decode tokens)")
            p = plan(c, batch.gpu, s.kernel)
            bp.calls.append(DerivedCall(c.label, p.call, p, "decode_kernel"))
        r = int(np.argmax(per_rank))
        c = DecodeCall(kind="sparse", b=1, s_q=int(per_rank[r]), h_q=heads, d_qk=s.d_qk, topk=s.topk, page=s.page,
                       is_fp8=True, label=f"ShardQ tokens of rank {r} of {ranks} (b = 1, s_q = its tokens, all heads)")
        p = plan(c, batch.gpu, s.kernel)
        bp.calls.append(DerivedCall(c.label, p.call, p, "decode_kernel"))
        bp.routing["shard_q"] = {"ranks": ranks, "decode_tokens": decode_tokens, "heads": heads, "source": source,
                                 "tokens_per_rank": [int(x) for x in per_rank]}
        bp.routing["vllm_mode"] = f"mixed batch, ShardQ over {ranks} ranks"

    def derive(self, batch: Batch, version: dict, setup: SparseSetup, bp: BatchPlan, build, memo=None) -> None:
        s = setup
        columns = step_columns(batch)
        step = split_step(*columns, s.threshold, s.uniform, s.order, s.decode_query_len)
        self.record_step(batch, bp, step, s.mode, version, "tokens" if s.mode == "mixed batch" else "decode requests")
        dense_mha = step.num_prefills > 0 and step.longest_prefill <= s.topk
        mqa_prefill = 0 if dense_mha else step.prefill_tokens
        if dense_mha:
            bp.routing["prefill"] = f"prefills up to {step.longest_prefill} tokens <= index_topk {s.topk}: dense MHA"
        if s.mode == "mixed batch" and s.shard_q:
            sharded = shard_q_calls(columns, s)
            if sharded is not None:
                self._shard_q(batch, s, bp, *sharded)
                return
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


def _shard_q_setting(batch: Batch, version: dict, mode: str) -> tuple:
    """ShardQ's configuration (``shard_q`` of the version): on for the mixed-batch path under tensor
    parallelism unless switched off (``sparse_mla_shard_q``), under context parallelism, or with CUDA
    graphs that capture mixed steps whole (``cudagraph_mode`` FULL); () when off. (HiSparse, which
    turns it off too, is not modelled.)"""
    spec = version.get("shard_q")
    if spec is None or mode != "mixed batch":
        return ()
    tp = positive_int(batch.arg("tp_size", 1) or 1, "server_args.tp_size")
    on = batch.arg(spec["setting"], spec["default"])
    if not isinstance(on, bool):
        raise InputError(f"server_args.{spec['setting']}", f"expected true or false, got {on!r:.40}")
    graphs = str(batch.arg("cudagraph_mode", spec["cudagraph_default"]) or "").strip().upper()
    off = (not on or tp <= 1 or graphs in spec["cudagraph_off"]
           or any(int(batch.arg(k, 1) or 1) != 1 for k in spec["context_parallel_settings"]))
    if off:
        return ()
    least = positive_int(batch.arg(spec["min_tokens_setting"], spec["min_tokens"]),
                         f"server_args.{spec['min_tokens_setting']}")
    heads = heads_per_rank(batch, profile_data(NAME)["defaults"]) * tp
    return tp, least, spec["source"], _pad_decode_heads(version, heads)


def _small_heads(batch: Batch, version: dict, heads: int) -> tuple:
    """``(tokens above which the bf16 prefill runs the real heads, source)`` on this GPU, or ()."""
    spec = version.get("prefill_small_heads")
    if spec is None or batch.gpu.arch != spec["arch"] or heads not in spec["heads"]:
        return ()
    per_sm = int(spec["min_tokens_per_sm"].get(str(heads), spec["min_tokens_per_sm"]["*"]))
    return batch.gpu.num_sms * per_sm, spec["source"]


def zigzag_tokens(lengths, ranks: int):
    """Tokens per rank when each request of ``lengths`` is cut into ``2 * ranks`` chunks (chunk ``i``:
    ``[floor(i*L/2r), floor((i+1)*L/2r))``) and rank ``j`` takes chunks ``j`` and ``2r-1-j``."""
    L = np.asarray(lengths, dtype=np.int64)[:, None]
    n = 2 * ranks
    i = np.arange(n + 1, dtype=np.int64)[None, :]
    size = np.diff((i * L) // n, axis=1).sum(axis=0)
    return size[:ranks] + size[::-1][:ranks]


def shard_q_calls(columns: tuple, s: SparseSetup) -> tuple | None:
    """ShardQ's split of a step (None: it does not apply): the requests of at most ``1 + num_speculative_tokens``
    tokens that lead the runner's order are decodes; it applies with at least ``least`` other tokens, one of
    their requests longer than ``index_topk`` and every rank owning a token. ``(decode tokens, tokens per
    rank)``."""
    ranks, least = s.shard_q[:2]
    st = split_step(*columns, s.decode_query_len, False, s.order, s.decode_query_len)
    if not st.num_prefills or st.prefill_tokens < least:
        return None
    nd = st.num_decodes
    if int((st.computed[nd:] + st.query[nd:]).max()) <= s.topk:
        return None
    per_rank = zigzag_tokens(st.query[nd:], ranks)
    if int(per_rank.min()) == 0:
        return None
    return st.decode_tokens, per_rank


PROFILE = FlashMLASparseProfile()
