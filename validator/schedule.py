"""FlashMLA's decode scheduler (``get_decoding_sched_meta``), modelled bit for bit.

Two implementations of the same greedy partitioning:

* :func:`schedule_reference` - a plain loop over requests and partitions, written to read like the
  description in the facts (one cursor: request ``r``, block offset ``k``, split counter ``j``).
* :func:`schedule_fast` - the production path. It walks a *stream* where request ``i`` occupies
  ``[C[i], C[i+1])`` with ``C`` the prefix sum of ``n_i + F``. A partition starting at stream
  position ``x`` ends at ``x + payload``; if a request boundary lies within the last ``F`` units the
  partition stops there, otherwise it splits the request and the next partition starts at
  ``end - F`` (it pays the fixed overhead again). So ``x' = max(x + Q, floor_C(x + Q + F))`` with
  ``Q = payload - F``: one binary search per partition, O(b + P log b), and for the common
  uniform-length case no per-request arrays at all (boundaries are multiples of one width).
  The walk keeps only what the rules read (split events) and where each partition starts; the
  metadata rows are derived from those positions on demand.

Speed notes (the walk is one Python step per partition, so constant factors matter): small batches
build prefix sums with Python ints (numpy's per-call overhead dominates there); large ones keep them
in numpy and binary-search them through a memoryview instead of converting b values to Python ints;
when there are at most about as many requests as partitions the next boundary is found by looking
one or two requests ahead.

Both return a :class:`Schedule` whose ``metadata`` is the ``[P, 8]`` int32 tile metadata (column 7,
which the kernel never writes, is 0) and ``num_splits`` the cumulative ``[b + 1]`` int32 array.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np


@dataclass(eq=False)
class Schedule:
    """The scheduler's output for one call, plus cheap summaries the rules read.

    The fast path records where each *active* partition (one that receives work) starts in the
    stream (``starts``; the last one stops at ``total``) and the request of every split event;
    ``metadata`` and ``num_splits`` are derived from these lazily, with a few vector operations,
    only when somebody asks for them. The reference path fills ``rows`` directly.
    """

    b: int
    num_sm_parts: int
    split_requests: list            # request index of every split event, ascending
    rows: list | None = None        # reference path: P rows of columns 0..6
    lengths: np.ndarray | None = None   # effective lengths (fast path, non-uniform)
    uniform: int | None = None          # the common effective length (fast path, uniform)
    fixed_overhead: int = 0
    block: int = 64
    starts: list | None = None      # fast path: stream position where each active partition begins
    total: int = 0                  # fast path: stream length sum(n_i + F)
    prefix: np.ndarray | list | None = None  # fast path, non-uniform: C [b + 1] (int64, or ints)
    _metadata: np.ndarray | None = field(default=None, repr=False)
    _num_splits: np.ndarray | None = field(default=None, repr=False)

    @property
    def num_split_events(self) -> int:
        return len(self.split_requests)

    @property
    def last_split_request(self) -> int:
        """Index of the last request that is split (-1 when none is)."""
        return self.split_requests[-1] if self.split_requests else -1

    @property
    def total_splits(self) -> int:
        """``num_splits[b]``: rows of partial results the combine kernel reads."""
        return self.b + len(self.split_requests)

    @property
    def max_split_row(self) -> int:
        """Largest partial-result row index of a request that is split (-1 if none is split).

        ``num_splits`` is cumulative, so the last split request owns the largest such row:
        ``num_splits[r+1] - 1 = r + (split events up to r)`` and every event is at or before it.
        """
        if not self.split_requests:
            return -1
        return self.split_requests[-1] + len(self.split_requests)

    @property
    def metadata(self) -> np.ndarray:
        """``tile_scheduler_metadata``: int32 ``[P, 8]``; column 7 (never written by the kernel) is 0."""
        md = self._metadata
        if md is None:
            md = self._metadata = self._build_metadata()
        return md

    @property
    def num_splits(self) -> np.ndarray:
        """Cumulative ``num_splits``: int32 ``[b + 1]``, i.e. ``r`` plus the split events before ``r``."""
        ns = self._num_splits
        if ns is None:
            ns = self._num_splits = self._build_num_splits()
        return ns

    def _build_metadata(self) -> np.ndarray:
        P = self.num_sm_parts
        if self.rows is not None:
            out = np.zeros((P, 8), dtype=np.int32)
            out[:, :7] = np.asarray(self.rows, dtype=np.int64).reshape(P, 7)
            return out
        b, F = self.b, self.fixed_overhead
        m = len(self.starts)
        # Stream positions where the active partitions start, then where the last one stops: each
        # position is (request q, offset R) with the offset in blocks from the request's start.
        xs = np.array(self.starts + [self.total], dtype=np.int64)
        if self.uniform is not None:
            w = (self.uniform - 1 if self.uniform > 1 else 0) // self.block + 1 + F
            n0 = n_last = w - F
            s_zero = self.uniform == 0
            q = xs // w
            R = xs - q * w
        else:
            C, s = self.prefix, self.lengths
            if not isinstance(C, np.ndarray):
                C = self.prefix = np.array(C, dtype=np.int64)
            n0 = int(C[1]) - F
            n_last = int(C[b] - C[b - 1]) - F
            s_zero = bool(s[b - 1] == 0)
            q = C.searchsorted(xs, "right")
            q -= 1
            R = xs - C[q]
        r, k = q[:-1], R[:-1]                 # where each partition begins
        i, rem = q[1:], R[1:]                 # where it stops (the next one begins)
        sp = rem != 0                         # stops inside request i: it is split
        er = i - 1
        er += sp
        if self.uniform is not None:
            eb = np.where(sp, rem, 0 if s_zero else n0)
        else:
            full = xs[1:] - C[er]             # an unsplit end request is whole: n blocks (0 if empty)
            full -= F
            full[s[er] == 0] = 0
            eb = np.where(sp, rem, full)
        # begin_split: split events in partitions from the first one that reached request r up to
        # this one (0 when the partition starts its request afresh).
        ev = np.add.accumulate(sp, dtype=np.int64)
        ev -= sp
        fs = k > 0
        same = r == er                        # begins and ends in one request: flags are their OR
        both = fs | sp
        out = np.empty((P, 8), dtype=np.int32)
        out[:m, 0] = r
        out[:m, 1] = er
        out[:m, 2] = k
        out[:m, 3] = eb
        out[:m, 4] = ev - ev[i.searchsorted(r)]
        out[:m, 5] = np.where(same, both, fs)
        out[:m, 6] = np.where(same, both, sp)
        out[:m, 7] = 0
        # Partitions after all work is placed: begin_req = b and, as the kernel reads one element past
        # its per-request array, begin_block = last_0; they end with the last request.
        out[m:] = (b, b - 1, n0 - 1, 0 if s_zero else n_last, 0, 0, 0, 0)
        return out

    def _build_num_splits(self) -> np.ndarray:
        b = self.b
        out = np.arange(b + 1, dtype=np.int32)
        ev = self.split_requests
        if not ev:
            return out
        if b <= 2048:       # an event at request e counts for every r > e
            out += np.array(ev, dtype=np.int64).searchsorted(out, "left")
            return out
        edges = np.empty(len(ev) + 2, dtype=np.int64)
        edges[0] = 0
        edges[1:-1] = ev
        edges[1:-1] += 1
        edges[-1] = b + 1
        out += np.repeat(np.arange(len(ev) + 1, dtype=np.int32), np.diff(edges))
        return out

    def split_request_rows(self) -> list[tuple[int, int]]:
        """(request, last partial-result row) for every split request, ascending."""
        out: list[tuple[int, int]] = []
        ev = self.split_requests
        for idx, r in enumerate(ev):
            if idx + 1 == len(ev) or ev[idx + 1] != r:
                out.append((r, r + idx + 1))    # num_splits[r+1] - 1 = r + (events up to r)
        return out


def block_counts(s: np.ndarray, block: int = 64) -> np.ndarray:
    """``n_i = max(s_i - 1, 0) // block + 1``: an empty sequence still counts one block."""
    return np.maximum(s - 1, 0) // block + 1


