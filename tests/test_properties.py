"""Property tests: the fast path agrees with the full path and with arithmetic written here.

The oracle in this file is first principles, not the code under test: FlashMLA's scheduler needs
4*(5b+1) bytes of shared memory (232448 on an H200, so b <= 11622); SGLang routes extend forwards
above 11673 rows (a threshold derived from 228 KiB) to the sparse prefill kernel in versions that
have routing; a decode forward has one row per request, a verify forward batch x draft rows; a slot
must index a row of every slot-indexed buffer.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")     # the test extra: without it these tests are skipped, not an error

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from validate_batch import Checker, InputError

SMEM = 232448
LIMIT = (SMEM - 4) // 20
THRESHOLD = (228 * 1024 // 4 - 1) // 5
NUM_SMS = 132
INT32_MAX = 2 ** 31 - 1
R, E, DRAFT = 32, 64, 3

CONFIGS = {
    "pre": dict(engine="sglang-dsv4@pre-25418", server_args={}),
    "post": dict(engine="sglang-dsv4@post-25418", kernel="flashmla-9241ae3", server_args={"speculative_num_draft_tokens": DRAFT}),
    "mixed": dict(engine="sglang-dsv4@post-25418", kernel="flashmla-9241ae3", server_args={"enable_mixed_chunk": True,
                                                               "speculative_num_draft_tokens": DRAFT}),
    "slots": dict(engine=["sglang-dsv4@pre-25418", "sglang-slots@pre-fix"],
                  server_args={"max_running_requests": R, "disaggregation_mode": "decode",
                               "disaggregation_decode_extra_slots": E, "speculative_algorithm": "NEXTN",
                               "speculative_num_draft_tokens": DRAFT}),
}
CHECKERS = {k: Checker(gpu="H200", **v) for k, v in CONFIGS.items()}
THRESHOLDS = {"pre": None, "post": THRESHOLD, "mixed": THRESHOLD, "slots": None}
DRAFTS = {"pre": 0, "post": DRAFT, "mixed": DRAFT, "slots": DRAFT}
# the plain DSA builder's draft tails have R + 1 rows; the request table R + E + 1
MAX_SLOT = {"slots": R}

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@st.composite
def steps(draw, small: bool = False, configs=tuple(CONFIGS)):
    cfg = draw(st.sampled_from(configs))
    modes = ["extend", "mixed", "decode"] + (["target_verify", "draft_extend"] if DRAFTS[cfg] else [])
    mode = draw(st.sampled_from(modes))
    n = draw(st.integers(1, 6 if small else 24))
    big = 120 if small else 1400
    kw: dict = {"rids": [f"q{i}" for i in range(n)]}
    if mode in ("extend", "mixed", "draft_extend") and (mode != "draft_extend" or draw(st.booleans())):
        ext = draw(st.lists(st.integers(0 if mode != "draft_extend" else 0, big), min_size=n, max_size=n))
        if mode == "draft_extend" and DRAFTS[cfg] == 0:
            ext = [max(e, 1) for e in ext]
        kw["extend_lens"] = ext
        kw["prefix_lens"] = draw(st.lists(st.integers(0, 9000), min_size=n, max_size=n))
        if mode in ("extend", "mixed"):
            k = draw(st.integers(0, n))
            if k:
                kw["extend_lens"] = ext[: n - k] + [1] * k
                kw["num_merged_decodes"] = k
    else:
        kw["seq_lens"] = draw(st.lists(st.integers(1, 70000), min_size=n, max_size=n))
    if cfg == "slots" or draw(st.booleans()):
        hi = R + E + 2 if cfg == "slots" else 5000
        kw["req_pool_indices"] = draw(st.lists(st.integers(0, hi), min_size=n, max_size=n))
    if not small and draw(st.integers(0, 3)) == 0:
        kw["padded_rows"] = draw(st.sampled_from([0, LIMIT - 1, LIMIT, LIMIT + 1, THRESHOLD, THRESHOLD + 1,
                                                  draw(st.integers(0, 14000))]))
    return cfg, mode, kw


def expected_rows(cfg: str, mode: str, kw: dict) -> int:
    ext, n = kw.get("extend_lens"), len(kw["rids"])
    d = DRAFTS[cfg]
    if mode in ("extend", "mixed"):
        k = kw.get("num_merged_decodes", 0)
        rows = sum(ext[: n - k]) + k
    elif mode == "decode":
        rows = n
    elif mode == "target_verify":
        rows = n * d
    else:
        rows = sum(e if e else d for e in ext) if ext is not None else n * d
    return max(rows, kw.get("padded_rows") or 0)


def expected_legal(cfg: str, mode: str, kw: dict) -> bool:
    rows = expected_rows(cfg, mode, kw)
    thr = THRESHOLDS[cfg]
    rows_ok = rows >= 1 and (4 * (5 * rows + 1) <= SMEM or (mode in ("extend", "mixed") and thr is not None
                                                             and rows > thr))
    # live slots are 1 .. MAX_SLOT: row 0 of the request table is the reserved padding row
    slots_ok = cfg not in MAX_SLOT or all(1 <= s <= MAX_SLOT[cfg] for s in kw.get("req_pool_indices") or [])
    return rows_ok and slots_ok


# ------------------------------------------------------------------ fast path == full path == arithmetic
@SETTINGS
@given(steps())
def test_fast_and_full_paths_agree_with_the_arithmetic(impl, step):
    cfg, mode, kw = step
    chk = CHECKERS[cfg]
    v = chk.verdict(mode, **kw)
    full = chk.check(mode, **kw)
    assert v.legal == full.legal == expected_legal(cfg, mode, kw)
    if not v.legal:
        assert v.report.codes == full.codes
    if "query_rows" in full.context:
        assert full.context["query_rows"] == expected_rows(cfg, mode, kw)


# ------------------------------------------------------------------ vectorized schedule == reference
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps(small=True, configs=("pre", "post", "mixed")))
def test_vectorized_and_reference_schedules_agree(impl, step):
    cfg, mode, kw = step
    rep = CHECKERS[cfg].check(mode, **kw)
    for p in rep.plans:
        if not p.is_decode or p.schedule is None:
            continue
        ref = p.reference_schedule()
        assert np.array_equal(p.schedule.metadata[:, :7], ref.metadata[:, :7])
        assert np.array_equal(p.schedule.num_splits, ref.num_splits)


# ------------------------------------------------------------------ legal => every limit by arithmetic
@SETTINGS
@given(steps())
def test_a_legal_verdict_means_every_kernel_limit_holds(impl, step):
    cfg, mode, kw = step
    chk = CHECKERS[cfg]
    if not chk.verdict(mode, **kw).legal:
        return
    rep = chk.check(mode, **kw)
    rows = expected_rows(cfg, mode, kw)
    for p in rep.plans:
        c = p.call
        if not p.is_decode:                     # routed to flash_mla_sparse_fwd: no row limit, never empty
            assert c.s_q >= 1 and mode in ("extend", "mixed") and rows > THRESHOLDS[cfg]
            continue
        assert c.b == rows and 4 * (5 * c.b + 1) <= SMEM
        assert c.topk % 64 == 0 and c.h_q in (64, 128) and c.h_k == 1 and c.d_qk in (512, 576)
        parts = max(NUM_SMS // c.s_q // (c.h_q // 64), 1)
        assert p.num_sm_parts == parts <= 160
        if c.topk_length is not None:
            assert int(c.topk_length.min()) >= 0 and int(c.topk_length.max()) <= c.topk
        if c.extra_topk_length is not None:
            assert int(c.extra_topk_length.min()) >= 0 and int(c.extra_topk_length.max()) <= c.extra_topk
        ns = p.reference_schedule().num_splits.astype(np.int64)
        split = np.flatnonzero(np.diff(ns) > 1)
        for r in split:
            assert (int(ns[r + 1]) - 1) * c.s_q * c.h_q * 512 <= INT32_MAX
    for s in kw.get("req_pool_indices") or []:
        if cfg in MAX_SLOT:
            assert s <= R < R + E + 1


# ------------------------------------------------------------------ the safe split
@st.composite
def illegal_extend_steps(draw):
    cfg = draw(st.sampled_from(["pre", "post"]))
    n = draw(st.integers(1, 12))
    ext = draw(st.lists(st.integers(1, 9000), min_size=n, max_size=n))
    assume(LIMIT < sum(ext) and (THRESHOLDS[cfg] is None or sum(ext) <= THRESHOLDS[cfg]))
    pre = draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n))
    return cfg, ext, pre


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(illegal_extend_steps())
def test_safe_split_steps_are_legal_and_keep_every_request_in_order(case):
    cfg, ext, pre = case
    chk = CHECKERS[cfg]
    rids = [f"q{i}" for i in range(len(ext))]
    v = chk.verdict("extend", extend_lens=ext, prefix_lens=pre, rids=rids)
    assert not v
    sp = v.safe_split
    assert sp.possible
    idx = {r: i for i, r in enumerate(rids)}
    if sp.steps is not None:
        assert [r for st_ in sp.steps for r in st_] == rids
        for st_ in sp.steps:
            sub = [idx[r] for r in st_]
            assert sub == list(range(sub[0], sub[0] + len(sub)))           # contiguous
            e = [ext[i] for i in sub]
            assert 1 <= sum(e) <= LIMIT
            assert chk.verdict("extend", extend_lens=e, prefix_lens=[pre[i] for i in sub]).legal
    else:
        assert any(e > LIMIT for e in ext)
    chunks = sp.chunked_steps
    assert chunks is not None
    done = {r: 0 for r in rids}
    for st_ in chunks:
        assert 1 <= sum(c["tokens"] for c in st_) <= LIMIT
        for c in st_:
            assert c["start"] == done[c["id"]]                              # chunks follow each other
            done[c["id"]] += c["tokens"]
        e = [c["tokens"] for c in st_]
        p = [pre[idx[c["id"]]] + c["start"] for c in st_]
        assert chk.verdict("extend", extend_lens=e, prefix_lens=p).legal
    assert done == dict(zip(rids, ext))                                     # every token, exactly once
    order = [c["id"] for st_ in chunks for c in st_]
    assert sorted(set(order), key=order.index) == rids                      # requests in order


# ------------------------------------------------------------------ invalid input -> InputError only
JUNK = st.sampled_from([-1, -(2 ** 40), 1.5, float("nan"), "7", None, True, [3], {"a": 1}, 2 ** 40, b"x"])


@st.composite
def corrupted_steps(draw):
    cfg, mode, kw = draw(steps(small=True))
    what = draw(st.sampled_from(["mode", "element", "length", "rids", "merged", "padded", "column_type"]))
    kw = dict(kw)
    if what == "mode":
        mode = draw(st.sampled_from(["", "prefill-ish", "DECODE ", 3, None, ["extend"]]))
        if mode is None:
            mode = 0
    elif what in ("element", "length", "column_type"):
        cols = [c for c in ("extend_lens", "seq_lens", "prefix_lens", "req_pool_indices") if c in kw]
        col = draw(st.sampled_from(cols))
        vals = list(kw[col])
        if what == "element":
            i = draw(st.integers(0, len(vals) - 1))
            bad = draw(JUNK)
            if col == "seq_lens" and draw(st.booleans()):
                bad = 0
            vals[i] = bad
            kw[col] = vals
        elif what == "length":
            kw[col] = vals + [1] if draw(st.booleans()) or len(vals) == 1 else vals[:-1]
            assume(col != "extend_lens" or "num_merged_decodes" not in kw)
            if col == "extend_lens" or (col == "seq_lens" and "extend_lens" not in kw):
                kw["rids"] = kw["rids"] + ["extra"] if len(kw[col]) > len(kw["rids"]) else kw["rids"][:-1]
                assume(len(kw["rids"]) == len(kw[col]) and any(c in kw for c in cols if c != col))
        else:
            kw[col] = draw(st.sampled_from(["1,2,3", 12, {"a": 1}, np.array([[1, 2]]), np.array([1.0, 2.0])]))
    elif what == "rids":
        kw["rids"] = draw(st.sampled_from([kw["rids"][:-1] or ["x", "y"], [None] * len(kw["rids"]),
                                           ["same"] * (len(kw["rids"]) + 1), "abc", 5]))
        assume(not (isinstance(kw["rids"], list) and len(kw["rids"]) == 1 and kw["rids"] == ["same"]))
        if isinstance(kw["rids"], list) and len(kw["rids"]) == len(kw.get("extend_lens") or kw.get("seq_lens")) \
                and kw["rids"] and kw["rids"][0] == "same" and len(kw["rids"]) == 1:
            assume(False)
    elif what == "merged":
        n = len(kw["rids"])
        kw["num_merged_decodes"] = draw(st.sampled_from([-1, n + 1, 1.0, "1", True]))
        if kw["num_merged_decodes"] is True and mode in ("extend", "mixed") and n >= 1:
            assume(False)          # True is an int; 1 merged decode may be a valid step
    else:
        kw["padded_rows"] = draw(st.sampled_from([-1, 1.5, "9", 2 ** 30]))
    return cfg, mode, kw


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(corrupted_steps())
def test_invalid_input_raises_input_error_and_nothing_else(impl, case):
    cfg, mode, kw = case
    chk = CHECKERS[cfg]
    for fn in (chk.verdict, chk.check, chk.assert_legal):
        with pytest.raises(InputError):
            fn(mode, **kw)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(list(CHECKERS)), st.one_of(st.none(), JUNK, st.lists(JUNK, max_size=3)),
       st.one_of(st.none(), JUNK, st.lists(JUNK, max_size=3)), st.one_of(st.none(), JUNK))
def test_headroom_rejects_junk_with_input_error(cfg, ext, seq, nreq):
    chk = CHECKERS[cfg]
    try:
        chk.headroom("extend", ext, seq, num_requests=nreq)
    except InputError:
        pass


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["pre", "post", "mixed"]), st.lists(st.integers(0, 3000), max_size=8),
       st.integers(0, 64), st.integers(0, 13000))
def test_headroom_agrees_with_verdicts(cfg, ext, running, add):
    chk = CHECKERS[cfg]
    h = chk.headroom("extend", ext, num_running_decodes=running)
    merged = running if cfg == "mixed" else 0
    assert h.rows == sum(ext) + merged
    # adding `add` rows as one more request: the verdict must say what can_add says
    lists = ext + [add] + [1] * merged
    v = chk.verdict("mixed" if merged else "extend", extend_lens=lists, num_merged_decodes=merged)
    assert h.can_add(add) == v.legal
