"""Findings and reports: what the rules say, in a form both humans and programs can read."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping

from ..errors import NotModelled
from ..facts.provenance import summary as provenance_summary
from .finding import SEVERITIES, Finding  # noqa: F401 (re-exported: a report's findings)
from .registry import verdict_facts


#: field metadata: how a typed part of a report appears in its JSON (by default: under its own name)
_INLINE = MappingProxyType({"json": "inline"})      # its keys are merged into the enclosing object
_NOT_JSON = MappingProxyType({"json": None})        # for Python callers only


@dataclass(frozen=True)
class BatchContext:
    """What a batch report checked: the JSON keys after ``legal`` and ``findings``.

    ``batch``: label, GPU, requests and running requests; ``plan``: the forward's mode, engine
    versions and each profile's part (:meth:`validate_batch.engines.BatchPlan.to_dict`);
    ``engine_steps``: the steps the engine runs instead when it chunks the forward; ``judged_as``:
    per engine profile, the version entry and release it was judged as, why, and the kernel build.
    """

    batch: dict
    kernel_build: str
    plan: dict = field(metadata=_INLINE)
    notes: tuple = ()
    engine_steps: dict | None = None
    judged_as: list = field(default_factory=list)
    kind: ClassVar[str] = "batch"

    def to_dict(self) -> dict:
        d: dict = {"kind": self.kind, "batch": self.batch, "kernel_build": self.kernel_build, **self.plan}
        if self.judged_as:
            d["judged_as"] = self.judged_as
        if self.notes:
            d["notes"] = list(self.notes)
        if self.engine_steps is not None:
            d["engine_steps"] = self.engine_steps
        return d


@dataclass(frozen=True)
class CallsContext:
    """What a report of kernel-call records checked: the GPU and each call's plan."""

    gpu: dict | None
    calls: list
    kind: ClassVar[str] = "calls"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "gpu": self.gpu, "calls": self.calls}


