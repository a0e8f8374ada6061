"""Rank-local versus global slots under attention data parallelism.

Each attention-DP rank has its own request table of R/dp + 1 rows, indexed by the request's
``req_pool_idx`` (the rank's own numbering); a buffer indexed by global slots (numbered across all
ranks) declares ``indexed_by: global_slot`` and is checked with each request's ``global_slot``.
Sizes here are arithmetic: --max-running-requests 64 over 2 attention-DP ranks = 32 per rank.
"""
import pytest

from validate_batch import check

SA = {"max_running_requests": 64, "dp_size": 2, "enable_dp_attention": True}
PER_RANK = 64 // 2
BUF = {"name": "mapping sized per rank", "rows": PER_RANK, "indexed_by": "global_slot"}


def doc(**req):
    return {"engine": "sglang-slots@post-fix", "forward_mode": "decode", "server_args": SA, "buffers": [BUF],
            "requests": [{"id": "a", "seq_len": 10, "dp_rank": 1, **req}]}


@pytest.mark.parametrize("g,legal", [(PER_RANK - 2, True), (PER_RANK - 1, True), (PER_RANK, False)])
def test_global_slot_against_a_globally_indexed_buffer(g, legal):
    rep = check(doc(req_pool_idx=1, global_slot=g))
    assert rep.legal is legal
    if not legal:
        f = next(f for f in rep.errors if f.code == "SLOT004")
        assert f.numbers["slot"] == g and f.numbers["buffer_rows"] == PER_RANK


@pytest.mark.parametrize("local,legal", [(PER_RANK - 1, True), (PER_RANK, True), (PER_RANK + 1, False)])
def test_rank_local_slot_against_the_rank_table(local, legal):
    # the rank's table has 32 + 1 rows: local slots 1..32; the global slot is fine
    rep = check(doc(req_pool_idx=local, global_slot=3))
    assert rep.legal is legal
    assert ("SLOT001" in rep.codes) is (not legal)


def test_unknown_global_slot_is_said_not_guessed():
    rep = check(doc(req_pool_idx=PER_RANK))
    assert rep.legal            # nothing known to be broken ...
    w = [f for f in rep.findings if f.code == "SLOT004"]
    assert w and w[0].severity == "warning" and "global_slot" in w[0].message   # ... and it says what is missing


def test_without_attention_dp_the_rank_slot_is_the_global_one():
    d = doc(req_pool_idx=PER_RANK)
    d["server_args"] = {"max_running_requests": 64}
    rep = check(d)
    assert "SLOT004" in {f.code for f in rep.errors}
