"""The host-side MLA plan (validator/flashinfer/mla_schedule.py) against plans worked out by hand from
the algorithm of flashinfer-python 0.7.2 scheduler.cuh:1614-1872 (MLAPlan) and heap.h:30-62 (a
std::push_heap / std::pop_heap min-heap; the tie order below is the one those functions give).

Until a plan recorded on an H200 is in fixtures/measured/, these hand-worked cases are the ground truth.
"""
from __future__ import annotations

import random

import pytest

from validate_batch.flashinfer.mla_schedule import MAX_WORKS, PER_WORK, _Heap, mla_schedule


def works(s):
    """The per-cluster work items as tuples of the per-work arrays."""
    a, wi = s["arrays"], s["arrays"]["work_indptr"]
    return [[tuple(a[k][j] for k in PER_WORK) for j in range(wi[c], wi[c + 1])] for c in range(len(wi) - 1)]


def test_one_short_decode_goes_to_cluster_0_unsplit():
    # 16 packed rows, 4 SMs: 1-CTA clusters of 64 rows; 100 keys over 4 clusters -> 25 -> chunks of 128
    s = mla_schedule([0, 1], [0, 100], [100], num_heads=16, num_sm=4)
    assert s["plan_info"][:2] == [1, 4]
    assert works(s) == [[(0, 0, -1, 1, 100, 0, 0, 100)], [], [], []]
    assert all(v == 0 for k, v in s["arrays"].items() if k.startswith("merge") for v in v)
    # integer workspace: 3 arrays of 16384 int32, 5 of num_sm int32 (16 B each here), then 6 of 16384
    big, small = 4 * 16384, 16
    expect, at = [], 0
    for size in [big] * 3 + [small] * 5 + [big] * 6:
        expect.append(at)
        at += size
    assert s["plan_info"][2:16] == expect and s["staged_bytes"] == at
    # float workspace: partial outputs (2 x clusters x 64 rows x 2 B x 512) first, then their LSEs
    assert s["plan_info"][16:] == [0, 2 * 4 * 64 * 2 * 512]


def test_a_long_request_is_split_and_merged():
    # 8 SMs: 100 keys / 8 -> 13 -> chunks of 64: keys 0..64 and 64..100
    s = mla_schedule([0, 1], [0, 100], [100], num_heads=16, num_sm=8)
    # the heap of 8 equal costs gives cluster 0, then (0 now costs 2*64+64) cluster 2
    assert works(s) == [[(0, 0, 0, 1, 100, 0, 0, 64)], [], [(0, 0, 16, 1, 100, 0, 64, 100)], [], [], [], [], []]
    a = s["arrays"]
    # one merge entry: output rows 0..16 from partial rows 0..2*16 in strides of 16
    assert [a[k][0] for k in ("merge_packed_offset_start", "merge_packed_offset_end",
                              "merge_partial_packed_offset_start", "merge_partial_packed_offset_end",
                              "merge_partial_stride")] == [0, 16, 0, 32, 16]
    assert all(a[k][1:] == [0] * 7 for k in a if k.startswith("merge"))