@dataclass(eq=False, repr=False)
class Report:
    """The verdict for one call or one batch, and everything its JSON says.

    ``context`` says what was checked: a :class:`BatchContext` or :class:`CallsContext` (or a
    plain mapping, written as it is), or ``None``. It and ``safe_split`` may be given as functions
    (:meth:`defer_context`, :meth:`defer_split`): they are then built the first time somebody reads
    them, so a step whose report is only asked "legal?" does not pay for them. ``kernel``,
    ``reproduction`` and ``across_builds`` are what a command adds on request (kernel mode's
    result, PyTorch reproductions of slot findings, the verdict per kernel build).
    :meth:`to_dict` is the one place the report's JSON is assembled.
    """

    findings: list[Finding]
    plans: list = field(default_factory=list, metadata=_NOT_JSON)
    safe_split: Any = None
    context: BatchContext | CallsContext | Mapping | None = field(default=None, metadata=_INLINE)
    batch_plan: Any = field(default=None, metadata=_NOT_JSON)
    kernel: dict | None = None
    reproduction: list | None = None
    across_builds: list | None = None

    @classmethod
    def deferred(cls, findings: list, plans: list, batch_plan: Any, context: Callable[[], Any]) -> "Report":
        """``Report(findings, plans, batch_plan=batch_plan)`` with ``defer_context(context)``: what an
        evaluation returns on every step, built without the constructor's field setters."""
        blank = cls.__dict__.get("_blank")
        if blank is None:       # the constructor's fields at their defaults, taken from it once per class
            blank = cls([]).__dict__
            cls._blank = blank
        r = object.__new__(cls)
        fields = blank.copy()
        fields["findings"], fields["plans"], fields["batch_plan"] = findings, plans, batch_plan
        r.__dict__ = fields
        r.defer_context(context)
        return r

    def defer_split(self, build: Callable[[], Any]) -> None:
        """Set ``safe_split`` to ``build()``, called on first read (at most once)."""
        self._safe_split = None
        self._split_fn = build

    def defer_context(self, build: Callable[[], Any]) -> None:
        """Set ``context`` to ``build()``, called on first read (at most once)."""
        self._context = None
        self._context_fn = build

    @property
    def checked(self) -> BatchContext | CallsContext | Mapping | None:
        """What was checked, as it was given (typed, or a mapping)."""
        fn = self._context_fn
        if fn is not None:
            self._context_fn = None
            self._context = fn()
        return self._context

    def with_engine_steps(self, engine_steps: dict) -> "Report":
        """This report with the steps the engine runs instead of its forward (chunked prefill)."""
        ctx = self.checked
        if not isinstance(ctx, BatchContext):
            raise TypeError(f"engine steps belong to a batch report, not to {type(ctx).__name__}")
        self.context = replace(ctx, engine_steps=engine_steps)
        return self

    def __repr__(self) -> str:
        return (f"Report(findings={self.findings!r}, plans={self.plans!r}, safe_split={self.safe_split!r}, "
                f"context={self.context!r}, batch_plan={self.batch_plan!r})")

    def __eq__(self, other) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in _FIELDS)

    __hash__ = None  # mutable

    @property
    def legal(self) -> bool:
        """No error finding, and every part of the step on a path the profiles model."""
        for f in self.findings:
            if f.is_error:
                return False
        return not self.not_modelled

    @property
    def not_modelled(self) -> tuple:
        """The paths of this step that the profiles do not model (the engine runs another kernel for
        it): one record each (``path``, ``why``, ``field``, ``source``, ...). A step with one is
        neither legal nor illegal: it is "not modelled"."""
        bp = self.batch_plan
        return tuple(bp.unmodelled) if bp is not None and bp.unmodelled else ()

    @property
    def verdict(self) -> str:
        """``legal``, ``illegal`` (an error finding) or ``not_modelled``."""
        if any(f.is_error for f in self.findings):
            return "illegal"
        return "not_modelled" if self.not_modelled else "legal"

    def refusal(self):
        """The :class:`~validate_batch.errors.NotModelled` of a step on an unmodelled path (None otherwise)."""
        if not self.not_modelled:
            return None
        r = self.not_modelled[0]
        e = NotModelled(r["field"], r["path"], r["why"])
        e.source, e.report = r.get("source"), self
        return e

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.is_error]

    @property
    def codes(self) -> list[str]:
        return sorted({f.code for f in self.findings})

    def __bool__(self) -> bool:  # `if report:` reads as "is it legal"
        return self.legal

    @property
    def provenance(self) -> dict:
        """Where the facts this verdict rests on come from (:func:`validate_batch.facts.provenance.summary`):
        every rule it ran, on the build each call runs on; built on first read."""
        got = self.__dict__.get("_provenance")
        if got is None:
            got = self.__dict__["_provenance"] = provenance_summary(verdict_facts(self.plans, self.batch_plan))
        return got

    @property
    def rests_on_read_facts(self) -> bool:
        """Whether a fact this verdict rests on is neither measured on its build nor tested."""
        return bool(self.read_facts_behind_verdict())

    def read_facts_behind_verdict(self) -> list[dict]:
        """The facts neither measured on their build nor tested that decide this verdict: for an
        illegal one, those of the rules that found an error; for a legal one, those of every rule
        it ran (each could have fired)."""
        read = self.provenance["read_facts"]
        if self.legal:
            return list(read)
        broken = {f.code for f in self.errors}
        return [r for r in read if broken & set(r["rules"])]

    def to_dict(self) -> dict:
        """The report's JSON: verdict, findings, what was checked, the safe split, where its facts
        come from, and what the command added."""
        prov = self.provenance
        d: dict = {"legal": self.legal, "findings": [_with_provenance(f.to_dict(), prov) for f in self.findings]}
        if self.not_modelled:
            d["verdict"] = self.verdict
            d["not_modelled"] = [dict(r) for r in self.not_modelled]
        d.update(self.context)
        d["provenance"] = prov
        sp = self.safe_split
        if sp is not None:
            d["safe_split"] = sp.to_dict() if hasattr(sp, "to_dict") else sp
        for key in _ADDED:
            v = getattr(self, key)
            if v is not None:
                d[key] = v
        return d

    def document(self, schema: str, statistics: dict | None = None) -> dict:
        """The report as one JSON document of the given schema version (``statistics``: finding
        counts per rule, when asked for)."""
        d = {"schema": schema, **self.to_dict()}
        if statistics is not None:
            d["statistics"] = statistics
        return d


def _with_provenance(d: dict, prov: dict) -> dict:
    """A finding's JSON with the standing of the facts its rule rests on (when the verdict ran it)."""
    got = prov.get("rules", {}).get(d["code"])
    if got is not None:
        d["provenance"] = got
    return d


_FIELDS = tuple(f.name for f in fields(Report))
_ADDED = ("kernel", "reproduction", "across_builds")


def _split_get(self):
    fn = self._split_fn
    if fn is not None:
        self._split_fn = None
        self._safe_split = fn()
    return self._safe_split


def _split_set(self, value) -> None:
    self._safe_split = value
    self._split_fn = None


def _context_get(self) -> dict:
    ctx = self.checked
    if ctx is None:
        return {}
    return ctx.to_dict() if isinstance(ctx, (BatchContext, CallsContext)) else ctx


def _context_set(self, value) -> None:
    self._context = value
    self._context_fn = None


# ``safe_split`` and ``context`` are fields of the constructor, read through these (a deferred one
# is built on first read); ``context`` reads as the JSON mapping of what was checked
Report.safe_split = property(_split_get, _split_set, doc="The minimal safe split (None when legal or not "
                             "asked for); a deferred one is computed on first read.")
Report.context = property(_context_get, _context_set, doc="What was checked, as the mapping the JSON carries.")
Report._split_fn = None
Report._context_fn = None
