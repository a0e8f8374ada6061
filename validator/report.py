"""Findings and reports: what the rules say, in a form both humans and programs can read."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
            d["failure"] = self.failure
        if self.source:
            d["source"] = self.source
        return d

    def one_line(self) -> str:
        subj = f"[{self.subject}] " if self.subject else ""
        fix = f" - {self.fix}" if self.fix else ""
        return f"{self.code} {subj}{self.message}{fix}"


@dataclass
class Report:
    """The verdict for one call or one batch."""

    findings: list[Finding]
    plans: list = field(default_factory=list)
    safe_split: Any = None
    context: dict = field(default_factory=dict)
    batch_plan: Any = None

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
