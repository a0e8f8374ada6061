"""What FlashInfer's MLA ``plan()`` computes on the host: the work partition the SM90/SM80 MLA kernels run.

A plain-Python account of ``MLAPlan`` (flashinfer-python 0.7.2 and 0.7.2.post1
``include/flashinfer/attention/scheduler.cuh:1614-1872``, 0.7.4 :1622-1880; the same algorithm at fb28d72
:1580-1837),
written so that a recorded plan can be compared with it value for value:

1. Each request ``i`` has ``qo_len`` query tokens, i.e. ``qo_len * num_heads`` packed query rows. When the
   mean packed length over the batch (integer division) is above 64, two CTAs form a cluster; otherwise
   one. There are ``num_sm // cluster_size`` clusters and a cluster covers ``64 * cluster_size`` rows.
2. A request's rows are cut into tiles of that size. Every tile counts its KV length (under a causal
   mask, only the keys its last row can see) towards a total; the total divided over the clusters,
   rounded up, sets the longest KV chunk one work item may take (``kv_chunk_limit``).
3. Tiles are dealt out, requests in order and each request's tiles from its last to its first, in
   chunks of at most ``kv_chunk_limit`` keys, each chunk to the cluster with the least work so far (a
   binary min-heap of float32 costs, ``2 * rows + keys`` per chunk, with the C++ standard library's
   tie order). A tile with no keys still gets one chunk; a tile with a negative length gets none.
4. A tile cut into several chunks writes partial outputs; it also gets merge entries that say which
   output rows to combine from which partial rows.

The result has the 18 numbers ``plan()`` returns (cluster size, cluster count, the byte offsets of
each array in the integer workspace, those of the partial outputs in the float workspace) and every
array the kernel reads.
"""
from __future__ import annotations

from typing import Sequence
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


TILE_ROWS = 64                 # query rows one CTA takes
MAX_WORKS = 16384              # entries each per-work array has room for in the integer workspace
PER_WORK = ("q_indptr", "kv_indptr", "partial_indptr", "q_len", "kv_len", "q_start", "kv_start", "kv_end")
MERGE = ("merge_packed_offset_start", "merge_packed_offset_end", "merge_partial_packed_offset_start",
         "merge_partial_packed_offset_end", "merge_partial_stride")
#: plan_info's 18 entries, in order
PLAN_INFO = ("num_blks_x", "num_blks_y", "q_indptr", "kv_indptr", "partial_indptr", *MERGE,
             "q_len", "kv_len", "q_start", "kv_start", "kv_end", "work_indptr", "partial_o", "partial_lse")


def _cdiv(x: int, y: int) -> int:
    """``(x + y - 1) / y`` with C's division (truncates toward zero)."""
    n = x + y - 1
    q = abs(n) // abs(y)
    return q if (n >= 0) == (y > 0) else -q


def _chunk_limit(per_cluster: int) -> int:
    if per_cluster <= 8:
        return 32
    if per_cluster <= 16:
        return 64
    if per_cluster <= 32:
        return 128
    if per_cluster <= 64:
        return 192
    return _cdiv(per_cluster, 256) * 256


def _visible_keys(qo_len: int, kv_len: int, tile: int, tile_rows: int, n_tiles: int, heads: int) -> int:
    """Keys the last row of a tile sees under a causal mask (queries right-aligned to the keys)."""
    if tile + 1 == n_tiles:
        return kv_len
    return max(min(kv_len - qo_len + _cdiv((tile + 1) * tile_rows, heads), kv_len), 0)


class _Heap:
    """A min-heap on cost, kept exactly as the C++ standard library's push_heap / pop_heap keep it."""

    def __init__(self, n: int):
        self.h = [(i, np.float32(0)) for i in range(n)]

    @staticmethod
    def _before(a, b) -> bool:       # the comparator: a sorts before b when its cost is higher
        return a[1] > b[1]

    def _sift_up(self, hole: int, top: int, value) -> None:
        h = self.h
        parent = (hole - 1) // 2
        while hole > top and self._before(h[parent], value):
            h[hole] = h[parent]
            hole = parent
            parent = (hole - 1) // 2
        h[hole] = value

    def pop(self):
        h = self.h
        first = h[0]
        if len(h) > 1:
            value, n = h[-1], len(h) - 1
            h[-1] = first
            hole, child = 0, 0
            while child < (n - 1) // 2:
                child = 2 * (child + 1)
                if self._before(h[child], h[child - 1]):
                    child -= 1
                h[hole] = h[child]
                hole = child
            if n % 2 == 0 and child == (n - 2) // 2:
                child = 2 * (child + 1)
                h[hole] = h[child - 1]
                hole = child - 1
            self._sift_up(hole, 0, value)
        return h.pop()

    def push(self, item) -> None:
        self.h.append(item)
        self._sift_up(len(self.h) - 1, 0, item)


