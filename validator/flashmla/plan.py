"""Plan one kernel call: which FlashMLA implementation runs, its partitions, schedule and buffers.

"Plan once, check many": every rule reads the :class:`Plan`; nothing here decides legality.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..facts.formula import Formula, formula_field
from ..facts.knowledge import GPU, build_record, generation, resolve_gpu
from .calls import MAX_ROWS, DecodeCall, KernelCall, SparsePrefillCall, cached, call_from_record
from .schedule import (Schedule, WalkMemo, schedule_fast, schedule_first_generation, schedule_memo, schedule_reference,
                       uniform_schedule)
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# num_sm_parts formulas named in rules/flashmla.json (C++ integer division on non-negative ints).
# Each returns None when the kernel's own formula would divide by zero (it crashes the process).
def _parts_sparse_sm90(g: GPU, c: DecodeCall):
    heads = c.h_q // 64
    return None if heads == 0 else max(g.num_sms // c.s_q // heads, 1)


def _parts_per_sq(g: GPU, c: DecodeCall):
    return max(g.num_sms // c.s_q, 1)


def _parts_per_sq_half(g: GPU, c: DecodeCall):
    return max(g.num_sms // c.s_q // 2, 1)


def _parts_dense_sm90(g: GPU, c: DecodeCall):
    per_k = c.s_q * c.h_q // c.h_k
    return max(g.num_sms // c.h_k // _cdiv(per_k, 64), 1)


def _parts_sparse_sm90_oct2025(g: GPU, c: DecodeCall):
    return max((g.num_sms // 2) // c.h_k // (_cdiv(c.h_q // c.h_k, 128) * c.s_q), 1)


def _parts_sparse_sm100_oct2025(g: GPU, c: DecodeCall):
    return max(g.num_sms // c.h_k // (_cdiv(c.h_q // c.h_k, 64) * c.s_q), 1)


PARTS_FORMULAS = {
    "sparse_sm90": (_parts_sparse_sm90, "max(num_sms / s_q / (h_q/64), 1)"),
    "per_sq": (_parts_per_sq, "max(num_sms / s_q, 1)"),
    "per_sq_half": (_parts_per_sq_half, "max(num_sms / s_q / 2, 1)"),
    "dense_sm90": (_parts_dense_sm90, "max(num_sms / h_k / ceil(s_q*h_q/h_k / 64), 1)"),
    "sparse_sm90_oct2025": (_parts_sparse_sm90_oct2025, "max((num_sms/2) / h_k / (ceil(h_q/h_k / 128) * s_q), 1)"),
    "sparse_sm100_oct2025": (_parts_sparse_sm100_oct2025, "max(num_sms / h_k / (ceil(h_q/h_k / 64) * s_q), 1)"),
    "dense_fp8": (_parts_dense_sm90, "max(num_sms / h_k / ceil(s_q*h_q/h_k / 64), 1)"),
}


# combine-kernel launch grids named in rules/flashmla.json (``combine.grid``): (x, y, z) of a call,
# with ``m`` the query heads one CTA combines (``combine_heads_per_block``)
def _grid_b_x__sqhq_y(c: DecodeCall, m: int) -> tuple[int, int, int]:
    return c.b, _cdiv(c.s_q * c.h_q, m), 1


def _grid_b_x__sq_y__hq_z(c: DecodeCall, m: int) -> tuple[int, int, int]:
    return c.b, c.s_q, _cdiv(c.h_q, m)


def _grid_bsq_x(c: DecodeCall, m: int) -> tuple[int, int, int]:
    return c.b * c.s_q, 1, _cdiv(c.h_q, m)


COMBINE_GRIDS = {
    "b_x__sqhq_y": (_grid_b_x__sqhq_y, ("b", "ceil(s_q*h_q/{m})", "1")),
    "b_x__sq_y__hq_z": (_grid_b_x__sq_y__hq_z, ("b", "s_q", "ceil(h_q/{m})")),
    "bsq_x": (_grid_bsq_x, ("b*s_q", "1", "ceil(h_q/{m})")),
}


CANONICAL_LAYOUT = ["begin_req", "end_req", "begin_block", "end_block", "begin_split", "first_splitted", "last_splitted"]


@dataclass(frozen=True)
class Implementation:
    name: str
    path: str
    arch: int
    parts: str
    fixed_overhead: int
    source: str
    extra_topk_block: bool = False   # extra_topk must also be a multiple of the generation's topk_block

    @property
    def parts_formula(self) -> str:
        return PARTS_FORMULAS[self.parts][1]


#: call fields a size formula may name by the same name (with ``P`` and ``num_sms``)
CALL_VARIABLES = ("b", "s_q", "h_q", "h_k", "d_qk", "d_v", "topk")


def sched_smem_formula(gen: dict) -> Formula:
    """Generation ``gen``'s scheduler shared-memory formula (``sched_smem.bytes`` in rules/flashmla.json)."""
    return formula_field(gen["sched_smem"], "bytes", f"flashmla.generations.{gen['name']}.sched_smem")


