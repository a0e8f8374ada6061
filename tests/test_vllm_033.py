"""vLLM 0.33 profiles and the guard on vLLM 0.33's own classes.

Ground truth: the scheduler's shared-memory arithmetic written out here (``4*(5b+1)`` bytes on the
legacy kernels, ``4*(4b+1)`` on the current ones, within the 232448 B an H200 / B200 grants; the
dense fp8 scheduler's static arrays take b <= 4095, measured) and the numbers read from the vLLM
0.33.0 backends (cited at each use). The ``SchedulerOutput`` / ``NewRequestData`` /
``CachedRequestData`` objects are the release's real dataclasses (see ``vllm_release``); the
engine core around ``EngineCore.step`` is a stand-in (the real one starts GPU executors).
"""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import vllm_release

pytest.importorskip("hypothesis")     # the test extra: without it these tests are skipped, not an error

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from validate_batch import LEGAL, BatchIllegalError, Checker, InputError
from validate_batch.api import check

ROOT = Path(__file__).resolve().parents[1]
SMEM = 232448
LEGACY = (SMEM // 4 - 1) // 5          # 4*(5b+1) <= 232448 -> 11622
CURRENT = (SMEM // 4 - 1) // 4         # 4*(4b+1) <= 232448 -> 14527
DENSE_FP8 = 4095                       # static scheduler arrays (measured: 4095 ok, 4096 exits)
# SM90 sparse decode of vLLM 0.33's bundled copy: the current scheduler, 4*(4b+1), in front of the
# legacy kernels (measured: fixtures/measured/vllm033_h200_probes.jsonl, 14527 ran, 14528 raised)
SM90_SPARSE = CURRENT

OUT = vllm_release.sched_output()
needs_vllm = pytest.mark.skipif(OUT is None, reason=vllm_release.source(vllm_release.OUTPUT)[1])


def doc(engine, sa, mode, requests, gpu="H200", model=None):
    # the profiles as vLLM 0.33 has them: a name without a version is the latest release (0.34)
    engine = engine if "@" in engine else f"{engine}@0.33"
    d = {"engine": engine, "gpu": gpu, "server_args": sa, "forward_mode": mode, "requests": requests}
    if model:
        d["model"] = model
    return d


def decodes(n, seq=100):
    return [{"id": f"r{i}", "seq_len": seq} for i in range(n)]


def cached(n, q, computed=100, prefix="r"):
    return [{"id": f"{prefix}{i}", "extend_tokens": q, "prefix_len": computed} for i in range(n)]


def calls(report):
    return report.context["kernel_calls"]


# ------------------------------------------------------------------------------------ vllm-dsv4
# B200 runs the current kernels, which split the KV (and so schedule) only when topk + extra_topk
# > 640: the ratio-128 call's extra width is ceil(context / 128) rounded up to 64, so a 131072-token
# context (1024 + 128 > 640) schedules and 65536 (512 + 128) does not
@pytest.mark.parametrize("gpu, limit, ctx", [("H200", SM90_SPARSE, 65536), ("B200", CURRENT, 131072),
                                             ("B200", None, 65536)])
@pytest.mark.parametrize("k", [0, 3])
def test_dsv4_decode_rows_are_requests_times_one_plus_drafts(gpu, limit, ctx, k):
    per = 1 + k
    edge = (limit or CURRENT) // per         # the most decode requests whose tokens fit
    sa = {"num_speculative_tokens": k, "context_length": ctx} if k else {"context_length": ctx}
    mode = "target_verify" if k else "decode"
    if k:
        sa["speculative_num_draft_tokens"] = per
    for n in (edge - 1, edge, edge + 1):
        legal = limit is None or n * per <= limit   # edge + 1 requests: (edge + 1) x per rows > limit
        r = check(doc("vllm-dsv4", sa, mode, decodes(n), gpu))
        assert r.legal is legal, (n, r.codes)
        assert {c["call"]["b"] for c in calls(r)} == {n * per} and {c["call"]["s_q"] for c in calls(r)} == {1}
        if not legal:
            assert r.codes == ["FMLA001"]


def test_dsv4_prefill_tokens_leave_the_decode_kernel():
    # 3 decodes of 4 tokens (k = 3: decode threshold 4) and a 20000-token first chunk
    reqs = cached(3, 4) + [{"id": "p", "extend_tokens": 20000, "prefix_len": 0}]
    r = check(doc("vllm-dsv4", {"num_speculative_tokens": 3}, "extend", reqs))
    assert r.legal
    dec = [c for c in calls(r) if c["route"] == "decode_kernel"]
    pre = [c for c in calls(r) if c["route"] == "sparse_prefill"]
    assert {c["call"]["b"] for c in dec} == {12} and {c["call"]["s_q"] for c in pre} == {20000}


# ------------------------------------------------------------------------- vllm-flashmla-sparse
FP8 = {"kv_cache_dtype": "fp8_ds_mla"}


def test_sparse_mixed_batch_is_one_call_of_all_tokens():
    # flashmla_sparse.py:74 and :442-446: fp8 cache, fewer than 32 heads per rank (128 / tp 8 = 16)
    sa = {**FP8, "tp_size": 8, "num_speculative_tokens": 3}
    reqs = cached(5000, 4) + [{"id": "p", "extend_tokens": 3000, "prefix_len": 0}]
    r = check(doc("vllm-flashmla-sparse", sa, "extend", reqs))
    (c,) = calls(r)
    assert r.legal and c["call"]["b"] == 1 and c["call"]["s_q"] == 5000 * 4 + 3000 and c["call"]["h_q"] == 64


# the mixed call's q is [1, T, 64, 576] (16 heads padded to the decode kernel's 64, flashmla_sparse.py:718):
# its stride(0) T*64*576 is an int32 kernel parameter
MIXED_LIMIT = (2 ** 31 - 1) // (64 * 576)


@pytest.mark.parametrize("tokens", [MIXED_LIMIT - 1, MIXED_LIMIT, MIXED_LIMIT + 1])
def test_sparse_mixed_batch_tokens_limit(tokens):
    sa = {**FP8, "tp_size": 8}
    reqs = cached(2, 1) + [{"id": "p", "extend_tokens": tokens - 2, "prefix_len": 3000}]
    r = check(doc("vllm-flashmla-sparse", sa, "extend", reqs))
    assert r.legal is (tokens <= MIXED_LIMIT) and calls(r)[0]["call"]["s_q"] == tokens
    guard = Checker("vllm-flashmla-sparse@0.33", "H200", sa)
    assert guard.max_rows == MIXED_LIMIT                    # the fast path's bound is the same edge
    assert bool(guard.verdict("decode", seq_lens=[9] * tokens)) is (tokens <= MIXED_LIMIT)


@pytest.mark.parametrize("heads, tp, mode", [(124, 4, "mixed batch"),                    # 31 per rank
                                             (128, 4, "separate prefill and decode"),   # 32 per rank
                                             (132, 4, "separate prefill and decode")])  # 33 per rank
def test_sparse_mode_at_32_heads(heads, tp, mode):
    r = check(doc("vllm-flashmla-sparse", {**FP8, "tp_size": tp}, "decode", decodes(10),
                  model={"num_attention_heads": heads}))
    assert r.context["routing"]["vllm_mode"] == mode


@pytest.mark.parametrize("n, legal", [(SM90_SPARSE - 1, True), (SM90_SPARSE, True), (SM90_SPARSE + 1, False)])
def test_sparse_separate_decode_b_is_decode_requests(n, legal):
    r = check(doc("vllm-flashmla-sparse", FP8, "decode", decodes(n)))
    assert r.legal is legal and calls(r)[0]["call"]["b"] == n and calls(r)[0]["call"]["s_q"] == 1


@pytest.mark.parametrize("gpu, thr", [("H200", 256), ("B200", 1024)])
@pytest.mark.parametrize("dq", [-1, 0, 1])
def test_sparse_reorder_threshold_128_heads(gpu, thr, dq):
    # flashmla_sparse.py:366-371: 128 heads per rank -> 256 query tokens off SM100, 1024 on SM100
    q = thr + dq
    r = check(doc("vllm-flashmla-sparse", FP8, "extend", cached(4, q, computed=5000), gpu=gpu))
    routes = [(c["route"], c["call"].get("b"), c["call"]["s_q"]) for c in calls(r)]
    assert routes == ([("decode_kernel", 4, q)] if q <= thr else [("sparse_prefill", None, 4 * q)])


def test_sparse_uniform_decodes_only_the_leading_run():
    # flashmla_sparse.py:351 (uniform decodes) + utils.py:884-892: a shorter request ends the run; under
    # model runner V1 (its reorder keeps the order within the decode region) the run is the first 3
    reqs = cached(3, 4) + cached(1, 2, prefix="s") + cached(2, 4, prefix="t")
    r = check(doc("vllm-flashmla-sparse", {**FP8, "num_speculative_tokens": 3, "use_v2_model_runner": False},
                  "extend", reqs))
    dec = [c for c in calls(r) if c["route"] == "decode_kernel"]
    assert dec[0]["call"]["b"] == 3 and dec[0]["call"]["s_q"] == 4
    assert r.context["routing"]["step"]["prefill_tokens"] == 2 + 8


def test_sparse_uniform_decodes_under_model_runner_v2():
    # V2, 0.33's default (config/vllm.py:730-767): the requests of 1 + 3 tokens first (model_runner.py:2507-2519),
    # then the shorter one: the run is all five of 4 tokens, the 2-token request is the prefill
    reqs = cached(3, 4) + cached(1, 2, prefix="s") + cached(2, 4, prefix="t")
    r = check(doc("vllm-flashmla-sparse", {**FP8, "num_speculative_tokens": 3}, "extend", reqs))
    dec = [c for c in calls(r) if c["route"] == "decode_kernel"]
    assert dec[0]["call"]["b"] == 5 and dec[0]["call"]["s_q"] == 4
    assert r.context["routing"]["step"]["prefill_tokens"] == 2


def test_sparse_bf16_cache_has_no_decode_kernel():
    r = check(doc("vllm-flashmla-sparse", {}, "decode", decodes(LEGACY + 1)))
    assert r.legal and [c["route"] for c in calls(r)] == ["sparse_prefill"]


def test_sparse_short_prefills_run_dense_mha():
    # sparse_mla_attention.py:136-143: prefills within index_topk (2048) tokens leave FlashMLA
    for total, routed in ((2048, False), (2049, True)):
        reqs = cached(2, 1) + [{"id": "p", "extend_tokens": total - 48, "prefix_len": 48}]
        r = check(doc("vllm-flashmla-sparse", FP8, "extend", reqs))
        assert any(c["route"] == "sparse_prefill" for c in calls(r)) is routed


# -------------------------------------------------------------------------------- vllm-flashmla
@pytest.mark.parametrize("sa, limit", [({}, LEGACY), ({"kv_cache_dtype": "fp8"}, DENSE_FP8)])
def test_dense_decode_limit_per_kernel(sa, limit):
    for n, legal in ((limit - 1, True), (limit, True), (limit + 1, False)):
        r = check(doc("vllm-flashmla", sa, "decode", decodes(n)))
        assert r.legal is legal, (n, r.codes)


@pytest.mark.parametrize("q, decode", [(127, True), (128, True), (129, False)])
def test_dense_reorders_up_to_128_tokens_into_decode(q, decode):
    # flashmla.py:112: reorder_batch_threshold = 128
    r = check(doc("vllm-flashmla", {}, "extend", cached(8, q)))
    assert [(c["call"]["b"], c["call"]["s_q"]) for c in calls(r)] == ([(8, q)] if decode else [])


def test_dense_threshold_follows_speculative_tokens():
    # backend.py:665-676: max(128, 1 + num_speculative_tokens)
    r = check(doc("vllm-flashmla", {"num_speculative_tokens": 199}, "extend", cached(2, 200)))
    assert [(c["call"]["b"], c["call"]["s_q"]) for c in calls(r)] == [(2, 200)]


# --------------------------------------------------------------- the real SchedulerOutput (0.33)
def scheduler_output(cached_reqs: dict, new_reqs: dict | None = None, drafts: int = 0, outputs: int = 7):
    """A real ``SchedulerOutput``: ``cached_reqs`` {id: num_computed_tokens} each scheduled for
    ``1 + drafts`` tokens with ``drafts`` draft tokens; ``new_reqs`` {id: (prompt, computed, tokens)}."""
    new_reqs = new_reqs or {}
    ids = list(cached_reqs)
    c = OUT.CachedRequestData(req_ids=ids, resumed_req_ids=set(), new_token_ids=[], all_token_ids={},
                              new_block_ids=[None] * len(ids), num_computed_tokens=list(cached_reqs.values()),
                              num_output_tokens=[outputs] * len(ids))
    new = [OUT.NewRequestData(req_id=r, prompt_token_ids=list(range(p)), mm_features=[], sampling_params=None,
                              pooling_params=None, block_ids=([],), num_computed_tokens=comp, lora_request=None)
           for r, (p, comp, _) in new_reqs.items()]
    tokens = {**{r: 1 + drafts for r in ids}, **{r: t for r, (_, _, t) in new_reqs.items()}}
    spec = {r: list(range(drafts)) for r in ids} if drafts else {}
    return OUT.SchedulerOutput(scheduled_new_reqs=new, scheduled_cached_reqs=c, num_scheduled_tokens=tokens,
                               total_num_scheduled_tokens=sum(tokens.values()), scheduled_spec_decode_tokens=spec,
                               scheduled_encoder_inputs={}, finished_req_ids=set(), free_encoder_mm_hashes=[])


@needs_vllm
@pytest.mark.parametrize("engine, sa, per", [
    ("vllm-dsv4", {"num_speculative_tokens": 3}, 4),                 # b = requests x (1 + drafts)
    # b = requests, s_q = 4; 16 heads per rank keep the o_accum offset (row x 4 x 16 x 512) in range
    ("vllm-flashmla", {"num_speculative_tokens": 3, "tp_size": 8}, 1),
])
def test_real_spec_step_is_judged_as_the_backend_runs_it(engine, sa, per):
    guard = Checker(f"{engine}@0.33", "H200", sa)
    edge = (SM90_SPARSE if engine == "vllm-dsv4" else LEGACY) // per
    for n, legal in ((edge - 1, True), (edge, True), (edge + 1, False)):
        so = scheduler_output({f"r{i}": 500 for i in range(n)}, drafts=3)
        v = guard.verdict(so)
        assert bool(v) is legal, n
        r = guard.check(so)
        dec = {(c["call"]["b"], c["call"]["s_q"]) for c in calls(r) if c["route"] == "decode_kernel"}
        assert dec == ({(n * 4, 1)} if per == 4 else {(n, 4)})
        if not legal:
            assert "FMLA001" in v.report.codes


@needs_vllm
def test_real_spec_step_on_the_separate_sparse_path_breaks_the_offset_rule():
    # b = 11622 decode requests of s_q = 4 at 128 heads: within the scheduler's rows, but a split
    # request's o_accum row times 4*128*512 passes 2^31 on the legacy kernels (FMLA002)
    guard = Checker("vllm-flashmla-sparse@0.33", "H200", {**FP8, "num_speculative_tokens": 3})
    so = scheduler_output({f"r{i}": 500 for i in range(LEGACY)}, drafts=3)
    assert guard.verdict(so).report.codes == ["FMLA002"]
    assert guard.verdict(scheduler_output({f"r{i}": 500 for i in range(100)}, drafts=3)) is LEGAL


@needs_vllm
def test_real_mixed_step_orders_and_splits_like_the_backend():
    # a new request mid-prompt (computed 64 < prompt 400) scheduled for 4 tokens sits after the
    # decodes (reorder regions, utils.py:965-983) and is a short extend: with uniform decodes of 4
    # it joins them only because its length equals theirs
    so = scheduler_output({"a": 900, "b": 900}, {"n": (400, 64, 4), "p": (3000, 0, 3000)}, drafts=3)
    r = Checker("vllm-flashmla@0.33", "H200", {"num_speculative_tokens": 3}).check(so)
    assert [(c["call"]["b"], c["call"]["s_q"]) for c in calls(r)] == [(3, 4)]
    assert r.context["routing"]["step"]["prefill_tokens"] == 3000


@needs_vllm
def test_real_plain_decode_takes_the_fast_path():
    guard = Checker("vllm-flashmla@0.33", "H200")
    assert guard.verdict(scheduler_output({f"r{i}": 10 for i in range(LEGACY)})) is LEGAL
    assert guard.verdict(scheduler_output({f"r{i}": 10 for i in range(LEGACY + 1)})).report.codes == ["FMLA001"]


# ----------------------------------------------------------- the README's EngineCore.step hook
snippets = vllm_release.readme_hook_snippets


StandInCore = vllm_release.StandInCore


@needs_vllm
def test_readme_hook_refuses_the_step_before_execute_model():
    code = snippets()
    big = scheduler_output({f"r{i}": 500 for i in range(SM90_SPARSE // 4 + 1)}, drafts=3)
    ok = scheduler_output({f"r{i}": 500 for i in range(10)}, drafts=3)
    core = StandInCore([ok, big])
    log = logging.getLogger("engine-under-test")
    scope = {"engine_core": core, "logger": log, "max_num_seqs": 4096}
    exec(code["vllm-init"], scope)
    exec(code["vllm-hook"], scope)
    outputs, executed = core.step()                              # the release's EngineCore.step
    assert executed and core.executed == [ok] and core.schedule_args == [(False,)]
    with pytest.raises(BatchIllegalError) as ei:
        core.step()
    assert core.executed == [ok] and "FMLA001" in ei.value.report.codes   # never reached execute_model
    exec(code["vllm-prevent"], scope)
    assert scope["max_num_seqs"] == SM90_SPARSE // 4


@needs_vllm
def test_readme_hook_passes_the_throttle_decision_through():
    code = snippets()
    core = StandInCore([scheduler_output({"a": 5})], throttle=True)
    scope = {"engine_core": core, "logger": logging.getLogger("x"), "max_num_seqs": 8}
    exec(code["vllm-init"], scope)
    exec(code["vllm-hook"], scope)
    core.step()
    assert core.schedule_args == [(True,)]


# ------------------------------------------------------------- the fast path agrees with the full one
VLLM_CONFIGS = {
    "sparse-separate": ("vllm-flashmla-sparse", {**FP8, "num_speculative_tokens": 3}),
    "sparse-mixed": ("vllm-flashmla-sparse", {**FP8, "tp_size": 8}),
    "dsv4": ("vllm-dsv4", {"num_speculative_tokens": 3}),
    "dense": ("vllm-flashmla", {"num_speculative_tokens": 3}),
    "dense-fp8": ("vllm-flashmla", {"kv_cache_dtype": "fp8"}),
}
# both releases (0.34: model runner V2 only, ShardQ on the mixed batch under tensor parallelism)
VLLM_CHECKERS = {(k, v): Checker(f"{e}@{v}", "H200", sa) for k, (e, sa) in VLLM_CONFIGS.items() for v in ("0.33", "0.34")}

sizes = st.sampled_from([1, 2, 4, 4, 4, 100, 128, 129, 256, 257, 3000])
groups = st.lists(st.tuples(st.integers(1, 4000), sizes, st.sampled_from([0, 50, 5000])), min_size=1, max_size=3)


@pytest.mark.parametrize("cfg", sorted(VLLM_CHECKERS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=groups)
def test_vllm_verdict_agrees_with_the_full_check(cfg, groups):
    # groups of (count, query tokens, computed tokens): the fast verdict on lists must be the full answer
    ext = [q for n, q, _ in groups for _ in range(n)]
    pre = [c for n, _, c in groups for _ in range(n)]
    assume(sum(ext) <= 60000)
    guard = VLLM_CHECKERS[cfg]
    fast = bool(guard.verdict("extend", extend_lens=ext, prefix_lens=pre))
    assert fast == guard.full_legal("extend", extend_lens=ext, prefix_lens=pre)


REAL_CONFIGS = {"sparse-separate": ("vllm-flashmla-sparse", "H200", {**FP8, "num_speculative_tokens": 3}),
                "sparse-mixed": ("vllm-flashmla-sparse", "H200", {**FP8, "tp_size": 8, "num_speculative_tokens": 3}),
                "dense-b200-fp8": ("vllm-flashmla", "B200", {"kv_cache_dtype": "fp8", "num_speculative_tokens": 3}),
                "dsv4": ("vllm-dsv4", "H200", {"num_speculative_tokens": 3})}
REAL_CHECKERS: dict = {}


@needs_vllm
@pytest.mark.parametrize("cfg", sorted(REAL_CONFIGS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 16000), drafts=st.sampled_from([0, 1, 3]),
       new=st.lists(st.tuples(st.integers(1, 9000), st.sampled_from([0, 10, 500])), max_size=3))
def test_real_scheduler_output_verdict_agrees_with_the_full_check(cfg, n, drafts, new):
    engine, gpu, sa = REAL_CONFIGS[cfg]
    guard = REAL_CHECKERS.get(cfg) or REAL_CHECKERS.setdefault(cfg, Checker(f"{engine}@0.33", gpu, sa))
    so = scheduler_output({f"r{k}": 300 for k in range(n)},
                          {f"n{j}": (t + c + 10, c, t) for j, (t, c) in enumerate(new)}, drafts=drafts)
    assume(so.total_num_scheduled_tokens <= 70000)
    assert bool(guard.verdict(so)) == guard.check(so).legal


def test_mixed_batch_split_and_prevention_are_in_tokens():
    # one 60000-token prefill on the mixed path: chunks within MIXED_LIMIT tokens, and the token cap
    r = check(doc("vllm-flashmla-sparse", {**FP8, "tp_size": 8}, "extend",
                  [{"id": "p", "extend_tokens": 60000, "prefix_len": 0}]), split=True)
    assert [f.code for f in r.errors] == ["FMLA009"]
    split = r.safe_split.to_dict()
    assert [[c["tokens"] for c in step] for step in split["chunked_steps"]] == [[MIXED_LIMIT], [60000 - MIXED_LIMIT]]
    assert [(s["flag"], s["value"]) for s in split["settings"]] == [("--max-num-batched-tokens", MIXED_LIMIT)]


def test_dsv4_prevention_counts_draft_tokens():
    sa = {"num_speculative_tokens": 3, "speculative_num_draft_tokens": 4}
    r = check(doc("vllm-dsv4", sa, "target_verify", decodes(SM90_SPARSE // 4 + 1)), split=True)
    assert [(s["flag"], s["value"]) for s in r.safe_split.to_dict()["settings"]] == [("--max-num-seqs", SM90_SPARSE // 4)]


@pytest.mark.parametrize("engine, dtype", [("vllm-flashmla-sparse", "fp8_e5m2"),   # flashmla_sparse.py:149-155
                                           ("vllm-flashmla", "fp8_ds_mla"),        # flashmla.py:48-54
                                           ("vllm-dsv4", "bfloat16")])             # deepseek_v4/attention.py:111-117
def test_cache_dtypes_the_backend_refuses_are_input_errors(engine, dtype):
    with pytest.raises(InputError) as ei:
        check(doc(engine, {"kv_cache_dtype": dtype}, "decode", decodes(2)))
    assert ei.value.field == "server_args.kv_cache_dtype" and dtype in str(ei.value)


def test_backend_architectures():
    # flashmla.py:73-74 and flashmla_sparse.py:203-204: compute capability 9.x or 10.x
    with pytest.raises(InputError) as ei:
        check(doc("vllm-flashmla", {}, "decode", decodes(2), gpu={"num_sms": 84, "cc": [8, 0], "smem_optin": 166912}))
    assert ei.value.field == "gpu"


def test_vllm_steps_take_no_draft_extend():
    with pytest.raises(InputError) as ei:
        check(doc("vllm-dsv4", {"speculative_num_draft_tokens": 4}, "draft_extend", decodes(2)))
    assert ei.value.field == "forward_mode"


def test_nvfp4_cache_is_blackwell_only():
    # flashmla_sparse.py:250-254: nvfp4_ds_mla needs compute capability 10.x
    with pytest.raises(InputError) as ei:
        check(doc("vllm-flashmla-sparse", {"kv_cache_dtype": "nvfp4_ds_mla"}, "decode", decodes(2), gpu="H200"))
    assert ei.value.field == "server_args.kv_cache_dtype"
    r = check(doc("vllm-flashmla-sparse", {"kv_cache_dtype": "nvfp4_ds_mla"}, "decode", decodes(2), gpu="B200"))
    assert r.context["routing"]["vllm_mode"] == "separate prefill and decode"