def _align16(x: int) -> int:
    return -(-x // 16) * 16


def mla_schedule(qo_indptr: Sequence[int], kv_indptr: Sequence[int], kv_len: Sequence[int], num_heads: int,
                 num_sm: int, causal: bool = False, head_dim_o: int = 512) -> dict:
    """The plan ``MLAPlan`` makes for one batch on a GPU with ``num_sm`` SMs.

    Returns ``{"plan_info": [18 ints], "arrays": {name: list}, "total_works": n, "fits": bool}``; the
    per-work arrays hold ``total_works`` entries, ``work_indptr`` one per cluster + 1, the merge arrays
    ``num_sm`` (zeros where no merge is written). ``fits`` is False when the work items overrun the
    16384 entries each per-work array has (MLAPlan does not check that)."""
    qo = [int(x) for x in qo_indptr]
    kvp = [int(x) for x in kv_indptr]
    kvl = [int(x) for x in kv_len]
    batch = len(kvl)                      # the module takes the batch size from kv_len
    if batch == 0:
        raise ZeroDivisionError("MLAPlan divides by the batch size: an empty batch has no plan")
    for i in range(batch):
        if qo[i + 1] - qo[i] < 0:
            raise ValueError(f"qo_indptr[{i + 1}]{qo[i + 1]} - qo_indptr[{i}]{qo[i]} should be non-negative")
    q_lens = [qo[i + 1] - qo[i] for i in range(batch)]
    cluster = 2 if sum(q * num_heads for q in q_lens) // batch > 64 else 1
    clusters = num_sm // cluster
    rows = cluster * TILE_ROWS

    def tiles(i):
        packed = q_lens[i] * num_heads
        n = _cdiv(packed, rows)
        for t in range(n - 1, -1, -1):
            keys = _visible_keys(q_lens[i], kvl[i], t, rows, n, num_heads) if causal else kvl[i]
            yield t, packed, keys

    total_keys = sum(keys for i in range(batch) for _, _, keys in tiles(i))
    limit = _chunk_limit(max(_cdiv(total_keys, clusters), 1))

    heap = _Heap(clusters)
    works: list[list[tuple]] = [[] for _ in range(clusters)]
    merge = {k: [0] * num_sm for k in MERGE}
    n_merge = 0
    partial_rows = 0
    for i in range(batch):
        for t, packed, remaining in tiles(i):
            kv_start = 0
            split = remaining > limit
            tile_rows = min(rows, packed - t * rows)
            if split:
                chunks = max(remaining * cluster // limit, 1)
                step = _cdiv(tile_rows, chunks)
                base = qo[i] * num_heads + t * rows
                for off in range(0, tile_rows, step):
                    if n_merge >= num_sm:
                        raise AssertionError("merge entries exceed the SM count (MLAPlan's internal check)")
                    merge["merge_packed_offset_start"][n_merge] = base + off
                    merge["merge_packed_offset_end"][n_merge] = base + min(off + step, tile_rows)
                    merge["merge_partial_packed_offset_start"][n_merge] = partial_rows + off
                    merge["merge_partial_packed_offset_end"][n_merge] = partial_rows + _cdiv(remaining, limit) * tile_rows
                    merge["merge_partial_stride"][n_merge] = tile_rows
                    n_merge += 1
            empty = remaining == 0
            while remaining > 0 or empty:
                c, cost = heap.pop()
                take = min(remaining, limit)
                heap.push((c, np.float32(cost + (np.float32(2) * np.float32(rows) + np.float32(take)))))
                part = -1
                if split:
                    part = partial_rows
                    partial_rows += tile_rows
                works[c].append((qo[i], kvp[i], part, q_lens[i], kvl[i], t * rows, kv_start, kv_start + take))
                remaining -= take
                kv_start += take
                if empty:
                    break

    work_indptr = [0]
    for w in works:
        work_indptr.append(work_indptr[-1] + len(w))
    flat = [w for ws in works for w in ws]
    arrays = {name: [w[j] for w in flat] for j, name in enumerate(PER_WORK)}
    arrays.update(merge)
    arrays["work_indptr"] = work_indptr

    sizes = ([4 * MAX_WORKS] * 3 + [4 * num_sm] * 5 + [4 * MAX_WORKS] * 6)
    offsets, at = [], 0
    for s in sizes:
        at = _align16(at)
        offsets.append(at)
        at += s
    partial_o_bytes = 2 * clusters * rows * 2 * head_dim_o
    plan_info = [cluster, clusters, *offsets, 0, _align16(partial_o_bytes)]
    return {"plan_info": plan_info, "arrays": arrays, "total_works": work_indptr[-1],
            "staged_bytes": at, "fits": work_indptr[-1] <= MAX_WORKS}