@pytest.mark.parametrize("qo_len, cluster", [(63, 1), (64, 1), (65, 2)])
def test_two_cta_clusters_above_a_mean_of_64_packed_rows(qo_len, cluster):
    s = mla_schedule([0, qo_len], [0, 1], [10], num_heads=1, num_sm=132)
    assert s["plan_info"][:2] == [cluster, 132 // cluster]


def test_causal_tiles_see_only_their_keys_last_tile_first():
    # 3 queries x 64 heads = 192 rows (> 64): 2-CTA clusters of 128 rows, 2 tiles; 4 SMs -> 2 clusters.
    # the last tile sees all 10 keys; tile 0 ends at row 128 = query 2: 10 - 3 + 2 = 9 keys
    s = mla_schedule([0, 3], [0, 10], [10], num_heads=64, num_sm=4, causal=True)
    assert s["plan_info"][:2] == [2, 2]
    assert works(s) == [[(0, 0, -1, 3, 10, 128, 0, 10)], [(0, 0, -1, 3, 10, 0, 0, 9)]]
    plain = mla_schedule([0, 3], [0, 10], [10], num_heads=64, num_sm=4)
    assert works(plain)[1] == [(0, 0, -1, 3, 10, 0, 0, 10)]


@pytest.mark.parametrize("kv, n_works", [(-1, 0), (0, 1), (1, 1)])
def test_kv_length_edge(kv, n_works):
    # request 1's tile: a negative length gets no work (its rows are never written), 0 gets one empty item
    s = mla_schedule([0, 1, 2], [0, 70, 70 + max(kv, 0)], [70, kv], num_heads=16, num_sm=4)
    mine = [w for ws in works(s) for w in ws if w[0] == 1]
    assert len(mine) == n_works
    if n_works:
        assert mine[0][6:] == (0, kv)
    assert len([w for ws in works(s) for w in ws if w[0] == 0]) == 1


@pytest.mark.parametrize("qo_len", [-1, 0, 1])
def test_query_length_edge(qo_len):
    if qo_len < 0:
        with pytest.raises(ValueError, match=r"qo_indptr\[2\]3 - qo_indptr\[1\]4 should be non-negative"):
            mla_schedule([0, 4, 4 + qo_len], [0, 1, 2], [5, 5], num_heads=16, num_sm=4)
        return
    s = mla_schedule([0, 4, 4 + qo_len], [0, 1, 2], [5, 5], num_heads=16, num_sm=4)
    assert len([w for ws in works(s) for w in ws if w[0] == 4]) == qo_len    # 0 rows: no tile, no work


def test_empty_batch_has_no_plan():
    with pytest.raises(ZeroDivisionError):
        mla_schedule([0], [0], [], num_heads=16, num_sm=132)
    assert mla_schedule([0, 1], [0, 1], [1], num_heads=16, num_sm=132)["total_works"] == 1


@pytest.mark.parametrize("batch, fits", [(16383, True), (16384, True), (16385, False)])
def test_work_item_capacity_edge(batch, fits):
    # 128 heads x 1 query: one 128-row tile per request; 1 key each never splits -> one item per request
    s = mla_schedule(list(range(batch + 1)), list(range(batch + 1)), [1] * batch, num_heads=128, num_sm=132)
    assert s["total_works"] == batch and s["fits"] == fits


def test_heap_pops_in_the_standard_library_order():
    # worked by hand with std::pop_heap on equal costs (heap.h: the vector starts as 0..n-1, all 0)
    h = _Heap(8)
    assert [h.pop()[0] for _ in range(8)] == [0, 2, 6, 5, 7, 4, 1, 3]
    h = _Heap(3)
    assert [h.pop()[0] for _ in range(3)] == [0, 1, 2]
    h = _Heap(2)
    got = h.pop()[0]
    h.push((got, 1.0))
    assert [h.pop()[0] for _ in range(2)] == [1, 0]           # the cheaper one first, whatever its index


def test_every_tile_is_covered_once_in_order():
    rng = random.Random(7)
    for _ in range(60):
        b = rng.randint(1, 40)
        heads = rng.choice([16, 128])
        q = [rng.choice([0, 1, 1, 2, 8, rng.randint(1, 200)]) for _ in range(b)]
        kv = [rng.choice([0, rng.randint(1, 50), rng.randint(50, 20000)]) for _ in range(b)]
        if sum(q) == 0:
            q[0] = 1
        qo = [0]
        for x in q:
            qo.append(qo[-1] + x)
        causal = rng.random() < 0.5
        kv = [max(k, x) if causal else k for k, x in zip(kv, q)]
        s = mla_schedule(qo, list(range(b + 1)), kv, num_heads=heads, num_sm=132, causal=causal)
        rows = s["plan_info"][0] * 64
        seen = {}
        for ws in works(s):
            for w in ws:
                seen.setdefault((w[0], w[5]), []).append((w[6], w[7]))
        for i in range(b):
            n_tiles = -(-q[i] * heads // rows)
            for t in range(n_tiles):
                spans = sorted(seen.pop((qo[i], t * rows)))
                assert spans[0][0] == 0 and all(a[1] == b_[0] for a, b_ in zip(spans, spans[1:]))
                assert spans[-1][1] <= kv[i]
        assert not seen
        assert s["total_works"] <= MAX_WORKS
