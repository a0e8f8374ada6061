"""The minimal safe split of an illegal batch.

Steps keep the requests' order: each step is a contiguous run of the forward's requests (or, with
chunking, of their tokens). The fewest steps are found by dynamic programming over prefixes with a
cheap row-count predicate (the configuration's :class:`~validate_batch.legality.bounds.RowRule`); every chosen
step is then re-checked with the full rule set, and if a re-check disagrees the search is redone
with full checks.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..inputs.batch import Batch, Request, RequestColumns, request_arrays
from .bounds import RowRule
from ..engines.forward import request_rows
from .ruleset import get_rule
from .search import largest_legal


@dataclass
class SafeSplit:
    possible: bool
    reason: str = ""
    steps: list[list[str]] | None = None              # whole requests per step (no chunking)
    chunked_steps: list[list[dict]] | None = None     # {id, start, tokens} per step (chunking allowed)
    unchunked_reason: str = ""
    naive: dict | None = None                         # the "one prefill per step while decoding" guard
    settings: list[dict] = field(default_factory=list)
    rechecked: bool = False

    @property
    def num_steps(self) -> int | None:
        return len(self.steps) if self.steps is not None else None

    @property
    def num_chunked_steps(self) -> int | None:
        return len(self.chunked_steps) if self.chunked_steps is not None else None

    def to_dict(self) -> dict:
        d: dict = {"possible": self.possible, "steps": self.steps, "num_steps": self.num_steps,
                   "chunked_steps": self.chunked_steps, "num_chunked_steps": self.num_chunked_steps,
                   "rechecked": self.rechecked, "settings": self.settings}
        if self.reason:
            d["reason"] = self.reason
        if self.unchunked_reason:
            d["unchunked_reason"] = self.unchunked_reason
        if self.naive is not None:
            d["naive_guard"] = self.naive
        return d


def _min_segments_rows(prefix: list[int], rule: RowRule) -> list[tuple[int, int]] | None:
    """Fewest contiguous segments under a RowRule, in O(n) (exact).

    Without routing the rule is monotone (a sub-run of a legal run is legal), so filling each step
    greedily is optimal. With routing a run is legal when short enough or long enough; the DP then
    takes, for each end j, the best start among the short-enough window (a sliding minimum, its left
    edge only moves right) and among the long-enough prefix (a running minimum).
    """
    n = len(prefix) - 1
    if any(prefix[k + 1] == prefix[k] for k in range(n)):
        return None  # zero-row requests: let the general DP handle the emptiness edge cases
    if rule.threshold is None and rule.min_rows > 1:
        return _min_segments_window(prefix, rule.min_rows - rule.merged, rule.max_rows - rule.merged)
    if rule.threshold is None:
        segs, i = [], 0
        while i < n:
            j = i
            while j < n and rule(prefix[j + 1] - prefix[i]):
                j += 1
            if j == i:
                return None
            segs.append((i, j))
            i = j
        return segs
    INF = n + 1
    best = [0] + [INF] * n
    prev = [-1] * (n + 1)
    window: deque[int] = deque()          # candidate starts with increasing best, for the short run
    lo = 0                                # first start whose run to j is short enough
    pre_best, pre_arg, hi = INF, -1, 0    # running minimum over starts whose run to j is long enough
    cap_short = rule.max_rows - rule.merged
    cap_long = rule.threshold - rule.merged
    for j in range(1, n + 1):
        k = j - 1
        while window and best[window[-1]] >= best[k]:
            window.pop()
        window.append(k)
        while prefix[j] - prefix[lo] > cap_short:
            lo += 1
        while window and window[0] < lo:
            window.popleft()
        while hi < j and prefix[j] - prefix[hi] > cap_long:
            if best[hi] < pre_best:
                pre_best, pre_arg = best[hi], hi
            hi += 1
        cand, arg = INF, -1
        if window and best[window[0]] < cand:
            cand, arg = best[window[0]], window[0]
        if pre_best < cand:
            cand, arg = pre_best, pre_arg
        if cand < INF:
            best[j], prev[j] = cand + 1, arg
    return _segments(best, prev, n)


def _min_segments_window(prefix: list[int], low: int, cap: int) -> list[tuple[int, int]] | None:
    """Fewest contiguous segments whose rows are each in ``low..cap``, in O(n) (exact): for each end
    j the starts whose run to j fits form a window that only moves right (a sliding minimum)."""
    n = len(prefix) - 1
    INF = n + 1
    best = [0] + [INF] * n
    prev = [-1] * (n + 1)
    window: deque[int] = deque()          # eligible starts with increasing best
    nxt = 0                               # next start not yet in the window
    for j in range(1, n + 1):
        while nxt < j and prefix[j] - prefix[nxt] >= low:       # long enough: eligible from now on
            while window and best[window[-1]] >= best[nxt]:
                window.pop()
            window.append(nxt)
            nxt += 1
        while window and prefix[j] - prefix[window[0]] > cap:  # too long: never again
            window.popleft()
        if window and best[window[0]] < INF:
            best[j], prev[j] = best[window[0]] + 1, window[0]
    return _segments(best, prev, n)


def _segments(best: list[int], prev: list[int], n: int) -> list[tuple[int, int]] | None:
    """Walk the DP's back-pointers from n to 0; None when n was never reached."""
    if best[n] > n:
        return None
    segs = []
    j = n
    while j > 0:
        segs.append((prev[j], j))
        j = prev[j]
    return segs[::-1]


