"""The errors a log shows: each recognised line becomes an :class:`ErrorEvent` with a ``kind``, the
numbers it carries, how the process ended (``failure``), the library that printed it, and where in the
log it is (line, rank, timestamp).

How a line is read is not decided here: every error-line format is one row of the recogniser table in
:mod:`validate_batch.ingest.recognisers` (a new format goes there, with a fixture line in
``fixtures/error_lines.jsonl``), shared with kernel mode. Which rules explain an error is not decided
here either: each rule's ``signatures`` in ``rules/catalog.json`` say which error lines it produces
(:mod:`validate_batch.ingest.signatures`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .recognisers import KERNEL_LIBRARIES, KINDS, site_patterns
from .recognisers import classify as classify_error   # the table's one classifier, as bisect's readers name it

__all__ = ["ErrorEvent", "KERNEL_LIBRARIES", "KINDS", "classify_error", "site_patterns"]


@dataclass
class ErrorEvent:
    kind: str
    line_no: int
    text: str
    rank: str | None = None
    rank_inferred: bool = False   # no prefix on the line: the rank of the preceding prefixed line
    timestamp: str | None = None
    numbers: dict = field(default_factory=dict)

    @property
    def specificity(self) -> int:
        return KINDS.get(self.kind, (0, None))[0]

    @property
    def quantity(self) -> str | None:
        """What varies for this error: ``rows``, ``slot`` (an index out of a buffer) or None."""
        if self.kind == "device_assert" and "index" in str(self.numbers.get("condition", "")):
            return "slot"
        return KINDS.get(self.kind, (0, None))[1]

    @property
    def failure(self) -> str | None:
        """How the process ended, as the rule catalog names it (``process_exit``, ``illegal_memory_access``,
        ``python_exception``, ``process_crash``, ``device_assert``, ``launch_error_silent``), or None."""
        return self.numbers.get("failure")

    @property
    def owner(self) -> str | None:
        """The library whose failure the error reports: the one its path or text names (FlashMLA,
        FlashInfer, DeepGEMM, FlashAttention-3), else the one the traceback around it points into
        (``owner`` set by the log scan, with ``owner_from``); None when nothing says."""
        if "owner" in self.numbers:
            return self.numbers["owner"]
        lib = self.numbers.get("library")
        return lib if lib in KERNEL_LIBRARIES else None

    @property
    def function(self) -> str | None:
        return self.numbers.get("function")

    @property
    def file(self) -> str | None:
        return self.numbers.get("file")

    @property
    def source_line(self) -> int | None:
        return self.numbers.get("source_line")

    def recognised(self) -> dict:
        """What the line was read as: its class, failure, library, source file and line, and what else it carries."""
        d = {"kind": self.kind, "failure": self.failure, "library": self.numbers.get("library")}
        for k, v in self.numbers.items():
            if k not in d:
                d[k] = v
        return d

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "line": self.line_no, "text": self.text}
        if self.rank is not None:
            d["rank"] = self.rank
            if self.rank_inferred:
                d["rank_inferred"] = True
        if self.timestamp:
            d["timestamp"] = self.timestamp
        if self.numbers:
            d["numbers"] = dict(self.numbers)
        return d
