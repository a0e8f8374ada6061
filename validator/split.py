"""The minimal safe split of an illegal batch.

Steps keep the requests' order: each step is a contiguous run of the forward's requests (or, with
chunking, of their tokens). The fewest steps are found by dynamic programming over prefixes with a
cheap row-count predicate; every chosen step is then re-checked with the full rule set, and if a
re-check disagrees the search is redone with full checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .batch import Batch, Request


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


def _full_ok(batch: Batch, reqs: list[Request], kernel) -> bool:
    from .engine import check_engine_batch

    return check_engine_batch(batch.with_requests(reqs), kernel=kernel, split=False).legal


def _row_cost(batch: Batch, r: Request) -> int:
    mode = batch.forward_mode
    if mode == "target_verify":
        return int(batch.arg("speculative_num_draft_tokens") or 0)
    if r.is_decode:
        return 1
    if mode == "draft_extend":
        return r.extend_tokens or int(batch.arg("speculative_num_draft_tokens") or 0)
    return r.extend_tokens


@dataclass(frozen=True)
class RowRule:
    """Legality of a step from its request rows alone: ``0 < rows + merged <= max_rows``, or, when
    the forward can be routed, ``rows + merged > threshold`` too (a non-monotone predicate)."""

    max_rows: int
    threshold: int | None
    merged: int

    def __call__(self, rows: int) -> bool:
        total = rows + self.merged
        if total <= 0:
            return False
        return total <= self.max_rows or (self.threshold is not None and total > self.threshold)


def _rows_predicate(batch: Batch, report) -> RowRule | None:
    """The row rule of this batch, when only the row count can matter (DSv4 without slots)."""
    bp = report.batch_plan
    if bp is None or bp.rows is None or bp.slots is not None:
        return None
    routable = batch.forward_mode in ("extend", "mixed")
    thr = bp.routing.get("threshold") if routable else None
    return RowRule(bp.max_decode_rows, thr, len(batch.running) if batch.mixed else 0)


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
    from collections import deque

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
    if batch.forward_mode not in ("extend", "mixed"):
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
            out.append(Request(r.id, c["tokens"], r.prefix_len + c["start"], r.seq_len, r.req_pool_idx, r.dp_rank, False))
    return out


def _settings(batch: Batch, report) -> list[dict]:
    bp = report.batch_plan
    out: list[dict] = []
    if bp is None:
        return out
    if bp.rows is not None and bp.max_decode_rows is not None:
        L = bp.max_decode_rows
        mode = batch.forward_mode
        if mode in ("extend", "mixed"):
            if batch.arg("enable_mixed_chunk", False) or mode == "mixed":
                R = int(batch.arg("max_running_requests") or len(batch.running) or 0)
                out.append({"flag": "--chunked-prefill-size", "value": L - R,
                            "why": f"with mixed chunking up to {R} running decodes join each prefill: {L} - {R}"})
            else:
                out.append({"flag": "--chunked-prefill-size", "value": L,
                            "why": f"bounds the query rows of every extend forward to the decode kernel's {L}"})
            out.append({"flag": "--max-prefill-tokens", "value": L, "why": "keeps a prefill batch's new tokens within the limit"})
            if bp.routing.get("threshold") is not None:
                out.append({"flag": "(engine)", "value": f"route at > {L} rows instead of > {bp.routing['threshold']}",
                            "why": "the routing threshold assumes 228 KiB of shared memory; the opt-in limit is 227 KiB"})
            else:
                out.append({"flag": "(upgrade)", "value": "SGLang with sparse-prefill routing (PR #25418)",
                            "why": f"routes extend forwards above 11673 rows to flash_mla_sparse_fwd; {L + 1}..11673 still crash"})
        elif mode == "target_verify":
            d = int(batch.arg("speculative_num_draft_tokens") or 1)
            out.append({"flag": "--max-running-requests", "value": L // d,
                        "why": f"a verify forward has batch size x {d} draft tokens rows"})
        else:
            out.append({"flag": "--max-running-requests", "value": L, "why": "a decode forward has one row per request"})
    if bp.slots is not None:
        s = bp.slots
        for buf in s.buffers[1:]:
            if buf.rows < s.table_rows:
                out.append({"flag": "(engine)", "value": f"size {buf.name} with {s.table_rows + 1} rows",
                            "why": f"live slots go up to {s.table_rows - 1}; it has {buf.rows} ({buf.sizing})"})
        if s.pd_decode and s.extra_slots:
            out.append({"flag": "--disaggregation-decode-extra-slots", "value": 0,
                        "why": f"stopgap: keeps slots within {s.max_running} so {s.max_running + 1}-row buffers suffice (fewer pre-allocated transfers)"})
    return out


def safe_split(batch: Batch, report, kernel=None) -> SafeSplit:
    reqs = list(batch.requests)
    n = len(reqs)
    errors = report.errors
    slot_errors = [f for f in errors if f.code.startswith("SLOT")]
    settings = _settings(batch, report)
    if slot_errors:
        who = ", ".join(sorted({str(f.numbers.get("request")) for f in slot_errors}))
        return SafeSplit(False, reason=(f"no split can make request(s) {who} legal: the slot is the request's own and "
                                        f"a slot-indexed buffer is too small ({slot_errors[0].message}); fix the sizing"),
                         settings=settings)
    pred = _rows_predicate(batch, report)
    costs = [_row_cost(batch, r) for r in reqs]
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    memo: dict[tuple[int, int], bool] = {}

    def full_seg(i: int, j: int) -> bool:
        if (i, j) not in memo:
            memo[(i, j)] = _full_ok(batch, reqs[i:j], kernel)
        return memo[(i, j)]

    seg_ok = (lambda i, j: pred(prefix[j] - prefix[i])) if pred is not None else full_seg
    segs = _min_segments_rows(prefix, pred) if pred is not None else None
    if segs is None:
        segs = _min_contiguous(n, seg_ok) if (pred is None or n <= 400) else None
    rechecked = True
    if segs is not None and not all(full_seg(i, j) for i, j in segs):
        rechecked = True
        segs = _min_contiguous(n, full_seg)
    steps = [[r.id for r in reqs[i:j]] for i, j in segs] if segs is not None else None
    unchunked_reason = ""
    if steps is None:
        bad = [r.id for k, r in enumerate(reqs) if not seg_ok(k, k + 1)]
        unchunked_reason = f"request(s) {', '.join(bad)} are illegal even alone; they need chunking"
    chunked = None
    if pred is not None and batch.forward_mode in ("extend", "mixed"):
        merged = len(batch.running) if batch.mixed else 0
        cap = report.batch_plan.max_decode_rows - merged
        chunked = _chunked(batch, pred, cap)
        if chunked is not None and not all(_full_ok(batch, _chunk_requests(batch, st), kernel) for st in chunked):
            chunked = None
    naive = None
    if batch.forward_mode in ("extend", "mixed") and (batch.running or any(r.is_decode for r in reqs)):
        prefills = [r for r in reqs if not r.is_decode]
        illegal = [r.id for r in prefills if not _full_ok(batch, [r], kernel)]
        naive = {"rule": "one prefill per step while decoding", "steps": len(prefills), "illegal_steps": illegal,
                 "crashes": bool(illegal)}
    possible = steps is not None or chunked is not None
    reason = "" if possible else (unchunked_reason or "no step arrangement is legal under every rule")
    return SafeSplit(possible, reason, steps, chunked, unchunked_reason, naive, settings, rechecked)
