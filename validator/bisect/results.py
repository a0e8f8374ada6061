"""What bisection finds: the boundary of a quantity, the candidate crashing steps, the diagnosis."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..ingest.crash_dump import CrashDump
from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..ingest.scan import LogEvidence
from ..ingest.sglang_log import Step


@dataclass
class Boundary:
    """Where the checker's verdict flips for the quantity that varies."""

    quantity: str
    largest_legal: int | None
    first_illegal: int | None
    observed: int | None
    codes: list[str]
    evaluations: int
    note: str = ""

    @property
    def margin(self) -> int | None:
        """How far the crash was past the boundary (negative: headroom left)."""
        if self.observed is None or self.largest_legal is None:
            return None
        return self.observed - self.largest_legal

    def to_dict(self) -> dict:
        return {"quantity": self.quantity, "largest_legal": self.largest_legal, "first_illegal": self.first_illegal,
                "observed": self.observed, "margin": self.margin, "codes": self.codes,
                "checks": self.evaluations, "note": self.note}


@dataclass
class Candidate:
    """One possible crashing step, as a family of batches indexed by the varying quantity."""

    rank: str
    kind: str                   # prefill | decode | verify | slot | vllm
    label: str
    quantity: str               # "query rows" | "slot index" | "batch size"
    lo: int
    hi: int
    likely: int | None
    exact: bool
    basis: list[str]
    make: Callable[[int, str | None], dict]
    step: Step | None = None
    versions: list[str | None] = field(default_factory=lambda: [None])
    # filled by evaluate()
    version: str | None = None
    verdict: str = "unchecked"          # illegal | legal | partly illegal | error
    codes: list[str] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    boundary: Boundary | None = None
    matches_error: bool = False
    explains: list[str] = field(default_factory=list)   # its error codes whose signature matches the error
    completed: str | None = None        # why the log shows this step completed (then it is not the crash)
    assumptions: list[str] = field(default_factory=list)   # what the batch assumes beyond the evidence
    invented_ids: list[str] = field(default_factory=list)  # request ids made up (the log gives counts only)
    batch: dict | None = None
    safe_split: dict | None = None
    check_error: str | None = None
    version_notes: list[str] = field(default_factory=list)
    judged_as: list = field(default_factory=list)   # per profile: the release and build the verdict was judged as, and why
    deduction: str | None = None        # what the step's batch deduces from the error's numbers (not in the evidence)

    @property
    def value(self) -> int:
        return self.likely if self.likely is not None else self.hi

    @property
    def is_illegal(self) -> bool:
        return self.verdict in ("illegal", "partly illegal")

    def to_dict(self) -> dict:
        d = {"rank": self.rank, "kind": self.kind, "label": self.label, "quantity": self.quantity,
             "range": [self.lo, self.hi], "likely": self.likely, "exact": self.exact, "basis": self.basis,
             "engine_version": self.version, "verdict": self.verdict, "codes": self.codes,
             "matches_error": self.matches_error, "explains": self.explains, "findings": self.findings,
             "boundary": self.boundary.to_dict() if self.boundary else None, "batch": self.batch}
        if self.step is not None:
            d["from_line"] = self.step.line_no
        if self.completed:
            d["completed"] = self.completed
        if self.assumptions:
            d["assumptions"] = self.assumptions
        if self.invented_ids:
            d["invented_request_ids"] = self.invented_ids
        if self.safe_split is not None:
            d["safe_split"] = self.safe_split
        if self.check_error:
            d["check_error"] = self.check_error
        if self.version_notes:
            d["version_notes"] = self.version_notes
        if self.judged_as:
            d["judged_as"] = self.judged_as
        if self.deduction:
            d["deduction"] = self.deduction
        return d


@dataclass
class Explanation:
    """Whether a rule explains the crash, and what else the evidence shows.

    ``status``: ``explained`` (a rule whose signature matches the error line breaks on the crashing
    step), ``not_explained`` (an error line, but no rule both matches it and breaks), ``no_error``
    (no error line: nothing to explain, the verdicts are for the last steps logged)."""

    status: str
    rules: list[str]                     # the rules that explain the crash
    signature_rules: list[str]           # rules whose signature matches the error line
    signatures: list[dict]               # those signatures
    possible: list[str]                  # a cut-off line: rules its visible part is consistent with
    recognised: dict | None              # what the error line was read as
    also_illegal: list[dict]             # steps that break rules that do not explain the error
    summary: str

    def to_dict(self) -> dict:
        return {"status": self.status, "rules": self.rules, "summary": self.summary,
                "signature_matches": self.signature_rules, "signatures": self.signatures,
                "possible": self.possible, "recognised": self.recognised, "also_illegal": self.also_illegal}


@dataclass
class Diagnosis:
    engine: str | None
    profile: list[str]
    error: ErrorEvent | None
    after_forward: bool | None
    version_basis: str
    candidates: list[Candidate]
    explained: Candidate | None
    fixes: list[dict]
    config: EngineConfig
    evidence: LogEvidence | None = None
    dump: CrashDump | None = None
    notes: list[str] = field(default_factory=list)
    kernel: dict | None = None
    explanation: Explanation | None = None

    @property
    def partial(self) -> bool:
        return self.explained is None or not self.explained.exact or self.error is None

    def to_dict(self) -> dict:
        ex = self.explained
        d = {
            "engine": self.engine, "profile": self.profile,
            "error": self.error.to_dict() if self.error else None,
            "prefill_logged_after_forward": self.after_forward, "version_basis": self.version_basis,
            "crashing_step": ex.to_dict() if ex else None,
            "rule": ex.explains if ex else [],
            "explanation": self.explanation.to_dict() if self.explanation else None,
            "boundary": ex.boundary.to_dict() if ex and ex.boundary else None,
            "fixes": self.fixes, "partial": self.partial,
            "candidates": [c.to_dict() for c in self.candidates],
            "config": self.config.to_dict(), "notes": self.notes,
        }
        if self.evidence is not None:
            d["log"] = self.evidence.to_dict()
        if self.dump is not None:
            d["crash_dump"] = self.dump.to_dict()
        if self.kernel is not None:
            d["kernel"] = self.kernel
        return d
