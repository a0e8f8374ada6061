"""The scheduler model: reference loop, fast path and Plan agree on thousands of random calls.

Besides reference-vs-fast equivalence, every call is also checked against a third model written
here from the algorithm in the facts (section 3), with its own effective-length and num_sm_parts
arithmetic, so that a bug shared by both implementations in ``validator/flashmla/schedule.py`` or in
``validator/flashmla/plan.py`` still shows up. Bit-exactness against the real kernel is in test_oracle.py.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from validate_batch.flashmla.plan import plan
from validate_batch.flashmla.schedule import Schedule, schedule_fast, schedule_reference

# every test here runs on the pure-Python paths and on the compiled helpers
pytestmark = pytest.mark.usefixtures("impl")

BLOCK = 64


# ---------------------------------------------------------------------------------------------
# An independent model, straight from the facts (section 3), kept deliberately naive.
# ---------------------------------------------------------------------------------------------
def facts_schedule(s: list[int], P: int, F: int) -> tuple[list[list[int]], list[int]]:
    """Return (rows of columns 0..6 for all P partitions, cumulative num_splits of length b+1)."""
    b = len(s)
    last = [(x - 1 if x > 1 else 0) // BLOCK for x in s]
    nblk = [x + 1 for x in last]
    total = sum(nb + F for nb in nblk)
    payload = (total + P - 1) // P + F
    pieces = [0] * b                       # how many partial results each request produces
    rows = []
    r = k = j = 0
    for _ in range(P):
        budget = payload
        beg = (r, k, j, 1 if k else 0)
        while r < b:
            rest = nblk[r] - k
            if budget >= rest + F:
                pieces[r] = j + 1
                budget -= rest + F
                r += 1
                k = 0
                j = 0
                continue
            if budget > F:
                k += budget - F
                j += 1
            break
        e_req = r if k else r - 1
        if k:
            e_blk = k
        elif s[e_req] == 0:
            e_blk = 0
        else:
            e_blk = last[e_req] + 1
        l_spl = 1 if (e_blk != last[e_req] + 1 and s[e_req] != 0) else 0
        f_spl = beg[3]
        if beg[0] == e_req:
            f_spl = l_spl = f_spl | l_spl
        b_blk = beg[1] if beg[0] < b else last[0]   # one element past the per-request array
        rows.append([beg[0], e_req, b_blk, e_blk, beg[2], f_spl, l_spl])
    num_splits = [0]
    for c in pieces:
        num_splits.append(num_splits[-1] + c)
    return rows, num_splits


def facts_lengths(rec: dict) -> list[int]:
    """Per-request effective key length (facts section 3), from a call record."""
    b = rec["b"]
    if rec["kind"] == "dense":
        return list(rec["seqlens"])
    tl = rec.get("topk_length")
    s = [rec["topk"]] * b if tl is None else list(tl)
    s = [1 if x == 0 else x for x in s]
    if rec.get("extra_topk") is not None:
        etl = rec.get("extra_topk_length")
        extra = [rec["extra_topk"]] * b if etl is None else list(etl)
        s = [-(-x // 64) * 64 + e for x, e in zip(s, extra)]
    return s


def facts_parts_sm90(rec: dict, num_sms: int = 132) -> tuple[int, int]:
    """(num_sm_parts, fixed overhead) of the SM90 rows of the facts' implementation table."""
    s_q, h_q = rec["s_q"], rec["h_q"]
    if rec["kind"] == "sparse":
        return max(num_sms // s_q // (h_q // 64), 1), 5
    h_k = rec.get("h_k", 1)
    return max(num_sms // h_k // -(-(s_q * h_q // h_k) // 64), 1), 5


def split_summary(num_splits: list[int]) -> tuple[list[int], int]:
    """Split requests and the largest partial-result row of a split request, brute force."""
    split = [r for r in range(len(num_splits) - 1) if num_splits[r + 1] - num_splits[r] > 1]
    return split, max((num_splits[r + 1] - 1 for r in split), default=-1)


def rows_of(sch: Schedule) -> list[list[int]]:
    md = sch.metadata
    assert md.dtype == np.int32 and md.shape == (sch.num_sm_parts, 8)
    return md[:, :7].tolist()


def assert_same(sch: Schedule, rows: list[list[int]], num_splits: list[int], what: str) -> None:
    # the summaries first: the fast path answers them before (and without) building any array
    split, max_row = split_summary(num_splits)
    assert sch.total_splits == num_splits[-1], what
    assert sch.max_split_row == max_row, what
    assert sch.last_split_request == (split[-1] if split else -1), what
    assert sch.num_split_events == num_splits[-1] - len(num_splits) + 1, what
    got_rows = rows_of(sch)
    if got_rows != rows:
        bad = next(i for i, (a, e) in enumerate(zip(got_rows, rows)) if a != e)
        pytest.fail(f"{what}: partition {bad}: got {got_rows[bad]}, expected {rows[bad]}")
    ns = sch.num_splits
    assert ns.dtype == np.int32 and ns.shape == (len(num_splits),)
    assert ns.tolist() == num_splits, f"{what}: num_splits differ"
    assert sch.split_request_rows() == [(r, num_splits[r + 1] - 1) for r in split], what
    events = [r for r in range(len(num_splits) - 1) for _ in range(num_splits[r + 1] - num_splits[r] - 1)]
    assert sch.split_requests == events, what


# ---------------------------------------------------------------------------------------------
# Random inputs
# ---------------------------------------------------------------------------------------------
SPECIAL = [0, 1, 2, 63, 64, 65, 127, 128, 129, 512, 2048]
HUGE = [2**20, 2**24 + 1, 2**31 - 1]


def random_b(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.1:
        return rng.choice([1, 2, 3, 131, 132, 133, 264, 3000])
    return min(3000, int(round(2 ** rng.uniform(0, np.log2(3000)))))


def random_lengths(rng: random.Random, b: int, hi: int, allow_zero: bool = True) -> list[int]:
    """Uniform, near-uniform, special-valued, or fully random lengths in [0, hi]."""
    mode = rng.choice(["uniform", "special", "random", "random", "one_long", "zeros"])
    lo = 0 if allow_zero else 1
    if mode == "uniform":
        v = rng.choice([x for x in SPECIAL if lo <= x <= hi] + [hi])
        return [v] * b
    if mode == "special":
        pool = [x for x in SPECIAL if lo <= x <= hi] + [hi]
        return [rng.choice(pool) for _ in range(b)]
    if mode == "one_long":
        out = [rng.randint(lo, min(hi, 64)) for _ in range(b)]
        out[rng.randrange(b)] = hi
        return out
    if mode == "zeros":
        return [lo] * b
    return [rng.randint(lo, hi) for _ in range(b)]


def random_record(rng: random.Random) -> dict:
    b = random_b(rng)
    s_q = rng.choice([1, 1, 1, 2, 3, 4, 8, 16, 64, 133])
    if rng.random() < 0.3:
        h_q = rng.choice([16, 32, 64, 128, 256])
        hi = rng.choice([64, 65, 4096, 100000, 2**31 - 1])
        return {"kind": "dense", "b": b, "s_q": s_q, "h_q": h_q, "seqlens": random_lengths(rng, b, hi)}
    h_q = rng.choice([64, 128])
    rec = {"kind": "sparse", "b": b, "s_q": s_q, "h_q": h_q}
    if rng.random() < 0.3:
        rec.update(d_qk=576, topk=rng.choice([64, 128, 512, 2048]))
        return rec
    topk = rng.choice([64, 128, 448, 512, 1024, 2048])
    rec.update(d_qk=512, topk=topk)
    if rng.random() < 0.5:
        rec["topk_length"] = random_lengths(rng, b, topk)
    if rng.random() < 0.5:
        rec["extra_topk"] = rng.choice([64, 128, 512, 832])
        if rng.random() < 0.5:
            rec["extra_topk_length"] = random_lengths(rng, b, rec["extra_topk"])
    return rec


def random_lengths_raw(rng: random.Random, b: int) -> list[int]:
    hi = rng.choice([1, 64, 65, 700, 5000, 2**20, 2**31 - 1])
    return random_lengths(rng, b, hi)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------
def test_facts_model_on_a_hand_computed_case():
    """Sanity of the in-test model itself on a case worked out by hand.

    s = [64, 65, 0], P = 2, F = 5: blocks n = [1, 2, 1], total = 6 + 7 + 6 = 19, payload = 10 + 5 = 15.
    Partition 0: request 0 costs 6 (budget 9 left), request 1 costs 7 (2 left), request 2 needs 6 > 2
    and 2 - 5 <= 0, so it stops without splitting. Partition 1 takes request 2. Then rows are
    [0, 1, 0, 2, 0, 0, 0] and [2, 2, 0, 0, 0, 0, 0] (request 2 is empty: end block 0, not split).
    """
    rows, ns = facts_schedule([64, 65, 0], 2, 5)
    assert rows == [[0, 1, 0, 2, 0, 0, 0], [2, 2, 0, 0, 0, 0, 0]]
    assert ns == [0, 1, 2, 3]
    # One request of 10 blocks over 3 partitions, F = 5: total 15, payload 5 + 5 = 10.
    # P0 takes 10 - 5 = 5 blocks (split), P1 then needs 5 + 5 = 10 <= 10: takes the rest. P2 is empty:
    # begin_req = b = 1, begin_block = last_0 = 9, end_req = 0, end_block = 10.
    rows, ns = facts_schedule([640], 3, 5)
    assert rows == [[0, 0, 0, 5, 0, 1, 1], [0, 0, 5, 10, 1, 1, 1], [1, 0, 9, 10, 0, 0, 0]]
    assert ns == [0, 2]


def test_reference_fast_and_facts_on_random_raw_lengths():
    """schedule_reference == schedule_fast (array and, when uniform, scalar form) == the facts model."""
    rng = random.Random(20260429)
    n_uniform = 0
    for it in range(1500):
        b = random_b(rng)
        s = random_lengths_raw(rng, b)
        P = rng.choice([1, 2, 3, 7, 8, 16, 22, 33, 66, 132, 148, 159, 160, rng.randint(1, 200)])
        F = rng.choice([3, 5])
        arr = np.asarray(s, dtype=np.int64)
        ref = schedule_reference(arr, P, F)
        fast = schedule_fast(arr, P, F)
        if it % 3 == 0 or b <= 64:
            rows, ns = facts_schedule(s, P, F)
        else:
            rows, ns = rows_of(ref), ref.num_splits.tolist()
        what = f"case {it}: b={b} P={P} F={F}"
        assert_same(ref, rows, ns, "reference " + what)
        assert_same(fast, rows, ns, "fast " + what)
        if len(set(s)) == 1:
            n_uniform += 1
            uni = schedule_fast(None, P, F, uniform=s[0], b=b)
            assert_same(uni, rows, ns, "fast uniform " + what)
    assert n_uniform > 100  # the generator does exercise the uniform path


@pytest.mark.parametrize("F", [3, 5])
@pytest.mark.parametrize("length", [0, 1, 63, 64, 65, 128, 129, 2048, 2**31 - 1])
@pytest.mark.parametrize("b", [1, 2, 131, 132, 133, 1000, 3000])
def test_uniform_scalar_form_matches_model(b, length, F):
    """The O(P) uniform walk (no per-request arrays) at the length and batch edges."""
    for P in (1, 8, 132, 160):
        rows, ns = facts_schedule([length] * b, P, F)
        assert_same(schedule_fast(None, P, F, uniform=length, b=b), rows, ns, f"b={b} s={length} P={P} F={F}")


@pytest.mark.parametrize("P", [1, 6, 8, 33, 66, 132])
def test_fast_path_strategy_switches_do_not_change_results(P):
    """The fast path picks its strategy from b and P (Python or numpy prefix sums, list or
    memoryview lookups, short or binary search); results must not depend on it. b runs through
    every b <= 140 and around b = P, b = 3 P and b = 16 P."""
    rng = random.Random(P)
    sizes = (set(range(1, 141)) | {max(1, P + d) for d in (-1, 0, 1)} | {3 * P + d for d in (-1, 0, 1)}
             | {16 * P + d for d in (-1, 0, 1, 2)})
    for b in sorted(sizes):
        s = [rng.choice([0, 1, 64, 65, 300, 4096, 70000]) for _ in range(b)]
        rows, ns = facts_schedule(s, P, 5)
        assert_same(schedule_fast(np.asarray(s, dtype=np.int64), P, 5), rows, ns, f"b={b} P={P}")
        assert_same(schedule_fast(s, P, 5), rows, ns, f"list input b={b} P={P}")


def test_plan_schedule_matches_reference_and_facts_on_random_records(h200):
    """Plan.schedule (fast) == Plan.reference_schedule() == facts model with facts' lengths and P."""
    rng = random.Random(132)
    for it in range(1200):
        rec = random_record(rng)
        p = plan(rec, h200)
        P, F = facts_parts_sm90(rec)
        assert p.num_sm_parts == P, rec
        assert p.fixed_overhead == F
        fast, ref = p.schedule, p.reference_schedule()
        assert fast is not None and ref is not None
        what = f"record {it}: {p.call.summary()}"
        if it % 4 == 0 or rec["b"] <= 64:
            rows, ns = facts_schedule(facts_lengths(rec), P, F)
        else:
            rows, ns = rows_of(ref), ref.num_splits.tolist()
        assert_same(ref, rows, ns, "reference " + what)
        assert_same(fast, rows, ns, "fast " + what)


def test_plan_schedule_for_other_profiles_and_fixed_overhead_3():
    """SM100 head128 uses F = 3 and P = num_sms / s_q / 2; head64 P = num_sms / s_q (facts table)."""
    rng = random.Random(100)
    for it in range(200):
        b = random_b(rng)
        s_q = rng.choice([1, 2, 3, 5])
        h_q = rng.choice([64, 128])
        rec = {"kind": "sparse", "b": b, "s_q": s_q, "h_q": h_q, "d_qk": 512, "topk": 512,
               "topk_length": [rng.randint(0, 512) for _ in range(b)]}
        p = plan(rec, "B200")
        if h_q == 64:
            P, F = max(148 // s_q, 1), 5
        else:
            P, F = max(148 // s_q // 2, 1), 3
        assert (p.num_sm_parts, p.fixed_overhead) == (P, F)
        rows, ns = facts_schedule(facts_lengths(rec), P, F)
        assert_same(p.schedule, rows, ns, f"B200 {rec['b']} {s_q} {h_q}")
        assert_same(p.reference_schedule(), rows, ns, f"B200 ref {rec['b']} {s_q} {h_q}")


def test_effective_length_rules_from_the_facts(h200):
    """topk_length 0 counts as 1; with an extra cache the length is round_up(s, 64) + extra.

    Checked through the schedule: one partition (s_q = 132 gives P = 1 at h_q = 64) holds everything,
    so its end block is the request's block count ceil(s/64) (an empty request still counts 1).
    """
    def end_blocks(rec):
        p = plan({**rec, "b": len(rec["topk_length"])}, h200)
        assert p.num_sm_parts == 1
        md = p.schedule.metadata
        return int(md[0, 3])

    base = {"kind": "sparse", "s_q": 132, "h_q": 64, "d_qk": 512, "topk": 128}
    # last request decides end_block of the only partition
    assert end_blocks({**base, "topk_length": [5, 0]}) == 1          # 0 -> 1 -> 1 block
    assert end_blocks({**base, "topk_length": [5, 65]}) == 2         # 65 -> 2 blocks
    # extra: round_up(65, 64) + 100 = 228 -> 4 blocks; round_up(1, 64) + 0 = 64 -> 1 block
    ex = {**base, "extra_topk": 128}
    assert end_blocks({**ex, "topk_length": [5, 65], "extra_topk_length": [0, 100]}) == 4
    assert end_blocks({**ex, "topk_length": [5, 0], "extra_topk_length": [0, 0]}) == 1
    # extra without per-request lengths: round_up(65, 64) + 128 = 256 -> 4 blocks
    assert end_blocks({**ex, "topk_length": [5, 65]}) == 4


def test_trailing_partitions_repeat_last_block_of_request_zero():
    """Partitions after all work have begin_req == b and begin_block == last_0 (facts section 3)."""
    s = [64 * 7 + 1, 10]            # last_0 = 7
    sch = schedule_fast(np.asarray(s, dtype=np.int64), 132, 5)
    md = sch.metadata
    trailing = md[md[:, 0] == 2]
    assert len(trailing) > 100
    assert (trailing[:, 2] == 7).all() and (trailing[:, 1] == 1).all() and (trailing[:, 3] == 1).all()
    assert (trailing[:, 4:7] == 0).all() and (md[:, 7] == 0).all()


def test_schedule_summaries_on_a_split_heavy_case():
    """num_splits, total_splits and max_split_row worked out by hand.

    b = 4 requests of 40 blocks, P = 8, F = 5: total 4*45 = 180, payload ceil(180/8) + 5 = 28.
    P0: r0 takes 23 blocks (split).  P1: r0's rest 17+5 = 22 fits (6 left), r1 gets 1 block.
    P2: r1 +23 (k=24).  P3: r1's rest 16+5 fits (7 left), r2 gets 2.  P4: r2 +23 (k=25).
    P5: r2's rest 15+5 fits (8 left), r3 gets 3.  P6: r3 +23.  P7: r3's rest 14+5 fits.
    Pieces: r0 2, r1 3, r2 3, r3 3 -> num_splits [0, 2, 5, 8, 11]; largest split row 10 (r3).
    """
    s = [64 * 40] * 4
    rows, ns = facts_schedule(s, 8, 5)
    assert ns == [0, 2, 5, 8, 11]
    assert [r[:2] for r in rows] == [[0, 0], [0, 1], [1, 1], [1, 2], [2, 2], [2, 3], [3, 3], [3, 3]]
    for sch in (schedule_reference(s, 8, 5), schedule_fast(np.asarray(s), 8, 5),
                schedule_fast(None, 8, 5, uniform=64 * 40, b=4)):
        assert_same(sch, rows, ns, "split-heavy")
        assert sch.total_splits == 11
        assert sch.max_split_row == 10
        assert sch.last_split_request == 3


@pytest.mark.parametrize("block", [16, 32, 128])
def test_other_block_sizes_reference_equals_fast(block):
    """The block size is a generation constant (64 today); both paths must honour another one."""
    rng = random.Random(block)
    for _ in range(100):
        b = random_b(rng)
        s = random_lengths_raw(rng, b)
        P, F = rng.randint(1, 160), rng.choice([3, 5])
        ref = schedule_reference(s, P, F, block)
        rows, ns = rows_of(ref), ref.num_splits.tolist()
        assert_same(schedule_fast(np.asarray(s, dtype=np.int64), P, F, block), rows, ns, f"block={block}")
        if len(set(s)) == 1:
            assert_same(schedule_fast(None, P, F, block, uniform=s[0], b=b), rows, ns, f"uniform block={block}")


def test_uniform_periodic_walk_in_every_regime():
    """Uniform lengths: the walk advances by Q until k*Q mod w lands within F of a boundary, so
    schedules differ in how long that takes (never within P partitions, at once, a few steps,
    hundreds of steps). Many partitions (P up to 4096, raw GPU numbers) and huge lengths reach the
    long ones; all must match the model step by step."""
    rng = random.Random(4096)
    seen = set()
    for _ in range(700):
        b = rng.choice([1, 2, 3, 5, 8, 64, 100, 1000, 3000])
        P = rng.choice([1, 2, 7, 66, 132, 160, 300, 1000, 4096])
        length = rng.choice([0, 1, 64, 65, 640, 2048, 100000, 2**20 + 7, 2**31 - 1, rng.randint(0, 2**31 - 1)])
        F = rng.choice([3, 5])
        sch = schedule_fast(None, P, F, uniform=length, b=b)
        rows, ns = facts_schedule([length] * b, P, F)
        assert_same(sch, rows, ns, f"b={b} P={P} s={length} F={F}")
        # how many steps until the walk first stops at a request boundary (0: never, before the end)
        w = (max(length - 1, 0) // 64) + 1 + F
        Q = -(-b * w // P)
        steps = next((k for k in range(1, P + 1) if (k * Q) % w == 0 or (k * Q) % w >= w - F), 0)
        seen.add("never" if steps == 0 else "1" if steps == 1 else "<=64" if steps <= 64
                 else "<=256" if steps <= 256 else ">256")
    assert seen == {"never", "1", "<=64", "<=256", ">256"}


@pytest.mark.parametrize("b,P,F,uniform", [(1, 132, 5, 128), (64, 132, 5, 640), (11622, 132, 5, 167), (3, 7, 0, 1)])
def test_the_uniform_schedule_is_the_one_its_constructor_makes(b, P, F, uniform):
    # uniform_schedule builds its Schedule from the fields' defaults in one step: the same object as the
    # dataclass constructor makes from the same fields
    from validate_batch.flashmla.schedule import Schedule, uniform_schedule

    got = uniform_schedule(b, P, F, 64, uniform)
    want = Schedule(b, P, uniform=uniform, fixed_overhead=F, block=64, total=got.total, period=got.period,
                    num_split_events=got.num_split_events, last_split_request=got.last_split_request)
    assert got.__dict__ == want.__dict__
    assert got.total == b * ((uniform - 1) // 64 + 1 + F)
    assert np.array_equal(got.metadata, schedule_reference(np.full(b, uniform), P, F).metadata)
