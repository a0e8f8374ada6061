"""What the vLLM profiles share: a step's requests as vLLM's attention backends split them.

vLLM flattens a step into one query row per scheduled token. Before the attention metadata is
built, the model runner orders the requests, and each backend splits them at a query-length
threshold into decode requests, which its decode kernel takes as ``[num_decodes, query_len, heads,
dim]``, and prefill requests. Some backends require the decode requests to share one query length.
Two orders exist (``request_orders`` of a version in ``rules/engines.json``, the first its default):
model runner V2's sort (requests of the decode query length ``1 + num_speculative_tokens`` first,
then the rest by ascending query length) and model runner V1's reorder (decodes, short extends,
long extends, first-chunk prefills). The numbers (thresholds, head padding, cache formats) are per
version in ``rules/engines.json``; :class:`VllmProfile` is what the three vLLM profile modules
build on.
"""
from __future__ import annotations

from ..inputs.batch import Batch, request_arrays
from ..errors import InputError
from ..facts.fields import min_max, positive_int
from ..flashmla.calls import MAX_ROWS
from .forward import draft_tokens, forward_rows
from ..facts.knowledge import load
from ..facts.modes import Mode
from .base import BatchPlan, Profile
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())

#: the forward modes a vLLM step can be described with
VLLM_MODES = (Mode.DECODE, Mode.TARGET_VERIFY, Mode.EXTEND, Mode.MIXED)


def profile_data(name: str) -> dict:
    return load("engines")["profiles"][name]


class VllmStep:
    """One step's requests in the order the backend runs them, split into decodes and prefills.

    ``query``: query tokens per request (speculative tokens included); ``computed``: tokens already
    in the KV cache before the step (built on first use: a decode probe of millions of rows never
    needs it); the first ``num_decodes`` requests are decodes."""

    __slots__ = ("query", "_computed", "num_decodes", "threshold", "num_tokens", "decode_tokens")

    def __init__(self, query: np.ndarray, computed, num_decodes: int, threshold: int):
        self.query = query
        self._computed = computed
        self.num_decodes = num_decodes
        self.threshold = threshold
        self.num_tokens = int(query.sum())
        self.decode_tokens = self.num_tokens if num_decodes == len(query) else int(query[:num_decodes].sum())

    @property
    def computed(self) -> np.ndarray:
        if callable(self._computed):
            self._computed = self._computed()
        return self._computed

    @property
    def prefill_tokens(self) -> int:
        return self.num_tokens - self.decode_tokens

    @property
    def num_prefills(self) -> int:
        return len(self.query) - self.num_decodes

    @property
    def decode_len(self) -> int:
        """The decode requests' query length (the first request's: the backend reshapes by it)."""
        return int(self.query[0]) if self.num_decodes else 0

    @property
    def longest_prefill(self) -> int:
        """The longest sequence (computed + query tokens) among the prefill requests (0: none)."""
        if not self.num_prefills:
            return 0
        return int((self.computed[self.num_decodes:] + self.query[self.num_decodes:]).max())

    def decode_row_lengths(self) -> np.ndarray:
        """Per decode query row, the KV tokens it attends to (causal): request i's j-th row sees
        ``computed_i + j + 1``."""
        q = np.asarray(self.query[:self.num_decodes], dtype=np.int64)
        c = self.computed[:self.num_decodes]
        if q.shape[0]:
            lo, hi = (int(q[0]),) * 2 if q.strides == (0,) else min_max(q)
            if lo == hi == 1:
                return c + 1
            if lo == hi > 1:           # (one query length for every decode: request i's rows, in order)
                return (c[:, None] + np.arange(1, lo + 1, dtype=np.int64)).ravel()
        n = int(q.sum())
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        first = np.cumsum(q) - q
        return np.repeat(c + 1 - first, q) + np.arange(n, dtype=np.int64)

    def to_dict(self) -> dict:
        return {"num_decodes": self.num_decodes, "decode_tokens": self.decode_tokens,
                "num_prefills": self.num_prefills, "prefill_tokens": self.prefill_tokens,
                "decode_query_len": self.decode_len, "reorder_threshold": self.threshold}


