"""The O(n) step search under a row rule equals brute force over every segmentation."""
import itertools
import random

import pytest

import validate_batch
from validate_batch.legality.bounds import RowRule
from validate_batch.legality.split import _min_segments_rows


def brute(tokens, ok):
    n = len(tokens)
    for k in range(1, n + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = (0, *cuts, n)
            if all(ok(sum(tokens[a:b])) for a, b in zip(bounds, bounds[1:])):
                return k
    return None


@pytest.mark.parametrize("seed", range(300))
def test_row_rule_search_is_minimal(seed):
    rng = random.Random(seed)
    L = rng.randint(5, 40)
    thr = rng.choice([None, L + rng.randint(0, 10)])
    merged = rng.choice([0, 0, 1, 3])
    n = rng.randint(1, 8)
    tokens = [rng.randint(1, 2 * L) for _ in range(n)]

    def ok(rows):  # written independently of the code under test
        t = rows + merged
        return 0 < t <= L or (thr is not None and t > thr)

    prefix = [0]
    for t in tokens:
        prefix.append(prefix[-1] + t)
    segs = _min_segments_rows(prefix, RowRule(L, thr, merged))
    want = brute(tokens, ok)
    if want is None:
        assert segs is None
        return
    assert segs is not None and len(segs) == want
    assert segs[0][0] == 0 and segs[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
    assert all(ok(prefix[j] - prefix[i]) for i, j in segs)


def test_splitting_a_huge_decode_step_is_linear():
    L = (232448 - 4) // 20
    n = L + 1
    doc = {"engine": "sglang-dsv4@pre-25418", "gpu": "H200", "forward_mode": "decode",
           "requests": [{"id": f"r{i}", "seq_len": 200} for i in range(n)]}
    rep = validate_batch.check(doc)
    assert not rep.legal
    assert rep.safe_split.num_steps == 2
    assert [len(s) for s in rep.safe_split.steps] == [L, 1]
