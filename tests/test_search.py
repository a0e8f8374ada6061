"""The boundary search against brute force: every edge of a monotone predicate, hints right and wrong."""
from __future__ import annotations

import random

import pytest

from validate_batch.legality.search import largest_legal


def brute(edge: int, lo: int, cap: int):
    legal = [v for v in range(lo, cap + 1) if v <= edge]
    illegal = [v for v in range(lo, cap + 1) if v > edge]
    return (max(legal) if legal else None), (min(illegal) if illegal else None)


@pytest.mark.parametrize("lo", [0, 1, 5])
def test_every_edge_every_start(lo):
    cap = 70
    for edge in range(lo - 1, cap + 2):
        for start in (None, lo, lo + 3, edge, edge + 1, cap, cap + 5):
            for hint in (False, True):
                calls = []

                def legal(v, edge=edge):
                    calls.append(v)
                    assert lo <= v <= cap + 1 or v == start, v
                    return v <= edge

                assert largest_legal(legal, lo, start, cap, exact_hint=hint) == brute(edge, lo, cap), (edge, start, hint)
                assert len(calls) == len(set(calls)), "each value is evaluated once"


def test_a_right_hint_costs_two_evaluations():
    calls = []
    assert largest_legal(lambda v: calls.append(v) or v <= 11622, 1, 11622, 1 << 24, exact_hint=True) == (11622, 11623)
    assert calls == [11622, 11623]


def test_random_large_ranges_are_logarithmic():
    rng = random.Random(3)
    for _ in range(200):
        cap = rng.randint(1, 1 << 40)
        edge = rng.randint(-1, cap + 1)
        n = [0]

        def legal(v, edge=edge):
            n[0] += 1
            return v <= edge

        assert largest_legal(legal, 0, rng.choice([None, rng.randint(0, cap)]), cap) == brute_fast(edge, 0, cap)
        assert n[0] <= 2 * 42 + 2


def brute_fast(edge, lo, cap):
    good = None if edge < lo else min(edge, cap)
    bad = None if edge >= cap else max(edge + 1, lo)
    return good, bad
