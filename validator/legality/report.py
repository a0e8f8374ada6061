"""Findings and reports: what the rules say, in a form both humans and programs can read."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One broken (or nearly broken) limit.

    ``message`` says "expected X, got Y" and names the thing (request, slot, call); ``numbers`` holds
    the same numbers for programs; ``fix`` says what to do; ``failure`` how the process dies.
    """

    code: str
    severity: str
    message: str
    subject: str = ""
    numbers: dict = field(default_factory=dict)
    fix: str = ""
    failure: str = ""
    source: str = ""

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def to_dict(self) -> dict:
        d = {"code": self.code, "severity": self.severity, "message": self.message}
        if self.subject:
            d["subject"] = self.subject
        if self.numbers:
            d["numbers"] = self.numbers
        if self.fix:
            d["fix"] = self.fix
        if self.failure:
            d["failure"] = str(self.failure)     # the prose; its kind is ``self.failure.kind``
        if self.source:
            d["source"] = self.source
        return d

    def one_line(self) -> str:
        subj = f"[{self.subject}] " if self.subject else ""
        fix = f" - {self.fix}" if self.fix else ""
        return f"{self.code} {subj}{self.message}{fix}"


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
        return not any(f.is_error for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.is_error]

    @property
    def codes(self) -> list[str]:
        return sorted({f.code for f in self.findings})

    def __bool__(self) -> bool:  # `if report:` reads as "is it legal"
        return self.legal

    def to_dict(self) -> dict:
        """The report's JSON: verdict, findings, what was checked, the safe split, and what the
        command added."""
        d: dict = {"legal": self.legal, "findings": [f.to_dict() for f in self.findings]}
        d.update(self.context)
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