def schedule_reference(s: list[int] | np.ndarray, num_sm_parts: int, fixed_overhead: int, block: int = 64) -> Schedule:
    """Plain greedy loop, one request and one partition at a time (the readable reference)."""
    s = [int(x) for x in s]
    b, P, F = len(s), num_sm_parts, fixed_overhead
    last = [max(x - 1, 0) // block for x in s]
    n = [x + 1 for x in last]
    total = sum(x + F for x in n)
    payload = -(-total // P) + F
    rows = []
    splits: list[int] = []
    r = k = j = 0
    for _ in range(P):
        budget = payload
        begin_req, begin_block, begin_split, first = r, k, j, int(k != 0)
        if r >= b:  # nothing left: the kernel reads one past its per-request array, i.e. last_0
            begin_block = last[0]
        while r < b:
            need = n[r] - k + F
            if budget >= need:
                budget -= need
                r, k, j = r + 1, 0, 0
            else:
                if budget - F > 0:
                    k += budget - F
                    j += 1
                    splits.append(r)
                break
        end_req = r if k > 0 else r - 1
        end_block = k if k > 0 else (0 if s[end_req] == 0 else last[end_req] + 1)
        last_sp = int(end_block != last[end_req] + 1 and s[end_req] != 0)
        if begin_req == end_req:
            first = last_sp = first | last_sp
        rows.append([begin_req, end_req, begin_block, end_block, begin_split, first, last_sp])
    return Schedule(b, P, splits, rows=rows)


def _walk_uniform(b: int, P: int, F: int, w: int):
    """The greedy walk when every request costs ``w = n + F``: boundaries are multiples of ``w``.

    Returns (total, start of each active partition, request of each split event).
    """
    total = b * w
    QF = -(-total // P) + F
    starts: list[int] = []
    events: list[int] = []
    add_start, add_event = starts.append, events.append
    x = 0
    for _ in range(P):
        add_start(x)
        end = x + QF
        i = end // w
        if i >= b:                      # the rest fits: this partition finishes the batch
            break
        c = i * w
        if c <= x or end - c > F:       # no request ends in [end - F, end]: split request i
            x = end - F
            add_event(i)
        else:                           # stop at the end of request i - 1
            x = c
    return total, starts, events


def _walk_prefix(C, P: int, F: int, total: int):
    """The greedy walk over prefix sums ``C`` (a list, or a memoryview of an int64 array)."""
    QF = -(-total // P) + F
    starts: list[int] = []
    events: list[int] = []
    add_start, add_event = starts.append, events.append
    x = r = 0
    for _ in range(P):
        add_start(x)
        end = x + QF
        if end >= total:
            break
        r = bisect_right(C, end, r) - 1  # last request boundary at or before end (C[r] <= x)
        c = C[r]
        if c <= x or end - c > F:
            x = end - F
            add_event(r)
        else:
            x = c
    return starts, events


def _walk_prefix_short(C, P: int, F: int, total: int):
    """:func:`_walk_prefix` for at most about one request per partition: look at the next two
    boundaries before falling back to a binary search."""
    QF = -(-total // P) + F
    starts: list[int] = []
    events: list[int] = []
    add_start, add_event = starts.append, events.append
    x = r = 0
    for _ in range(P):
        add_start(x)
        end = x + QF
        if end >= total:
            break
        r += 1
        if C[r] <= end:
            r += 1
            if C[r] <= end:
                r = bisect_right(C, end, r)
        r -= 1
        c = C[r]
        if c <= x or end - c > F:
            x = end - F
            add_event(r)
        else:
            x = c
    return starts, events


# Up to this many requests, prefix sums are built with Python ints (cheaper than numpy's per-call
# overhead); above _MEMORYVIEW_RATIO requests per partition they are read through a memoryview
# (one binary search per partition) instead of being converted to Python ints one by one.
_SMALL_B = 96
_MEMORYVIEW_RATIO = 16


def schedule_fast(s: np.ndarray | None, num_sm_parts: int, fixed_overhead: int, block: int = 64,
                  uniform: int | None = None, b: int | None = None) -> Schedule:
    """Schedule by walking the request stream: prefix sums plus one binary search per partition.

    ``uniform``: when every request has the same effective length pass it with ``b`` (``s`` may
    then be None): request boundaries are multiples of one width and nothing of length ``b`` is built.
    """
    P, F = num_sm_parts, fixed_overhead
    if uniform is not None:
        if b is None:
            b = len(s)
        w = (uniform - 1 if uniform > 1 else 0) // block + 1 + F
        total, starts, events = _walk_uniform(b, P, F, w)
        return Schedule(b, P, events, uniform=uniform, fixed_overhead=F, block=block, starts=starts, total=total)
    s = np.asarray(s, dtype=np.int64)
    b = s.shape[0]
    if b <= _SMALL_B:
        w0 = 1 + F
        C = list(accumulate([(v - 1 if v > 1 else 0) // block + w0 for v in s.tolist()], initial=0))
        view = prefix = C
    else:
        prefix = np.empty(b + 1, dtype=np.int64)
        prefix[0] = 0
        if block == 64:
            blocks = np.maximum(s, 1)
            blocks -= 1
            blocks >>= 6
        else:
            blocks = np.maximum(s - 1, 0) // block
        blocks += 1 + F
        np.cumsum(blocks, out=prefix[1:])
        view = memoryview(prefix) if b > _MEMORYVIEW_RATIO * P else prefix.tolist()
    total = int(view[b])
    walk = _walk_prefix_short if b <= P else _walk_prefix
    starts, events = walk(view, P, F, total)
    return Schedule(b, P, events, lengths=s, fixed_overhead=F, block=block, starts=starts, total=total,
                    prefix=prefix)