def fast_rows_limit(gen: dict, smem_bytes: int, values: dict) -> int:
    """The largest b whose scheduler shared memory (``sched_smem.bytes``) fits ``smem_bytes``, the
    formula's other variables at ``values``; at most :data:`MAX_ROWS`."""
    return sched_smem_formula(gen).largest("b", smem_bytes, hi=MAX_ROWS, **values)


def select_implementation(call: DecodeCall, gpu: GPU, gen: dict) -> Implementation | None:
    """The implementation row of the facts table that this call dispatches to, or None."""
    for row in gen["implementations"]:
        if row["path"] != call.kind or row["arch"] != gpu.arch:
            continue
        if "h_q" in row and row["h_q"] != call.h_q:
            continue
        if "d_qk" in row and row["d_qk"] != call.d_qk:
            continue
        return Implementation(row["name"], row["path"], row["arch"], row["parts"], row["fixed_overhead"], row["source"],
                              row.get("extra_topk_block", False))
    return None


def _nonzero(x: int) -> int:
    """A length of 0 counts as 1 (scalar form of ``where(x == 0, 1, x)``, non-decreasing in x)."""
    return 1 if x == 0 else x


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def effective_lengths(call: DecodeCall, gen: dict) -> tuple[np.ndarray | None, int | None]:
    """Per-request key lengths the scheduler sees: ``(array, None)`` or ``(None, uniform_value)``.

    Sparse calls: ``topk_length`` (0 counts as 1; ``topk`` when absent), rounded up to the
    generation's ``extra_length_round`` (64) when there is an extra cache, plus ``extra_topk_length`` (``extra_topk`` when absent). Every step is
    non-decreasing in each length, so a length array whose range (:attr:`DecodeCall.length_ranges`)
    maps to one value acts as that scalar, and an array plus a scalar is uniform exactly when its
    range says so; only the sum of two varying arrays is compared element-wise.
    """
    if call.kind in ("dense", "dense_fp8"):
        s = call.seqlens
        if s.shape[0] and bool((s == s[0]).all()):
            return None, int(s[0])
        return s, None
    if gen.get("effective_length") == "constant_topk":
        return None, call.topk
    tl, el = call.topk_length, call.extra_topk_length
    if tl is None and el is None:
        ranges = {}
    elif not call.b:
        return np.zeros(0, dtype=np.int64), None
    else:
        ranges = call.length_ranges
    base = None                        # the varying part, or None when it is the scalar base_u
    if tl is None:
        base_u = 1 if call.topk == 0 else call.topk
    else:
        lo, hi = ranges["topk_length"]
        lo, hi = _nonzero(lo), _nonzero(hi)
        if lo == hi:
            base_u = lo
        else:
            base = np.where(tl == 0, 1, tl)
    if call.extra_topk is not None:
        m = gen["extra_length_round"]
        if base is None:
            base_u = _round_up(base_u, m)
        else:
            lo, hi = _round_up(lo, m), _round_up(hi, m)
            if lo == hi:
                base, base_u = None, lo
            else:
                base = (base + (m - 1)) // m * m
        if el is None:
            if base is None:
                return None, base_u + call.extra_topk
            base = base + call.extra_topk
        else:
            elo, ehi = ranges["extra_topk_length"]
            if base is None:
                if elo == ehi:
                    return None, base_u + ehi
                return el + base_u, None   # a scalar plus a varying array varies
            if elo == ehi:
                return base + ehi, None    # a varying array plus a scalar varies
            base = base + el
            if bool((base == base[0]).all()):
                return None, int(base[0])
            return base, None
    if base is None:
        return None, base_u
    return base, None


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything the rules need about one kernel call, computed once."""

    call: KernelCall
    gpu: GPU
    gen: dict
    implementation: Implementation | None
    num_sm_parts: int | None
    memo: WalkMemo | None = None    # reuse walks of earlier steps (a Checker's own memo), or None
    quiet_rules: frozenset = frozenset()   # shape-only rules known silent for this shape (see registry)

    @cached
    def is_decode(self) -> bool:
        return isinstance(self.call, DecodeCall)

    def fact_scope(self) -> tuple:
        """Where the rules' facts about this call live: its generation, on its build (see
        :mod:`validate_batch.facts.provenance`)."""
        return "flashmla", self.gen["name"], self.gen["build"], {}

    @cached
    def block_size(self) -> int:
        return self.gen["block_size"]

    @cached
    def fixed_overhead(self) -> int | None:
        return self.implementation.fixed_overhead if self.implementation else None

    @cached
    def sched_smem_formula(self) -> Formula:
        """The generation's ``sched_smem.bytes``: the scheduler's dynamic shared memory in bytes."""
        return sched_smem_formula(self.gen)

    def formula_values(self) -> dict:
        """The call's values of the variables a size formula may name: those the call has (``P`` once
        partitions are known)."""
        out = {"num_sms": self.gpu.num_sms}
        for name in CALL_VARIABLES:
            v = getattr(self.call, name, None)
            if v is not None:
                out[name] = v
        if self.num_sm_parts is not None:
            out["P"] = self.num_sm_parts
        return out

    @cached
    def sched_smem_bytes(self) -> int:
        """Dynamic shared memory the scheduling kernel asks for, in bytes (``sched_smem.bytes``)."""
        f = self.sched_smem_formula
        if f.variables <= {"b"}:
            return f(b=self.call.b)
        return f.evaluate(self.formula_values())

    @cached
    def fast_sched_rows(self) -> int:
        """Largest b whose scheduler shared memory fits the GPU's opt-in limit (a static scheduler:
        its batch limit)."""
        if self.gen["sched_smem"].get("static"):
            return self.gen["max_batch"]["max_b"]
        values = self.formula_values()
        values.pop("b", None)
        return fast_rows_limit(self.gen, self.gpu.smem_optin, values)

    @cached
    def falls_back(self) -> bool:
        """This build runs a slower scheduler instead of failing when the fast one does not fit."""
        return "fallback" in self.gen["sched_smem"]

    @cached
    def max_sched_rows(self) -> int:
        """Largest b the scheduler runs at all: the fast path's limit, or the largest valid b when the
        build falls back to a low-shared-memory scheduler above it."""
        return MAX_ROWS if self.falls_back else self.fast_sched_rows

    @cached
    def split_kv(self) -> bool:
        """The call splits the KV across partitions (scheduler, o_accum, combine). Builds that gate it
        split only when the index widths add up past their threshold; the others always do."""
        gate = self.gen.get("split_kv")
        if gate is None or not self.is_decode or self.call.kind != "sparse":
            return True
        c = self.call
        if c.enable_batch_invariant and gate.get("batch_invariant_disables"):
            return False
        return c.topk + (c.extra_topk or 0) >= gate["min_topk_total"]

    @cached
    def scheduler_runs(self) -> bool:
        """False when the kernel exits before writing any metadata (no implementation, or b too big),
        when the call does not split the KV, and for a call of no rows (which validated input never
        is: there is no schedule to model)."""
        return (self.is_decode and self.num_sm_parts is not None and self.split_kv
                and 0 < self.call.b <= self.max_sched_rows)

    @cached
    def lengths(self) -> tuple[np.ndarray | None, int | None]:
        return effective_lengths(self.call, self.gen)

    @cached
    def schedule(self) -> Schedule | None:
        """The scheduler's output (fast path), or None when the scheduler never runs.

        With a ``memo`` (a :class:`validate_batch.Checker` passes its own), the walk of a non-uniform
        schedule is reused from an earlier step with the same block counts
        (see :class:`~validate_batch.flashmla.schedule.WalkMemo`): the result is the same.
        """
        if not self.scheduler_runs:
            return None
        if self.gen.get("algorithm") == "first_generation":
            return self.reference_schedule()
        arr, uni = self.lengths
        if uni is not None:
            return uniform_schedule(self.call.b, self.num_sm_parts, self.fixed_overhead, self.block_size, uni, self.memo)
        if self.memo is not None:
            return schedule_memo(arr, self.num_sm_parts, self.fixed_overhead, self.block_size, memo=self.memo)
        return schedule_fast(arr, self.num_sm_parts, self.fixed_overhead, self.block_size)

    def reference_schedule(self) -> Schedule | None:
        """The same schedule from the plain reference loop (slow; for tests and debugging)."""
        if not self.scheduler_runs:
            return None
        arr, uni = self.lengths
        s = np.full(self.call.b, uni, dtype=np.int64) if uni is not None else arr
        if self.gen.get("algorithm") == "first_generation":
            return schedule_first_generation(s, self.num_sm_parts, self.fixed_overhead, self.block_size)
        return schedule_reference(s, self.num_sm_parts, self.fixed_overhead, self.block_size)

    def metadata_in_layout(self, sch: Schedule | None = None) -> np.ndarray | None:
        """``tile_scheduler_metadata`` in this generation's column order (unwritten columns are 0)."""
        sch = sch if sch is not None else self.schedule
        if sch is None:
            return None
        md = sch.metadata
        if self.gen.get("positions") == "tokens":       # rows are already in the build's layout
            return md
        if self.gen.get("idle_begin_block") == 0:       # partitions after all work is placed
            idle = md[:, 0] >= sch.b
            if idle.any():
                md = md.copy()
                md[idle, CANONICAL_LAYOUT.index("begin_block")] = 0
        layout = self.gen.get("row_layout", CANONICAL_LAYOUT)
        if list(layout) == CANONICAL_LAYOUT:
            return md
        out = np.zeros_like(md)
        for k, name in enumerate(layout):
            out[:, k] = md[:, CANONICAL_LAYOUT.index(name)]
        return out

    @cached
    def runs_attention(self) -> bool:
        """The record is an attention call (``flash_mla_with_kvcache``), not the hoisted metadata op
        alone: split-KV buffers, o_accum offsets and the combine kernel belong to the call."""
        return self.call.entry == "flash_mla_with_kvcache"

    @cached
    def oaccum_max_row(self) -> int | None:
        """The largest ``o_accum`` row whose offset, ``row * s_q*h_q*d_v``, fits the offset's signed
        integer (``oaccum.offset_bits``); None for a call that is not a decode call. A fact of the
        shape (:data:`SHAPE_FACTS`)."""
        if not self.is_decode:
            return None
        c = self.call
        acc = self.gen["oaccum"]
        return ((1 << (acc["offset_bits"] - 1)) - 1) // (c.s_q * c.h_q * acc["d_v"])

    @cached
    def workspace_rows(self) -> int | None:
        """Rows of the split-KV accumulators: ``b + num_sm_parts`` (None: no split-KV attention call)."""
        if not self.is_decode or self.num_sm_parts is None or not self.runs_attention or not self.split_kv:
            return None
        return self.call.b + self.num_sm_parts

    @cached
    def workspace_bytes(self) -> int | None:
        """fp32 ``lse_accum [b+P, s_q, h_q]`` plus ``o_accum [b+P, s_q, h_q, d_v]``."""
        rows = self.workspace_rows
        if rows is None:
            return None
        c = self.call
        acc = self.gen["oaccum"]
        return rows * c.s_q * c.h_q * acc["accum_bytes"] * (1 + acc["d_v"])

    @cached
    def combine_grid(self) -> tuple[int, int, int] | None:
        """The combine kernel's launch grid ``(x, y, z)`` on this build (None: the call runs no
        combine, or the build's grid is not recorded)."""
        name = self.gen.get("combine", {}).get("grid")
        if name is None or self.workspace_rows is None:
            return None
        return COMBINE_GRIDS[name][0](self.call, self.gen["combine_heads_per_block"])

    def failure_for(self, f):
        """``f`` with this build's own failure for its rule, where the build fails differently
        (``failures`` in ``rules/flashmla.json``)."""
        own = self.gen.get("failures", {}).get(f.code)
        if own is None or own == f.failure:
            return f
        return replace(f, failure=own)

    def for_call(self, call: KernelCall, memo: WalkMemo | None, quiet_rules: frozenset) -> "Plan":
        """This plan for another call of the same shape (``call.with_rows``): the same GPU,
        generation, implementation and partitions, which depend on the shape alone, so nothing
        is recomputed."""
        p = object.__new__(Plan)
        fields = self.shape_fields.copy()
        fields["call"], fields["memo"], fields["quiet_rules"] = call, memo, quiet_rules
        object.__setattr__(p, "__dict__", fields)
        return p

    @cached
    def shape_fields(self) -> dict:
        """What every plan :meth:`for_call` makes from this one shares with it: the GPU, generation,
        implementation and partitions, and the facts that depend on the shape alone
        (:data:`SHAPE_FACTS`, computed once here)."""
        fields = {"gpu": self.gpu, "gen": self.gen, "implementation": self.implementation,
                  "num_sm_parts": self.num_sm_parts}
        for name in SHAPE_FACTS if self.is_decode else ("is_decode",):   # (the rest are decode-call facts)
            fields[name] = getattr(self, name)
        return fields

    def to_dict(self, with_schedule: bool = True) -> dict:
        out: dict = {
            "call": _call_record(self.call),
            "implementation": self.implementation.name if self.implementation else None,
            "num_sm_parts": self.num_sm_parts,
            "fixed_overhead": self.fixed_overhead,
        }
        if self.is_decode:
            out["sched_smem_bytes"] = self.sched_smem_bytes
            out["workspace_bytes"] = self.workspace_bytes
            sch = self.schedule
            if sch is not None:
                out["num_splits_total"] = sch.total_splits
                out["max_split_row"] = sch.max_split_row
                if with_schedule:
                    out["tile_scheduler_metadata"] = self.metadata_in_layout(sch).tolist()
                    out["num_splits"] = sch.num_splits.tolist()
        return out


