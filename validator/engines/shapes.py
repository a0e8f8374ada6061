"""DeepSeek-V4 decode-call shapes, shared by the engine profiles that derive such calls every step
(``sglang-dsv4``, ``vllm-dsv4``).

A shape is a sparse FlashMLA decode call of one row: ``plan`` picks its implementation and
partitions from the shape and the GPU alone, never from ``b`` or the per-row lengths, so a step's
calls are that plan with their rows put in (:func:`step_plan`). What a shape's calls skip is asked
of the rules once per shape (:class:`QuietRules`): the shape-only rules that find nothing for it,
and the rows rules up to the rows at which each starts to find something.

A sparse-prefill call (``flash_mla_sparse_fwd``) of these profiles is planned the same way: its
shape is the call of one query row (:func:`prefill_shape_plan`), its rows are ``s_q``.

A one-shot check of any sparse decode call (``validate_batch.check(record)``) takes its plan from
the same pieces (:func:`call_plan`): the plan of the call's shape, made once per shape, with the
call put in, carrying the shape-only rules silent for the shape.
"""
from __future__ import annotations

from dataclasses import fields, replace
from functools import lru_cache

from ..errors import InputError
from ..facts.knowledge import generation
from ..flashmla.calls import MAX_ROWS, DecodeCall, SparsePrefillCall
from ..flashmla.plan import Plan, plan
from ..legality.ruleset import STATE as RULES
from ..legality.ruleset import rows_rules, shape_rules, silent_rows
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


@lru_cache(maxsize=1024)
def shape_plan(gpu, build: str | None, h_q: int, d_qk: int, topk: int, extra_topk: int | None, page: int,
               extra_page: int | None, label: str, use_legacy: bool | None = None) -> Plan:
    """The plan of one DeepSeek-V4 decode-call shape (a call of one row), computed once per
    configuration; a step's calls of this shape reuse it (:func:`step_plan`)."""
    return plan(DecodeCall(kind="sparse", b=1, s_q=1, h_q=h_q, d_qk=d_qk, topk=topk, extra_topk=extra_topk,
                           page=page, extra_page=extra_page, label=label, use_legacy=use_legacy), gpu, build)


@lru_cache(maxsize=1024)
def prefill_shape_plan(gpu, build: str | None, h_q: int, d_qk: int, topk: int, label: str) -> Plan:
    """The plan of one sparse-prefill call shape (a call of one query row), computed once per
    configuration; a step's prefill calls of this shape are it with their ``s_q`` put in
    (:func:`step_plan` with no length arrays)."""
    return plan(SparsePrefillCall(s_q=1, h_q=h_q, d_qk=d_qk, topk=topk, label=label), gpu, build)


@lru_cache(maxsize=1024)
def shape_quiet(shape: Plan, has_topk_length: bool, has_extra_length: bool, revision: int) -> frozenset:
    """Codes of the shape-only rules that find nothing for calls of ``shape`` with these length
    arrays present: such a rule finds nothing for any ``b`` and any length values (see the registry),
    so the calls derived every step skip it (``revision``: the rule registry's, which they were
    asked at)."""
    one = np.zeros(1, dtype=np.int64)
    p = step_plan(shape, 1, one if has_topk_length else None, one if has_extra_length else None, quiet=frozenset())
    return frozenset(r.code for r in shape_rules() if not r.func(p))


@lru_cache(maxsize=1024)
def rows_edges(shape: Plan, revision: int) -> dict:
    """Per rows rule (:func:`~validate_batch.legality.registry.rows_rules`), the most rows for which
    it finds nothing on calls of ``shape`` (0: it finds something at one row), asked of the rule
    itself (``revision``: the rule registry's). A rows rule reads no per-row length, so the calls
    asked carry none, and the edges hold whichever length arrays a step's call carries."""
    plans: dict = {}

    def plan_at(b: int) -> Plan:        # (one plan per row count, shared by the rules asked of it)
        p = plans.get(b)
        if p is None:
            p = plans[b] = step_plan(shape, b, None, None, quiet=frozenset())
        return p

    hint = shape.fast_sched_rows if shape.is_decode else None
    return {r.code: silent_rows(r.func, plan_at, hint, MAX_ROWS) for r in rows_rules()}


#: a call's fields that depend on its rows (or only name it): every other field is its shape
_PER_ROW = frozenset({"b", "topk_length", "extra_topk_length", "seqlens", "block_table", "num_blocks", "label", "meta"})
SHAPE_FIELDS = tuple(f.name for f in fields(DecodeCall) if f.name not in _PER_ROW)
#: (GPU, build, the call's shape fields) -> the plan of that shape's call of one row
_CALL_SHAPES: dict = {}


