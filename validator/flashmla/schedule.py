"""FlashMLA's decode scheduler (``get_decoding_sched_meta``), modelled bit for bit.

Two implementations of the same greedy partitioning:

* :func:`schedule_reference` - a plain loop over requests and partitions, written to read like the
  description in the facts (one cursor: request ``r``, block offset ``k``, split counter ``j``).
* :func:`schedule_fast` - the production path. It walks a *stream* where request ``i`` occupies
  ``[C[i], C[i+1])`` with ``C`` the prefix sum of ``n_i + F``. A partition starting at stream
  position ``x`` ends at ``x + payload``; if a request boundary lies within the last ``F`` units the
  partition stops there, otherwise it splits the request and the next partition starts at
  ``end - F`` (it pays the fixed overhead again). So ``x' = max(x + Q, floor_C(x + Q + F))`` with
  ``Q = payload - F``: one binary search per partition, O(b + P log b).

  When every request has the same length (the common case) the boundaries are the multiples of one
  width ``w`` and the walk is periodic: from a boundary it advances by ``Q`` until ``k*Q mod w`` falls
  in ``{0} | [w - F, w)``, then snaps to the next boundary and starts over. The period ``T`` and its
  length ``L`` give every partition's start in closed form, ``x_p = (p // T) * L + (p % T) * Q``, so
  the summaries the rules read cost O(T) with T <= P, and the metadata rows are one period's rows
  repeated and shifted.

Both return a :class:`Schedule` whose ``metadata`` is the ``[P, 8]`` int32 tile metadata (column 7,
which the kernel never writes, is 0) and ``num_splits`` the cumulative ``[b + 1]`` int32 array; both
are derived lazily, only when somebody asks for them.

When the compiled helpers are built (:mod:`validate_batch._accel`), the non-uniform walk is one forward
pass over the requests in C (the boundaries only move forward, so no search is needed), and the
metadata rows and ``num_splits`` come from one pass of the kernel's own loop in C; the Schedule
keeps the walk's starts and events packed until they are read. The pure-Python paths below give the
same results (the tests run both).

Speed notes on the pure-Python walk (one Python step per partition, so constant factors matter):
small batches build prefix sums with Python ints (numpy's per-call overhead dominates there), larger
ones with numpy, converted to Python ints in one call; beyond 16 requests per partition they stay in
numpy and are binary-searched through a memoryview instead of converting b values to Python ints.
Either way one walk, :func:`_walk_prefix`, reads them, each binary search confined to the requests
a partition can reach.
"""
from __future__ import annotations

import os
import sys
import weakref
from threading import Lock
from bisect import bisect_right
from dataclasses import MISSING, dataclass, fields
from itertools import accumulate

from .. import _accel
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


