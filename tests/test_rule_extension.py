"""A rule added the documented way (one ``@rule`` definition) is enforced by every path.

The rules registered here exist only in these tests: one that flags a cached prefix above 100000
tokens (it reads the requests, which no bound covers, so the guard must take the full check), one
that allows at most two requests per forward, and one that moves the row limit (it reads only the
query rows, so the bounds must move with it). Expected values come from the rules' own thresholds
and from FlashMLA's shared-memory formula ``4*(5b+1) <= 232448`` (b <= 11622 on an H200).
"""
from __future__ import annotations

import pytest

import validate_batch
from validate_batch.bisect import BisectChecker, find_boundary
from validate_batch.engines import shapes
from validate_batch.errors import BatchIllegalError
from validate_batch.legality.registry import revision, rule, unregister

ENGINE = "sglang-dsv4@pre-25418"
H200_ROWS = (232448 - 4) // 20           # 11622


@pytest.fixture
def add_rule():
    added = []

    def add(code: str, scope: str, reads, func, title: str = "test rule"):
        rule(code, scope=scope, reads=reads, title=title, failure="python_exception: test", source="this test")(func)
        added.append(code)
        return func

    yield add
    for code in added:
        unregister(code)


def _prefix_rule(add_rule):
    def big_prefix(bp):
        """A cached prefix above 100000 tokens (test rule)."""
        out = []
        for r in bp.batch.requests:
            if r.prefix_len > 100000:
                out.append(big_prefix.rule.finding(f"request {r.id} prefix expected <= 100000, got {r.prefix_len}",
                                                   subject=f"request {r.id}", numbers={"request": r.id}))
        return out

    return add_rule("TST901", "batch", None, big_prefix)


def test_default_reads_is_requests(add_rule):
    f = _prefix_rule(add_rule)
    assert f.rule.reads == frozenset({"requests"}) and f.rule.split_helps


@pytest.mark.parametrize("built_before", [True, False])
def test_guard_check_and_assert_legal_enforce_a_new_rule(add_rule, built_before):
    before = validate_batch.Checker(engine=ENGINE, gpu="H200") if built_before else None
    _prefix_rule(add_rule)
    guard = before or validate_batch.Checker(engine=ENGINE, gpu="H200")
    assert "TST901" in guard.bounds.undecided or not guard.bounds.complete
    for prefix, legal in [(99999, True), (100000, True), (100001, False)]:
        v = guard.verdict("extend", extend_lens=[10], prefix_lens=[prefix], rids=["a"])
        assert bool(v) is legal, prefix
        rep = guard.check("extend", extend_lens=[10], prefix_lens=[prefix], rids=["a"])
        assert rep.legal is legal and (("TST901" in rep.codes) is not legal)
        if legal:
            assert guard.assert_legal("extend", extend_lens=[10], prefix_lens=[prefix], rids=["a"])
        else:
            assert v.report.codes == ["TST901"]
            with pytest.raises(BatchIllegalError):
                guard.assert_legal("extend", extend_lens=[10], prefix_lens=[prefix], rids=["a"])
    # the one-shot API and a batch document
    doc = {"engine": ENGINE, "forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": 10, "prefix_len": 100001}]}
    assert not validate_batch.check(doc).legal
    with pytest.raises(BatchIllegalError):
        validate_batch.assert_legal(doc)


def test_removing_the_rule_restores_the_fast_path(add_rule):
    _prefix_rule(add_rule)
    guard = validate_batch.Checker(engine=ENGINE, gpu="H200")
    assert not guard.bounds.complete
    unregister("TST901")
    fresh = validate_batch.Checker(engine=ENGINE, gpu="H200")
    assert fresh.bounds.complete and fresh.bounds.rules_revision == revision()
    assert fresh.verdict("extend", extend_lens=[10], prefix_lens=[100001], rids=["a"])


def test_headroom_enforces_a_new_rule(add_rule):
    _prefix_rule(add_rule)
    guard = validate_batch.Checker(engine=ENGINE, gpu="H200")
    bad = guard.headroom("extend", extend_lens=[10], prefix_lens=[100001])
    assert not bad.legal_now and not bad.can_add(1) and bad.more_rows == 0
    good = guard.headroom("extend", extend_lens=[10], prefix_lens=[5])
    assert good.legal_now and good.more_rows == H200_ROWS - 10
    assert good.can_add(H200_ROWS - 10) and not good.can_add(H200_ROWS - 9)