def step_columns(batch: Batch) -> tuple:
    """``(query tokens, computed tokens or a function that builds them)`` per request of a vLLM
    step described in the project's forward modes: decode (one token on top of ``seq_len - 1``
    computed), target verify (``speculative_num_draft_tokens`` query tokens each), extend / mixed
    (``extend_tokens`` on top of ``prefix_len``; decode entries and merged running decodes one
    token each)."""
    mode = batch.forward_mode
    if mode not in VLLM_MODES:
        raise InputError("forward_mode", f"a vLLM step is one of {', '.join(VLLM_MODES)}, got {mode.value!r}")
    reqs = batch.requests
    n = len(reqs)
    if mode.is_decode_or_verify():
        d = 1
        if mode.is_target_verify():
            d = draft_tokens(batch)
            if d <= 0:
                raise InputError("server_args.speculative_num_draft_tokens",
                                 "missing: a target_verify step has that many query tokens per request")
        ctx = reqs.contexts() if hasattr(reqs, "contexts") else request_arrays(reqs)[2]
        return np.broadcast_to(np.int64(d), (n,)), lambda: np.maximum(ctx - 1, 0)
    ext, pre, ctx, is_dec = request_arrays(reqs)
    query = np.where(is_dec, 1, ext).astype(np.int64)
    if n and int(query.min()) <= 0:
        # vLLM's scheduler gives every request of a step at least one token; the backends split and
        # reshape by query length (a decode query of length 0 has no shape)
        i = int(np.argmax(query <= 0))
        raise InputError(f"requests[{i}].extend_tokens", "0: every request of a vLLM step has at least one "
                                                         "scheduled token (leave the request out of the step)")
    computed = np.where(is_dec, ctx - 1, pre).astype(np.int64)
    if batch.mixed and batch.running:
        run_ctx = np.array([r.context_len for r in batch.running], dtype=np.int64)
        query = np.concatenate([query, np.ones(len(run_ctx), dtype=np.int64)])
        computed = np.concatenate([computed, run_ctx - 1])
    return query, np.maximum(computed, 0)


def num_speculative_tokens(batch: Batch) -> int:
    """vLLM's ``num_speculative_tokens`` (or SGLang's ``speculative_num_draft_tokens`` less the
    verified token); 0 without speculative decoding."""
    k = batch.arg("num_speculative_tokens")
    if k is not None:
        return int(k)
    d = draft_tokens(batch)
    return d - 1 if d > 0 else 0


def draft_slots(batch: Batch, version: dict) -> int:
    """The query slots a drafter adds to each verified request beyond its drafts (the version's
    ``draft_slots`` by ``server_args.speculative_method``; 0 without speculative decoding)."""
    slots = version.get("draft_slots")
    if not slots or num_speculative_tokens(batch) <= 0:
        return 0
    return int(slots.get(str(batch.arg("speculative_method") or "").strip().lower(), 0))


def request_order(batch: Batch, version: dict) -> str:
    """The order the step's requests run in: the version's default (the first of its
    ``request_orders``), or model runner V1's / V2's as ``server_args.use_v2_model_runner`` asks
    (vLLM's ``VLLM_USE_V2_MODEL_RUNNER``; a release without that runner refuses it)."""
    orders = version.get("request_orders") or ["v1"]
    want = batch.arg("use_v2_model_runner")
    if want is None:
        return orders[0]
    if not isinstance(want, bool):
        raise InputError("server_args.use_v2_model_runner", f"expected true or false, got {want!r:.40}")
    order = "v2" if want else "v1"
    if order not in orders:
        raise InputError("server_args.use_v2_model_runner",
                         f"vLLM {version['name']} has no model runner {order.upper()} "
                         f"({version.get('request_orders_source', 'rules/engines.json request_orders')})")
    return order


