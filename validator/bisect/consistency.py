"""Notes on whether the evidence agrees with the settings and the model's boundary."""
from __future__ import annotations

from ..ingest.crash_lines import ErrorEvent
from ..ingest.scan import LogEvidence
from .builder import Builder
from .results import Candidate


def cross_check(c: Candidate, err: ErrorEvent, notes: list[str]) -> None:
    """An index error names its buffer's size: say whether the model's boundary agrees with it."""
    b = c.boundary
    if err.kind == "index_oob" and b is not None and b.largest_legal is not None:
        size = err.numbers.get("size")
        if size is not None and b.largest_legal != size - 1:
            notes.append(f"the error's buffer has {size} rows (largest index {size - 1}) but the model's boundary is "
                         f"{b.largest_legal}: the settings given differ from the crashed server's")
        elif size is not None:
            notes.append(f"the model agrees with the error: the buffer has {size} rows, so slot {size - 1} is the "
                         f"largest legal one")


def survival_check(ev: LogEvidence, c: Candidate | None, after: bool | None, notes: list[str]) -> None:
    """A prefill printed after its forward ran: if the model calls it illegal, say so."""
    if c is None or c.boundary is None or c.boundary.largest_legal is None or c.quantity != "query rows":
        return
    if after is not True:
        return
    tl = ev.ranks.get(c.rank)
    big = tl.largest_prefill if tl else None
    if big is not None and big.new_token and big.new_token > c.boundary.largest_legal and c.kind == "prefill":
        notes.append(f"line {big.line_no}: a prefill of {big.new_token} new tokens completed, above the model's "
                     f"boundary {c.boundary.largest_legal}: the engine version or settings differ from those assumed")


def budget_check(ev: LogEvidence, b: Builder, notes: list[str]) -> None:
    """A logged prefill larger than the chunk budget means the settings given are not the server's."""
    budget, bsrc = b.budget()
    if budget is None:
        return
    big = max((tl.largest_prefill for tl in ev.ranks.values() if tl.largest_prefill is not None),
              key=lambda s: s.new_token or 0, default=None)
    if big is not None and (big.new_token or 0) > budget:
        notes.append(f"line {big.line_no}: a prefill of {big.new_token} new tokens on {big.rank} is larger than the "
                     f"budget {bsrc}: the settings given do not match this server's")
