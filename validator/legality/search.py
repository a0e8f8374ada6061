"""The one boundary search over a monotone legality: the largest legal value of a quantity.

Used wherever the model's verdict is searched along one quantity (the bounds' edges, headroom from
full checks, the split's longest legal run, bisect's boundary). Kernel mode's probe search
(:func:`validate_batch.kernel_mode.probe.bisect`) is a different search: it measures real kernel runs in
parallel rounds and copes with inconclusive runs and with legality that is not monotone.
"""
from __future__ import annotations

from typing import Callable


def largest_legal(legal: Callable[[int], bool], lo: int, start: int | None = None, cap: int = 1 << 62,
                  exact_hint: bool = False) -> tuple[int | None, int | None]:
    """``(largest legal v in lo..cap, smallest illegal v)`` when the legal values are ``lo..edge``.

    The first is None when ``lo`` itself is illegal; the second None when every value up to ``cap``
    is legal. The search gallops up from ``start`` (or from ``lo``), doubling, then bisects.
    ``exact_hint``: ``start`` is believed to be the edge, so ``start`` and ``start + 1`` are asked
    first (two evaluations when it is right). Each value is evaluated at most once.
    """
    seen: dict[int, bool] = {}

    def ok(v: int) -> bool:
        if v not in seen:
            seen[v] = bool(legal(v))
        return seen[v]

    if exact_hint and start is not None and lo <= start < cap and ok(start) and not ok(start + 1):
        return start, start + 1
    if not ok(lo):
        return None, lo
    good = lo
    probe = start if start is not None and start > lo else max(lo * 2, lo + 1)
    bad = None
    while True:
        probe = min(probe, cap)
        if probe <= good:
            break
        if not ok(probe):
            bad = probe
            break
        good = probe
        if probe == cap:
            break
        probe = probe * 2
    if bad is None:
        return good, None
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good, bad
