"""A vLLM step of requests scheduled before, in their order and all done prefilling, is read without
the general reading's per-request dictionaries, and reads exactly as the general reading does.

``validate_batch.inputs.adapters.vllm_lists`` turns a ``SchedulerOutput`` into the Checker's lists.
Its common step (the cached requests' ``req_ids`` are the first scheduled requests in the order
``num_scheduled_tokens`` lists them, each with output tokens and computed tokens; new requests, if
any, after them) keeps them first and in order, so it takes their ``num_computed_tokens`` as they
are and reads only the new requests one by one. Held here to the
general reading (the same function with that shortcut turned off): the same keyword arguments, or
the same InputError (field and message), and where it reads the step, to vLLM 0.33's rules written
out in the test (which requests are done prefilling, the backend's reorder, decode or extend), on
generated steps that cover the shortcut's every
condition and both sides of each: new requests or none, after the cached ones or before them; ``req_ids`` in the scheduled order,
permuted, longer, shorter or repeated; output counts 0, 1, 7, 0.5, 1.5, ``True`` and ``"7"``;
computed counts 0, 1 and 300; parallel lists of wrong lengths, tuples, numpy arrays or missing;
draft tokens, valid, as many as a request's scheduled tokens and for requests not scheduled; totals that do not add up. The steps are plain
namespaces with vLLM 0.33.0's attribute names (stand-ins: no vLLM install is needed), and, where the
release's wheel is there (``tests/vllm_release.py``), its real ``SchedulerOutput`` and
``CachedRequestData`` too.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import vllm_release

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from validate_batch import Checker, InputError
from validate_batch.inputs import adapters

# model runner V2 (the latest release's only one, 0.33's default) and V1 (0.33 with VLLM_USE_V2_MODEL_RUNNER=0)
GUARDS = {"vllm-dsv4": Checker("vllm-dsv4", "H200", {"num_speculative_tokens": 3}),
          "vllm-flashmla": Checker("vllm-flashmla", "H200", {"num_speculative_tokens": 3, "tp_size": 8}),
          "vllm-dsv4@0.33 V1": Checker("vllm-dsv4@0.33", "H200", {"num_speculative_tokens": 3,
                                                                  "use_v2_model_runner": False}),
          "vllm-flashmla@0.33 V1": Checker("vllm-flashmla@0.33", "H200", {"num_speculative_tokens": 3, "tp_size": 8,
                                                                          "use_v2_model_runner": False})}
OUT = vllm_release.sched_output()


def _read(so, guard, shortcut: bool, monkeypatch):
    with monkeypatch.context() as m:
        if not shortcut:
            m.setattr(adapters, "_vllm_done_lead", lambda out, rids: None)
        try:
            return "ok", adapters.vllm_lists(so, guard)
        except InputError as e:
            return "error", e.field, str(e)


OUTPUTS = st.sampled_from([0, 1, 7, 0.5, 1.5, True, "7"])
COMPUTED = st.sampled_from([0, 1, 300])


@st.composite
def steps(draw):
    n = draw(st.integers(1, 12))
    ids = [f"r{i}" for i in range(n)]
    outs = [draw(OUTPUTS) if draw(st.booleans()) else 7 for _ in ids]
    nums = [draw(COMPUTED) if draw(st.booleans()) else 300 for _ in ids]
    drafts = draw(st.sampled_from([0, 0, 1, 3]))
    tokens = {r: 1 + drafts for r in ids}
    new = []
    for j in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        prompt, comp, t = draw(st.sampled_from([(50, 0, 50), (50, 10, 40), (50, 49, 1)]))
        new.append(SimpleNamespace(req_id=f"n{j}", prompt_token_ids=list(range(prompt)), num_computed_tokens=comp))
        tokens[f"n{j}"] = t
    if new and draw(st.booleans()):        # (new requests scheduled before the cached ones)
        tokens = {**{r.req_id: tokens[r.req_id] for r in new}, **{r: tokens[r] for r in ids}}
    order = draw(st.sampled_from(["same", "same", "permuted", "longer", "shorter", "repeated"]))
    cached_ids = list(ids)
    if order == "permuted" and n > 1:
        cached_ids = draw(st.permutations(ids))
    elif order == "longer":
        cached_ids, outs, nums = cached_ids + ["extra"], outs + [7], nums + [300]
    elif order == "shorter" and n > 1:
        tokens.pop(cached_ids[-1])
    elif order == "repeated" and n > 1:
        cached_ids[-1] = cached_ids[0]
    form = draw(st.sampled_from(["list", "list", "list", "tuple", "array", "short", "missing_outputs"]))
    nums_v, outs_v = list(nums), list(outs)
    if form == "tuple":
        nums_v, outs_v = tuple(nums_v), tuple(outs_v)
    elif form == "array" and all(isinstance(x, int) for x in nums):
        nums_v = np.array(nums, dtype=np.int64)
    elif form == "short":
        outs_v = outs_v[:-1]
    elif form == "missing_outputs":
        outs_v = None
    spec = {r: [0] * drafts for r in tokens if r in ids} if drafts else {}
    if drafts and draw(st.booleans()):
        spec["not-scheduled"] = [0]
    if spec and draw(st.integers(0, 3)) == 0:      # (as many drafts as scheduled tokens: refused)
        victim = draw(st.sampled_from(sorted(r for r in spec if r in tokens)))
        spec[victim] = [0] * tokens[victim]
    total = sum(tokens.values()) + draw(st.sampled_from([0, 0, 0, 1]))
    return dict(ids=cached_ids, nums=nums_v, outs=outs_v, new=new, tokens=tokens, spec=spec, total=total)


def _namespace(s: dict):
    cached = SimpleNamespace(req_ids=list(s["ids"]), num_computed_tokens=s["nums"], num_output_tokens=s["outs"])
    return SimpleNamespace(scheduled_new_reqs=s["new"], scheduled_cached_reqs=cached,
                           num_scheduled_tokens=dict(s["tokens"]), total_num_scheduled_tokens=s["total"],
                           scheduled_spec_decode_tokens=dict(s["spec"]))


def _real(s: dict):
    new = [OUT.NewRequestData(req_id=r.req_id, prompt_token_ids=r.prompt_token_ids, mm_features=[],
                              sampling_params=None, pooling_params=None, block_ids=([],),
                              num_computed_tokens=r.num_computed_tokens, lora_request=None) for r in s["new"]]
    ids = list(s["ids"])
    c = OUT.CachedRequestData(req_ids=ids, resumed_req_ids=set(), new_token_ids=[], all_token_ids={},
                              new_block_ids=[None] * len(ids), num_computed_tokens=s["nums"],
                              num_output_tokens=s["outs"])
    return OUT.SchedulerOutput(scheduled_new_reqs=new, scheduled_cached_reqs=c,
                               num_scheduled_tokens=dict(s["tokens"]), total_num_scheduled_tokens=s["total"],
                               scheduled_spec_decode_tokens=dict(s["spec"]), scheduled_encoder_inputs={},
                               finished_req_ids=set(), free_encoder_mm_hashes=[])


def _expected(s: dict, reorder: bool) -> dict:
    """What a step reads as, from vLLM 0.33's rules written out here: a request is done prefilling
    when it has output tokens (a new one when its computed tokens reach its prompt); a vLLM profile
    under model runner V1 (``reorder``) lists first, in order, the requests with computed tokens that
    are done or have drafts, then the rest in order (under V2 the scheduler's order is kept: the
    profile sorts by query length itself); a step of one token per request on top of computed tokens
    is a decode step."""
    computed, done = {}, {}
    for r in s["new"]:
        computed[r.req_id] = r.num_computed_tokens
        done[r.req_id] = len(r.prompt_token_ids) > 0 and r.num_computed_tokens >= len(r.prompt_token_ids)
    for i, rid in enumerate(s["ids"]):
        computed[rid] = int(s["nums"][i])
        done[rid] = s["outs"] is not None and int(s["outs"][i]) > 0     # (no output counts: none is done)
    rids = list(s["tokens"])
    if reorder:
        lead = [r for r in rids if (done[r] or r in s["spec"]) and computed[r] > 0]
        rids = lead + [r for r in rids if r not in lead]
    toks = [s["tokens"][r] for r in rids]
    prefix = [computed[r] for r in rids]
    if all(t == 1 for t in toks) and all(p > 0 for p in prefix):
        return {"forward_mode": "decode", "rids": rids, "seq_lens": [p + 1 for p in prefix]}
    return {"forward_mode": "extend", "rids": rids, "extend_lens": toks, "prefix_lens": prefix}


@pytest.mark.parametrize("engine", sorted(GUARDS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(s=steps())
def test_the_shortcut_reads_as_the_general_reading(engine, s, monkeypatch):
    guard = GUARDS[engine]
    makers = [_namespace] + ([_real] if OUT is not None else [])
    for make in makers:
        got = _read(make(s), guard, True, monkeypatch)
        assert got == _read(make(s), guard, False, monkeypatch)
        # drafts for a request not scheduled, or as many as its scheduled tokens: refused
        bad_drafts = any(r not in s["tokens"] or len(d) >= s["tokens"][r] for r, d in s["spec"].items())
        if got[0] == "ok":
            assert not bad_drafts and got[1] == _expected(s, guard.vllm_steps and guard.vllm_order == "v1")
        else:
            assert got[0] == "error"


def test_the_common_step_takes_the_shortcut_and_others_do_not(monkeypatch):
    taken = []
    real = adapters._vllm_done_lead

    def spy(out, rids):
        got = real(out, rids)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(adapters, "_vllm_done_lead", spy)
    guard = GUARDS["vllm-dsv4"]
    base = dict(ids=["a", "b", "c"], nums=[300, 301, 302], outs=[7, 1, 2], new=[], tokens={"a": 1, "b": 1, "c": 1},
                spec={}, total=3)
    kw = adapters.vllm_lists(_namespace(base), guard)
    assert kw == {"forward_mode": "decode", "rids": ["a", "b", "c"], "seq_lens": [301, 302, 303]}
    for change in ({"outs": [7, 0, 2]}, {"nums": [300, 0, 302]}, {"ids": ["b", "a", "c"]},
                   {"outs": [7, 0.5, 2]}):
        adapters.vllm_lists(_namespace({**base, **change}), guard)
    # a step with drafts
    adapters.vllm_lists(_namespace({**base, "tokens": {"a": 4, "b": 4, "c": 4}, "total": 12,
                                    "spec": {"a": [0] * 3, "b": [0] * 3, "c": [0] * 3}}), guard)
    adapters.vllm_lists(_namespace({**base, "new": [SimpleNamespace(req_id="n", prompt_token_ids=[1] * 9,
                                                                    num_computed_tokens=0)],
                                    "tokens": {"a": 1, "b": 1, "c": 1, "n": 9}, "total": 12}), guard)
    # a new request scheduled after them (it leaves the lead as it is), and one before them
    adapters.vllm_lists(_namespace({**base, "new": [SimpleNamespace(req_id="n", prompt_token_ids=[1] * 9,
                                                                    num_computed_tokens=0)],
                                    "tokens": {"n": 9, "a": 1, "b": 1, "c": 1}, "total": 12}), guard)
    assert taken == [True, False, False, False, False, True, True, False]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=40), st.sampled_from([1, 2, 4, None]),
       st.booleans(), st.integers(0, 40))
def test_decode_row_lengths_are_each_requests_rows_in_order(computed, d, broadcast, cut):
    """Request i's j-th query row attends to ``computed_i + j + 1`` tokens (first principles, as a
    loop): for one query length (a broadcast column, or equal values) and for mixed ones."""
    from validate_batch.engines.vllm_steps import VllmStep

    n = len(computed)
    c = np.array(computed, dtype=np.int64)
    if d is None:
        q = np.array([1 + (v % 3) for v in computed], dtype=np.int64)
    elif broadcast:
        q = np.broadcast_to(np.int64(d), (n,))
    else:
        q = np.full(n, d, dtype=np.int64)
    nd = min(cut, n)
    step = VllmStep(q, c, nd, 8)
    want = [computed[i] + j + 1 for i in range(nd) for j in range(int(q[i]))]
    got = step.decode_row_lengths()
    assert got.dtype == np.int64 and got.tolist() == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.sampled_from([0, 0, 1, 300])), min_size=1, max_size=30),
       st.sampled_from([1, 4, 128]), st.booleans())
def test_the_split_orders_requests_by_region_keeping_their_order(reqs, threshold, uniform):
    """vLLM's reorder, first principles: requests with computed tokens and at most ``threshold``
    query tokens, then those with computed tokens and more, then those with none, each region in
    the step's order (a Python stable sort here); a step already in that order is kept as it is."""
    from validate_batch.engines.vllm_steps import split_step

    q = np.array([t for t, _ in reqs], dtype=np.int64)
    c = np.array([comp for _, comp in reqs], dtype=np.int64)

    def region(i):
        return 2 if reqs[i][1] == 0 else (1 if reqs[i][0] > threshold else 0)

    order = sorted(range(len(reqs)), key=region)
    step = split_step(q, c, threshold, uniform)
    assert step.query.tolist() == [reqs[i][0] for i in order]
    assert step.computed.tolist() == [reqs[i][1] for i in order]
