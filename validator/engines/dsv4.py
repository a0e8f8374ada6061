"""``sglang-dsv4``: SGLang's DeepSeek-V4 attention backend.

One FlashMLA call per compression ratio (SWA, 4, 128) with ``b`` = the query rows of the forward
(one row per token), routed to ``flash_mla_sparse_fwd`` for large extend forwards in versions that
have the routing. Provides the ``rows`` quantity (counted by :mod:`validate_batch.engines.forward`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..inputs.batch import Batch, request_arrays, request_contexts
from ..errors import InputError, NotModelled
from ..facts.fields import min_max, positive_int
from ..flashmla.calls import MAX_ROWS
from .forward import draft_tokens, forward_rows
from ..facts.knowledge import load
from ..facts.modes import Mode
from .base import BatchPlan, DerivedCall, Profile
from .shapes import QuietRules, prefill_shape_plan, ratio_lengths, shape_plan, step_plan
from .rules import precompute_for, precompute_formula, precompute_releases, release_tuple
from .versions import resolve_version
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())

NAME = "sglang-dsv4"


def _data() -> dict:
    return load("engines")["profiles"][NAME]


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(starts[i], starts[i] + counts[i])`` over i, without a Python loop."""
    n = int(counts.sum()) if counts.shape[0] else 0
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.cumsum(counts) - counts          # position of each request's first row
    return np.repeat(starts - first, counts) + np.arange(n, dtype=np.int64)


def causal_lengths(batch: Batch, rows: int) -> np.ndarray:
    """Per query row, the number of KV tokens it attends to (causal), in row order.

    Request by request: a target-verify request has ``draft`` rows attending to ``context_len ..
    context_len + draft - 1`` tokens; a decode entry one row attending to ``context_len``; an extend
    request one row per new token, attending to ``prefix + 1 .. prefix + n``. Merged running decodes
    follow; rows the engine pads with are 0.
    """
    mode = batch.forward_mode
    if mode.is_decode():                 # one row per entry: its context
        arr = request_contexts(batch.requests)
    elif mode.is_target_verify():        # d rows per request: context .. context + d - 1
        ctx = request_contexts(batch.requests)
        arr = (ctx[:, None] + np.arange(draft_tokens(batch), dtype=np.int64)).reshape(-1)
    else:
        d = draft_tokens(batch)
        ext, pre, ctx, is_dec = request_arrays(batch.requests)
        n_ext = np.where(ext > 0, ext, d) if mode.is_draft_extend() else ext
        starts = np.where(is_dec, ctx, pre + 1)
        counts = np.where(is_dec, 1, n_ext)
        arr = _ranges(starts, counts)
    if batch.mixed:
        arr = np.concatenate([arr, np.array([r.context_len for r in batch.running], dtype=np.int64)])
    if arr.shape[0] < rows:
        arr = np.concatenate([arr, np.zeros(rows - arr.shape[0], dtype=np.int64)])
    return arr


