"""The pre-dispatch Checker: verdicts, full reports, headroom, configuration and input errors.

Expected numbers come from first principles written here: FlashMLA's scheduler asks for
4*(5b+1) bytes of shared memory and an H200 grants 232448, so the decode kernel takes
b <= (232448 - 4) // 20 rows; SGLang's routing threshold was derived from 228 KiB instead:
(228*1024/4 - 1) // 5 = 11673.
"""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

import validate_batch
from validate_batch import LEGAL, BatchIllegalError, Checker, InputError

# every test here runs on the pure-Python paths and on the compiled helpers
pytestmark = pytest.mark.usefixtures("impl")

H200_SMEM = 232448
LIMIT = (H200_SMEM - 4) // 20
THRESHOLD = (228 * 1024 // 4 - 1) // 5
PRE, POST = "sglang-dsv4@pre-25418", "sglang-dsv4@post-25418"
# The routing gap (11623..11673 rows reach the decode kernel and crash) is a fact of builds without
# the low-shared-memory fallback: upstream 9241ae3, which the DeepSeek-V4 builds of spring 2026 ran
# with the routing version. The SGLang releases' own builds fall back instead (tests/test_builds.py,
# tests/test_engine_builds.py), so these tests name the upstream build.
UPSTREAM = "flashmla-9241ae3"
SEED_ARGS = {"chunked_prefill_size": 16384, "enable_mixed_chunk": False, "max_running_requests": 64, "tp_size": 8}


def test_first_principles():
    assert LIMIT == 11622 and 4 * (5 * LIMIT + 1) <= H200_SMEM < 4 * (5 * (LIMIT + 1) + 1)
    assert THRESHOLD == 11673


@pytest.fixture(scope="module")
def pre():
    return Checker(engine=PRE, gpu="H200", server_args=SEED_ARGS)


@pytest.fixture(scope="module")
def post():
    return Checker(engine=POST, build=UPSTREAM, gpu="H200")


# ------------------------------------------------------------------ resolved configuration
def test_configuration_is_resolved_up_front(pre, post):
    assert pre.max_rows == LIMIT and pre.threshold is None
    assert post.max_rows == LIMIT and post.threshold == THRESHOLD
    assert pre.versions == {"sglang-dsv4": "pre-routing"} and post.versions == {"sglang-dsv4": "routing"}
    assert pre.describe()["server_args"] == SEED_ARGS
    half = Checker(engine=PRE, gpu={"num_sms": 132, "cc": [9, 0], "smem_optin": H200_SMEM // 2})
    assert half.max_rows == (H200_SMEM // 2 - 4) // 20


def test_slot_configuration_from_the_seed_crash():
    R, E = 32, 64
    c = Checker(engine="sglang-slots@pre-fix", server_args={
        "max_running_requests": R, "disaggregation_mode": "decode", "disaggregation_decode_extra_slots": E,
        "speculative_algorithm": "NEXTN", "speculative_num_draft_tokens": 4})
    assert c.table_rows == R + E + 1
    assert c.max_slot == (R + 1) - 1          # the draft tails have R + 1 rows
    fixed = Checker(engine="sglang-slots@post-fix", server_args={
        "max_running_requests": R, "disaggregation_mode": "decode", "disaggregation_decode_extra_slots": E,
        "speculative_num_draft_tokens": 4})
    assert fixed.max_slot == R + E             # every live slot 1..R+E fits


def test_server_args_object_drops_unset_and_unknown_flags():
    class ServerArgs:  # stands in for an engine's settings object
        def __init__(self):
            self.chunked_prefill_size = 8192
            self.max_running_requests = None       # unset
            self.log_level = "info"                # read by no profile
            self.enable_mixed_chunk = True
    c = Checker(engine=PRE, server_args=ServerArgs())
    assert c.describe()["server_args"] == {"chunked_prefill_size": 8192, "enable_mixed_chunk": True}
    c2 = Checker(engine=PRE, server_args={"--chunked-prefill-size": 4096, "max_running_requests": None})
    assert c2.describe()["server_args"] == {"chunked_prefill_size": 4096}


@pytest.mark.parametrize("kwargs,field", [
    (dict(engine="vllm-unknown"), "engine"),
    (dict(engine=PRE, gpu="A100-imaginary"), "gpu"),
    (dict(engine="sglang-dsv4@9.9-nope"), "engine"),
    (dict(engine="sglang-slots"), "server_args.max_running_requests"),
    (dict(engine=PRE, server_args={"chunked_prefill_size": "big"}), "server_args.chunked_prefill_size"),
    (dict(engine=PRE, model={"h_q": 0}), "model.h_q"),
])
def test_bad_configuration_raises_input_error(kwargs, field):
    with pytest.raises(InputError) as ei:
        Checker(**kwargs)
    assert ei.value.field == field


# ------------------------------------------------------------------ verdicts
def test_seed_batch_is_refused_with_the_split(pre):
    v = pre.verdict("extend", extend_lens=[4096, 4096, 4096], rids=["p1", "p2", "p3"])
    assert not v and v.legal is False
    assert {"FMLA001", "SGL001"} <= {f.code for f in v.findings}
    f = next(f for f in v.findings if f.code == "FMLA001")
    assert f.numbers["b"] == 3 * 4096 and f.numbers["max_b"] == LIMIT
    assert f.numbers["smem_bytes"] == 4 * (5 * 3 * 4096 + 1)
    assert v.safe_split.steps == [["p1", "p2"], ["p3"]]
    with pytest.raises(BatchIllegalError) as ei:
        pre.assert_legal("extend", extend_lens=[4096, 4096, 4096], rids=["p1", "p2", "p3"])
    assert ei.value.safe_split.steps == [["p1", "p2"], ["p3"]]
    assert {f.code for f in ei.value.findings} == {f.code for f in v.findings}


def test_legal_verdict_is_the_shared_constant(pre):
    v = pre.verdict("extend", extend_lens=[4096])
    assert v is LEGAL and v and v.report is None and v.findings == [] and v.safe_split is None
    assert pre.assert_legal("decode", seq_lens=[100, 200]) is LEGAL
    with pytest.raises(AttributeError):
        LEGAL.legal = False
    with pytest.raises(AttributeError):
        pre.max_rows = 20000


@pytest.mark.parametrize("rows", [LIMIT - 1, LIMIT, LIMIT + 1])
@pytest.mark.parametrize("engine", [PRE, POST])
def test_decode_rows_at_the_limit(rows, engine):
    c = Checker(engine=engine, split=False, build=UPSTREAM)   # the split of >11000 requests is not what is tested here
    v = c.verdict("decode", seq_lens=[700] * rows)
    assert v.legal is (rows <= LIMIT)


@pytest.mark.parametrize("rows,legal", [(LIMIT, True), (LIMIT + 1, False), (THRESHOLD, False), (THRESHOLD + 1, True),
                                        (200000, True)])
def test_extend_rows_and_the_routing_gap(post, rows, legal):
    v = post.verdict("extend", extend_lens=[rows])
    assert v.legal is legal
    if not legal:
        assert "SGL001" in v.report.codes


@pytest.mark.parametrize("bs,draft", [(2905, 4), (2906, 4), (1452, 8), (1453, 8)])
def test_verify_rows_are_batch_times_draft_and_never_routed(bs, draft):
    c = Checker(engine=POST, build=UPSTREAM, server_args={"speculative_num_draft_tokens": draft})
    assert c.verdict("target_verify", seq_lens=[500] * bs).legal is (bs * draft <= LIMIT)


def test_verify_without_draft_tokens_is_an_input_error(post):
    with pytest.raises(InputError) as ei:
        post.verdict("target_verify", seq_lens=[500, 600])
    assert ei.value.field == "server_args.speculative_num_draft_tokens"


def test_draft_extend_counts_draft_tokens_for_requests_without_extend(pre):
    c = Checker(engine=PRE, server_args={"speculative_num_draft_tokens": 3}, split=False)
    # rows = 11000 + 3 * (zeros) ; 11000 + 3*207 = 11621 legal, 208 zeros -> 11624 illegal
    assert c.verdict("draft_extend", extend_lens=[11000] + [0] * 207).legal is True
    assert c.verdict("draft_extend", extend_lens=[11000] + [0] * 208).legal is False
    assert c.verdict("draft_extend", seq_lens=[50] * (LIMIT // 3)).legal is True
    assert c.verdict("draft_extend", seq_lens=[50] * (LIMIT // 3 + 1)).legal is False


def test_merged_decodes_count_one_row_each(pre):
    # SGLang mixed chunking: the running decodes are appended to the extend lists with length 1.
    v = pre.verdict("mixed", extend_lens=[5811, 5811, 1], prefix_lens=[0, 0, 1799], num_merged_decodes=1,
                    rids=["a", "b", "d1"])
    assert 5811 * 2 + 1 == LIMIT + 1 and not v
    assert v.report.context["row_breakdown"] == {"extend_tokens": 11622, "decode_rows_in_forward": 1,
                                                 "merged_running_decodes": 0}
    assert pre.verdict("mixed", extend_lens=[5811, 5810, 1], num_merged_decodes=1) is LEGAL


def test_padded_rows_count(post):
    assert post.verdict("decode", seq_lens=[10, 20], padded_rows=LIMIT) is LEGAL
    assert not post.verdict("decode", seq_lens=[10, 20], padded_rows=LIMIT + 1)


def test_slots_seed_crash_and_edges():
    c = Checker(engine="sglang-slots@pre-fix", server_args={
        "max_running_requests": 32, "disaggregation_mode": "decode", "disaggregation_decode_extra_slots": 64,
        "speculative_algorithm": "NEXTN", "speculative_num_draft_tokens": 4})
    v = c.verdict("draft_extend", seq_lens=[5000, 7000], req_pool_indices=[3, 96], rids=["a", "b"])
    assert not v and "SLOT002" in v.report.codes
    f = next(f for f in v.findings if f.code == "SLOT002")
    assert "index 96 is out of bounds for dimension 0 with size 33" in f.message
    assert v.safe_split.possible is False
    for slot, ok in ((31, True), (32, True), (33, False), (97, False)):
        assert c.verdict("decode", seq_lens=[10], req_pool_indices=[slot]).legal is ok


def test_a_configuration_that_breaks_a_rule_makes_every_step_illegal():
    c = Checker(engine=PRE, model={"h_q": 96})        # no sparse decode kernel for 96 heads
    assert "FMLA005" in c.describe()["static_errors"]
    v = c.verdict("decode", seq_lens=[100])
    assert not v and "FMLA005" in v.report.codes
    assert c.headroom("decode", seq_lens=[100]).config_ok is False


# ------------------------------------------------------------------ full path == document path
def _doc(engine, mode, reqs, **extra):
    doc = {"engine": engine, "gpu": "H200", "forward_mode": mode, "requests": reqs, **extra}
    return {**doc, "kernel_build": UPSTREAM} if engine == POST else doc


@pytest.mark.parametrize("case", ["seed", "decode", "verify", "prefix", "legal"])
def test_full_check_from_lists_equals_the_document_path(case):
    if case == "seed":
        c = Checker(engine=PRE, server_args=SEED_ARGS)
        kw = dict(forward_mode="extend", extend_lens=[4096] * 3, rids=["p1", "p2", "p3"])
        doc = _doc(PRE, "extend", [{"id": f"p{i}", "extend_tokens": 4096} for i in (1, 2, 3)], server_args=SEED_ARGS)
    elif case == "decode":
        c = Checker(engine=POST, build=UPSTREAM)
        seq = [100 + 37 * i for i in range(300)]  # padded past the limit: illegal, the split is compared too
        kw = dict(forward_mode="decode", seq_lens=seq, padded_rows=LIMIT + 5)
        doc = _doc(POST, "decode", [{"id": f"r{i}", "seq_len": s} for i, s in enumerate(seq)], padded_rows=LIMIT + 5)
    elif case == "verify":
        c = Checker(engine=POST, build=UPSTREAM, server_args={"speculative_num_draft_tokens": 4})
        kw = dict(forward_mode="target_verify", seq_lens=[300, 5000, 70000])
        doc = _doc(POST, "target_verify", [{"id": f"r{i}", "seq_len": s} for i, s in enumerate([300, 5000, 70000])],
                   server_args={"speculative_num_draft_tokens": 4})
    elif case == "prefix":
        c = Checker(engine=POST, build=UPSTREAM)
        kw = dict(forward_mode="extend", extend_lens=[3000, 9000], prefix_lens=[100, 70000])
        doc = _doc(POST, "extend", [{"id": "r0", "extend_tokens": 3000, "prefix_len": 100},
                                    {"id": "r1", "extend_tokens": 9000, "prefix_len": 70000}])
    else:
        c = Checker(engine=POST, build=UPSTREAM)
        kw = dict(forward_mode="extend", extend_lens=[1000, 2000], seq_lens=[1500, 2000])  # prefix = seq - extend
        doc = _doc(POST, "extend", [{"id": "r0", "extend_tokens": 1000, "prefix_len": 500},
                                    {"id": "r1", "extend_tokens": 2000}])
    mode = kw.pop("forward_mode")
    a, b = c.check(mode, **kw), validate_batch.check(doc)
    assert a.legal == b.legal
    assert [f.to_dict() for f in a.findings] == [f.to_dict() for f in b.findings]
    ka = {k: v for k, v in a.context.items() if k != "batch"}
    kb = {k: v for k, v in b.context.items() if k != "batch"}
    assert ka == kb
    for pa, pb in zip(a.plans, b.plans):
        if pa.is_decode and pa.schedule is not None:
            assert np.array_equal(pa.schedule.metadata, pb.schedule.metadata)
            assert np.array_equal(pa.schedule.num_splits, pb.schedule.num_splits)
    if not a.legal:
        assert a.safe_split.to_dict() == b.safe_split.to_dict()


def test_check_completes_a_document_from_the_configuration(pre):
    rep = pre.check({"forward_mode": "extend", "requests": [{"id": "p", "extend_tokens": 12000}]})
    assert not rep.legal and rep.context["versions"] == {"sglang-dsv4": "pre-routing"}
    # a document's own engine wins
    rep2 = pre.check({"engine": POST, "kernel_build": UPSTREAM, "forward_mode": "extend", "requests": [{"id": "p", "extend_tokens": 12000}]})
    assert rep2.legal and rep2.context["routing"]["routed"]


def test_idle_steps_are_legal(pre):
    assert pre.verdict("idle") is LEGAL and pre.check("idle").legal


# ------------------------------------------------------------------ headroom
def test_headroom_without_routing(pre):
    h = pre.headroom("extend", extend_lens=[4096, 4096])
    assert h.rows == 8192 and h.more_rows == LIMIT - 8192 and h.legal_now
    assert h.can_add(LIMIT - 8192) and not h.can_add(LIMIT - 8192 + 1)
    assert h.rows_to_route is None and h.gap is None
    empty = pre.headroom("extend")
    assert empty.rows == 0 and empty.more_rows == LIMIT and not empty.legal_now and empty.can_add(1)


@pytest.mark.parametrize("rows,legal", [(LIMIT - 1, True), (LIMIT, True), (LIMIT + 1, False)])
def test_headroom_at_the_limit_adding_nothing_is_the_step_as_it_is(pre, rows, legal):
    h = pre.headroom("extend", extend_lens=[rows])
    assert h.legal_now is legal and h.can_add(0) is legal
    assert h.can_add(1) is (rows + 1 <= LIMIT)
    assert pre.verdict("extend", extend_lens=[rows]).legal is legal


def test_headroom_with_routing_names_the_gap(post):
    rows = 8192
    h = post.headroom("extend", extend_lens=[4096, 4096])
    assert h.more_rows == LIMIT - rows
    assert h.rows_to_route == THRESHOLD + 1 - rows
    assert h.gap == (LIMIT - rows + 1, THRESHOLD - rows)
    assert h.can_add(LIMIT - rows) and not h.can_add(LIMIT - rows + 1) and not h.can_add(THRESHOLD - rows)
    assert h.can_add(THRESHOLD + 1 - rows) and h.can_add(10 ** 6)
    assert "legal again" in h.note
    # in the gap now: nothing small helps, enough rows route it
    g = post.headroom("extend", extend_lens=[11640])
    assert not g.legal_now and g.more_rows == 0 and g.rows_to_route == THRESHOLD + 1 - 11640
    assert not g.can_add(1) and g.can_add(THRESHOLD + 1 - 11640)
    routed = post.headroom("extend", extend_lens=[20000])
    assert routed.routed and routed.legal_now and routed.more_rows is None and routed.can_add(10 ** 6)


def test_headroom_counts_merged_decodes_only_with_mixed_chunking():
    on = Checker(engine=POST, build=UPSTREAM, server_args={"enable_mixed_chunk": True})
    off = Checker(engine=POST, build=UPSTREAM)
    assert on.headroom("extend", num_running_decodes=64).more_rows == LIMIT - 64
    h = off.headroom("extend", num_running_decodes=64)
    assert h.more_rows == LIMIT and "mixed chunking is off" in h.note


def test_headroom_of_decode_and_verify():
    c = Checker(engine=POST, build=UPSTREAM, server_args={"speculative_num_draft_tokens": 4})
    d = c.headroom("decode", seq_lens=[10] * 100)
    assert d.more_requests == LIMIT - 100 and d.threshold is None and "never routed" in d.note
    v = c.headroom("target_verify", num_requests=100)
    assert v.rows == 400 and v.more_rows == LIMIT - 400 and v.more_requests == (LIMIT - 400) // 4


# ------------------------------------------------------------------ input errors
@pytest.mark.parametrize("kwargs,field", [
    (dict(step="sideways", extend_lens=[1]), "forward_mode"),
    (dict(step="extend"), "extend_lens"),
    (dict(step="decode", extend_lens=[1]), "seq_lens"),
    (dict(step="extend", extend_lens=[1, -2]), "extend_lens[1]"),
    (dict(step="extend", extend_lens=[1, 2.5]), "extend_lens[1]"),
    (dict(step="extend", extend_lens=[True]), "extend_lens[0]"),
    (dict(step="extend", extend_lens="4096"), "extend_lens"),
    (dict(step="extend", extend_lens=[]), "requests"),
    (dict(step="extend", extend_lens=[1, 2], prefix_lens=[0]), "prefix_lens"),
    (dict(step="decode", seq_lens=[0]), "seq_lens[0]"),
    (dict(step="decode", seq_lens=[5], req_pool_indices=[-1]), "req_pool_indices[0]"),
    (dict(step="decode", seq_lens=np.array([1.5])), "seq_lens"),
    (dict(step="extend", extend_lens=[1, 2], rids=["a", "a"]), "rids"),
    (dict(step="extend", extend_lens=[1, 2], rids=["a"]), "rids"),
    (dict(step="extend", extend_lens=[1], num_merged_decodes=2), "num_merged_decodes"),
    (dict(step="decode", seq_lens=[1], num_merged_decodes=1), "num_merged_decodes"),
    (dict(step="extend", extend_lens=[1], padded_rows=-1), "padded_rows"),
    (dict(step="extend", extend_lens=[1 << 25]), "extend_lens[0]"),
    (dict(step="extend", extend_lens=[2, 3], seq_lens=[5, 2]), "seq_lens[1]"),
    (dict(step=12345), "batch"),
])
def test_malformed_steps_raise_input_error_naming_the_field(pre, kwargs, field):
    for fn in (pre.verdict, pre.check):
        with pytest.raises(InputError) as ei:
            fn(**kwargs)
        assert ei.value.field == field


def test_numpy_and_tuple_columns_are_accepted(pre):
    assert pre.verdict("decode", seq_lens=np.arange(1, 101, dtype=np.int32)) is LEGAL
    assert pre.verdict("extend", extend_lens=(4096, 4096), prefix_lens=np.zeros(2, dtype=np.uint16)) is LEGAL
    assert pre.verdict("extend", extend_lens=[np.int64(4096)] * 3).legal is False


# ------------------------------------------------------------------ threads and imports
def test_one_checker_shared_by_threads_gives_the_sequential_answers():
    post = Checker(engine=POST, build=UPSTREAM, split=False)
    cases = [("extend", dict(extend_lens=[n])) for n in (1, 4096, LIMIT, LIMIT + 1, THRESHOLD, THRESHOLD + 1)]
    cases += [("decode", dict(seq_lens=[300] * n)) for n in (10, LIMIT + 1)]
    want = [post.check(m, **kw).legal for m, kw in cases]
    got: dict = {}
    errors: list = []

    def work(t):
        try:
            for r in range(3):
                for i, (m, kw) in enumerate(cases):
                    got[(t, r, i, "v")] = post.verdict(m, **kw).legal
                    got[(t, r, i, "c")] = post.check(m, **kw).legal
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for (t, r, i, kind), legal in got.items():
        assert legal == want[i], (t, r, i, kind)


def test_importable_and_usable_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import validate_batch, validate_batch.guard.checker, validate_batch.inputs.adapters, validate_batch.pytest_plugin\n"
            "c = validate_batch.Checker(engine='sglang-dsv4@pre-25418', gpu='H200')\n"
            "v = c.verdict('extend', extend_lens=[4096, 4096, 4096], rids=['p1', 'p2', 'p3'])\n"
            "assert not v and v.safe_split.steps == [['p1', 'p2'], ['p3']]\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_explain_renders_codes_fixes_and_split(pre):
    v = pre.verdict("extend", extend_lens=[4096] * 3, rids=["p1", "p2", "p3"])
    text = validate_batch.explain(v.report)
    assert text.startswith("batch is ILLEGAL")
    assert "FMLA001" in text and "SGL001" in text and "fix:" in text
    assert "step 1: p1, p2" in text and "step 2: p3" in text
    chunked = validate_batch.explain(pre.verdict("extend", extend_lens=[12000], rids=["long"]).report)
    assert f"long[0:{LIMIT}]" in chunked and f"long[{LIMIT}:12000]" in chunked


def test_verdict_and_check_accept_batches_and_documents(pre):
    from validate_batch.inputs.batch import batch_from_dict

    doc = {"engine": PRE, "forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": LIMIT + 1}]}
    b = batch_from_dict(doc)
    assert not pre.verdict(b) and not pre.verdict(doc) and not pre.check(b).legal
    small = {"forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": LIMIT}]}
    assert pre.verdict(small) is LEGAL and pre.assert_legal(small) is LEGAL
    with pytest.raises(BatchIllegalError):
        pre.assert_legal(doc)
    with pytest.raises(InputError):
        pre.verdict({"forward_mode": "extend", "requests": []})


@pytest.mark.parametrize("gpu", ["H200", "B200", {"num_sms": 78, "cc": [9, 0], "smem_optin": H200_SMEM}])
@pytest.mark.parametrize("kernel", [None, "flashmla-1408756"])
@pytest.mark.parametrize("h_q,extra", [(64, None), (64, 512), (128, 512), (96, None)])
def test_step_plans_equal_planning_each_call_from_scratch(gpu, kernel, h_q, extra):
    # The per-step path reuses a call shape's implementation and partitions; planning the same call
    # from scratch must give the same plan.
    from validate_batch.flashmla.calls import DecodeCall
    from validate_batch.flashmla.plan import plan
    from validate_batch.facts.knowledge import resolve_gpu
    from validate_batch.engines.shapes import shape_plan as _shape_plan
    from validate_batch.engines.shapes import step_plan as _decode_plan

    g = resolve_gpu(gpu)
    rng = np.random.default_rng(7)
    b = 300
    tl = rng.integers(0, 129, b)
    etl = rng.integers(0, 513, b) if extra else None
    fast = _decode_plan(_shape_plan(g, kernel, h_q, 512, 128, extra, 64, 64 if extra else None, "x"), b, tl, etl)
    ref = plan(DecodeCall(kind="sparse", b=b, s_q=1, h_q=h_q, d_qk=512, topk=128, extra_topk=extra, page=64,
                          extra_page=64 if extra else None, label="x", topk_length=tl, extra_topk_length=etl),
               g, kernel)
    assert fast.implementation == ref.implementation and fast.num_sm_parts == ref.num_sm_parts
    assert fast.gen == ref.gen and fast.gpu == ref.gpu
    assert fast.call.to_record() == ref.call.to_record()
    if ref.schedule is not None:
        assert np.array_equal(fast.schedule.metadata, ref.schedule.metadata)