def _min_contiguous(n: int, seg_ok: Callable[[int, int], bool]) -> list[tuple[int, int]] | None:
    """Fewest contiguous segments [i, j) covering 0..n, each accepted by seg_ok (exact DP)."""
    INF = n + 1
    best = [0] + [INF] * n
    prev = [-1] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j - 1, -1, -1):
            if best[i] + 1 < best[j] and seg_ok(i, j):
                best[j] = best[i] + 1
                prev[j] = i
    return _segments(best, prev, n)


def _chunked(batch: Batch, step_ok: Callable[[int], bool], cap: int) -> list[list[dict]] | None:
    """Greedy chunking: each step takes the largest legal number of remaining tokens."""
    if not batch.forward_mode.is_routable():
        return None
    items = [[r, r.extend_tokens, 0] for r in batch.requests if not r.is_decode]
    decodes = [r for r in batch.requests if r.is_decode]
    remaining = sum(x[1] for x in items)
    steps: list[list[dict]] = []
    first = True
    while remaining > 0 or (first and decodes):
        take = remaining + (len(decodes) if first else 0)
        size = remaining if step_ok(take) else min(remaining, cap - (len(decodes) if first else 0))
        if size <= 0 and remaining > 0:
            return None
        step: list[dict] = []
        if first:
            step.extend({"id": r.id, "start": 0, "tokens": 1, "decode": True} for r in decodes)
        left = size
        for it in items:
            if left == 0:
                break
            r, rem, done = it
            if rem == 0:
                continue
            n = min(rem, left)
            step.append({"id": r.id, "start": done, "tokens": n})
            it[1] -= n
            it[2] += n
            left -= n
        remaining -= size
        steps.append(step)
        first = False
    return steps


def _chunk_requests(batch: Batch, step: list[dict]) -> list[Request]:
    by_id = {r.id: r for r in batch.requests}
    out = []
    for c in step:
        r = by_id[c["id"]]
        if c.get("decode"):
            out.append(r)
        else:
            out.append(Request(r.id, c["tokens"], r.prefix_len + c["start"], r.seq_len, r.req_pool_idx, r.dp_rank, False, r.global_slot))
    return out


#: requests named in a reason; full checks of single requests the split makes at most (the rest
#: follow from the row rule when it decides, or are not named)
MAX_NAMED = 20
MAX_SINGLE_CHECKS = 64


def _settings(batch: Batch, report, bounds) -> list[dict]:
    """Engine settings that would have prevented the batch, from each of its profiles."""
    bp = report.batch_plan
    if bp is None:
        return []
    return [st for prof in bp.profiles for st in prof.prevention(batch, bp, bounds)]


def _no_split(errors: list, shapes_grow: bool = False) -> str | None:
    """Why no split can help, when some error is of a rule that splitting cannot fix (it reads only
    the configuration or a request's own slot); None otherwise. ``shapes_grow``: a profile's call
    shapes grow with the step's rows (a vLLM mixed batch), so a shape-only rule is one a split fixes."""
    fixed = [f for f in errors if not (_rule_of(f).split_helps or (shapes_grow and _rule_of(f).shape_only))]
    if not fixed:
        return None
    first = fixed[0]
    who = sorted({str(f.numbers["request"]) for f in fixed if "request" in f.numbers})
    if who:
        return (f"no split can make request(s) {', '.join(who)} legal: the slot is the request's own and "
                f"a slot-indexed buffer is too small ({first.message}); fix the sizing")
    codes = ", ".join(sorted({f.code for f in fixed}))
    return f"no split can help: the configuration itself breaks {codes} ({first.message})"


def _rule_of(f):
    r = get_rule(f.code)
    if r is None:           # a finding of a rule removed since: treat as one a split may fix
        return _UNKNOWN
    return r


class _Unknown:
    split_helps = True
    shape_only = False


_UNKNOWN = _Unknown()