#: per-row values a plan's record shows in full; a larger call is shown by its summary (dense) or
#: with its per-row lengths as counts (sparse), so a report's size stays bounded whatever the input
MAX_RECORD_VALUES = 64


def _call_record(c: KernelCall) -> dict | str:
    if not isinstance(c, DecodeCall):
        return c.to_record()
    if c.seqlens is not None:
        big = c.seqlens.shape[0] > MAX_RECORD_VALUES or (c.block_table is not None and
                                                          c.block_table.size > MAX_RECORD_VALUES * MAX_RECORD_VALUES)
        return c.summary() if big else c.to_record()
    if any(v is not None and len(v) > MAX_RECORD_VALUES for v in (c.topk_length, c.extra_topk_length)):
        return c.light().to_record()
    return c.to_record()


#: cached plan facts that depend on the call's shape, GPU and build only (not on b or the lengths)
SHAPE_FACTS = ("fast_sched_rows", "falls_back", "max_sched_rows", "split_kv", "sched_smem_formula", "is_decode",
               "runs_attention", "block_size", "fixed_overhead", "oaccum_max_row")

_HOISTED: dict[tuple, dict] = {}


def hoisted(gen: dict) -> dict:
    """The generation as its hoisted ``get_mla_decoding_metadata`` op schedules: a sparse call by
    the constant ``topk`` (no per-row lengths, no extra cache), a dense one by its seqlens."""
    key = (gen["build"], gen["name"])
    out = _HOISTED.get(key)
    if out is None:
        out = _HOISTED[key] = {**gen, "effective_length": "constant_topk", "entry": "get_mla_decoding_metadata"}
    return out


def plan(call: KernelCall | dict, gpu="H200", build: str | None = None) -> Plan:
    """Plan one call. ``call`` may be a :class:`DecodeCall` or an oracle-format record (dict)."""
    if isinstance(call, dict):
        call = call_from_record(call)
    g = resolve_gpu(gpu)
    build_record(build)                   # a bad name is an InputError here, before any cache sees it
    if isinstance(call, SparsePrefillCall):
        return Plan(call, g, generation(build, "prefill", call.use_legacy, g.arch), None, None)
    gen = generation(build, call.kind, call.use_legacy, g.arch)
    if call.entry == "get_mla_decoding_metadata":
        gen = hoisted(gen)
    impl = select_implementation(call, g, gen)
    parts = PARTS_FORMULAS[impl.parts][0](g, call) if impl else None
    return Plan(call, g, gen, impl, parts)
