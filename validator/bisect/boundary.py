"""Asking the checker, and bisecting the quantity that varies to where its verdict flips."""
from __future__ import annotations

from typing import Any, Callable

from ..api import check
from ..legality.search import largest_legal
from .results import Boundary

MAX_VALUE = 1 << 22          # search cap for a quantity (rows, slots, batch size)


class BisectChecker:
    """``validate_batch.check`` with a call count; every verdict of bisection comes through here. With
    ``keep_code`` (``--select`` / ``--ignore``) only the findings of the rule codes it keeps count."""

    def __init__(self, gpu: Any = None, kernel_gen: str | None = None, keep_code: Callable[[str], bool] | None = None):
        self.gpu = gpu
        self.kernel_gen = kernel_gen
        self.keep_code = keep_code
        self.calls = 0

    def __call__(self, doc: dict, split: bool = False):
        self.calls += 1
        kw: dict = {"kernel": self.kernel_gen}
        if self.gpu is not None:
            kw["gpu"] = self.gpu
        if "engine" in doc:
            kw["split"] = split
            kw["chunk"] = False     # a logged step is what the engine ran: never re-chunked
        report = check(doc, **kw)
        if self.keep_code is not None:
            report.findings = [f for f in report.findings if self.keep_code(f.code)]
        return report


def error_codes(report, targets: set[str] | None) -> list[str]:
    """The report's error codes (sorted), only those in ``targets`` when given."""
    codes = sorted({f.code for f in report.findings if f.is_error})
    if targets:
        return [c for c in codes if c in targets]
    return codes


def find_boundary(make: Callable[[int], dict], checker: BisectChecker, lo: int, observed: int | None,
                  targets: set[str] | None, quantity: str, cap: int = MAX_VALUE) -> Boundary:
    """Largest ``v >= lo`` whose batch the checker finds legal (for the ``targets`` codes), by
    galloping up from ``observed`` (or ``lo``) and bisecting (:func:`validate_batch.legality.search.largest_legal`);
    assumes legality is monotone in ``v``."""
    cache: dict[int, list[str]] = {}

    def bad(v: int) -> list[str]:
        if v not in cache:
            cache[v] = error_codes(checker(make(v)), targets)
        return cache[v]

    start = observed if observed is not None and observed > lo else None
    good, first_bad = largest_legal(lambda v: not bad(v), lo, start, cap)
    if good is None:
        return Boundary(quantity, None, lo, observed, bad(lo), len(cache),
                        note=f"illegal already at the smallest value {lo}: the varying quantity is not the cause")
    if first_bad is None:
        return Boundary(quantity, None, None, observed, [], len(cache),
                        note=f"legal up to {good}: no boundary below {cap}")
    return Boundary(quantity, good, first_bad, observed, bad(first_bad), len(cache))
