"""The bounds a configuration puts on a step, derived from the rules: the one legality model.

The guard's fast path (:meth:`validate_batch.Checker.verdict`), ``headroom``, the split search and
bisect's boundary all decide a step from :class:`StepBounds`; nothing else keeps a copy of a limit.

Each rule declares the per-step quantities it reads (:data:`validate_batch.legality.registry.QUANTITIES`). The
engine profiles give the bounds they know for the quantities they provide (``max_rows`` and the
routing threshold; ``max_slot``); :func:`derive_bounds` checks each against the rules themselves
on synthetic steps at the bound and one past it, and searches for the real edge when they
disagree (a rule added later that fires earlier moves the bound). Rules that read only the
configuration are run once. A rule reading ``schedule`` is decided below its ``safe_rows``; above
it, and for every rule whose quantities no bound covers, the guard runs the full check.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..inputs.batch import Batch, RequestColumns
from .evaluate import EngineSetup, evaluate
from ..flashmla.calls import MAX_ROWS
from ..facts.modes import Mode
from ..facts.names import ROUTABLE_MODES
from .ruleset import STATE as RULES
from .ruleset import forward_rules, revision
from .search import largest_legal
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())

#: quantities a bound (or the configuration probe) always covers; ``lengths`` is covered when
#: every profile of the batch guarantees it
COVERED = frozenset({"config", "rows", "slots", "schedule"})


@dataclass(frozen=True)
class RowRule:
    """Legality of a step from its request rows alone: ``min_rows <= rows + merged <= max_rows``, or,
    when the forward can be routed, ``rows + merged > threshold`` too (a non-monotone predicate).
    ``min_rows`` is 1 unless steps of fewer rows run a path not modelled (they are not legal)."""

    max_rows: int
    threshold: int | None
    merged: int
    min_rows: int = 1

    def __call__(self, rows: int) -> bool:
        t = rows + self.merged
        if t <= 0:
            return False
        return self.min_rows <= t <= self.max_rows or (self.threshold is not None and t > self.threshold)


@dataclass(frozen=True)
class StepBounds:
    """What a step of one configuration may hold, and how to decide it from counts."""

    rules_revision: int
    has_rows: bool                    # a profile provides query rows
    has_slots: bool                   # a profile provides request slots
    max_rows: int | None              # largest legal query rows on the decode kernel (None: no rows)
    threshold: int | None             # extend forwards above it are routed (None: never)
    sched_free_rows: int              # rows up to which the schedule rules provably find nothing
    max_slot: int | None              # largest legal slot (None: no slots)
    decode_ok: bool                   # the configuration breaks no rule on the decode-kernel path
    routed_ok: bool                   # ... on the routed path
    static_findings: tuple            # errors of the configuration itself
    undecided: tuple                  # rules no bound covers: the guard runs the full check for them
    slow_above: int | None = None     # above this many rows the build's scheduler falls back (legal, slow)
    routed_full: bool = False         # routed forwards are not decided by their rows (late-layer tails)
    row_modes: tuple | None = None    # the modes whose rows are what ``max_rows`` bounds (None: every mode)
    # (modes, max_rows) spans of steps that run a path the profiles do not model (max_rows None: any
    # rows): such a step takes the full check, whose report says "not modelled"
    unmodelled: tuple = ()

    def __post_init__(self):
        # read on every step by decide (a property would cost a call there)
        object.__setattr__(self, "_sure", self.sure_rows)

    def is_unmodelled(self, mode: Mode | str, rows: int) -> bool:
        """Whether a step of ``mode`` with ``rows`` query rows runs a path the profiles do not model."""
        return any(mode in modes and 0 < rows and (top is None or rows <= top) for modes, top in self.unmodelled)

    def mode_unmodelled(self, mode: Mode | str) -> bool:
        """Whether some step of ``mode`` runs a path the profiles do not model."""
        return any(mode in modes for modes, _ in self.unmodelled)

    @property
    def complete(self) -> bool:
        """Every registered rule is decided by these bounds (and none was added since)."""
        return not self.undecided and self.rules_revision == revision()

    @property
    def sure_rows(self) -> int:
        """1..sure_rows query rows are legal in any mode, given slots within range (0 when a rule
        needs the full check)."""
        if not self.decode_ok or self.undecided or self.unmodelled:
            return 0
        if not self.has_rows:
            return MAX_ROWS
        return min(self.max_rows, self.sched_free_rows, self.threshold if self.threshold is not None else self.max_rows)

    def decide(self, mode: Mode | str, rows: int, max_slot: int | None) -> bool | None:
        """Legality from the row count and the largest slot; None when only the full check can tell.
        ``mode``: a :class:`Mode`, or its name (the guard passes the name it was given).

        The one bounds decision: the guard's verdict on every step, ``headroom`` and the split read
        it. The commonest answer comes first: 1..:attr:`sure_rows` rows with every slot in range,
        under the rules these bounds were derived for, are legal in any mode."""
        if (0 < rows <= self._sure and (max_slot is None or self.max_slot is None or 0 <= max_slot <= self.max_slot)
                and RULES.revision == self.rules_revision):
            return True
        if not self.complete:
            return None
        if self.unmodelled and self.is_unmodelled(mode, rows):
            return None         # the full check says "not modelled"
        if max_slot is not None and self.max_slot is not None and (max_slot > self.max_slot or max_slot < 0):
            return False        # beyond the buffers, or -1: a request holds the reserved row 0
        if not self.has_rows:
            return self.decode_ok
        if rows <= 0:
            return False
        thr = self.threshold
        if thr is not None and rows > thr and mode in ROUTABLE_MODES:
            return None if self.routed_full else self.routed_ok
        if not self.decode_ok:
            return False
        if rows > self.max_rows:
            # in a mode whose kernel limit is not on its rows (rows >= the bounded quantity), only a full
            # check can say it is illegal
            return None if self.row_modes is not None and mode not in self.row_modes else False
        if rows > self.sched_free_rows:
            return None
        return True

    def row_rule(self, mode: Mode, merged: int) -> RowRule | None:
        """The row predicate of a step of this mode, when rows alone decide it (no slots, every rule
        covered); None otherwise (the split then checks each candidate step in full)."""
        if not self.complete or not self.has_rows or self.has_slots or not self.decode_ok:
            return None
        if self.routed_full and mode.is_routable() and self.threshold is not None:
            return None
        if self.row_modes is not None and mode not in self.row_modes:
            return None
        low = 1
        spans = [top for modes, top in self.unmodelled if mode in modes]
        if spans:       # steps of 1..top rows are not modelled: legal runs start above them
            if None in spans or (mode.is_routable() and self.threshold is not None):
                return None
            low = max(spans) + 1
        thr = self.threshold if (mode.is_routable() and self.routed_ok) else None
        return RowRule(self.max_rows, thr, merged, low)


def probe_step(batch: Batch) -> Batch:
    """The configuration of ``batch`` with a one-request decode step (what the configuration probe checks)."""
    return replace(batch, forward_mode=Mode.DECODE, requests=RequestColumns(1, ["probe"], None, None, [1], None, 0),
                   running=(), padded_rows=None)


def _codes(pred, kinds: frozenset) -> frozenset:
    return frozenset(r.code for r in forward_rules(kinds) if pred(r.reads))


def _edge(legal, hint: int, lo: int, cap: int) -> int:
    """The largest ``x`` in ``lo..cap`` with ``legal(x)`` (``lo - 1`` when none is), the profile's
    hint asked first."""
    good, _ = largest_legal(legal, lo, hint, cap, exact_hint=True)
    return lo - 1 if good is None else good


def derive_bounds(batch: Batch, setup: EngineSetup, build: str | None = None) -> StepBounds:
    """The bounds of ``batch``'s configuration (its requests are not read)."""
    gen = revision()
    template = probe_step(batch)
    probe = evaluate(template, build, setup=setup, probe=True)
    bp = probe.batch_plan
    static = tuple(probe.errors)
    decode_ok = not static
    hints: dict = {}
    for prof, _, part in setup.parts:
        hints.update(prof.bound_hints(part, bp))
    covered = COVERED | setup.guarantees
    kinds = setup.call_kinds
    undecided = tuple(r.code for r in forward_rules(kinds) if not r.reads <= covered)
    has_rows, has_slots = "rows" in setup.provides, "slots" in setup.provides

    max_rows = threshold = slow_above = None
    sched_free = MAX_ROWS
    routed_ok = decode_ok
    if has_rows:
        shapes = any(p.shape_grows_with_rows for p in setup.profiles)
        only = _codes(lambda q: ("rows" in q and q <= {"rows", "config"}) or (shapes and q == {"config"}), kinds)

        def rows_legal(r: int) -> bool:
            # r decode entries of length 1, held as one broadcast value (no per-row memory)
            seq = np.broadcast_to(np.int64(1), (r,))
            step = replace(template, requests=RequestColumns(r, None, None, None, seq, None, 0))
            return evaluate(step, build, setup=setup, only=only, rows_only=True, probe=True).legal

        max_rows = _edge(rows_legal, hints["max_rows"], 1, MAX_ROWS)
        threshold = hints.get("threshold")
        sched_rules = [r for r in forward_rules(kinds) if "schedule" in r.reads]
        sched_free = max_rows
        slow = [dc.plan.fast_sched_rows for dc in bp.calls if dc.plan.is_decode and dc.plan.falls_back]
        flashmla = [dc for dc in bp.calls if getattr(dc.plan, "rule_kind", "flashmla") == "flashmla"]
        slow_above = min(slow) if slow else None
        for dc in flashmla:
            for r in sched_rules:
                safe = r.safe_rows(dc.plan) if r.safe_rows is not None else 0
                if safe is not None:
                    sched_free = min(sched_free, safe)
        if threshold is not None:
            routed = replace(template, forward_mode=Mode.EXTEND,
                             requests=RequestColumns(1, ["probe"], [threshold + 1], [0]))
            routed_ok = evaluate(routed, build, setup=setup, probe=True).legal
    max_slot = None
    if has_slots:
        only = _codes(lambda q: "slots" in q and q <= {"slots", "config"}, kinds)

        def slot_legal(s: int) -> bool:
            step = replace(template, requests=RequestColumns(1, ["probe"], None, None, [1], [s], 0))
            return evaluate(step, build, setup=setup, only=only, probe=True).legal

        max_slot = _edge(slot_legal, hints["max_slot"], 0, 1 << 31)
    return StepBounds(gen, has_rows, has_slots, max_rows, threshold, max(sched_free, 0), max_slot, decode_ok,
                      routed_ok, static, undecided, slow_above, has_rows and not hints.get("routed_by_rows", True),
                      hints.get("row_modes"), tuple(hints.get("unmodelled", ())))