def _min_greedy(n: int, seg_ok: Callable[[int, int], bool], prefix: list[int] | None = None,
                low: int = 1) -> list[tuple[int, int]] | None:
    """Contiguous segments, each the longest legal run from its start (found by bisection): for
    long steps whose legality only the full check can tell (not always the fewest). ``low``: runs
    of fewer rows (``prefix``: the rows before each request) are never legal (a path not
    modelled), so a run starts at ``low`` rows and leaves none or at least ``low`` behind it."""
    segs, i = [], 0
    while i < n:
        if low > 1 and prefix is not None:
            if seg_ok(i, n):
                segs.append((i, n))
                break
            j0 = next((j for j in range(i + 1, n + 1) if prefix[j] - prefix[i] >= low), None)
            cap = next((j for j in range(n - 1, i, -1) if prefix[n] - prefix[j] >= low), None)
            if j0 is None or cap is None or cap < j0:
                return None
            good, _ = largest_legal(lambda j: seg_ok(i, j), j0, cap, cap)
        else:
            good, _ = largest_legal(lambda j: seg_ok(i, j), i + 1, n, n)
        if good is None:
            return None
        segs.append((i, good))
        i = good
    return segs


def safe_split(batch: Batch, report, legal: Callable[[list], bool], bounds) -> SafeSplit:
    """The fewest steps that run ``batch``'s requests in order, each legal under every rule.

    ``legal(requests)``: the full check of the batch with just these requests; ``bounds``: the
    configuration's :class:`~validate_batch.legality.bounds.StepBounds` (its row rule is the cheap predicate)."""
    reqs = batch.requests
    if not isinstance(reqs, RequestColumns):
        reqs = tuple(reqs)
    n = len(reqs)
    ids = reqs.id_list() if isinstance(reqs, RequestColumns) else [r.id for r in reqs]
    settings = _settings(batch, report, bounds)
    bp = report.batch_plan
    if bp is not None and bp.rows == 0 and any(f.code == "SGL002" for f in report.errors):
        # nothing to split or chunk: an empty forward is illegal in every step it could become
        return SafeSplit(False, reason="no split can help: the forward has no query rows (no new tokens); "
                                       "do not launch attention for an empty forward")
    reason = _no_split(report.errors, bp is not None and any(p.shape_grows_with_rows for p in bp.profiles))
    if reason is not None:
        return SafeSplit(False, reason=reason, settings=settings)
    merged = len(batch.running) if batch.mixed else 0
    pred = bounds.row_rule(batch.forward_mode, merged) if report.batch_plan is not None else None
    low = pred.min_rows - merged if pred is not None else 1     # shorter runs are not modelled
    costs = request_rows(batch) if pred is not None else [0] * n
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    memo: dict[tuple[int, int], bool] = {}

    def full_seg(i: int, j: int) -> bool:
        if (i, j) not in memo:
            memo[(i, j)] = legal(reqs[i:j])
        return memo[(i, j)]

    seg_ok = (lambda i, j: pred(prefix[j] - prefix[i])) if pred is not None else full_seg
    segs = _min_segments_rows(prefix, pred) if pred is not None else None
    if segs is None:
        if n <= 400:
            segs = _min_contiguous(n, seg_ok)
        elif pred is None:
            segs = _min_greedy(n, seg_ok)
    rechecked = True
    if segs is not None and not all(full_seg(i, j) for i, j in segs):
        segs = _min_contiguous(n, full_seg) if n <= 400 else _min_greedy(n, full_seg, prefix, low)
    steps = [ids[i:j] for i, j in segs] if segs is not None else None
    unchunked_reason = ""
    if steps is None:
        bad, asked = [], 0
        for k in range(n):              # full checks are bounded: the first few requests illegal alone
            if len(bad) >= MAX_NAMED or (pred is None and asked >= MAX_SINGLE_CHECKS):
                break
            asked += pred is None
            if not seg_ok(k, k + 1):
                bad.append(ids[k])
        more = " (and possibly more)" if len(bad) >= MAX_NAMED or asked >= MAX_SINGLE_CHECKS else ""
        unchunked_reason = f"request(s) {', '.join(bad)}{more} are illegal even alone; they need chunking"
    chunked = None
    if pred is not None and batch.forward_mode.is_routable():
        chunked = _chunked(batch, pred, bounds.max_rows - merged)
        if chunked is not None and not all(legal(_chunk_requests(batch, st)) for st in chunked):
            chunked = None
    naive = None
    is_dec = request_arrays(reqs)[3]
    if batch.forward_mode.is_routable() and (batch.running or bool(is_dec.any())):
        prefills = [k for k in range(n) if not is_dec[k]]
        # a prefill alone: by the row rule when it decides, else a full check (at most MAX_SINGLE_CHECKS)
        one = (lambda k: pred(costs[k])) if pred is not None else (lambda k: legal(reqs[k:k + 1]))
        illegal = [ids[k] for k in prefills[:MAX_SINGLE_CHECKS if pred is None else len(prefills)] if not one(k)]
        naive = {"rule": "one prefill per step while decoding", "steps": len(prefills), "illegal_steps": illegal,
                 "crashes": bool(illegal)}
    possible = steps is not None or chunked is not None
    reason = "" if possible else (unchunked_reason or "no step arrangement is legal under every rule")
    return SafeSplit(possible, reason, steps, chunked, unchunked_reason, naive, settings, rechecked)