def heads_per_rank(batch: Batch, defaults: dict) -> int:
    """Query heads per attention rank: ``model.h_q``, or the model's heads over the attention TP
    degree padded to 64, or the profile's default."""
    m = batch.model
    if "h_q" in m:
        return positive_int(m["h_q"], "model.h_q")
    if "num_attention_heads" in m:
        n = positive_int(m["num_attention_heads"], "model.num_attention_heads")
        tp = int(batch.arg("tp_size", 1) or 1)
        attn_tp = max(tp // batch.attn_dp_size(), 1)
        per = -(-n // attn_tp)
        return -(-per // 64) * 64
    return defaults["h_q"]




@dataclass(frozen=True)
class Dsv4Setup:
    """What a DeepSeek-V4 forward's calls depend on besides the step: the per-ratio call shapes
    (planned once, with their silent shape-only rules), the scheduler's row limit and the routing
    threshold."""

    h_q: int
    threshold: int | None
    max_rows: int
    # per compression ratio: (name, ratio, extra_topk or None, shape plan, silent shape-only rules
    # with per-row lengths, and without)
    calls: tuple
    # the same calls as sparse-prefill calls, for forwards routed to flash_mla_sparse_fwd: (shape plan,
    # the rules its calls skip)
    prefill: tuple
    draft_tokens: int
    version: str
    kernel: str | None          # the FlashMLA build the calls run on
    # SGLang 0.5.23 on: the sparse-prefill switch (None: the version has none), the tokens of a
    # late-layer tail per request (None: no tails), the KV layout and the decode kernel's half, and
    # the engine's schedule precompute of each decode-kernel call (None: it does not run)
    switch: bool | None = None
    tail_tokens: int | None = None
    kv_layout: str | None = None
    use_legacy: bool | None = None
    precompute: tuple | None = None    # (data, num_sm_parts) when the engine computes the schedule
    excluded: str | None = None        # why no extend goes to sparse prefill in this configuration (None: routing applies)
    # steps of this configuration that run a path the profile does not model: per span, the modes,
    # the most rows it takes (None: any rows) and its record (see :func:`unmodelled_steps`)
    unmodelled: tuple = ()


def _precompute_data(release: str) -> dict:
    return next(r for r in precompute_releases() if r["release"] == release)


@lru_cache(maxsize=256)
def _setup(gpu, build: str | None, h_q: int, context_length: int, threshold: int | None, draft: int,
           version: str, switch: bool | None = None, tail_tokens: int | None = None, kv_layout: str | None = None,
           use_legacy: bool | None = None, precompute: str | None = None, excluded: str | None = None) -> Dsv4Setup:
    prof = _data()
    dflt = prof["defaults"]
    d_qk, topk = dflt["d_qk"], dflt["swa_topk"]
    probe = shape_plan(gpu, build, h_q, d_qk, topk, None, dflt["page"], None, "", use_legacy)
    c128_width = -(-(-(-context_length // 128)) // 64) * 64
    calls, prefill = [], []
    for spec in prof["calls"]:
        r = spec["ratio"]
        extra_topk = extra_page = None
        if r == 4:
            extra_topk, extra_page = dflt["c4_extra_topk"], dflt["c4_extra_page"]
        elif r == 128:
            extra_topk, extra_page = c128_width, dflt["c128_extra_page"]
        shape = shape_plan(gpu, build, h_q, d_qk, topk, extra_topk, dflt["page"], extra_page, spec["name"], use_legacy)
        calls.append((spec["name"], r, extra_topk, shape, QuietRules(shape, True, extra_topk is not None),
                      QuietRules(shape, False, False)))
        pre = prefill_shape_plan(gpu, build, h_q, d_qk, topk + (extra_topk or 0), spec["name"])
        prefill.append((pre, QuietRules(pre, False, False)))
    pre = None
    if precompute is not None:
        pre = (_precompute_data(precompute), max(gpu.num_sms // 1, 1))   # num_sm_parts = SMs // s_q, and s_q is 1
    return Dsv4Setup(h_q, threshold, probe.max_sched_rows, tuple(calls), tuple(prefill), draft, version, build,
                     switch, tail_tokens, kv_layout, use_legacy, pre, excluded)


def _version_data(label: str) -> dict:
    """The resolved version a setup was made for, by its label (a known release, else the entry's name)."""
    return resolve_version(NAME, label)


def version_label(version: dict) -> str:
    return version.get("release") or version["name"]


def context_parallel(batch: Batch, version: dict) -> dict | None:
    """The version's context-parallelism facts when the batch's server runs prefill context parallelism."""
    cp = version.get("context_parallel")
    if cp is None or not batch.arg(cp["setting"], False):
        return None
    return cp


def sparse_prefill_excluded(batch: Batch, version: dict) -> str | None:
    """Why no extend forward of this batch goes to ``flash_mla_sparse_fwd`` in this version, whatever its
    rows (None: the routing applies): the GPU's architecture or context parallelism is left out."""
    if batch.gpu.cc[0] in version.get("sparse_prefill_archs_excluded", []):
        return f"SM{batch.gpu.cc[0]}0 GPUs are left out of sparse prefill in this release"
    cp = context_parallel(batch, version)
    if cp is not None and cp.get("never_routed"):
        return "a context-parallel extend forward never goes to sparse prefill in this release"
    return None


def sparse_prefill_switch(batch: Batch, version: dict) -> bool | None:
    """The state of the version's switch that sends every non-speculative extend forward to
    ``flash_mla_sparse_fwd`` (its default unless set); None when the version has no such switch."""
    sw = version.get("sparse_prefill_switch")
    if sw is None:
        return None
    cp = context_parallel(batch, version)
    if cp is not None and cp.get("switch_off") and batch.model.get("model_type") not in cp.get("switch_kept_for_models", []):
        return False                # the engine's DeepSeek-V4 hook turns it off under context parallelism
    v = batch.arg(sw["setting"])
    return bool(sw["default"]) if v is None else bool(v)


def late_layer_tail_tokens(batch: Batch, version: dict) -> int | None:
    """Tokens per request that the late layers run over (decoder SWA bounded replay), None when the
    forward has no late-layer tail: the setting, or its default for the models it is on for."""
    tails = version.get("late_layer_tails")
    if tails is None:
        return None
    v = batch.arg(tails["setting"])
    on = batch.model.get("model_type") in tails["default_on_models"] if v is None else bool(v)
    return int(tails["tail_tokens"]) if on else None


def kv_layout(batch: Batch, version: dict) -> tuple[str | None, bool | None]:
    """The KV layout a forward runs with and the decode kernel's ``use_legacy`` it implies
    (``(None, None)``: the version has no layout setting; the build's default half runs)."""
    kl = version.get("kv_layouts")
    if kl is None:
        return None, None
    name = str(batch.arg(kl["setting"]) or kl["default"]).lower()
    spec = kl["layouts"].get(name)
    if spec is None:
        raise InputError(f"server_args.{kl['setting']}", f"expected one of {', '.join(kl['layouts'])}, got {name!r}")
    same = spec.get("same_as")
    if same is not None:
        name = same.get(str(batch.gpu.cc[0]), same["other"])
        spec = kl["layouts"][name]
    return name, bool(spec["use_legacy"])


def _precompute_runs(batch: Batch, version: dict, h_q: int) -> str | None:
    """The release whose schedule precompute (a JIT kernel of SGLang's) runs for this configuration
    (None: none runs). A version entry that spans releases whose precompute differs, named without
    a release number, is an :class:`InputError` for the configurations the precompute would run for."""
    data = load("engines")["profiles"][NAME].get("sched_precompute")
    if (data is None or batch.model.get("model_type") not in data["models"]
            or batch.gpu.cc[0] not in data["cc_majors"] or h_q != data["h_q"]):
        return None
    kind, pre = precompute_for(version)
    if kind == "ambiguous":
        rels = [r["min_release"] for r in data["releases"]]
        span = "..".join(x or "" for x in (version.get("min_release"), version.get("max_release")))
        raise InputError("engine", f"sglang-dsv4@{version['name']} stands for releases {span}, whose schedule "
                                   f"precompute differs (none before {rels[0]}; from {rels[0]} each release its own: "
                                   f"{', '.join(rels)}): name the release, e.g. sglang-dsv4@{rels[-2] if len(rels) > 1 else rels[0]}")
    return None if pre is None else pre["release"]


def unmodelled_path(batch: Batch, version: dict) -> NotModelled | None:
    """The reason this configuration's attention runs a path the profile does not model (SGLang's
    SM120 kernels, another DeepSeek-V4 attention backend), or None."""
    spec = _data().get("unmodelled_paths") or {}
    sm120 = spec.get("sm120")
    if sm120 is not None and batch.gpu.cc[0] in sm120["cc_majors"]:
        return NotModelled("gpu", sm120["path"], f"{batch.gpu.name} is SM{batch.gpu.cc[0]}{batch.gpu.cc[1]}")
    ab = spec.get("attention_backend")
    if ab is None:
        return None
    given = batch.arg(ab["setting"])
    name = str(given or ab["default"]).strip().lower()
    if name == "auto":
        name = _auto_backend(batch, version, ab)
        how = f"{ab['setting']} auto resolves to {name}"
    else:
        how = f"{ab['setting']} {name}"
    if name in ab["modelled"]:
        return None
    path = ab["paths"].get(name, f"the {name} DeepSeek-V4 attention backend")
    return NotModelled(f"server_args.{ab['setting']}", path, how)


def _release(version: dict) -> str | None:
    """The release a resolved version stands for (None: an entry that names none)."""
    return version.get("matched_release") or version.get("release") or version.get("min_release")


def attention_tp(batch: Batch) -> int:
    """The attention tensor-parallel width: ``tp_size`` over the attention context- and data-parallel widths."""
    tp = int(batch.arg("tp_size", 1) or 1)
    cp = int(batch.arg("attn_cp_size", 1) or 1)
    return max(tp // max(cp * batch.attn_dp_size(), 1), 1)


def _span_for(spec: dict, rel: str | None) -> dict | None:
    """The release entry of a step spec whose range holds ``rel`` (None: none does)."""
    if rel is None:
        return None
    key = release_tuple(rel)
    for r in spec.get("releases", [spec]):
        lo, hi = r.get("min_release"), r.get("max_release")
        if (lo is None or key >= release_tuple(lo)) and (hi is None or key <= release_tuple(hi)):
            return r
    return None


def unmodelled_steps(batch: Batch, version: dict) -> tuple:
    """The steps of this configuration that run a path the profile does not model, as spans
    ``(modes, max_rows, record)``: a step of one of ``modes`` with ``1..max_rows`` query rows
    (``max_rows`` None: any rows) is judged "not modelled" with ``record`` (``path``, ``why``,
    ``field``, ``source``, ``release``). Which steps reach them depends on the step, so the
    configuration itself is checked as usual (``rules/engines.json`` ``unmodelled_steps``)."""
    spec = _data().get("unmodelled_steps") or {}
    rel = _release(version)
    out = []
    small = spec.get("small_decode")
    span = _span_for(small, rel) if small is not None else None
    if (span is not None and batch.model.get("model_type") in small["models"]
            and batch.gpu.cc[0] in small["cc_majors"]):
        layout = str(batch.arg(small["kv_layout_setting"]) or small["kv_layout_default"]).lower()
        heads = batch.model.get(small["heads_setting"])
        real = None if heads is None else positive_int(heads, f"model.{small['heads_setting']}") // attention_tp(batch)
        if layout in span["kv_layouts"] and (real is None or real in span["heads_per_rank"]):
            allowed = " or ".join(map(str, span["heads_per_rank"]))
            per = (f"{real} query heads per attention rank" if real is not None else
                   f"model.{small['heads_setting']} not given, so the heads per attention rank (the kernel takes "
                   f"{allowed}) are not known")
            why = (f"a {'/'.join(small['modes'])} step of 1..{span['max_rows']} query rows of {batch.model['model_type']} "
                   f"on {batch.gpu.name} (SM{batch.gpu.cc[0]}{batch.gpu.cc[1]}) with the {layout} KV layout and {per}")
            out.append((frozenset(small["modes"]), int(span["max_rows"]),
                        (("path", small["path"]), ("why", why), ("field", "forward_mode"),
                         ("source", f"sglang {rel} {span['lines']}"), ("release", rel), ("kind", "small_decode"))))
    cp = spec.get("context_parallel_extend")
    cp_span = _span_for(cp, rel) if cp is not None else None
    on = next((n for n in cp_span["settings"] if batch.arg(n, False)), None) if cp_span is not None else None
    if on is not None and int(batch.arg(cp["width_setting"], 0) or 0) != 1:
        width = batch.arg(cp["width_setting"])
        why = f"an extend step under {on} ({cp['width_setting']} {width if width is not None else 'not given'})"
        out.append((frozenset(cp["modes"]), None,
                    (("path", cp["path"]), ("why", why), ("field", f"server_args.{on}"),
                     ("source", f"sglang {rel} srt/layers/attention/deepseek_v4_backend.py:"
                                f"{cp['reindex_lines'].get(rel, '?')} (apply_cp_reindex)"),
                     ("release", rel), ("kind", "context_parallel_extend"))))
    return tuple(out)


def step_unmodelled(spans: tuple, mode, rows: int) -> dict | None:
    """The record of the first span that takes a step of ``mode`` with ``rows`` query rows (None: the step is modelled)."""
    for modes, top, record in spans:
        if mode in modes and 0 < rows and (top is None or rows <= top):
            return dict(record)
    return None


def _auto_backend(batch: Batch, version: dict, ab: dict) -> str:
    """What ``auto`` resolves to for this configuration: the release's rule when it has one."""
    auto = ab["auto"]
    rel = version.get("matched_release") or version.get("min_release")
    if rel is None or release_tuple(rel) < release_tuple(auto["min_release"]):
        return ab["modelled"][0]
    cache = batch.arg("kv_cache_dtype")
    layout = batch.arg("SGLANG_DSV4_KV_LAYOUT")
    if (batch.model.get("model_type") not in auto["models"] or batch.gpu.cc[0] not in auto["cc_majors"]
            or (cache if cache is None else str(cache).lower()) not in auto["kv_cache_dtypes"]
            or (layout if layout is None else str(layout).lower()) not in auto["kv_layouts"]):
        return ab["modelled"][0]
    if auto.get("not_with_attention_tp_outside_pd"):
        pd = str(batch.arg("disaggregation_mode") or "null").lower() not in ("null", "none", "")
        tp = int(batch.arg("tp_size", 1) or 1)
        cp = int(batch.arg("attn_cp_size", 1) or 1)
        attn_tp = max(tp // max(cp * batch.attn_dp_size(), 1), 1)
        if not pd and attn_tp > 1 and not batch.arg("enable_prefill_cp", False):
            return ab["modelled"][0]
    return auto["to"]


def precompute_smem(data: dict, b: int, parts: int) -> int:
    """Dynamic shared memory of the engine's schedule precompute for ``b`` rows and ``parts``
    partitions, in bytes (what its guard compares with its budget)."""
    return precompute_formula(data)(b=b, P=parts)


def _routing_reason(mode: Mode, rows: int, threshold: int | None, routed: bool, switch: bool | None = None) -> str:
    if routed and switch:
        return (f"extend forward with {rows} rows: sent to flash_mla_sparse_fwd "
                f"(SGLANG_OPT_FLASHMLA_SPARSE_PREFILL on: every non-speculative extend forward)")
    if routed:
        return f"extend forward with {rows} rows > threshold {threshold}: sent to flash_mla_sparse_fwd"
    if threshold is None:
        return "this version sends every forward to flash_mla_with_kvcache (no sparse-prefill routing)"
    if not mode.is_routable():
        return f"{mode} forwards are never routed: they go to flash_mla_with_kvcache"
    off = " (SGLANG_OPT_FLASHMLA_SPARSE_PREFILL off)" if switch is False else ""
    return f"{rows} rows <= threshold {threshold}{off}: sent to flash_mla_with_kvcache"


def routing_threshold(setup: Dsv4Setup) -> int | None:
    """Extend forwards with more query rows than this go to ``flash_mla_sparse_fwd`` (None: never).
    With the version's sparse-prefill switch on every extend forward does: 0; where the release leaves
    the configuration out of sparse prefill (an SM120 GPU, context parallelism), none does."""
    if setup.excluded:
        return None
    return 0 if setup.switch else setup.threshold


def tail_rows(batch: Batch, tail_tokens: int) -> np.ndarray:
    """Per query row of the late-layer tail, its causal length, in row order: each extend request's
    last ``min(tail_tokens, extend)`` tokens, one row per decode entry and merged running decode."""
    ext, pre, ctx, is_dec = request_arrays(batch.requests)
    counts = np.where(is_dec, 1, np.minimum(ext, tail_tokens))
    starts = np.where(is_dec, ctx, pre + ext - counts + 1)
    arr = _ranges(starts, counts)
    if batch.mixed:
        arr = np.concatenate([arr, np.array([r.context_len for r in batch.running], dtype=np.int64)])
    return arr


def routing_release() -> tuple[str, int] | None:
    """The first version of this profile with sparse-prefill routing and its threshold (data)."""
    for v in _data()["versions"]:
        if v.get("sparse_prefill_threshold") is not None:
            return v.get("min_release") or v["name"], v["sparse_prefill_threshold"]
    return None


class Dsv4Profile(Profile):
    name = NAME
    provides = frozenset({"rows"})
    # per-row lengths are min(causal length, width) of non-negative causal lengths
    guarantees = frozenset({"lengths"})

    def setup(self, batch: Batch, version: dict, build: str | None) -> Dsv4Setup:
        refused = unmodelled_path(batch, version)
        if refused is not None:
            raise refused
        build = build or version.get("kernel_build")    # the build this engine version ships
        dflt = _data()["defaults"]
        ctx = int(batch.arg("context_length") or batch.model.get("context_length") or dflt["context_length"])
        h_q = heads_per_rank(batch, dflt)
        layout, use_legacy = kv_layout(batch, version)
        s = _setup(batch.gpu, build, h_q, ctx, version.get("sparse_prefill_threshold"), draft_tokens(batch),
                   version_label(version), sparse_prefill_switch(batch, version),
                   late_layer_tail_tokens(batch, version), layout, use_legacy, _precompute_runs(batch, version, h_q),
                   sparse_prefill_excluded(batch, version) if version.get("sparse_prefill_threshold") is not None else None)
        spans = unmodelled_steps(batch, version)
        return replace(s, unmodelled=spans) if spans else s

    def derive(self, batch: Batch, version: dict, setup: Dsv4Setup, bp: BatchPlan, build: str | None,
               memo=None) -> None:
        """The step's FlashMLA calls: query rows, routing, per-row lengths and one plan per ratio."""
        dflt = _data()["defaults"]
        rows, bd = forward_rows(batch)
        threshold = routing_threshold(setup)
        mode = batch.forward_mode
        routed = mode.is_routable() and threshold is not None and rows > threshold
        bp.rows, bp.row_breakdown, bp.max_rows = rows, bd, setup.max_rows
        hit = step_unmodelled(setup.unmodelled, mode, rows) if setup.unmodelled and not bp.probe else None
        if hit is not None:     # the engine runs another kernel for this step: no FlashMLA call is derived
            bp.routing = {"threshold": threshold, "routed": False, "version": version["name"],
                          "reason": f"not modelled: the engine runs {hit['path']}"}
            if version.get("release"):
                bp.routing["release"] = version["release"]
            bp.unmodelled.append({"profile": NAME, **hit, "query_rows": rows})
            return
        bp.routing = {"threshold": threshold, "routed": routed,
                      "reason": (f"{setup.excluded}: sent to flash_mla_with_kvcache" if setup.excluded and mode.is_routable()
                                 else _routing_reason(mode, rows, threshold, routed, setup.switch)),
                      "version": version["name"]}
        if version.get("release"):
            bp.routing["release"] = version["release"]
        if setup.excluded:
            bp.routing["excluded"] = setup.excluded
        if setup.switch is not None:
            bp.routing["sparse_prefill_switch"] = setup.switch
        if setup.kv_layout is not None:
            bp.routing["kv_layout"] = setup.kv_layout
            bp.routing["use_legacy"] = setup.use_legacy
            spec = version["kv_layouts"]["layouts"][setup.kv_layout]
            if spec.get("needs_cc_major"):
                bp.routing["kv_layout_needs_cc_major"] = spec["needs_cc_major"]
        if setup.precompute is not None:
            bp.routing["sched_precompute"] = {"num_sm_parts": setup.precompute[1], "data": setup.precompute[0],
                                              "use_legacy": setup.use_legacy,
                                              "release": setup.precompute[0]["release"]}
        tail = setup.tail_tokens is not None and mode.is_routable()
        if routed:
            for shape, quiet in setup.prefill:
                p = step_plan(shape, rows, None, None, None, None, quiet.at(rows))
                bp.calls.append(DerivedCall(p.call.label, p.call, p, "sparse_prefill"))
            if tail:
                self._tail_call(batch, setup, bp, memo)
            return
        b = max(rows, 1)
        if bp.rows_only or not 0 < rows <= setup.max_rows:  # per-row lengths only matter when the scheduler runs
            for name, r, extra_topk, shape, _, quiet in setup.calls:
                p = step_plan(shape, b, None, None, memo, None, quiet.at(b))
                bp.calls.append(DerivedCall(name, p.call, p, "decode_kernel"))
            if tail:
                self._tail_call(batch, setup, bp, memo)
            return
        lengths = causal_lengths(batch, rows)
        topk = dflt["swa_topk"]
        topk_length = np.minimum(lengths, topk)
        lo, hi = min_max(lengths)
        tl_range = (min(lo, topk), min(hi, topk))
        for name, r, extra_topk, shape, quiet, _ in setup.calls:
            extra_len, ranges = ratio_lengths(lengths, lo, hi, tl_range, r, extra_topk)
            p = step_plan(shape, b, topk_length, extra_len, memo, ranges, quiet.at(b))
            bp.calls.append(DerivedCall(name, p.call, p, "decode_kernel"))
        if tail:
            self._tail_call(batch, setup, bp, memo)

    @staticmethod
    def _tail_call(batch: Batch, setup: Dsv4Setup, bp: BatchPlan, memo) -> None:
        """The late layers' call over the forward's late-layer tail: the SWA (ratio-0) shape on
        ``flash_mla_with_kvcache``, one row per tail token (the tail's own metadata turns sparse
        prefill off)."""
        topk = _data()["defaults"]["swa_topk"]
        spec = _version_data(setup.version)["late_layer_tails"]
        name, _, _, shape, quiet, quiet_plain = next(c for c in setup.calls if c[0] == spec["call"])
        lengths = tail_rows(batch, setup.tail_tokens)
        b = int(lengths.shape[0])
        if bp.rows_only or not 0 < b <= setup.max_rows:
            p = step_plan(shape, max(b, 1), None, None, memo, None, quiet_plain.at(max(b, 1)))
        else:
            lo, hi = min_max(lengths)
            p = step_plan(shape, b, np.minimum(lengths, topk), None, memo,
                          {"topk_length": (min(lo, topk), min(hi, topk))}, quiet.at(b))
        label = f"late-layer tail ({name})"
        bp.calls.append(DerivedCall(label, p.call, p, "decode_kernel"))
        bp.routing["late_layer_tail_rows"] = b

    def bound_hints(self, setup: Dsv4Setup, bp: BatchPlan) -> dict:
        # a late-layer tail's rows depend on how the tokens are spread over requests, not on their
        # count: routed forwards with tails take the full check
        return {"max_rows": setup.max_rows, "threshold": routing_threshold(setup),
                "routed_by_rows": setup.tail_tokens is None,
                "unmodelled": tuple((modes, top) for modes, top, _ in setup.unmodelled)}

    def prevention(self, batch: Batch, bp: BatchPlan, bounds) -> list[dict]:
        if bp.rows is None or bounds.max_rows is None:
            return []
        L = bounds.max_rows
        mode = batch.forward_mode
        out: list[dict] = []
        version_switch = bp.routing.get("sparse_prefill_switch")
        if mode.is_routable() and version_switch:
            tail = bp.routing.get("late_layer_tail_rows")
            if tail is not None and tail > L:
                per = _version_data(bp.routing.get("release") or bp.routing["version"])["late_layer_tails"]["tail_tokens"]
                out.append({"flag": "--prefill-max-requests", "value": max(L // per, 1),
                            "why": f"a late-layer tail has up to {per} rows per request and runs flash_mla_with_kvcache: "
                                   f"{L} // {per}"})
                out.append({"flag": "--no-enable-decoder-swa-bounded-replay", "value": True,
                            "why": "without late-layer tails every layer of an extend forward runs flash_mla_sparse_fwd"})
            return out
        if mode.is_routable():
            if batch.arg("enable_mixed_chunk", False) or mode.is_mixed():
                R = int(batch.arg("max_running_requests") or len(batch.running) or 0)
                cap = {"flag": "--chunked-prefill-size", "value": L - R,
                       "why": f"with mixed chunking up to {R} running decodes join each prefill: {L} - {R}"}
            else:
                cap = {"flag": "--chunked-prefill-size", "value": L,
                       "why": f"bounds the query rows of every extend forward to the decode kernel's {L}"}
            out.extend(_within_configured(batch, cap, "chunked_prefill_size"))
            out.extend(_within_configured(batch, {"flag": "--max-prefill-tokens", "value": L,
                                                  "why": "keeps a prefill batch's new tokens within the limit"},
                                          "max_prefill_tokens"))
            thr = bp.routing.get("threshold")
            if version_switch is False:
                out.append({"flag": "(environment)", "value": "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=1",
                            "why": "the switch's default: every non-speculative extend forward goes to flash_mla_sparse_fwd"})
            if thr is not None:
                out.append({"flag": "(engine)", "value": f"route at > {L} rows instead of > {thr}",
                            "why": f"the routing threshold {thr} is above the decode kernel's real limit {L}"})
            elif not bp.routing.get("excluded"):
                rel = routing_release()
                if rel is not None:
                    out.append({"flag": "(upgrade)", "value": f"SGLang {rel[0]} or later (sparse-prefill routing)",
                                "why": f"routes extend forwards above {rel[1]} rows to flash_mla_sparse_fwd; "
                                       f"{L + 1}..{rel[1]} still crash"})
        elif mode.is_target_verify():
            d = draft_tokens(batch) or 1
            out.append({"flag": "--max-running-requests", "value": L // d,
                        "why": f"a verify forward has batch size x {d} draft tokens rows"})
        else:
            out.append({"flag": "--max-running-requests", "value": L, "why": "a decode forward has one row per request"})
        return out

    def context(self, bp: BatchPlan) -> dict:
        ctx = self.rows_context(bp)
        if ctx:
            ctx["max_decode_kernel_rows"] = bp.max_rows
        return ctx

    def summary_lines(self, bp: BatchPlan) -> list[str]:
        if bp.rows is None:
            return []
        parts = " + ".join(f"{v} {k.replace('_', ' ')}" for k, v in bp.row_breakdown.items() if v)
        limit = (f"decode-kernel limit {bp.max_rows} rows" if bp.max_rows is None or bp.max_rows < MAX_ROWS
                 else "no decode-kernel row limit on this build")
        lines = [f"  FlashMLA query rows b = {bp.rows} ({parts or 'no new tokens'}); {limit}",
                 f"  routing: {bp.routing['reason']}"]
        if bp.rows == 0:
            lines.append("  (no query rows: the calls below are planned with b = 1, the least a call can have)")
        for c in bp.calls:
            extra = f", num_sm_parts {c.plan.num_sm_parts}" if c.plan.num_sm_parts else ""
            lines.append(f"    {c.name}: {c.kernel} {c.call.summary()}{extra}")
        return lines


def _within_configured(batch: Batch, advice: dict, setting: str) -> list[dict]:
    """A cap on a setting, never above what is configured: nothing when the configured value is
    already at or below the cap (raising it would not help)."""
    have = batch.arg(setting)
    if isinstance(have, int) and not isinstance(have, bool) and 0 < have <= advice["value"]:
        return []
    return [advice]


PROFILE = Dsv4Profile()
