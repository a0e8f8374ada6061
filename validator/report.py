"""Findings and reports: what the rules say, in a form both humans and programs can read."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

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


class Report:
    """The verdict for one call or one batch.

    ``context`` (the description of what was checked, merged into :meth:`to_dict`) may be given as
    a function with :meth:`defer_context`: it is then built the first time somebody reads it, so a
    step whose report is only asked "legal?" does not pay for it.
    """

    __slots__ = ("findings", "plans", "_safe_split", "_split_fn", "batch_plan", "_context", "_context_fn")

    def __init__(self, findings: list[Finding], plans: list | None = None, safe_split: Any = None,
                 context: dict | None = None, batch_plan: Any = None):
        self.findings = findings
        self.plans = [] if plans is None else plans
        self._safe_split = safe_split
        self._split_fn = None
        self._context = {} if context is None else context
        self._context_fn = None
        self.batch_plan = batch_plan

    @property
    def context(self) -> dict:
        ctx = self._context
        if ctx is None:
            ctx = self._context = self._context_fn()
            self._context_fn = None
        return ctx

    @context.setter
    def context(self, value: dict) -> None:
        self._context = value
        self._context_fn = None

    @property
    def safe_split(self):
        """The minimal safe split (None when legal or not asked for); a deferred one is computed on
        first read, so a guard that only asks "legal?" never pays for it."""
        fn = self._split_fn
        if fn is not None:
            self._split_fn = None
            self._safe_split = fn()
        return self._safe_split

    @safe_split.setter
    def safe_split(self, value) -> None:
        self._safe_split = value
        self._split_fn = None

    def defer_split(self, build: Callable[[], Any]) -> None:
        """Set ``safe_split`` to ``build()``, called on first read (at most once)."""
        self._safe_split = None
        self._split_fn = build

    def defer_context(self, build: Callable[[], dict]) -> None:
        """Set ``context`` to ``build()``, called on first read (at most once)."""
        self._context = None
        self._context_fn = build

    def __repr__(self) -> str:
        return (f"Report(findings={self.findings!r}, plans={self.plans!r}, safe_split={self.safe_split!r}, "
                f"context={self.context!r}, batch_plan={self.batch_plan!r})")

    def __eq__(self, other) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return ((self.findings, self.plans, self.safe_split, self.context, self.batch_plan)
                == (other.findings, other.plans, other.safe_split, other.context, other.batch_plan))

    __hash__ = None  # mutable, like the dataclass it replaces

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
        d: dict = {"legal": self.legal, "findings": [f.to_dict() for f in self.findings]}
        d.update(self.context)
        if self.safe_split is not None:
            d["safe_split"] = self.safe_split.to_dict() if hasattr(self.safe_split, "to_dict") else self.safe_split
        return d