def call_plan(call, gpu, build: str | None) -> Plan:
    """``plan(call, gpu, build)`` (``gpu`` resolved), for a sparse decode call from the plan of its
    shape (any call of the same :data:`SHAPE_FIELDS` on the same GPU, build and generation facts: its
    implementation, partitions and shape facts, made once) with the call put in, carrying the shape-only rules
    silent for the shape (:func:`shape_quiet`), which :func:`~validate_batch.legality.registry.run_rules`
    then skips. Other calls, and calls with engine annotations (``meta``), are planned as they are."""
    if call.__class__ is not DecodeCall or call.kind != "sparse" or call.meta:
        return plan(call, gpu, build)
    d = call.__dict__
    try:
        # the generation's facts as they are read now (a shape planned from earlier ones is not reused;
        # the memo's plan holds its generation, so an id is not reused while it is kept)
        gen = generation(build, "sparse", call.use_legacy, gpu.arch)
        key = (gpu, build, id(gen), *[d[name] for name in SHAPE_FIELDS])
        shape = _CALL_SHAPES.get(key)
    except (TypeError, InputError):  # (a name or value plan() refuses: it says what is wrong with it)
        return plan(call, gpu, build)
    if shape is None:
        shape = plan(replace(call, b=1, topk_length=None, extra_topk_length=None, label=""), gpu, build)
        if len(_CALL_SHAPES) >= 1024:
            _CALL_SHAPES.clear()
        _CALL_SHAPES[key] = shape
    quiet = shape_quiet(shape, call.topk_length is not None, call.extra_topk_length is not None, RULES.revision)
    return shape.for_call(call, None, quiet)


class QuietRules:
    """The rules a call of one shape (and the length arrays it carries) skips at ``b`` rows
    (:meth:`at`): the shape-only rules silent for the shape, and the rows rules silent up to ``b``
    rows (each up to its edge, :func:`rows_edges`). Both are asked of the rules when first needed
    and again whenever the rule registry changes."""

    __slots__ = ("shape", "topk_length", "extra_length", "revision", "table", "base")

    def __init__(self, shape: Plan, has_topk_length: bool, has_extra_length: bool):
        self.shape, self.topk_length, self.extra_length = shape, has_topk_length, has_extra_length
        self.revision = None
        self.table: tuple = ()
        self.base = frozenset()

    def _refresh(self) -> None:
        rev = RULES.revision
        base = shape_quiet(self.shape, self.topk_length, self.extra_length, rev)
        edges = rows_edges(self.shape, rev)
        tops = sorted({e for e in edges.values() if e > 0})
        # at b rows (1 <= b <= top), the rules whose edge is at least top: one set per distinct edge
        self.table = tuple((top, base | frozenset(c for c, e in edges.items() if e >= top)) for top in tops)
        self.base, self.revision = base, rev

    def at(self, b: int) -> frozenset:
        """Codes of the rules that find nothing on this shape's call of ``b`` rows."""
        if self.revision != RULES.revision:
            self._refresh()
        if b >= 1:
            for top, quiet in self.table:
                if b <= top:
                    return quiet
        return self.base


def ratio_lengths(lengths, lo: int, hi: int, topk_range: tuple, ratio: int, extra_topk: int | None) -> tuple:
    """A compression ratio's per-row compressed lengths (``lengths // ratio`` clamped to
    ``extra_topk``; None for a call without them) and the exact ranges of its call's length arrays,
    given the rows' causal ``lengths``, their range ``lo..hi`` and that of the top-k lengths. Every
    length array is a non-decreasing function of the row's causal length, so its range follows from
    theirs."""
    if extra_topk is None:
        return None, {"topk_length": topk_range}
    extra = lengths // ratio
    if hi // ratio > extra_topk:       # (else no row reaches the width: nothing to clamp)
        np.minimum(extra, extra_topk, out=extra)
    return extra, {"topk_length": topk_range,
                   "extra_topk_length": (min(lo // ratio, extra_topk), min(hi // ratio, extra_topk))}


def step_plan(shape: Plan, b: int, topk_length, extra_topk_length, memo=None, ranges=None,
              quiet: frozenset | None = None) -> Plan:
    """``plan(call)`` for ``shape``'s call with ``b`` rows and these per-row lengths, without redoing
    the shape's work. ``ranges``: the exact ``(min, max)`` of the length arrays when known;
    ``quiet``: the rules that find nothing on this call (None: the shape-only rules silent for the
    shape, looked up)."""
    call = shape.call.with_rows(b, topk_length, extra_topk_length, ranges)
    if quiet is None:
        quiet = shape_quiet(shape, topk_length is not None, extra_topk_length is not None, RULES.revision)
    return shape.for_call(call, memo, quiet)
