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
  uniform-length case no per-request arrays at all.

Both return a :class:`Schedule` whose ``metadata`` is the ``[P, 8]`` int32 tile metadata (column 7,
which the kernel never writes, is 0) and ``num_splits`` the cumulative ``[b + 1]`` int32 array.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(eq=False)
class Schedule:
    """The scheduler's output for one call, plus cheap summaries the rules read.

    The fast path fills ``starts`` (stream position where each active partition begins), ``stops``
    (where it ends) and ``split`` (whether it ended inside a request); ``metadata`` and ``num_splits``
    are then derived lazily, vectorized, only when somebody asks for them. The reference path fills
    ``rows`` directly.
    """

    b: int
    num_sm_parts: int
    split_requests: list            # request index of every split event, ascending
    rows: list | None = None        # reference path: P rows of columns 0..6
    lengths: np.ndarray | None = None   # effective lengths (fast path, non-uniform)
    uniform: int | None = None          # the common effective length (fast path, uniform)
    fixed_overhead: int = 0
    block: int = 64
    starts: list | None = None
    stops: list | None = None
    split: list | None = None

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

    @cached_property
    def metadata(self) -> np.ndarray:
        """``tile_scheduler_metadata``: int32 ``[P, 8]``; column 7 (never written by the kernel) is 0."""
        out = np.zeros((self.num_sm_parts, 8), dtype=np.int32)
        if self.rows is not None:
            out[:, :7] = np.asarray(self.rows, dtype=np.int64).reshape(self.num_sm_parts, 7)
            return out
        b, F, B = self.b, self.fixed_overhead, self.block
        if self.uniform is not None:
            n = np.full(b, max(self.uniform - 1, 0) // B + 1, dtype=np.int64)
            s_is_zero = np.full(b, self.uniform == 0)
        else:
            n = np.maximum(self.lengths - 1, 0) // B + 1
            s_is_zero = self.lengths == 0
        C = np.zeros(b + 1, dtype=np.int64)
        np.cumsum(n + F, out=C[1:])
        m = len(self.starts)
        if m:
            x = np.asarray(self.starts, dtype=np.int64)
            nx = np.asarray(self.stops, dtype=np.int64)
            sp = np.asarray(self.split, dtype=bool)
            r = np.searchsorted(C, x, "right") - 1
            k = x - C[r]
            re = np.minimum(np.searchsorted(C, nx, "right") - 1, b)
            er = np.where(sp, re, re - 1)
            eb = np.where(sp, nx - C[np.minimum(re, b)], np.where(s_is_zero[er], 0, n[er]))
            ls = (sp & ~s_is_zero[er]).astype(np.int64)
            fs = (k > 0).astype(np.int64)
            ev_p = np.flatnonzero(sp)
            ev_req = er[ev_p]
            j = np.searchsorted(ev_p, np.arange(m), "left") - np.searchsorted(ev_req, r, "left")
            bs = np.where(k > 0, j, 0)
            same = r == er
            both = fs | ls
            fs = np.where(same, both, fs)
            ls = np.where(same, both, ls)
            out[:m, :7] = np.stack([r, er, k, eb, bs, fs, ls], axis=1)
        if m < self.num_sm_parts:
            out[m:, 0] = b
            out[m:, 1] = b - 1
            out[m:, 2] = n[0] - 1
            out[m:, 3] = 0 if s_is_zero[b - 1] else n[b - 1]
        return out

    @cached_property
    def num_splits(self) -> np.ndarray:
        """Cumulative ``num_splits``: int32 ``[b + 1]``."""
        counts = np.ones(self.b, dtype=np.int64)
        if self.split_requests:
            counts += np.bincount(np.asarray(self.split_requests, dtype=np.int64), minlength=self.b)
        out = np.zeros(self.b + 1, dtype=np.int64)
        np.cumsum(counts, out=out[1:])
        return out.astype(np.int32)

    def split_request_rows(self) -> list[tuple[int, int]]:
        """(request, last partial-result row) for every split request, ascending."""
        ns = self.num_splits
        return [(r, int(ns[r + 1]) - 1) for r in sorted(set(self.split_requests))]


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


def schedule_fast(s: np.ndarray | None, num_sm_parts: int, fixed_overhead: int, block: int = 64,
                  uniform: int | None = None, b: int | None = None) -> Schedule:
    """Vectorized schedule: prefix sums plus one binary search per partition.

    ``uniform``: when every request has the same effective length pass it with ``b`` (``s`` may
    then be None): the prefix sum is an arithmetic progression and nothing of length ``b`` is built.
    """
    P, F = num_sm_parts, fixed_overhead
    QF_pad = F
    starts: list = []
    stops: list = []
    split: list = []
    splits: list = []
    if uniform is not None:
        if b is None:
            b = len(s)
        w = max(uniform - 1, 0) // block + 1 + F
        total = b * w
        Q = -(-total // P)
        QF = Q + QF_pad
        x = 0
        for _ in range(P):
            if x >= total:
                break
            starts.append(x)
            end = x + QF
            i = end // w
            if i >= b:
                x = total
                split.append(False)
            else:
                c = i * w
                if c <= x or end - c > F:
                    x = end - F
                    split.append(True)
                    splits.append(i)
                else:
                    x = c
                    split.append(False)
            stops.append(x)
        return Schedule(b, P, splits, uniform=uniform, fixed_overhead=F, block=block,
                        starts=starts, stops=stops, split=split)
    b = len(s)
    if b <= 256:
        C = [0]
        acc = 0
        for v in s.tolist() if isinstance(s, np.ndarray) else s:
            acc += (v - 1 if v > 1 else 0) // block + 1 + F
            C.append(acc)
        total = acc
    else:
        Carr = np.empty(b + 1, dtype=np.int64)
        Carr[0] = 0
        np.cumsum(np.maximum(s - 1, 0) // block + (1 + F), out=Carr[1:])
        total = int(Carr[b])
        C = Carr.tolist()
    Q = -(-total // P)
    QF = Q + F
    x = 0
    for _ in range(P):
        if x >= total:
            break
        starts.append(x)
        end = x + QF
        i = bisect_right(C, end) - 1
        if i >= b:
            x = total
            split.append(False)
        else:
            c = C[i]
            if c <= x or end - c > F:
                x = end - F
                split.append(True)
                splits.append(i)
            else:
                x = c
                split.append(False)
        stops.append(x)
    return Schedule(b, P, splits, lengths=np.asarray(s, dtype=np.int64), fixed_overhead=F, block=block,
                    starts=starts, stops=stops, split=split)
