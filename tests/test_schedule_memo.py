"""Reusing schedule walks across steps (``schedule_memo`` / ``WalkMemo``) gives exactly the schedule
the reference loop computes, step after step, whether or not the walk came from the memo.

The memo keeps non-uniform walks only on the pure-Python path (the compiled walk costs less than
looking one up); uniform periods are kept on both. Tests of reuse therefore run on the Python path,
and the end-to-end tests on both."""
from __future__ import annotations

import random
import threading

import numpy as np
import pytest

import validate_batch
from validate_batch.flashmla.schedule import WalkMemo, schedule_memo, schedule_reference


def assert_same_as_reference(sch, s, P, F, block, what):
    ref = schedule_reference(s, P, F, block)
    assert sch.metadata.tolist() == ref.metadata.tolist(), f"{what}: metadata"
    assert sch.num_splits.tolist() == ref.num_splits.tolist(), f"{what}: num_splits"
    assert sch.max_split_row == ref.max_split_row, f"{what}: max_split_row"
    assert sch.total_splits == ref.total_splits, f"{what}: total_splits"
    assert sch.last_split_request == ref.last_split_request, f"{what}: last_split_request"
    assert sch.split_requests == ref.split_requests, f"{what}: split events"


def decode_steps(rng: random.Random, b: int, steps: int, lo: int, hi: int, ratio: int = 1):
    """Consecutive decode steps: every request grows by one token a step; now and then a request
    finishes and a new one (possibly empty) takes its place. With ``ratio``, the lengths of a cache
    compressed ``ratio`` to 1 (``len // ratio``), whose block counts change less often."""
    s = [rng.randint(lo, hi) for _ in range(b)]
    for _ in range(steps):
        yield [x // ratio for x in s]
        s = [x + 1 for x in s]
        if rng.random() < 0.15:
            s[rng.randrange(b)] = rng.choice([0, 1, rng.randint(lo, hi)])


# b <= 96 (list prefix sums), b <= 3 P (look-ahead), b > 3 P, and b > 16 P (windowed binary search)
@pytest.mark.parametrize("b,P,F", [(5, 8, 5), (40, 132, 5), (90, 16, 5), (200, 132, 5), (396, 132, 5),
                                   (397, 132, 5), (300, 8, 5), (1024, 66, 4), (256, 132, 0)])
def test_memoized_steps_match_reference(b, P, F, pure_python):
    rng = random.Random(b * 1000 + P)
    memo = WalkMemo(maxsize=4)
    hits = 0
    for t, s in enumerate(decode_steps(rng, b, 150, 1, 700 * 16, ratio=16)):
        arr = np.asarray(s, dtype=np.int64)
        before = memo.hits
        sch = schedule_memo(arr, P, F, 64, memo=memo)
        hits += memo.hits - before
        assert_same_as_reference(sch, s, P, F, 64, f"b={b} P={P} F={F} step {t}")
    # both paths are exercised: walks reused, and walks recomputed when some block count changed
    assert 0 < hits < 149, hits


def test_zero_and_one_token_requests_share_a_walk_but_not_rows(pure_python):
    # s = 0 and s = 1 both take one block, so the walk is reused; the last request's end_block
    # (0 for an empty sequence, 1 otherwise) must still come from this step's lengths.
    memo = WalkMemo()
    for s in ([700, 1, 300, 1], [700, 0, 300, 0], [700, 1, 300, 0], [700, 0, 300, 1]):
        sch = schedule_memo(np.asarray(s, dtype=np.int64), 3, 5, 64, memo=memo)
        assert_same_as_reference(sch, s, 3, 5, 64, f"s={s}")
    assert memo.hits == 3 and memo.misses == 1


def test_a_changed_block_count_is_a_miss(pure_python):
    memo = WalkMemo()
    s = [64 * 7] * 30 + [100]
    schedule_memo(np.asarray(s), 8, 5, 64, memo=memo)
    s[3] += 1                       # 7 blocks -> 8 blocks
    sch = schedule_memo(np.asarray(s), 8, 5, 64, memo=memo)
    assert memo.hits == 0 and memo.misses == 2
    assert_same_as_reference(sch, s, 8, 5, 64, "changed block count")
    sch = schedule_memo(np.asarray(s), 4, 5, 64, memo=memo)       # other num_sm_parts: its own walk
    assert memo.misses == 3
    assert_same_as_reference(sch, s, 4, 5, 64, "other P")


def test_memo_is_bounded_and_least_recently_used_goes_first(pure_python):
    memo = WalkMemo(maxsize=3)
    arrs = [np.asarray([64 * k, 1, 64 * k + 300], dtype=np.int64) for k in range(1, 6)]
    for a in arrs[:3]:
        schedule_memo(a, 2, 5, 64, memo=memo)
    schedule_memo(arrs[0], 2, 5, 64, memo=memo)            # refresh the oldest
    schedule_memo(arrs[3], 2, 5, 64, memo=memo)            # evicts arrs[1]
    assert len(memo) == 3
    h = memo.hits
    schedule_memo(arrs[0], 2, 5, 64, memo=memo)
    assert memo.hits == h + 1
    schedule_memo(arrs[1], 2, 5, 64, memo=memo)
    assert memo.hits == h + 1
    memo.clear()
    assert len(memo) == 0 and memo.hits == 0 and memo.misses == 0


def test_a_reused_walk_is_not_shared_mutable_state(pure_python):
    memo = WalkMemo()
    s = np.asarray([500, 900, 30, 2000] * 10, dtype=np.int64)
    first = schedule_memo(s, 16, 5, 64, memo=memo)
    first.split_requests.append(-7)            # a caller scribbling on its own schedule
    first.starts.append(-7)
    again = schedule_memo(s, 16, 5, 64, memo=memo)
    assert memo.hits == 1
    assert_same_as_reference(again, s.tolist(), 16, 5, 64, "after a caller modified an earlier schedule")


def test_threads_sharing_a_memo_get_exact_schedules(impl):
    memo = WalkMemo(maxsize=8)
    rng = random.Random(7)
    cases = [[rng.randint(0, 3000) for _ in range(rng.choice([50, 150, 400]))] for _ in range(12)]
    errors = []

    def work(seed):
        r = random.Random(seed)
        for _ in range(40):
            s = r.choice(cases)
            sch = schedule_memo(np.asarray(s, dtype=np.int64), 32, 5, 64, memo=memo)
            ref = schedule_reference(s, 32, 5, 64)
            if sch.metadata.tolist() != ref.metadata.tolist() or sch.num_splits.tolist() != ref.num_splits.tolist():
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(memo) <= 8


@pytest.mark.parametrize("mode,extra", [("decode", {}), ("target_verify", {"speculative_num_draft_tokens": 4})])
def test_checker_steps_match_reference_schedules(mode, extra, impl):
    """Full checks of consecutive steps (the memo warm) plan the same schedules as the reference."""
    chk = validate_batch.Checker(engine="sglang-dsv4@pre-25418", gpu="H200",
                            server_args={"chunked_prefill_size": 8192, "max_running_requests": 1024, **extra})
    rng = random.Random(11)
    n = 64 if mode == "target_verify" else 200
    seen_nonuniform = 0
    for t, seq in enumerate(decode_steps(rng, n, 70, 1, 9000)):
        seq = [max(x, 1) for x in seq]
        rep = chk.check(mode, seq_lens=seq)
        assert rep.legal
        for p in rep.plans:
            ref = p.reference_schedule()
            sch = p.schedule
            assert sch.metadata.tolist() == ref.metadata.tolist(), (t, p.call.label)
            assert sch.num_splits.tolist() == ref.num_splits.tolist(), (t, p.call.label)
            assert sch.max_split_row == ref.max_split_row, (t, p.call.label)
            seen_nonuniform += p.lengths[0] is not None
    assert seen_nonuniform > 0 and (impl == "compiled" or chk.schedule_memo.hits > 0)


def test_memo_belongs_to_its_checker(impl):
    """No process-wide state: plain plans compute afresh, and two checkers do not share walks."""
    a = validate_batch.Checker(engine="sglang-dsv4@pre-25418", gpu="H200")
    b = validate_batch.Checker(engine="sglang-dsv4@pre-25418", gpu="H200")
    seq = [1000 + 37 * i for i in range(300)]
    rep = a.check("decode", seq_lens=seq)
    # 300 rows are below FMLA002's safe rows for these shapes: the check walks no schedule, and a plan's
    # schedule read afterwards is walked in its checker's memo
    assert len(a.schedule_memo) == 0
    assert all(p.schedule is not None for p in rep.plans)
    assert len(a.schedule_memo) > 0 and len(b.schedule_memo) == 0
    rep = validate_batch.check({"engine": "sglang-dsv4@pre-25418", "forward_mode": "decode",
                           "requests": [{"id": f"r{i}", "seq_len": s} for i, s in enumerate(seq)]})
    assert all(p.memo is None for p in rep.plans)


def test_compiled_walk_bypasses_the_memo_for_non_uniform_lengths(impl):
    """With the compiled walk, non-uniform schedules are walked every time (nothing stored), uniform
    ones still keep their period; both are exact."""
    memo = WalkMemo()
    s = np.asarray([500, 900, 30, 2000] * 10, dtype=np.int64)
    for _ in range(3):
        assert_same_as_reference(schedule_memo(s, 16, 5, 64, memo=memo), s.tolist(), 16, 5, 64, "non-uniform")
    assert (memo.hits, memo.misses) == ((0, 0) if impl == "compiled" else (2, 1))
    for _ in range(3):
        sch = schedule_memo(None, 16, 5, 64, uniform=700, b=40, memo=memo)
        assert_same_as_reference(sch, [700] * 40, 16, 5, 64, "uniform")
    assert memo.hits == (2 if impl == "compiled" else 4)