def split_step(query: np.ndarray, computed, threshold: int, uniform: bool, order: str = "v1",
               decode_query_len: int = 1) -> VllmStep:
    """The step ordered and split as the version's model runner and backend do (sources: the
    version's ``split_source`` and ``request_orders_source``).

    ``order`` ``"v2"`` (model runner V2's sort): the requests of ``decode_query_len`` query tokens
    (``1 + num_speculative_tokens``) first, then the others by ascending query length, each group
    in its given order; V2 puts requests that carry drafts before all others, which this reading
    takes to be the requests of ``decode_query_len`` tokens (exact for drafters that propose every
    draft: MTP, EAGLE, a draft model). ``"v1"`` (V1's reorder): requests keep their order within a
    region (the caller gives decodes that are done prefilling before short extends, as the reorder
    does); regions: computed tokens and at most ``threshold`` query tokens (decode or short
    extend), computed tokens and more (long extend), nothing computed (first-chunk prefill). A step
    of one query length per request needs no reordering: whatever the order, every request is a
    decode when that length is within the threshold, none otherwise."""
    n = len(query)
    if n and query.strides == (0,):
        q0 = int(query[0])
        return VllmStep(query, computed, n if q0 <= threshold else 0, threshold)
    if order == "v2":
        key = np.where(query == decode_query_len, -1, query)
        if n < 2 or bool((key[1:] >= key[:-1]).all()):
            q, c = query, computed     # (already in the runner's order: the stable sort keeps it)
        else:
            perm = np.argsort(key, kind="stable")
            q = query[perm]
            c = (lambda f=computed: f()[perm]) if callable(computed) else computed[perm]
        return _split(q, c, threshold, uniform)
    computed = computed() if callable(computed) else computed
    region = np.where(computed == 0, 2, np.where(query > threshold, 1, 0))
    if n < 2 or bool((region[1:] >= region[:-1]).all()):
        q, c = query, computed         # (already in region order: the stable sort keeps it)
    else:
        perm = np.argsort(region, kind="stable")
        q, c = query[perm], computed[perm]
    return _split(q, c, threshold, uniform)


def _split(q: np.ndarray, c, threshold: int, uniform: bool) -> VllmStep:
    """``split_decodes_and_prefills`` on requests in the runner's order: the leading decodes."""
    n = len(q)
    if n == 0:
        nd = 0
    elif int(q.max()) <= threshold and (not uniform or threshold <= 1):
        nd = n
    elif int(q[0]) > threshold:
        nd = 0
    else:
        is_prefill = ((q != q[0]) & (q != 0)) if uniform else (q > threshold)
        nd = int(is_prefill.argmax()) if is_prefill.any() else n
    return VllmStep(q, c, nd, threshold)