@dataclass(frozen=True, init=False)
class Period:
    """The periodic walk of a uniform-length schedule (see the module docstring).

    ``T`` partitions per period (0: no partition before the last one reaches a boundary, i.e.
    ``x_p = p * Q``), ``L`` stream units per period (a multiple of ``w``), ``Q`` the payload less
    ``F``, ``w`` the stream width of one request and ``m`` the number of active partitions.
    """

    T: int
    L: int
    Q: int
    w: int
    m: int

    def __init__(self, T: int, L: int, Q: int, w: int, m: int):
        # (one dict for the fields: a frozen dataclass's own __init__ sets each through object.__setattr__)
        object.__setattr__(self, "__dict__", {"T": T, "L": L, "Q": Q, "w": w, "m": m})

    def start(self, p: int) -> int:
        if self.T:
            a, k = divmod(p, self.T)
            return a * self.L + k * self.Q
        return p * self.Q

    def starts(self, p: np.ndarray) -> np.ndarray:
        if self.T:
            a, k = np.divmod(p, self.T)
            return a * self.L + k * self.Q
        return p * self.Q

    @property
    def num_events(self) -> int:
        """Split partitions: every active one but the last, less those closing a period."""
        return self.m - 1 - ((self.m - 1) // self.T if self.T else 0)

    def last_event(self) -> int:
        """Request of the last split event (-1 when nothing is split)."""
        if self.num_events == 0:
            return -1
        p = self.m - 2
        if self.T and p % self.T == self.T - 1:
            p -= 1
        return self.start(p + 1) // self.w     # a split partition stops at its start + Q

    def event_array(self) -> np.ndarray:
        """Requests of the split events in order: per period, partitions 0..T-2 split at
        ``(k+1)*Q // w`` requests past the period's first; the last active partition never splits."""
        E = self.num_events
        if not self.T:
            return (np.arange(1, E + 1, dtype=np.int64) * self.Q) // self.w
        if self.T == 1:
            return np.empty(0, dtype=np.int64)
        rel = (np.arange(1, self.T, dtype=np.int64) * self.Q) // self.w
        n_per = -(-E // (self.T - 1))
        S = self.L // self.w
        ev = rel + np.arange(0, n_per * S, S, dtype=np.int64)[:, None]
        return ev.reshape(-1)[:E]


# A non-snapping residue walk longer than this is searched with numpy rather than a Python loop.
_PERIOD_SCAN = 256
# Periods up to this many partitions get their metadata rows built once and repeated.
_TILE_MAX = 64


def _first_snap(step: int, w: int, lo: int, kmax: int) -> int:
    """The first k in 1..kmax whose residue ``k * step % w`` is 0 or at least ``lo`` (0 < lo <= w,
    0 <= step < w), or 0 when there is none. The residues climb by ``step`` and wrap below ``w``: a
    climb reaches ``lo`` or wraps, so one step per wrap finds it (not one per k)."""
    if step == 0:
        return 1
    k = t = 0                          # residue t after k steps; t is never a hit here
    while True:
        j = -(-(lo - t) // step)       # the climb's first residue >= lo
        k += j
        if k > kmax:
            return 0
        t += j * step
        if t < w:                      # in [lo, w): a hit
            return k
        t -= w                         # wrapped (the climb passed over [lo, w)): 0 <= t < step
        if t == 0 or t >= lo:
            return k


def _period(b: int, P: int, F: int, w: int) -> Period:
    total = b * w
    Q = -(-total // P)
    step, lo = Q % w, w - F
    T = _first_snap(step, w, lo, min(P, _PERIOD_SCAN))
    if not T:
        if P > _PERIOD_SCAN:
            ks = np.arange(_PERIOD_SCAN + 1, P + 1, dtype=np.int64)
            res = ks * step % w
            hit = (res == 0) | (res >= lo)
            if hit.any():
                T = int(ks[hit.argmax()])
    L = -(-T * Q // w) * w if T else 0
    # The last active partition is the first whose payload reaches the end of the stream.
    target = total - Q - F
    if target <= 0:
        last = 0
    elif not T:
        last = -(-target // Q)
    else:
        a = target // L
        k = -(-(target - a * L) // Q)
        last = (a + 1) * T if k >= T else a * T + k
    return Period(T, L, Q, w, last + 1)


@dataclass(eq=False)
class Schedule:
    """The scheduler's output for one call, plus cheap summaries the rules read.

    ``events`` lists the request of every split event (ascending); the uniform fast path and the
    compiled walk leave it None and keep only its count and last element until somebody asks for
    the list (:attr:`split_requests`). The non-uniform fast path records where each *active*
    partition (one that receives work) starts in the stream (``starts``; the last one stops at
    ``total``; the compiled walk keeps both lists ``packed``), the uniform one its :class:`Period`.
    ``metadata`` and ``num_splits`` are derived from these lazily. The reference path fills
    ``rows`` directly.
    """

    b: int
    num_sm_parts: int
    events: list | None = None
    rows: list | None = None            # reference path: P rows of columns 0..6
    lengths: np.ndarray | None = None   # effective lengths (fast path, non-uniform)
    uniform: int | None = None          # the common effective length (fast path, uniform)
    fixed_overhead: int = 0
    block: int = 64
    starts: list | None = None          # fast path, non-uniform: where each active partition begins
    total: int = 0                      # fast path: stream length sum(n_i + F)
    prefix: np.ndarray | list | None = None  # fast path, non-uniform: C [b + 1] (int64, or ints)
    widths: np.ndarray | None = None    # n_i + F per request, when ``prefix`` is left to be built
    period: Period | None = None        # fast path, uniform
    packed: tuple | None = None         # compiled walk: (starts, events) as native int64 bytes
    num_split_events: int = 0
    last_split_request: int = -1        # index of the last request that is split (-1 when none is)
    _metadata: np.ndarray | None = None
    _num_splits: np.ndarray | None = None

    def __post_init__(self):
        ev = self.events
        if ev is not None:
            n = self.num_split_events = len(ev)
            self.last_split_request = int(ev[-1]) if n else -1

    @property
    def split_requests(self) -> list:
        """Request index of every split event, ascending (a request split k times appears k times)."""
        ev = self.events
        if ev is None:
            ev = self.events = self._event_array().tolist()
        return ev

    def _event_array(self) -> np.ndarray:
        if self.events is not None:
            return np.array(self.events, dtype=np.int64)
        if self.packed is not None:
            return np.frombuffer(self.packed[1], dtype=np.int64)
        return self.period.event_array()

    @property
    def total_splits(self) -> int:
        """``num_splits[b]``: rows of partial results the combine kernel reads."""
        return self.b + self.num_split_events

    @property
    def max_split_row(self) -> int:
        """Largest partial-result row index of a request that is split (-1 if none is split).

        ``num_splits`` is cumulative, so the last split request owns the largest such row:
        ``num_splits[r+1] - 1 = r + (split events up to r)`` and every event is at or before it.
        """
        if not self.num_split_events:
            return -1
        return self.last_split_request + self.num_split_events

    @property
    def metadata(self) -> np.ndarray:
        """``tile_scheduler_metadata``: int32 ``[P, 8]``; column 7 (never written by the kernel) is 0."""
        md = self._metadata
        if md is None:
            if self._build_compiled():
                return self._metadata
            md = self._metadata = self._build_metadata()
        return md

    @property
    def num_splits(self) -> np.ndarray:
        """Cumulative ``num_splits``: int32 ``[b + 1]``, i.e. ``r`` plus the split events before ``r``."""
        ns = self._num_splits
        if ns is None:
            if self._build_compiled():
                return self._num_splits
            ns = self._num_splits = self._build_num_splits()
        return ns

    def _build_compiled(self) -> bool:
        """Both arrays in one compiled pass of the kernel's loop (False: no compiled helper, or a
        reference schedule, which has its rows; the caller builds the array in numpy)."""
        c = _accel.compiled
        if c is None or self.rows is not None:
            return False
        s = self.lengths
        if s is None:                   # uniform: the loop over b equal lengths beats tiling periods
            s = np.full(self.b, self.uniform, dtype=np.int64)
        md = np.empty((self.num_sm_parts, 8), dtype=np.int32)
        ns = np.empty(self.b + 1, dtype=np.int32)
        try:
            c.rows(s, self.block, self.num_sm_parts, self.fixed_overhead, md, ns)
        except TypeError:               # lengths that are not a contiguous int64 array
            return False
        self._metadata, self._num_splits = md, ns
        return True

    def split_request_rows(self) -> list[tuple[int, int]]:
        """(request, last partial-result row) for every split request, ascending."""
        out: list[tuple[int, int]] = []
        ev = self.split_requests
        for idx, r in enumerate(ev):
            if idx + 1 == len(ev) or ev[idx + 1] != r:
                out.append((r, r + idx + 1))    # num_splits[r+1] - 1 = r + (events up to r)
        return out

    # -- building the arrays -----------------------------------------------------------------------
    def _build_metadata(self) -> np.ndarray:
        P = self.num_sm_parts
        if self.rows is not None:
            out = np.zeros((P, 8), dtype=np.int32)
            out[:, :7] = np.asarray(self.rows, dtype=np.int64).reshape(P, 7)
            return out
        b, F = self.b, self.fixed_overhead
        out = np.empty((P, 8), dtype=np.int32)
        if self.period is not None:
            pr = self.period
            m, w = pr.m, pr.w
            n0 = n_last = w - F
            s_zero = self.uniform == 0
            if 0 < pr.T <= _TILE_MAX:
                self._uniform_rows_tiled(out, 0 if s_zero else n0)
            else:
                xs = np.empty(m + 1, dtype=np.int64)
                xs[:m] = pr.starts(np.arange(m, dtype=np.int64))
                xs[m] = self.total
                q = xs // w
                self._rows_from_positions(out, xs, q, xs - q * w, np.where, 0 if s_zero else n0)
        else:
            starts = self.starts if self.starts is not None else np.frombuffer(self.packed[0], dtype=np.int64)
            m = len(starts)
            C, s = self._prefix_array(), self.lengths
            n0 = int(C[1]) - F
            n_last = int(C[b] - C[b - 1]) - F
            s_zero = bool(s[b - 1] == 0)
            xs = np.empty(m + 1, dtype=np.int64)
            xs[:m] = starts
            xs[m] = self.total
            q = C.searchsorted(xs, "right")
            q -= 1
            self._rows_from_positions(out, xs, q, xs - C[q], None, None)
        # Partitions after all work is placed: begin_req = b and, as the kernel reads one element past
        # its per-request array, begin_block = last_0; they end with the last request.
        out[m:] = (b, b - 1, n0 - 1, 0 if s_zero else n_last, 0, 0, 0, 0)
        return out

    def _prefix_array(self) -> np.ndarray:
        """The stream's prefix sums ``C`` as an int64 array (built from ``widths`` on first use)."""
        C = self.prefix
        if C is None:
            w = self.widths
            if w is None:
                w = self.widths = _widths(self.lengths, self.fixed_overhead, self.block)
            C = self.prefix = _prefix_of(w)
        elif not isinstance(C, np.ndarray):
            C = self.prefix = np.array(C, dtype=np.int64)
        return C

    def _rows_from_positions(self, out, xs, q, R, _uniform, full_blocks) -> None:
        """Rows of the active partitions from their start positions ``xs`` (plus the final stop),
        each as (request ``q``, block offset ``R``)."""
        F = self.fixed_overhead
        m = xs.shape[0] - 1
        r, k = q[:-1], R[:-1]                 # where each partition begins
        i, rem = q[1:], R[1:]                 # where it stops (the next one begins)
        sp = rem != 0                         # stops inside request i: it is split
        er = i - 1
        er += sp
        if _uniform is not None:
            eb = np.where(sp, rem, full_blocks)
        else:
            C, s = self._prefix_array(), self.lengths
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
        out[:m, 0] = r
        out[:m, 1] = er
        out[:m, 2] = k
        out[:m, 3] = eb
        out[:m, 4] = ev - ev[i.searchsorted(r)]
        out[:m, 5] = np.where(same, both, fs)
        out[:m, 6] = np.where(same, both, sp)
        out[:m, 7] = 0

    def _uniform_rows_tiled(self, out: np.ndarray, full_blocks: int) -> None:
        """Active rows of a periodic uniform schedule: one period built in Python, then repeated
        with the request columns shifted by ``L / w`` per period; the last partition (which stops
        at the end of the stream, not where its period would) is written separately."""
        pr = self.period
        T, L, Q, w, m = pr.T, pr.L, pr.Q, pr.w, pr.m
        period_rows = []
        j = prev_r = 0
        for k in range(T):
            x = k * Q
            r, boff = divmod(x, w)
            if k:                             # the previous partition split request r
                j = j + 1 if r == prev_r else 1
            if k < T - 1:                     # stops inside a request, Q further on
                er, eb = divmod(x + Q, w)
                ls = 1
            else:                             # snaps to the period's end, a request boundary
                er, eb, ls = L // w - 1, full_blocks, 0
            fs = 1 if boff else 0
            if r == er:
                fs = ls = fs | ls
            period_rows.append((r, er, boff, eb, j, fs, ls, 0))
            prev_r = r
        n_per = -(-m // T)
        buf = out if n_per * T <= out.shape[0] else np.empty((n_per * T, 8), dtype=np.int32)
        tiles = buf[:n_per * T].reshape(n_per, T, 8)
        tiles[:] = period_rows
        if n_per > 1:
            tiles[:, :, :2] += np.arange(0, n_per * (L // w), L // w, dtype=np.int32)[:, None, None]
        x = pr.start(m - 1)
        r, boff = divmod(x, w)
        fs = 1 if boff else 0
        buf[m - 1] = (r, self.b - 1, boff, full_blocks, period_rows[(m - 1) % T][4], fs,
                      fs if r == self.b - 1 else 0, 0)
        if buf is not out:
            out[:m] = buf[:m]

    def _build_num_splits(self) -> np.ndarray:
        b = self.b
        out = np.arange(b + 1, dtype=np.int32)
        E = self.num_split_events
        if not E:
            return out
        ev = self._event_array()
        if b <= 256:        # an event at request e counts for every r > e
            out += ev.searchsorted(out, "left")
            return out
        edges = np.empty(E + 2, dtype=np.int64)
        edges[0] = 0
        edges[1:-1] = ev
        edges[1:-1] += 1
        edges[-1] = b + 1
        out += np.arange(E + 1, dtype=np.int32).repeat(edges[1:] - edges[:-1])
        return out


#: every field of a Schedule, at its default where it has one (the uniform path builds its Schedules from it)
_SCHEDULE_DEFAULTS = {f.name: None if f.default is MISSING else f.default for f in fields(Schedule)}


def block_counts(s: np.ndarray, block: int = 64) -> np.ndarray:
    """``n_i = max(s_i - 1, 0) // block + 1``: an empty sequence still counts one block."""
    return np.maximum(s - 1, 0) // block + 1


def _greedy_partitions(n: list[int], P: int, payload: int, F: int, splits: list[int]):
    """The scheduler's greedy walk, one partition at a time: for each of the ``P`` partitions,
    ``(begin_req, begin_block, begin_split, end_req, end_block)`` where the end is where the walk
    stopped (request index and blocks done in it). Requests cut between partitions are appended
    to ``splits``."""
    b = len(n)
    r = k = j = 0
    for _ in range(P):
        budget = payload
        r0, k0, j0 = r, k, j
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
        yield r0, k0, j0, r, k


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
    for begin_req, begin_block, begin_split, r, k in _greedy_partitions(n, P, payload, F, splits):
        first = int(begin_block != 0)
        if begin_req >= b:  # nothing left: the kernel reads one past its per-request array, i.e. last_0
            begin_block = last[0]
        end_req = r if k > 0 else r - 1
        end_block = k if k > 0 else (0 if s[end_req] == 0 else last[end_req] + 1)
        last_sp = int(end_block != last[end_req] + 1 and s[end_req] != 0)
        if begin_req == end_req:
            first = last_sp = first | last_sp
        rows.append([begin_req, end_req, begin_block, end_block, begin_split, first, last_sp])
    return Schedule(b, P, splits, rows=rows)


def schedule_first_generation(seqlens, num_sm_parts: int, fixed_overhead: int, block: int = 64) -> Schedule:
    """FlashMLA's first-generation scheduler (2025; the dense fp8 path still runs it).

    ``ceil(seqlen / block)`` blocks per request (an empty request has none), ``payload =
    ceil(total / P) + F`` with ``total = sum(blocks + F)``, the same greedy walk as the current
    scheduler; each partition's row is ``[begin_req, begin_seqlen, end_req, end_seqlen,
    begin_split]`` in *token* positions (block index x ``block``; an end that closes a whole request
    is that request's seqlen). Partitions after all work is placed begin at ``b``, token 0, and end
    with the last request.
    """
    s = [int(x) for x in seqlens]
    b, P, F = len(s), num_sm_parts, fixed_overhead
    n = [-(-x // block) for x in s]
    payload = -(-sum(x + F for x in n) // P) + F
    rows: list = []
    splits: list[int] = []
    for begin_req, begin_block, begin_split, r, k in _greedy_partitions(n, P, payload, F, splits):
        end_req = r if k > 0 else r - 1
        end_seqlen = k * block if k > 0 else s[end_req]
        rows.append([begin_req, begin_block * block, end_req, end_seqlen, begin_split, 0, 0])
    return Schedule(b, P, splits, rows=rows)


def _walk_prefix(C, P: int, F: int, total: int):
    """The greedy walk over prefix sums ``C`` (a list of ints, or a memoryview of an int64 array,
    each probe converting one value): the one Python walk beside the compiled one.

    Each partition finds the last request boundary at or before its end by a binary search confined
    to the requests that can start in ``(C[r], end]``, as each takes at least ``1 + F`` units; with
    up to about three requests per partition the next two boundaries are looked at first (the end
    is often before them)."""
    QF = -(-total // P) + F
    w_min = 1 + F
    n_c = len(C)
    many = n_c > 3 * P + 1
    starts: list[int] = []
    events: list[int] = []
    add_start, add_event = starts.append, events.append
    x = r = c = 0
    for _ in range(P):
        add_start(x)
        end = x + QF
        if end >= total:
            break
        if many:
            hi = r + (end - c) // w_min + 2
            r = bisect_right(C, end, r + 1, hi if hi < n_c else n_c) - 1  # last boundary at or before end
            c = C[r]
        elif C[r + 1] <= end:           # (C[r] <= end < total = C[b], so r < b): else it ends in request r
            r += 1
            if C[r + 1] <= end:
                hi = r + (end - c) // w_min + 2
                r = bisect_right(C, end, r + 1, hi if hi < n_c else n_c) - 1
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


def _stream(s, P: int, F: int, block: int):
    """The request stream of a non-uniform schedule: ``(s, b, prefix, total)`` with ``prefix`` the
    prefix sums ``C`` of ``n_i + F`` (a list of ints, or an int64 array when the walk binary-searches
    a memoryview of it)."""
    s = np.asarray(s, dtype=np.int64)
    b = s.shape[0]
    w0 = 1 + F
    if b <= _SMALL_B:
        prefix = list(accumulate([(v - 1 if v > 1 else 0) // block + w0 for v in s.tolist()], initial=0))
        return s, b, prefix, prefix[b]
    prefix, total = _prefix_for_walk(_widths(s, F, block), b, P)
    return s, b, prefix, total


def _widths(s: np.ndarray, F: int, block: int) -> np.ndarray:
    """``n_i + F`` per request (int64): ``max(ceil(s / block), 1) + F``, i.e.
    ``max(floor((s + block - 1 + block * F) / block), 1 + F)``."""
    w = s + (block - 1 + block * F)
    if block == 64:
        w >>= 6
    else:
        w //= block
    np.maximum(w, 1 + F, out=w)
    return w


def _prefix_for_walk(widths: np.ndarray, b: int, P: int):
    """``(C, total)`` in the form the walk for ``b`` and ``P`` reads: an int64 array when it binary
    searches a memoryview, otherwise a list of ints (built from the running sum in one conversion)."""
    if b > _MEMORYVIEW_RATIO * P:
        C = _prefix_of(widths)
        return C, int(C[b])
    C = [0]
    C += widths.cumsum().tolist()
    return C, C[b]


def _prefix_of(widths: np.ndarray) -> np.ndarray:
    """``C``: 0 followed by the running sum of the widths."""
    prefix = np.empty(widths.shape[0] + 1, dtype=np.int64)
    prefix[0] = 0
    widths.cumsum(out=prefix[1:])
    return prefix


def _walk(prefix, b: int, P: int, F: int, total: int) -> tuple[list, list]:
    """The greedy walk over the stream's prefix sums, read in the form that suits ``b`` and ``P``."""
    if isinstance(prefix, list):
        return _walk_prefix(prefix, P, F, total)
    return _walk_prefix(memoryview(prefix) if b > _MEMORYVIEW_RATIO * P else prefix.tolist(), P, F, total)


def uniform_schedule(b: int, P: int, F: int, block: int, uniform: int, memo: WalkMemo | None = None) -> Schedule:
    """The schedule of ``b`` requests of one effective length ``uniform`` (:func:`schedule_fast` and
    :func:`schedule_memo` with ``uniform``): the periodic walk, its period kept in ``memo`` when given."""
    w = (uniform - 1 if uniform > 1 else 0) // block + 1 + F
    hit = None
    if memo is not None:    # the period depends on b, P, F and the width alone
        key = ("period", b, P, F, w)
        hit = memo.get(key)
    if hit is None:
        pr = _period(b, P, F, w)
        hit = (pr, pr.num_events, pr.last_event())
        if memo is not None:
            memo.put(key, hit)
    pr, num_events, last_event = hit
    # (a Schedule of these fields, the others at their defaults, without the constructor's keyword binding)
    sch = object.__new__(Schedule)
    d = _SCHEDULE_DEFAULTS.copy()
    d["b"], d["num_sm_parts"], d["uniform"], d["fixed_overhead"], d["block"] = b, P, uniform, F, block
    d["total"], d["period"], d["num_split_events"], d["last_split_request"] = b * w, pr, num_events, last_event
    sch.__dict__ = d
    return sch


def schedule_fast(s: np.ndarray | None, num_sm_parts: int, fixed_overhead: int, block: int = 64,
                  uniform: int | None = None, b: int | None = None) -> Schedule:
    """Schedule by walking the request stream: prefix sums plus one binary search per partition.

    ``uniform``: when every request has the same effective length pass it with ``b`` (``s`` may
    then be None): the walk is periodic and nothing of length ``b`` is built.
    """
    P, F = num_sm_parts, fixed_overhead
    if uniform is not None:
        return uniform_schedule(len(s) if b is None else b, P, F, block, uniform)
    if _accel.compiled is not None:
        return _schedule_compiled(s, P, F, block)
    s, b, prefix, total = _stream(s, P, F, block)
    starts, events = _walk(prefix, b, P, F, total)
    return Schedule(b, P, events, lengths=s, fixed_overhead=F, block=block, starts=starts, total=total,
                    prefix=prefix)


def _schedule_compiled(s, P: int, F: int, block: int) -> Schedule:
    """The non-uniform schedule walked by the compiled helper, from the effective lengths ``s``.
    Its starts and events stay packed until the metadata rows or the event list are asked for;
    the rules read only the count and the last event."""
    if s.__class__ is not np.ndarray:
        s = np.asarray(s, dtype=np.int64)
    try:
        starts, events, total = _accel.compiled.walk(s, block, P, F)
    except TypeError:               # not a contiguous int64 array: convert it
        s = np.ascontiguousarray(s, dtype=np.int64)
        starts, events, total = _accel.compiled.walk(s, block, P, F)
    n = len(events) >> 3
    last = int.from_bytes(events[-8:], _BYTEORDER, signed=True) if n else -1
    return Schedule(s.shape[0], P, lengths=s, fixed_overhead=F, block=block, total=total, packed=(starts, events),
                    num_split_events=n, last_split_request=last)


_BYTEORDER = sys.byteorder


class WalkMemo:
    """A bounded, thread-safe memo of non-uniform walks, for :func:`schedule_memo`.

    The walk (where each active partition starts, which request each split event falls in) is a
    function of ``P``, ``F`` and the stream's prefix sums ``C`` alone, and ``C`` only of the block
    counts ``n_i + F``; the lengths themselves (which of them are 0) are read only when the metadata
    rows are built, from the Schedule's own ``lengths``. So a step whose block counts equal an
    earlier step's - consecutive decode steps, until some request crosses a 64-token block - reuses
    that walk exactly. Entries are keyed by ``(P, F, widths)`` (small batches: ``(P, F, C)``), and
    uniform schedules keep their :class:`Period` under ``("period", b, P, F, w)``; the least
    recently used entry is evicted first. With the compiled walk, :func:`schedule_memo` keeps only
    the periods: walking costs less than building a key and looking it up.
    """

    def __init__(self, maxsize: int = 64):
        from collections import OrderedDict

        self.maxsize = maxsize
        self._d: OrderedDict = OrderedDict()
        self._lock = Lock()
        _MEMOS.add(self)
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self.hits = self.misses = 0

    def get(self, key):
        d = self._d
        with self._lock:
            v = d.get(key)
            if v is None:
                self.misses += 1
            else:
                self.hits += 1
                d.move_to_end(key)
        return v

    def put(self, key, value) -> None:
        d = self._d
        with self._lock:
            if key in d:
                d.move_to_end(key)
            d[key] = value              # a new key goes last
            while len(d) > self.maxsize:
                d.popitem(last=False)


#: every memo, so that a forked child gets fresh locks: a thread of the parent may have held one at the
#: fork, and it does not exist in the child to release it
_MEMOS: "weakref.WeakSet[WalkMemo]" = weakref.WeakSet()


def _unlock_after_fork() -> None:
    for m in list(_MEMOS):
        m._lock = Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_unlock_after_fork)


def schedule_memo(s: np.ndarray | None, num_sm_parts: int, fixed_overhead: int, block: int = 64,
                  uniform: int | None = None, b: int | None = None, *, memo: WalkMemo) -> Schedule:
    """:func:`schedule_fast`, reusing the walk of an earlier call with the same block counts.

    Exactly the same Schedule (see :class:`WalkMemo`); for uniform lengths the memo keeps the
    period of the walk (a function of b, P, F and the width). With the compiled walk, non-uniform
    schedules are walked every time and nothing of them is stored. ``memo``: the memo to use; its
    owner (a :class:`validate_batch.Checker`) decides its lifetime.
    """
    P, F = num_sm_parts, fixed_overhead
    if uniform is not None:
        return uniform_schedule(len(s) if b is None else b, P, F, block, uniform, memo)
    if _accel.compiled is not None:     # the compiled walk costs less than looking it up
        return _schedule_compiled(s, P, F, block)
    s = np.asarray(s, dtype=np.int64)
    b = s.shape[0]
    if b <= _SMALL_B:
        s, b, prefix, total = _stream(s, P, F, block)
        key = (P, F, tuple(prefix))
        widths = None
    else:       # keyed by the widths, whose prefix sums are built only when the walk is not reused
        widths = _widths(s, F, block)
        key = (P, F, widths.tobytes())
        prefix = None
    hit = memo.get(key)
    if hit is None:
        if prefix is None:
            prefix, total = _prefix_for_walk(widths, b, P)
        starts, events = _walk(prefix, b, P, F, total)
        memo.put(key, (tuple(starts), tuple(events), total))
    else:
        starts, events, total = list(hit[0]), list(hit[1]), hit[2]
    return Schedule(b, P, events, lengths=s, fixed_overhead=F, block=block, starts=starts, total=total,
                    prefix=prefix, widths=widths)