def test_split_enforces_a_new_rule(add_rule):
    def two_per_step(bp):
        """At most two requests per forward (test rule)."""
        n = len(bp.batch.requests)
        if n > 2:
            return [two_per_step.rule.finding(f"expected <= 2 requests, got {n}", numbers={"requests": n})]
        return None

    add_rule("TST902", "batch", ("requests",), two_per_step)
    guard = validate_batch.Checker(engine=ENGINE, gpu="H200")
    v = guard.verdict("extend", extend_lens=[100, 100, 100, 100, 100], rids=["a", "b", "c", "d", "e"])
    assert not v and v.report.codes == ["TST902"]
    assert v.safe_split.steps == [["a", "b"], ["c", "d"], ["e"]]
    # the one-shot path's split too
    doc = {"engine": ENGINE, "forward_mode": "extend",
           "requests": [{"id": x, "extend_tokens": 100} for x in "abc"]}
    assert validate_batch.check(doc).safe_split.steps == [["a", "b"], ["c"]]


def test_a_request_the_new_rule_rejects_alone_has_no_split(add_rule):
    _prefix_rule(add_rule)
    guard = validate_batch.Checker(engine=ENGINE, gpu="H200")
    v = guard.verdict("extend", extend_lens=[100, 100], prefix_lens=[0, 200000], rids=["ok", "bad"])
    assert not v and v.safe_split.steps is None and "bad" in v.safe_split.reason and "ok" not in v.safe_split.reason


def test_a_row_rule_moves_the_bounds_of_every_path(add_rule):
    def rows_5000(bp):
        """At most 5000 query rows (test rule)."""
        if bp.rows is not None and bp.rows > 5000:
            return [rows_5000.rule.finding(f"expected <= 5000 rows, got {bp.rows}", numbers={"rows": bp.rows})]
        return None

    add_rule("TST903", "batch", ("rows",), rows_5000)
    guard = validate_batch.Checker(engine=ENGINE, gpu="H200")
    assert guard.bounds.complete and guard.max_rows == 5000 and guard.bounds.sure_rows == 5000
    for rows, legal in [(4999, True), (5000, True), (5001, False)]:
        assert bool(guard.verdict("decode", seq_lens=[7] * rows)) is legal
        assert bool(guard.verdict("extend", extend_lens=[rows], rids=["p"])) is legal
    room = guard.headroom("extend", extend_lens=[1000])
    assert room.more_rows == 4000 and room.can_add(4000) and not room.can_add(4001)
    v = guard.verdict("extend", extend_lens=[3000, 3000, 3000], rids=["a", "b", "c"])
    assert v.safe_split.steps == [["a"], ["b"], ["c"]]
    assert v.safe_split.settings[0] == {"flag": "--chunked-prefill-size", "value": 5000,
                                        "why": "bounds the query rows of every extend forward to the decode kernel's 5000"}


def test_bisect_boundary_follows_a_new_rule(add_rule):
    _prefix_rule(add_rule)

    def make(prefix: int) -> dict:
        return {"engine": ENGINE, "forward_mode": "extend",
                "requests": [{"id": "a", "extend_tokens": 10, "prefix_len": prefix}]}

    checker = BisectChecker()
    b = find_boundary(make, checker, 0, 150000, None, "prefix")
    assert (b.largest_legal, b.first_illegal, b.codes) == (100000, 100001, ["TST901"])


def test_a_shape_only_rule_added_later_runs_on_a_call_shape_planned_before():
    """A one-shot check plans a sparse decode call from its shape's plan, made once, and skips the
    shape-only rules silent for the shape (``validate_batch.engines.shapes.call_plan``): a rule
    added after the shape was planned runs on it."""
    rec = {"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
    shapes._CALL_SHAPES.clear()
    assert validate_batch.check(rec).legal
    assert validate_batch.check(rec).plans[0].quiet_rules           # the shape's silent rules, skipped

    def sixty_four_heads(p):
        """Sixty-four query heads (test rule)."""
        if p.call.h_q == 64:
            return [sixty_four_heads.rule.finding("h_q expected other than 64, got 64", subject="call")]
        return None

    rule("TST950", scope="call", reads=None, shape_only=True, title="test rule", failure="python_exception: test",
         source="this test")(sixty_four_heads)
    try:
        report = validate_batch.check(rec)
        assert "TST950" in report.codes and not report.legal
        assert "TST950" not in report.plans[0].quiet_rules
        assert validate_batch.check({**rec, "h_q": 128}).legal
    finally:
        unregister("TST950")
    assert validate_batch.check(rec).legal