def heads_per_rank(batch: Batch, defaults: dict) -> int:
    """Query heads per tensor-parallel rank (unpadded): ``model.h_q`` as given, else the model's
    ``num_attention_heads`` (or the profile's default) over ``tp_size``."""
    m = batch.model
    if "h_q" in m:
        return positive_int(m["h_q"], "model.h_q")
    n = positive_int(m.get("num_attention_heads", defaults["num_attention_heads"]), "model.num_attention_heads")
    tp = positive_int(batch.arg("tp_size", 1) or 1, "server_args.tp_size")
    return max(n // tp, 1)


def cache_dtype(batch: Batch, defaults: dict, version: dict) -> str:
    """``kv_cache_dtype`` (the profile's default when unset), one of the backend's supported names."""
    v = batch.arg("kv_cache_dtype", defaults.get("kv_cache_dtype", "auto"))
    name = v.strip().lower() if isinstance(v, str) else None
    if name not in version["cache_dtypes"]:
        raise InputError("server_args.kv_cache_dtype",
                         f"expected one of {', '.join(version['cache_dtypes'])} (the backend's cache dtypes), "
                         f"got {v!r:.60}")
    archs = version.get("cache_dtype_archs", {}).get(name)
    if archs is not None and batch.gpu.arch not in archs:
        raise InputError("server_args.kv_cache_dtype", f"{name} runs on compute capability "
                         f"{' or '.join(f'{a}.x' for a in archs)} only; {batch.gpu.name} is {batch.gpu.arch}.x")
    return name


def check_arch(batch: Batch, version: dict, profile: str) -> None:
    """The backend runs on the GPU's architecture (vLLM would not select it otherwise)."""
    archs = version.get("archs")
    if archs is not None and batch.gpu.arch not in archs:
        raise InputError("gpu", f"{profile} runs on compute capability {' or '.join(f'{a}.x' for a in archs)}; "
                                f"{batch.gpu.name} is {batch.gpu.arch}.x")


class VllmProfile(Profile):
    """A vLLM attention backend: the step is split by :func:`split_step`; a subclass derives the
    calls. Provides ``rows`` (the step's tokens); its bound is the decode kernel's row limit
    (``b`` of the decode call for a decode step), checked by :mod:`validate_batch.legality.bounds`."""

    provides = frozenset({"rows"})
    guarantees = frozenset({"lengths"})
    shape_grows_with_rows = True

    def record_step(self, batch: Batch, bp: BatchPlan, step: VllmStep, mode: str, version: dict,
                    rows_are: str = "decode requests") -> None:
        """The step's context; ``rows_are``: what the decode kernel's rows count (``decode
        requests``, ``decode tokens``, or ``tokens`` when the whole step is one call's query)."""
        rows, bd = forward_rows(batch)
        bp.rows, bp.row_breakdown = rows, bd
        bp.routing = {"threshold": None, "routed": False, "version": version["name"], "vllm_mode": mode,
                      "reason": f"vLLM {version['name']}: {mode}", "step": step.to_dict(), "rows_are": rows_are}

    def prevention(self, batch: Batch, bp: BatchPlan, bounds) -> list[dict]:
        if bounds.max_rows is None or not bp.calls or bounds.max_rows >= MAX_ROWS:
            return []
        L = bounds.max_rows
        rows_are = bp.routing.get("rows_are")
        if rows_are == "tokens":
            return [{"flag": "--max-num-batched-tokens", "value": L,
                     "why": f"the whole step is one call whose query is its tokens: at most {L}"}]
        per = 1
        if rows_are == "decode tokens":
            per = 1 + num_speculative_tokens(batch)
        return [{"flag": "--max-num-seqs", "value": L // per,
                 "why": f"bounds the decode requests of a step: the decode kernel takes at most {L} rows"
                        + (f" ({per} per request)" if per > 1 else "")}]

    def context(self, bp: BatchPlan) -> dict:
        return self.rows_context(bp)

    def summary_lines(self, bp: BatchPlan) -> list[str]:
        if bp.rows is None:
            return []
        s = bp.routing.get("step", {})
        lines = [f"  vLLM step: {bp.rows} tokens; {s.get('num_decodes', 0)} decode request(s) "
                 f"({s.get('decode_tokens', 0)} tokens, query length {s.get('decode_query_len', 0)}), "
                 f"{s.get('num_prefills', 0)} prefill request(s) ({s.get('prefill_tokens', 0)} tokens); "
                 f"reorder threshold {s.get('reorder_threshold')}",
                 f"  backend path: {bp.routing.get('vllm_mode')}"]
        for c in bp.calls:
            extra = f", num_sm_parts {c.plan.num_sm_parts}" if c.plan.num_sm_parts else ""
            lines.append(f"    {c.name}: {c.kernel} {c.call.summary()}{extra}")
        return lines


__all__ = ["VllmProfile", "VllmStep", "VLLM_MODES", "cache_dtype", "check_arch", "heads_per_rank",
           "num_speculative_tokens",
           "profile_data", "split_step", "step_columns", "request_order", "draft_slots"]
