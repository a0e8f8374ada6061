"""The per-step path's shortcuts give exactly what the plain computations give.

* effective lengths read the length arrays' exact ranges: checked against the scheduler's
  effective-length rule written out here element by element;
* engine profiles fill those ranges in arithmetically: checked against the arrays themselves;
* shape-only rules are skipped on derived calls when a plan of the same shape found nothing: the
  declaration is checked by varying ``b`` and the length values, and the engine's findings against
  every rule run on the same calls planned from scratch;
* list columns validated through numpy keep every input error the element-wise check raises.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from validate_batch import Checker, InputError
from validate_batch.legality.evaluate import plan_batch
from validate_batch.flashmla.calls import DecodeCall
from validate_batch.flashmla.plan import effective_lengths, plan
from validate_batch.facts.knowledge import resolve_gpu
from validate_batch.legality.registry import rules_for, run_rules, shape_rules

# every test here runs on the pure-Python paths and on the compiled helpers
pytestmark = pytest.mark.usefixtures("impl")

PRE = "sglang-dsv4@pre-25418"


def effective_by_element(call: DecodeCall) -> list[int]:
    """The scheduler's key length per request, one request at a time (sparse calls): topk_length
    (0 counts as 1; topk when absent), rounded up to a multiple of 64 when there is an extra cache,
    plus extra_topk_length (extra_topk when absent)."""
    out = []
    for i in range(call.b):
        t = call.topk if call.topk_length is None else int(call.topk_length[i])
        if t == 0:
            t = 1
        if call.extra_topk is not None:
            t = -(-t // 64) * 64
            t += call.extra_topk if call.extra_topk_length is None else int(call.extra_topk_length[i])
        out.append(t)
    return out


def random_lengths(rng: random.Random, b: int, width: int) -> np.ndarray | None:
    kind = rng.choice(["none", "const", "const0", "zeros_ones", "bucket", "wide", "negative", "over"])
    if kind == "none":
        return None
    if kind == "const":
        v = [rng.randint(0, width)] * b
    elif kind == "const0":
        v = [0] * b
    elif kind == "zeros_ones":
        v = [rng.choice([0, 1]) for _ in range(b)]
    elif kind == "bucket":       # varying values that all round to one multiple of 64
        k = rng.randint(0, max(width // 64 - 1, 0))
        v = [rng.randint(64 * k + 1, 64 * k + 64) for _ in range(b)]
    elif kind == "wide":
        v = [rng.randint(0, width) for _ in range(b)]
    elif kind == "negative":
        v = [rng.randint(-3, width) for _ in range(b)]
    else:
        v = [rng.randint(0, width + 70) for _ in range(b)]
    return np.asarray(v, dtype=np.int64)


def test_effective_lengths_match_the_element_wise_rule(h200):
    rng = random.Random(11)
    gen = plan(DecodeCall(kind="sparse", b=1, s_q=1, h_q=64, d_qk=512, topk=128), h200).gen
    seen = set()
    for _ in range(3000):
        b = rng.choice([1, 2, 3, 7, 64, 257])
        topk = rng.choice([0, 64, 100, 128, 2048])
        extra = rng.choice([None, 64, 512, 500])
        tl = random_lengths(rng, b, max(topk, 1))
        etl = random_lengths(rng, b, extra) if extra is not None else None
        call = DecodeCall(kind="sparse", b=b, s_q=1, h_q=64, d_qk=512, topk=topk, topk_length=tl,
                          extra_topk=extra, extra_topk_length=etl)
        want = effective_by_element(call)
        arr, uni = effective_lengths(call, gen)
        if len(set(want)) == 1:
            assert arr is None and uni == want[0], (call.summary(), tl, etl)
        else:
            assert uni is None and arr.tolist() == want, (call.summary(), tl, etl)
        seen.add((arr is None, tl is None, etl is None))
    assert len(seen) >= 6, seen     # uniform and varying results from every mix of arrays


def test_effective_lengths_of_an_empty_call_are_an_empty_array(h200):
    gen = plan(DecodeCall(kind="sparse", b=1, s_q=1, h_q=64, d_qk=512, topk=128), h200).gen
    empty = np.zeros(0, dtype=np.int64)
    for tl, etl in ((empty, None), (None, empty), (empty, empty)):
        call = DecodeCall(kind="sparse", b=0, s_q=1, h_q=64, d_qk=512, topk=128, topk_length=tl,
                          extra_topk=512, extra_topk_length=etl)
        arr, uni = effective_lengths(call, gen)
        assert uni is None and arr.shape == (0,)


def test_a_call_of_no_rows_has_no_schedule_and_the_rules_do_not_raise(h200):
    # b = 0 cannot come from validated input (records and engines ask for b >= 1), but a call built
    # in code can have it: there is no scheduler run to model, and no rule may raise
    for tl in (None, np.zeros(0, dtype=np.int64)):
        p = plan(DecodeCall(kind="sparse", b=0, s_q=1, h_q=64, d_qk=512, topk=128, topk_length=tl), h200)
        assert not p.scheduler_runs and p.schedule is None
        assert "FMLA002" not in {f.code for f in run_rules("call", p)}


def engine_batches(chk: Checker, rng: random.Random):
    for _ in range(60):
        n = rng.randint(1, 300)
        seq = [rng.choice([1, 2, 3, 4, 127, 128, 129, 511, 512, 513, rng.randint(1, 40000)]) for _ in range(n)]
        yield chk.batch("decode", seq_lens=seq)
        yield chk.batch("target_verify", seq_lens=seq)
        ext = [rng.randint(0, 40) for _ in range(n)]
        ext[0] = max(ext[0], 1)
        pre = [rng.randint(0, 9000) for _ in range(n)]
        yield chk.batch("extend", extend_lens=ext, prefix_lens=pre)
        yield chk.batch("extend", extend_lens=ext, prefix_lens=pre, padded_rows=sum(ext) + rng.randint(0, 50))
        k = rng.randint(0, n - 1)
        yield chk.batch("extend", extend_lens=ext[:n - k] + [1] * k, prefix_lens=pre, num_merged_decodes=k)
        drafts = [rng.choice([0, 2, 3]) for _ in range(n)]
        yield chk.batch("draft_extend", extend_lens=drafts, seq_lens=[max(s, d) for s, d in zip(seq, drafts)])


def test_derived_calls_carry_the_exact_ranges_of_their_lengths():
    rng = random.Random(5)
    chk = Checker(engine=PRE, gpu="H200", server_args={"speculative_num_draft_tokens": 3, "enable_mixed_chunk": True})
    checked = 0
    for batch in engine_batches(chk, rng):
        for dc in plan_batch(batch).calls:
            c = dc.call
            if not isinstance(c, DecodeCall) or c.topk_length is None:
                continue
            for name in ("topk_length", "extra_topk_length"):
                a = getattr(c, name)
                if a is not None:
                    assert c.length_ranges[name] == (int(a.min()), int(a.max())), (batch.forward_mode, dc.name, name)
                    checked += 1
            fresh = DecodeCall(**{k: v for k, v in c.__dict__.items() if k != "length_ranges"})
            assert "length_ranges" not in fresh.__dict__
            a1, u1 = dc.plan.lengths
            a2, u2 = effective_lengths(fresh, dc.plan.gen)
            assert u1 == u2 and (a1 is None) == (a2 is None) and (a1 is None or a1.tolist() == a2.tolist())
    assert checked > 500


def _sans_subject(findings):
    return [(f.code, f.severity, f.message, f.numbers, f.fix, f.failure) for f in findings]


def random_shape(rng: random.Random) -> dict:
    return dict(kind="sparse", s_q=rng.choice([1, 2, 4]), h_q=rng.choice([32, 64, 96, 128, 1 << 12]),
                h_k=rng.choice([1, 1, 2]), d_qk=rng.choice([512, 576, 600]), d_v=rng.choice([512, 512, 256]),
                topk=rng.choice([100, 128, 2048, 1 << 24]), extra_topk=rng.choice([None, 512, 500]),
                page=rng.choice([64, 64, 1 << 20]), bytes_per_token=rng.choice([None, 584, 656, 600]),
                kv_stride=rng.choice([None, 576 * 64, 1000]), kv_base_align=rng.choice([None, 16, 8]),
                is_fp8=rng.choice([True, True, False]), causal=rng.choice([False, False, True]))


def test_shape_only_rules_ignore_b_and_the_length_values():
    codes = {r.code for r in shape_rules()}
    assert {"FMLA001", "FMLA002", "FMLA003", "FMLA010"}.isdisjoint(codes) and len(codes) >= 8
    rng = random.Random(3)
    gpus = [resolve_gpu(g) for g in ("H200", "B200", {"num_sms": 200, "cc": [10, 0], "smem_optin": 232448})]
    fired = set()
    nrng = np.random.default_rng(3)
    for _ in range(300):
        shape = random_shape(rng)
        has_tl, has_el = rng.random() < 0.7, rng.random() < 0.7 and shape["extra_topk"] is not None
        gpu = rng.choice(gpus)
        variants = []
        for _ in range(3):
            b = rng.choice([1, 5, 300, 11622, 11623, 40000])
            tl = nrng.integers(-5, 3000, b) if has_tl else None
            el = nrng.integers(-5, 3000, b) if has_el else None
            p = plan(DecodeCall(b=b, topk_length=tl, extra_topk_length=el, **shape), gpu)
            variants.append({r.code: _sans_subject(r.func(p) or []) for r in shape_rules()})
        assert variants[0] == variants[1] == variants[2], shape
        fired |= {c for c, f in variants[0].items() if f}
    assert len(fired) >= 7, fired       # the shapes above break most of them


@pytest.mark.parametrize("gpu", ["H200", "B200"])
@pytest.mark.parametrize("model", [{}, {"h_q": 96}, {"h_q": 128}, {"h_q": 32}])
def test_engine_findings_equal_every_rule_on_calls_planned_from_scratch(gpu, model):
    from validate_batch.legality.pipeline import check_engine_batch

    rng = random.Random(len(model) + len(gpu))
    chk = Checker(engine=PRE, gpu=gpu, server_args={"speculative_num_draft_tokens": 2}, model=model)
    for batch in list(engine_batches(chk, rng))[:36]:
        bp = plan_batch(batch)
        for dc in bp.calls:
            if not isinstance(dc.call, DecodeCall):
                continue
            assert dc.plan.quiet_rules, "derived calls skip the shape rules that their shape passes"
            fresh_call = DecodeCall(**{k: v for k, v in dc.call.__dict__.items() if k != "length_ranges"})
            fresh = plan(fresh_call, resolve_gpu(gpu))
            want = [f for r in rules_for("call") for f in (r.func(fresh) or [])]
            got = [f for r in rules_for("call") if r.code not in dc.plan.quiet_rules for f in (r.func(dc.plan) or [])]
            assert _sans_subject(got) == _sans_subject(want), (gpu, model, batch.forward_mode, dc.name)
        report = check_engine_batch(batch, split=False)
        assert report.legal == (not any(f.severity == "error" for f in report.findings))


@pytest.mark.parametrize("value,where", [
    ([5, True, 7], "seq_lens[1]"), ([5, 7.0], "seq_lens[1]"), ([5, "7"], "seq_lens[1]"), ([5, None], "seq_lens[1]"),
    ([5, 0], "seq_lens[1]"), ([5, 1 << 80], "seq_lens[1]"), ([5, -2], "seq_lens[1]"), ([[5], [6]], "seq_lens[0]"),
    ([[3], 4, 5], "seq_lens[0]"), ([5, [6, 7]], "seq_lens[1]"), ([5, {}], "seq_lens[1]"),
])
def test_list_columns_keep_their_input_errors(value, where):
    chk = Checker(engine=PRE, gpu="H200")
    for fn in (chk.check, chk.verdict):
        with pytest.raises(InputError) as e:
            fn("decode", seq_lens=value)
        assert e.value.field == where


def test_list_columns_accept_what_the_element_check_accepts():
    chk = Checker(engine=PRE, gpu="H200", server_args={"max_running_requests": 8})
    base = chk.check("decode", seq_lens=[1, 2, 3], req_pool_indices=[0, 1, 2])
    for seq, slots in (([np.int64(1), 2, 3], [0, 1, 2]), ((1, 2, 3), (0, np.int32(1), 2)),
                       (np.array([1, 2, 3]), [0, 1, 2])):
        rep = chk.check("decode", seq_lens=seq, req_pool_indices=slots)
        assert rep.legal == base.legal and rep.context["query_rows"] == 3
        assert [p.call.topk_length.tolist() for p in rep.plans] == [p.call.topk_length.tolist() for p in base.plans]
    with pytest.raises(InputError) as e:
        chk.check("decode", seq_lens=[1, 2, 3], req_pool_indices=[0, False, 2])
    assert e.value.field == "req_pool_indices[1]"


def test_request_ids_of_mixed_types_and_bad_ones():
    chk = Checker(engine=PRE, gpu="H200")
    assert chk.check("decode", seq_lens=[5, 6], rids=["a", 7]).legal
    for rids, field in ((["a", b"b"], "rids[1]"), (["a", "a"], "rids"), (["a", 1.5], "rids[1]"), (["a"], "rids")):
        with pytest.raises(InputError) as e:
            chk.check("decode", seq_lens=[5, 6], rids=rids)
        assert e.value.field == field


def test_derived_plans_set_every_plan_and_call_field():
    # derived plans and calls are built field by field (no __init__): none may be missing
    import dataclasses

    from validate_batch.flashmla.plan import Plan

    chk = Checker(engine=PRE, gpu="H200")
    for batch in (chk.batch("decode", seq_lens=[5, 900]), chk.batch("decode", seq_lens=[5] * 12000)):
        for dc in plan_batch(batch).calls:
            assert {f.name for f in dataclasses.fields(Plan)} <= set(dc.plan.__dict__)
            assert {f.name for f in dataclasses.fields(DecodeCall)} <= set(dc.call.__dict__)
