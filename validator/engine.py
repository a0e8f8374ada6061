"""Engine profiles: turn a :class:`~validator.batch.Batch` into the kernel calls and slot-indexed
buffers one forward touches, then check them all.

* ``sglang-dsv4``: one FlashMLA call per compression ratio, ``b`` = query rows of the forward
  (one row per token), routed to ``flash_mla_sparse_fwd`` for large extend forwards in versions
  that have the routing.
* ``sglang-slots``: the request table's rows, the live slot domain, and every buffer indexed by
  ``req_pool_idx`` (DSA compression tails of the target and of the NextN draft, user buffers).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .batch import Batch, request_arrays, request_contexts
from .calls import DecodeCall, SparsePrefillCall, min_max, with_length_ranges
from .errors import InputError
from .knowledge import load
from .plan import Plan, plan
from .registry import run_rules, shape_rules
from .report import Finding, Report


def _vtuple(v: str) -> tuple[int, ...] | None:
    parts = v.lstrip("v").split(".")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        return None


@lru_cache(maxsize=None)
def resolve_version(profile: str, version: str | None) -> dict:
    """The version entry of a profile: by alias, by name, or by release number ranges."""
    prof = load("engines")["profiles"][profile]
    want = version or prof["default_version"]
    for v in prof["versions"]:
        if want == v["name"] or want in v.get("aliases", []):
            return v
    num = _vtuple(want)
    if num is not None:
        for v in prof["versions"]:
            lo, hi = v.get("min_release"), v.get("max_release")
            if (lo is None or num >= _vtuple(lo)) and (hi is None or num <= _vtuple(hi)):
                return {**v, "matched_release": want}
    names = [v["name"] for v in prof["versions"]] + [a for v in prof["versions"] for a in v.get("aliases", [])]
    raise InputError("engine", f"unknown version {want!r} of {profile}; known: {', '.join(names)} or a release number")


@dataclass
class DerivedCall:
    name: str
    call: DecodeCall | SparsePrefillCall
    plan: Plan
    route: str  # "decode_kernel" | "sparse_prefill"


@dataclass
class SlotBuffer:
    name: str
    rows: int
    owner: str                 # "target" | "draft" | "user"
    scope: str = "per_dp"      # rows sized per DP worker
    indexed_by: str = "req_pool_idx"
    width: int | None = None
    required_width: int | None = None
    sizing: str = ""

    def to_dict(self) -> dict:
        d = {"name": self.name, "rows": self.rows, "owner": self.owner, "scope": self.scope,
             "indexed_by": self.indexed_by, "sizing": self.sizing}
        if self.width is not None:
            d["width"] = self.width
        if self.required_width is not None:
            d["required_width"] = self.required_width
        return d


@dataclass
class SlotModel:
    max_running: int            # R per DP worker
    extra_slots: int            # E
    extra_slots_source: str
    table_rows: int             # T_rows
    pd_decode: bool
    draft_tokens: int
    buffers: list[SlotBuffer]

    def to_dict(self) -> dict:
        return {"max_running_requests_per_dp": self.max_running, "extra_slots": self.extra_slots,
                "extra_slots_source": self.extra_slots_source, "table_rows": self.table_rows,
                "live_slots": [1, self.table_rows - 1], "pd_decode": self.pd_decode,
                "draft_tokens": self.draft_tokens, "buffers": [b.to_dict() for b in self.buffers]}


@dataclass
class BatchPlan:
    """Everything the engine rules read about one forward, computed once."""

    batch: Batch
    versions: dict = field(default_factory=dict)
    rows: int | None = None                    # FlashMLA b of the forward (dsv4)
    row_breakdown: dict = field(default_factory=dict)
    calls: list[DerivedCall] = field(default_factory=list)
    routing: dict = field(default_factory=dict)
    max_decode_rows: int | None = None
    slots: SlotModel | None = None

    def to_dict(self) -> dict:
        d: dict = {"forward_mode": self.batch.forward_mode, "versions": self.versions}
        if self.rows is not None:
            d["query_rows"] = self.rows
            d["row_breakdown"] = self.row_breakdown
            d["max_decode_kernel_rows"] = self.max_decode_rows
            d["routing"] = self.routing
            d["kernel_calls"] = [
                {"name": c.name, "route": c.route, "kernel": "flash_mla_sparse_fwd" if c.route == "sparse_prefill"
                 else "flash_mla_with_kvcache", **_call_summary(c)} for c in self.calls]
        if self.slots is not None:
            d["slots"] = self.slots.to_dict()
        return d


class _RowCount:
    """Stands in for a per-row array in a call record: its ``tolist()`` is the summary text."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = n

    def tolist(self) -> str:
        return f"[{self.n} per-row values]"


