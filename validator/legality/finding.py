"""One finding: a broken (or nearly broken) limit, as the rules report it."""
from __future__ import annotations

from dataclasses import dataclass, field

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