def _call_summary(c: DerivedCall) -> dict:
    call = c.call
    if isinstance(call, DecodeCall) and (call.topk_length is not None or call.extra_topk_length is not None):
        # The record shows per-row arrays as a count; do not convert thousands of values to drop them.
        light = object.__new__(DecodeCall)
        light.__dict__.update(call.__dict__)
        for k in ("topk_length", "extra_topk_length"):
            v = light.__dict__[k]
            if v is not None:
                light.__dict__[k] = _RowCount(len(v))
        call = light
    rec = call.to_record()
    out = {"call": rec}
    if c.plan.num_sm_parts is not None:
        out["num_sm_parts"] = c.plan.num_sm_parts
        out["sched_smem_bytes"] = c.plan.sched_smem_bytes
    return out


# ----------------------------------------------------------------------------------- DSv4
def draft_tokens(batch: Batch) -> int:
    d = batch.arg("speculative_num_draft_tokens")
    return int(d) if d else 0


def forward_rows(batch: Batch) -> tuple[int, dict]:
    """Query rows ``T`` of the forward, with a breakdown per source."""
    mode = batch.forward_mode
    columns = hasattr(batch.requests, "arrays")  # a RequestColumns step: read its columns, build no objects
    if mode in ("extend", "mixed"):
        if columns:
            ext_a, _, _, is_dec = batch.requests.arrays()
            ext, dec_in = int(ext_a[~is_dec].sum()), int(is_dec.sum())
        else:
            ext = sum(r.extend_tokens for r in batch.requests if not r.is_decode)
            dec_in = sum(1 for r in batch.requests if r.is_decode)
        merged = len(batch.running) if batch.mixed else 0
        bd = {"extend_tokens": ext, "decode_rows_in_forward": dec_in, "merged_running_decodes": merged}
        total = ext + dec_in + merged
    elif mode == "decode":
        total = len(batch.requests)
        bd = {"decode_requests": total}
    elif mode == "target_verify":
        d = draft_tokens(batch)
        if d <= 0:
            raise InputError("server_args.speculative_num_draft_tokens", "missing: target_verify has batch size x draft tokens rows")
        total = len(batch.requests) * d
        bd = {"requests": len(batch.requests), "draft_tokens": d}
    else:  # draft_extend
        d = draft_tokens(batch)
        if columns:
            ext_a = batch.requests.arrays()[0]
            per_a = np.where(ext_a > 0, ext_a, d)
            if per_a.shape[0] and int(per_a.min()) <= 0:
                raise InputError("requests", "draft_extend needs extend_tokens per request or server_args.speculative_num_draft_tokens")
            total = int(per_a.sum())
        else:
            per = [r.extend_tokens or d for r in batch.requests]
            if any(p <= 0 for p in per):
                raise InputError("requests", "draft_extend needs extend_tokens per request or server_args.speculative_num_draft_tokens")
            total = sum(per)
        bd = {"requests": len(batch.requests), "tokens": total}
    if batch.padded_rows is not None and batch.padded_rows > total:
        bd["padding_rows"] = batch.padded_rows - total
        total = batch.padded_rows
    return total, bd


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(starts[i], starts[i] + counts[i])`` over i, without a Python loop."""
    total = int(counts.sum()) if counts.shape[0] else 0
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.cumsum(counts) - counts          # position of each request's first row
    return np.repeat(starts - first, counts) + np.arange(total, dtype=np.int64)


def causal_lengths(batch: Batch, total: int) -> np.ndarray:
    """Per query row, the number of KV tokens it attends to (causal), in row order.

    Request by request: a target-verify request has ``draft`` rows attending to ``context_len ..
    context_len + draft - 1`` tokens; a decode entry one row attending to ``context_len``; an extend
    request one row per new token, attending to ``prefix + 1 .. prefix + n``. Merged running decodes
    follow; rows the engine pads with are 0.
    """
    mode = batch.forward_mode
    if mode == "decode":                 # one row per entry: its context
        arr = request_contexts(batch.requests)
    elif mode == "target_verify":        # d rows per request: context .. context + d - 1
        ctx = request_contexts(batch.requests)
        arr = (ctx[:, None] + np.arange(draft_tokens(batch), dtype=np.int64)).reshape(-1)
    else:
        d = draft_tokens(batch)
        ext, pre, ctx, is_dec = request_arrays(batch.requests)
        n_ext = np.where(ext > 0, ext, d) if mode == "draft_extend" else ext
        starts = np.where(is_dec, ctx, pre + 1)
        counts = np.where(is_dec, 1, n_ext)
        arr = _ranges(starts, counts)
    if batch.mixed:
        arr = np.concatenate([arr, np.array([r.context_len for r in batch.running], dtype=np.int64)])
    if arr.shape[0] < total:
        arr = np.concatenate([arr, np.zeros(total - arr.shape[0], dtype=np.int64)])
    return arr


def heads_per_rank(batch: Batch, defaults: dict) -> int:
    m = batch.model
    if "h_q" in m:
        h = m["h_q"]
        if isinstance(h, bool) or not isinstance(h, int) or h <= 0:
            raise InputError("model.h_q", f"expected a positive integer, got {h!r}")
        return h
    if "num_attention_heads" in m:
        n = m["num_attention_heads"]
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise InputError("model.num_attention_heads", f"expected a positive integer, got {n!r}")
        tp = int(batch.arg("tp_size", 1) or 1)
        dp = int(batch.arg("dp_size", 1) or 1) if batch.arg("enable_dp_attention", False) else 1
        attn_tp = max(tp // dp, 1)
        per = -(-n // attn_tp)
        return -(-per // 64) * 64
    return defaults["h_q"]


@lru_cache(maxsize=1024)
def _shape_plan(gpu, kernel: str | None, h_q: int, d_qk: int, topk: int, extra_topk: int | None, page: int,
                extra_page: int | None, label: str) -> Plan:
    """The plan of a one-row sparse decode call of this shape.

    ``plan()`` picks the implementation and ``num_sm_parts`` from the call's shape (path, heads,
    head dimension, s_q) and the GPU, never from ``b`` or the per-row lengths, so a step's calls
    reuse these and only their rows change (see :func:`_decode_plan`).
    """
    return plan(DecodeCall(kind="sparse", b=1, s_q=1, h_q=h_q, d_qk=d_qk, topk=topk, extra_topk=extra_topk,
                           page=page, extra_page=extra_page, label=label), gpu, kernel)


@lru_cache(maxsize=1024)
def _shape_quiet(shape: Plan, has_topk_length: bool, has_extra_length: bool) -> frozenset:
    """Codes of the shape-only rules that find nothing for calls of ``shape`` with these length
    arrays present: they find nothing for any ``b`` and any length values (see the registry), so
    the calls derived every step skip them."""
    one = np.zeros(1, dtype=np.int64)
    p = _decode_plan(shape, 1, one if has_topk_length else None, one if has_extra_length else None, quiet=frozenset())
    return frozenset(r.code for r in shape_rules() if not r.func(p))


def _decode_plan(shape: Plan, b: int, topk_length, extra_topk_length, memo=None, ranges=None,
                 quiet: frozenset | None = None) -> Plan:
    """``plan(call)`` for ``shape``'s call with ``b`` rows and these per-row lengths, without redoing
    the shape's work: the same DecodeCall fields (dataclass fields only, no derived state) and the
    same implementation and partitions. ``ranges``: the exact ``(min, max)`` of the length arrays
    when the caller knows them (see :attr:`DecodeCall.length_ranges`). ``quiet``: the shape-only
    rules that are silent for this shape, which the rule pass then skips (None: look them up)."""
    call = object.__new__(DecodeCall)
    fields = call.__dict__
    fields.update(shape.call.__dict__)
    fields.pop("length_ranges", None)
    fields["b"] = b
    fields["topk_length"] = topk_length
    fields["extra_topk_length"] = extra_topk_length
    fields["meta"] = {}
    if ranges is not None:
        with_length_ranges(call, ranges)
    if quiet is None:
        quiet = _shape_quiet(shape, topk_length is not None, extra_topk_length is not None)
    p = object.__new__(Plan)      # the shape's plan with this call (its fields are already checked)
    p.__dict__.update(call=call, gpu=shape.gpu, gen=shape.gen, implementation=shape.implementation,
                      num_sm_parts=shape.num_sm_parts, memo=memo, quiet_rules=quiet)
    return p


@dataclass(frozen=True)
class _Dsv4Setup:
    """What a DeepSeek-V4 forward's calls depend on besides the step: the per-ratio call shapes
    (planned once, with their silent shape-only rules), the scheduler's row limit and the routing
    threshold. Built once per configuration (:func:`_dsv4_setup`)."""

    h_q: int
    threshold: int | None
    max_rows: int
    # per compression ratio: (name, ratio, extra_topk or None, shape plan, silent shape-only rules
    # with per-row lengths, and without)
    calls: tuple
    # the same calls as sparse-prefill plans, for forwards routed to flash_mla_sparse_fwd: (name, topk)
    prefill_topk: tuple


@lru_cache(maxsize=256)
def _dsv4_setup(gpu, kernel: str | None, h_q: int, context_length: int, threshold: int | None) -> _Dsv4Setup:
    prof = load("engines")["profiles"]["sglang-dsv4"]
    dflt = prof["defaults"]
    d_qk, topk = dflt["d_qk"], dflt["swa_topk"]
    probe = _shape_plan(gpu, kernel, h_q, d_qk, topk, None, 64, None, "")
    c128_width = -(-(-(-context_length // 128)) // 64) * 64
    calls, prefill = [], []
    for spec in prof["calls"]:
        r = spec["ratio"]
        extra_topk = extra_page = None
        if r == 4:
            extra_topk, extra_page = dflt["c4_extra_topk"], dflt["c4_extra_page"]
        elif r == 128:
            extra_topk, extra_page = c128_width, dflt["c128_extra_page"]
        shape = _shape_plan(gpu, kernel, h_q, d_qk, topk, extra_topk, dflt["page"], extra_page, spec["name"])
        calls.append((spec["name"], r, extra_topk, shape, _shape_quiet(shape, True, extra_topk is not None),
                      _shape_quiet(shape, False, False)))
        prefill.append((spec["name"], topk + (extra_topk or 0)))
    return _Dsv4Setup(h_q, threshold, probe.max_sched_rows, tuple(calls), tuple(prefill))


def dsv4_setup(batch: Batch, version: dict, kernel: str | None) -> _Dsv4Setup:
    """The DeepSeek-V4 profile's configuration part for this batch's GPU, model and server args."""
    dflt = load("engines")["profiles"]["sglang-dsv4"]["defaults"]
    ctx = int(batch.arg("context_length") or batch.model.get("context_length") or dflt["context_length"])
    return _dsv4_setup(batch.gpu, kernel, heads_per_rank(batch, dflt), ctx, version.get("sparse_prefill_threshold"))


def derive_dsv4(batch: Batch, version: dict, setup: _Dsv4Setup, bp: BatchPlan, kernel: str | None, memo=None) -> None:
    """The step's FlashMLA calls: query rows, routing, per-row lengths and one plan per ratio."""
    dflt = load("engines")["profiles"]["sglang-dsv4"]["defaults"]
    total, bd = forward_rows(batch)
    threshold = setup.threshold
    mode = batch.forward_mode
    routable = mode == "extend" or mode == "mixed"
    routed = routable and threshold is not None and total > threshold
    max_rows = setup.max_rows
    bp.rows, bp.row_breakdown, bp.max_decode_rows = total, bd, max_rows
    if routed:
        reason = f"extend forward with {total} rows > threshold {threshold}: sent to flash_mla_sparse_fwd"
    elif threshold is None:
        reason = "this version sends every forward to flash_mla_with_kvcache (no sparse-prefill routing)"
    elif not routable:
        reason = f"{mode} forwards are never routed: they go to flash_mla_with_kvcache"
    else:
        reason = f"{total} rows <= threshold {threshold}: sent to flash_mla_with_kvcache"
    bp.routing = {"threshold": threshold, "routed": routed, "reason": reason, "version": version["name"]}
    if routed:
        for name, topk in setup.prefill_topk:
            call = SparsePrefillCall(s_q=total, h_q=setup.h_q, d_qk=dflt["d_qk"], topk=topk, label=name)
            bp.calls.append(DerivedCall(name, call, plan(call, batch.gpu, kernel), "sparse_prefill"))
        return
    b = max(total, 1)
    if not 0 < total <= max_rows:  # per-row lengths only matter (and are only built) when the scheduler runs
        for name, r, extra_topk, shape, _, quiet in setup.calls:
            p = _decode_plan(shape, b, None, None, memo, None, quiet)
            bp.calls.append(DerivedCall(name, p.call, p, "decode_kernel"))
        return
    lengths = causal_lengths(batch, total)
    topk = dflt["swa_topk"]
    topk_length = np.minimum(lengths, topk)
    # every length array below is a non-decreasing function of the row's causal length, so its exact
    # range follows from the causal lengths' range
    lo, hi = min_max(lengths)
    tl_range = (min(lo, topk), min(hi, topk))
    for name, r, extra_topk, shape, quiet, _ in setup.calls:
        if extra_topk is None:
            extra_len, ranges = None, {"topk_length": tl_range}
        else:
            extra_len = np.minimum(lengths // r, extra_topk)
            ranges = {"topk_length": tl_range, "extra_topk_length": (min(lo // r, extra_topk), min(hi // r, extra_topk))}
        p = _decode_plan(shape, b, topk_length, extra_len, memo, ranges, quiet)
        bp.calls.append(DerivedCall(name, p.call, p, "decode_kernel"))


# ----------------------------------------------------------------------------------- slots
def _pos_int(v, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InputError(where, f"expected a non-negative integer, got {v!r}")
    return v


def derive_slots(batch: Batch, version: dict) -> SlotModel:
    """The request table and the buffers indexed by request slot (configuration only)."""
    prof = load("engines")["profiles"]["sglang-slots"]
    dflt = prof["defaults"]
    if batch.arg("max_running_requests") is None:
        raise InputError("server_args.max_running_requests", "missing (the request table is sized from it)")
    r_total = int(batch.arg("max_running_requests"))
    dp = int(batch.arg("dp_size", 1) or 1)
    attn_dp = dp if batch.arg("enable_dp_attention", False) else 1
    R = r_total // attn_dp
    pd_decode = str(batch.arg("disaggregation_mode", "null")).lower() == "decode"
    e_arg = batch.arg("disaggregation_decode_extra_slots")
    if not pd_decode:
        E, e_src = 0, "not a PD decode worker"
    elif e_arg is not None:
        E, e_src = int(e_arg), "--disaggregation-decode-extra-slots"
    else:
        lim = dflt["extra_slots_default_max_running"]
        E = dflt["extra_slots_default_factor"] * R if R <= lim else 0
        e_src = f"default: {dflt['extra_slots_default_factor']} x {R} (max_running_requests per DP <= {lim})" if R <= lim \
            else f"default: 0 (max_running_requests per DP {R} > {lim})"
    t_rows = R + E + 1
    d = draft_tokens(batch)
    index_kpool = _pos_int(batch.model.get("index_kpool", dflt["index_kpool"]), "model.index_kpool")
    tail_extra = batch.model.get("tail_extra_slots")
    width = index_kpool + (_pos_int(tail_extra, "model.tail_extra_slots") if tail_extra is not None else d)
    required = index_kpool + d
    buffers = [SlotBuffer("req_to_token (request table)", t_rows, "target", sizing=f"R + E + 1 = {R} + {E} + 1" if pd_decode else f"R + 1 = {R} + 1")]
    if batch.model.get("dsa_tails", True):
        buffers.append(SlotBuffer("target DSA compression tails (key, score)", t_rows + 1, "target", width=width,
                                  required_width=required, sizing=f"table rows + 1 = {t_rows} + 1 (hybrid builder)"))
        has_draft = d > 0 or str(batch.arg("speculative_algorithm", "") or "").upper() in ("NEXTN", "EAGLE", "EAGLE3", "MTP")
        if has_draft:
            if version.get("draft_tail_sizing") == "running_limit":
                rows, sizing = R + 1, f"max_running_requests + 1 = {R} + 1 (plain DSA builder given the scheduler limit)"
            else:
                rows, sizing = t_rows + 1, f"table rows + 1 = {t_rows} + 1 (builder given the shared table's rows)"
            buffers.append(SlotBuffer("NextN draft DSA compression tails (key, score)", rows, "draft", width=width,
                                      required_width=required, sizing=sizing))
    for i, ub in enumerate(batch.buffers):
        where = f"buffers[{i}]"
        if not isinstance(ub, dict) or "name" not in ub:
            raise InputError(where, "expected {name, rows | rows_from, scope, indexed_by}")
        if "rows" in ub:
            rows = _pos_int(ub["rows"], f"{where}.rows")
            sizing = "given"
        else:
            src = ub.get("rows_from")
            base = {"running_limit": R, "table_rows": t_rows, "running_limit_total": r_total}.get(src)
            if base is None:
                raise InputError(f"{where}.rows_from", f"expected running_limit, table_rows or running_limit_total, got {src!r}")
            plus = _pos_int(ub.get("plus", 0), f"{where}.plus")
            rows, sizing = base + plus, f"{src} + {plus} = {base} + {plus}"
        scope = ub.get("scope", "per_dp")
        indexed_by = ub.get("indexed_by", "req_pool_idx")
        if scope not in ("per_dp", "global") or indexed_by not in ("req_pool_idx", "global_slot"):
            raise InputError(where, "scope must be per_dp|global and indexed_by req_pool_idx|global_slot")
        buffers.append(SlotBuffer(str(ub["name"]), rows, "user", scope, indexed_by, sizing=sizing))
    return SlotModel(R, E, e_src, t_rows, pd_decode, d, buffers)


# ----------------------------------------------------------------------------------- checking
@dataclass(frozen=True)
class EngineSetup:
    """What :func:`plan_batch` derives from a batch's configuration alone (profiles and their
    versions, GPU, model, server args, buffers): a :class:`validator.Checker` builds it once and
    passes it with every step of that configuration."""

    versions: tuple                     # (profile, version label) in profile order
    dsv4: tuple | None = None           # (version entry, _Dsv4Setup)
    slots: SlotModel | None = None      # read-only: shared by every step's plan


def engine_setup(batch: Batch, kernel: str | None = None) -> EngineSetup:
    versions, dsv4, slots = [], None, None
    for name, ver in batch.profiles:
        v = resolve_version(name, ver)
        versions.append((name, v.get("matched_release", v["name"]) if ver else v["name"]))
        if name == "sglang-dsv4":
            dsv4 = (v, dsv4_setup(batch, v, kernel))
        elif name == "sglang-slots":
            slots = derive_slots(batch, v)
    return EngineSetup(tuple(versions), dsv4, slots)


def plan_batch(batch: Batch, kernel: str | None = None, memo=None, setup: EngineSetup | None = None) -> BatchPlan:
    """Derive every kernel call and slot buffer of the forward. ``memo``: a
    :class:`~validator.schedule.WalkMemo` to reuse schedule walks across steps (a Checker's own);
    ``setup``: :func:`engine_setup` of this batch's configuration, when the caller keeps it."""
    if setup is None:
        setup = engine_setup(batch, kernel)
    bp = BatchPlan(batch, dict(setup.versions))
    if setup.dsv4 is not None:
        derive_dsv4(batch, setup.dsv4[0], setup.dsv4[1], bp, kernel, memo)
    bp.slots = setup.slots
    return bp


def _merge_call_findings(bp: BatchPlan) -> list[Finding]:
    """Run the kernel rules on every derived call; one finding per distinct message, naming all calls."""
    merged: dict[tuple, list] = {}
    order = []
    for dc in bp.calls:
        for f in run_rules("call", dc.plan):
            key = (f.code, f.message)
            if key not in merged:
                merged[key] = [f, []]
                order.append(key)
            merged[key][1].append(dc.name)
    out = []
    for key in order:
        f, names = merged[key]
        subj = f"FlashMLA call(s) {', '.join(names)} of this {bp.batch.forward_mode} forward"
        out.append(Finding(f.code, f.severity, f.message, subj, f.numbers, f.fix, f.failure, f.source))
    return out


def check_engine_batch(batch: Batch, kernel: str | None = None, split: bool = True, memo=None,
                       setup: EngineSetup | None = None) -> Report:
    bp = plan_batch(batch, kernel, memo, setup)
    findings = _merge_call_findings(bp) + run_rules("batch", bp)
    report = Report(findings, [c.plan for c in bp.calls])
    report.defer_context(lambda: {"kind": "batch", "batch": {"label": batch.label, "gpu": batch.gpu.to_dict(),
                                                             "requests": len(batch.requests),
                                                             "running": len(batch.running)},
                                  **bp.to_dict()})
    report.batch_plan = bp
    if split and not report.legal:
        from .split import safe_split

        report.safe_split = safe_split(batch, report, kernel)
    return report
