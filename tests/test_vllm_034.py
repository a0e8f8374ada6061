"""vLLM 0.34 profiles: model runner V2's request order, ShardQ, SM90 small-head sparse prefill, a draft
model's extra query slot, and the facts' lines in the 0.34.0 wheel.

Ground truth:

* the request order: ``sort_batch_req_ids`` compiled from each release's own
  ``vllm/v1/worker/gpu/model_runner.py`` (0.33.0 and 0.34.0 wheels, ``tests/vllm_release.py``), called on
  generated steps; the split of the ordered requests is ``split_decodes_and_prefills``' rule written
  out here (``vllm/v1/attention/backends/utils.py:922-990`` in 0.34.0);
* ShardQ: the zigzag share of each rank written out here from ``v1/attention/ops/shardq.py:67-88`` (each
  request in ``2 * ranks`` chunks, chunk ``i`` of ``[floor(i*L/2r), floor((i+1)*L/2r))``, rank ``j``
  taking chunks ``j`` and ``2r-1-j``), the 32-bit query stride ``s_q * h_q * d_qk < 2^31`` and the
  kernel's padded heads (64 or 128);
* the small-head cut-off: the GPU's SMs (132 on an H200), twice that for 32 heads
  (``flashmla_sparse.py:1412-1424``);
* the cited lines: read from the 0.34.0 wheel where it is given (``VALIDATE_BATCH_VLLM_WHEEL``, this
  release's wheel beside it); skipped without it.
"""
from __future__ import annotations

import ast
import random
import re
import zipfile

import numpy as np
import pytest
import vllm_release

from validate_batch import Checker, InputError
from validate_batch.api import check
from validate_batch.engines.vllm_steps import split_step
from validate_batch.facts.knowledge import load

FP8 = {"kv_cache_dtype": "fp8_ds_mla"}
RUNNER = "vllm/v1/worker/gpu/model_runner.py"


def doc(engine, sa, mode, requests, gpu="H200", model=None):
    d = {"engine": engine, "gpu": gpu, "server_args": sa, "forward_mode": mode, "requests": requests}
    if model:
        d["model"] = model
    return d


def cached(n, q, computed=100, prefix="r"):
    return [{"id": f"{prefix}{i}", "extend_tokens": q, "prefix_len": computed} for i in range(n)]


def calls(report):
    return report.context["kernel_calls"]


def wheel(version: str) -> zipfile.ZipFile:
    path, why = vllm_release.wheel_path(version)
    if path is None:
        pytest.skip(why)
    return zipfile.ZipFile(path)


def release_sort(version: str):
    """``sort_batch_req_ids`` of the release, compiled from its own source (the one function)."""
    text = wheel(version).read(RUNNER).decode()
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "sort_batch_req_ids")
    scope: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), f"{RUNNER}:{fn.lineno}", "exec"), scope)
    return scope["sort_batch_req_ids"]


def split_rule(q: list[int], threshold: int, uniform: bool) -> int:
    """``split_decodes_and_prefills``' decode count for requests already in the runner's order."""
    if max(q) <= threshold and (not uniform or threshold <= 1):
        return len(q)
    if q[0] > threshold:
        return 0
    if uniform:
        if all(x == q[0] or x == 0 for x in q):
            return len(q)
        prefill = [x != q[0] and x != 0 for x in q]
    else:
        prefill = [x > threshold for x in q]
    return prefill.index(True) if any(prefill) else len(q)


# ------------------------------------------------------------------------------------ the request order
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_the_v2_order_is_the_releases_sort(version):
    sort = release_sort(version)
    rng = random.Random(20261204)
    for _ in range(600):
        k = rng.choice([0, 0, 1, 3])
        n = rng.randint(1, 24)
        q = [rng.choice([1, 1 + k, 2, 4, 100, 129, 3000]) if rng.random() < 0.8 else rng.randint(1, 600)
             for _ in range(n)]
        computed = [rng.choice([0, 64, 900]) for _ in range(n)]
        ids = [f"r{i}" for i in range(n)]
        # a drafter that proposes every draft (MTP, EAGLE, a draft model): the requests of 1 + k tokens carry k
        drafts = {r: [0] * k for r, x in zip(ids, q) if k and x == 1 + k}
        order = sort(dict(zip(ids, q)), drafts, 1 + k)
        want_q = [q[ids.index(r)] for r in order]
        want_c = [computed[ids.index(r)] for r in order]
        threshold, uniform = rng.choice([(1 + k, False), (128, True), (256, True), (max(128, 1 + k), False)])
        step = split_step(np.array(q, dtype=np.int64), np.array(computed, dtype=np.int64), threshold, uniform,
                          "v2", 1 + k)
        assert step.query.tolist() == want_q and step.computed.tolist() == want_c, (q, k)
        assert step.num_decodes == split_rule(want_q, threshold, uniform), (q, k, threshold, uniform)


def test_model_runner_v1_is_gone_from_0_34():
    with pytest.raises(InputError) as e:
        check(doc("vllm-flashmla@0.34", {"use_v2_model_runner": False}, "extend", cached(2, 4)))
    assert e.value.field == "server_args.use_v2_model_runner" and "no model runner V1" in str(e.value)
    with pytest.raises(InputError, match="use_v2_model_runner: expected bool"):
        check(doc("vllm-flashmla@0.33", {"use_v2_model_runner": "no"}, "extend", cached(2, 4)))


def test_mixed_step_orders_differ_between_the_runners():
    # two short extends of 100 tokens and a new 30-token first chunk: V1 leads with the extends (they have
    # computed tokens), V2 with the shortest query; dense FlashMLA takes the leading run of one length
    reqs = cached(2, 100, computed=500) + [{"id": "p", "extend_tokens": 30, "prefix_len": 0}]
    got = {}
    for engine, sa in (("vllm-flashmla@0.33", {"use_v2_model_runner": False}), ("vllm-flashmla@0.33", {}),
                       ("vllm-flashmla@0.34", {})):
        (c,) = calls(check(doc(engine, sa, "extend", reqs)))
        got[(engine, bool(sa))] = (c["call"]["b"], c["call"]["s_q"])
    assert got == {("vllm-flashmla@0.33", True): (2, 100), ("vllm-flashmla@0.33", False): (1, 30),
                   ("vllm-flashmla@0.34", False): (1, 30)}


def test_a_draft_model_keeps_one_more_query_slot_from_0_34():
    # backend.py:565-584 (0.34): 1 + k + 1 for a standalone draft model; 0.33: 1 + k
    k = 3
    reqs = cached(4, 1 + k) + cached(1, 2 + k, prefix="s")
    sa = {"num_speculative_tokens": k, "speculative_method": "draft_model"}
    new = check(doc("vllm-dsv4@0.34", sa, "extend", reqs))
    old = check(doc("vllm-dsv4@0.33", sa, "extend", reqs))
    assert new.context["routing"]["step"]["num_decodes"] == 5
    assert old.context["routing"]["step"]["num_decodes"] == 4
    mtp = check(doc("vllm-dsv4@0.34", {"num_speculative_tokens": k, "speculative_method": "mtp"}, "extend", reqs))
    assert mtp.context["routing"]["step"]["num_decodes"] == 4


# ------------------------------------------------------------------------------------ ShardQ
def zigzag(lengths: list[int], ranks: int) -> list[int]:
    n = 2 * ranks
    out = [0] * ranks
    for L in lengths:
        for j in range(ranks):
            for chunk in (j, n - 1 - j):
                out[j] += (chunk + 1) * L // n - chunk * L // n
    return out


DSV32 = {"num_attention_heads": 128}        # index_topk 2048, d_qk 576: the profile's defaults (DeepSeek V3.2)


def test_shard_q_splits_a_mixed_step_by_token():
    # tp 8: 16 heads per rank, fp8 cache: the mixed-batch path; 100 decodes and an 8000-token first chunk
    sa = {**FP8, "tp_size": 8}
    reqs = cached(100, 1, computed=900) + [{"id": "p", "extend_tokens": 8000, "prefix_len": 0}]
    r = check(doc("vllm-flashmla-sparse@0.34", sa, "extend", reqs, model=DSV32))
    got = [(c["call"]["b"], c["call"]["s_q"], c["call"]["h_q"]) for c in calls(r)]
    share = zigzag([8000], 8)
    assert share == [1000] * 8
    assert got == [(1, 100, 64), (1, max(share), 128)]           # the decode tokens; a rank's tokens, all 128 heads
    assert r.context["routing"]["shard_q"]["tokens_per_rank"] == share
    assert r.context["routing"]["vllm_mode"] == "mixed batch, ShardQ over 8 ranks"
    # the same step on 0.33: one call of every token at the rank's heads
    (c,) = calls(check(doc("vllm-flashmla-sparse@0.33", sa, "extend", reqs, model=DSV32)))
    assert (c["call"]["b"], c["call"]["s_q"], c["call"]["h_q"]) == (1, 8100, 64)


@pytest.mark.parametrize("lengths", [[3001, 1999], [4096, 17, 5000], [1030]])
def test_shard_q_takes_the_rank_with_the_most_tokens(lengths):
    sa = {**FP8, "tp_size": 8}                                   # 16 heads per rank: the mixed-batch path
    reqs = [{"id": f"p{i}", "extend_tokens": L, "prefix_len": 0 if L > 2048 else 3000} for i, L in enumerate(lengths)]
    r = check(doc("vllm-flashmla-sparse@0.34", sa, "extend", reqs, model=DSV32))
    share = zigzag(sorted(lengths), 8)                            # V2 runs them by ascending length
    assert [c["call"]["s_q"] for c in calls(r)] == [max(share)] and r.context["routing"]["shard_q"]["ranks"] == 8


def test_shard_q_query_stride_limit():
    # the rank's call has s_q x 128 heads x 576 elements per request: 32-bit up to (2^31 - 1) // (128 * 576) rows
    limit = (2 ** 31 - 1) // (128 * 576)
    sa = {**FP8, "tp_size": 8}
    for rows in (limit - 1, limit, limit + 1):
        # one request whose largest rank share is `rows` tokens
        L = next(n for n in range(8 * rows - 16, 8 * rows + 16) if max(zigzag([n], 8)) == rows)
        d = doc("vllm-flashmla-sparse@0.34", sa, "extend", [{"id": "a", "extend_tokens": L, "prefix_len": 0}],
                model=DSV32)
        d["as_written"] = True
        r = check(d)
        (shard,) = [c for c in calls(r) if "ShardQ" in c["name"]]
        assert shard["call"]["s_q"] == rows and shard["call"]["h_q"] == 128
        assert ("FMLA009" in r.codes) is (rows > limit), (rows, r.codes)


def test_the_verdict_agrees_with_the_full_check_at_shard_q_edges():
    # the fast verdict reads the step's tokens against the configuration's bounds; at and around the ShardQ
    # call's stride limit, and around the mixed call's, it gives the full check's answer
    limit = (2 ** 31 - 1) // (128 * 576)
    mixed = (2 ** 31 - 1) // (64 * 576)
    guard = Checker("vllm-flashmla-sparse@0.34", "H200", {**FP8, "tp_size": 8})
    lens = [next(n for n in range(8 * r - 16, 8 * r + 16) if max(zigzag([n], 8)) == r) for r in (limit - 1, limit, limit + 1)]
    for L in lens + [mixed - 1, mixed, mixed + 1, 1023, 1024]:
        for ext, pre in (([L], [0]), ([1] * 50 + [L], [900] * 50 + [0])):
            assert bool(guard.verdict("extend", extend_lens=ext, prefix_lens=pre)) == \
                guard.full_legal("extend", extend_lens=ext, prefix_lens=pre), L


@pytest.mark.parametrize("sa, heads, why", [({"tp_size": 1}, 16, "one rank (16 heads: the mixed-batch path)"),
                                            ({"sparse_mla_shard_q": False}, 128, "switched off"),
                                            ({"cudagraph_mode": "FULL"}, 128, "mixed steps captured whole"),
                                            ({"decode_context_parallel_size": 2}, 128, "context parallelism")])
def test_shard_q_off(sa, heads, why):
    reqs = cached(10, 1, computed=900) + [{"id": "p", "extend_tokens": 8000, "prefix_len": 0}]
    r = check(doc("vllm-flashmla-sparse@0.34", {**FP8, "tp_size": 8, **sa}, "extend", reqs,
                  model={"num_attention_heads": heads}))
    (c,) = calls(r)
    assert (c["call"]["b"], c["call"]["s_q"]) == (1, 8010) and "shard_q" not in r.context["routing"], why


def test_shard_q_needs_enough_tokens_and_a_long_request():
    sa = {**FP8, "tp_size": 8}
    base = cached(10, 1, computed=900)
    for extra, sharded in (([{"id": "p", "extend_tokens": 1023, "prefix_len": 3000}], False),   # < 1024 tokens
                           ([{"id": "p", "extend_tokens": 1024, "prefix_len": 3000}], True),
                           (cached(2, 600, computed=500, prefix="s"), False)):                # 1200 tokens, <= topk
        r = check(doc("vllm-flashmla-sparse@0.34", sa, "extend", base + extra, model=DSV32))
        assert ("shard_q" in r.context["routing"]) is sharded, extra


# ------------------------------------------------------------------------------------ SM90 small heads
@pytest.mark.parametrize("tp, heads, cut", [(16, 8, 132), (8, 16, 132), (4, 32, 264)])
def test_bf16_sparse_prefill_runs_small_heads_unpadded_on_sm90(tp, heads, cut):
    for tokens, want in ((cut, 64), (cut + 1, heads)):
        reqs = [{"id": "p", "extend_tokens": tokens, "prefix_len": 3000}]
        r = check(doc("vllm-flashmla-sparse@0.34", {"kv_cache_dtype": "bfloat16", "tp_size": tp}, "extend", reqs,
                      model=DSV32))
        (c,) = calls(r)
        assert c["call"]["h_q"] == want, (tokens, c["call"])
        (old,) = calls(check(doc("vllm-flashmla-sparse@0.33", {"kv_cache_dtype": "bfloat16", "tp_size": tp}, "extend",
                                 reqs, model=DSV32)))
        assert old["call"]["h_q"] == 64
    # SM100: padded to 64 at any count
    reqs = [{"id": "p", "extend_tokens": 5000, "prefix_len": 3000}]
    (c,) = calls(check(doc("vllm-flashmla-sparse@0.34", {"kv_cache_dtype": "bfloat16", "tp_size": tp}, "extend", reqs,
                           gpu="B200", model=DSV32)))
    assert c["call"]["h_q"] == 64


# ------------------------------------------------------------------------------------ the facts, in the wheel
def _line(zf: zipfile.ZipFile, path: str, line: int) -> str:
    return zf.read(path).decode().splitlines()[line - 1]


def test_the_cited_lines_are_the_0_34_wheels():
    zf = wheel("0.34.0")
    assert "def sort_batch_req_ids(" in _line(zf, RUNNER, 2579)
    assert "sort_batch_req_ids(" in _line(zf, RUNNER, 1395)
    assert "self.decode_query_len = (" in _line(zf, RUNNER, 451)
    assert "VLLM_USE_V2_MODEL_RUNNER" in _line(zf, "vllm/platforms/interface.py", 1481)
    sparse = "vllm/v1/attention/backends/mla/flashmla_sparse.py"
    assert _line(zf, sparse, 75).strip() == "MIN_HEADS_FOR_BF16_PREFILL = 32"
    assert "def _should_use_bf16_small_head_kernel(" in _line(zf, sparse, 1412)
    assert "min_tokens_per_sm = 2 if actual_num_heads == 32 else 1" in _line(zf, sparse, 1423)
    assert "q = q[:, :actual_num_heads]" in _line(zf, sparse, 1449)
    assert "self.use_shardq = (" in _line(zf, sparse, 788)
    assert _line(zf, "vllm/config/attention.py", 150).strip() == "sparse_mla_shard_q: bool = True"
    assert "default=1024" in _line(zf, "vllm/config/attention.py", 160)
    assert "def build_shardq_split(" in _line(zf, "vllm/v1/attention/ops/shardq.py", 108)
    assert "def zigzag_split(" in _line(zf, "vllm/v1/attention/ops/shardq.py", 67)
    assert "def split_decodes_and_prefills(" in _line(zf, "vllm/v1/attention/backends/utils.py", 922)
    assert "def max_decode_query_len(" in _line(zf, "vllm/v1/attention/backend.py", 565)
    assert "return 1" in _line(zf, "vllm/v1/worker/gpu/spec_decode/standalone_ar/config.py", 26)
    assert "combined_topk = round_up(top_k + self.window_size" in _line(zf, "vllm/models/deepseek_v4/nvidia/flashmla.py", 312)
    assert "flash_mla_sparse_fwd(" in _line(zf, "vllm/models/deepseek_v4/nvidia/flashmla.py", 386)
    assert not any(n.endswith("v1/worker/gpu_model_runner.py") for n in zf.namelist())


def test_engine_argument_names_are_the_0_34_wheels():
    text = wheel("0.34.0").read("vllm/engine/arg_utils.py").decode()
    names = set()
    for c in ast.walk(ast.parse(text)):
        if isinstance(c, ast.ClassDef) and c.name in ("EngineArgs", "AsyncEngineArgs"):
            names |= {n.target.id for n in c.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                      and not n.target.id.startswith("_")}
    assert names and names == set(load("engine_args")["engines"]["vllm@0.34.0"]["names"])


def test_each_vllm_version_names_its_own_release_as_its_facts_source():
    # a verdict's engine facts say which release they were read from (the version's provenance, not the
    # profile's)
    from validate_batch.legality.standing import rule_standing
    from validate_batch.legality.ruleset import get_rule
    standing = rule_standing(get_rule("SGL001"))
    for name in ("vllm-flashmla", "vllm-dsv4", "vllm-flashmla-sparse"):
        for version, release in (("0.33", "0.33.0"), ("0.34", "0.34.0")):
            (st,) = standing[f"{name}@{version}"]
            assert st.entry["package"] == f"vllm {release}", (name, version, st.line)


def test_latest_is_0_34_on_its_own_build():
    for name in ("vllm-flashmla", "vllm-dsv4", "vllm-flashmla-sparse"):
        versions = load("engines")["profiles"][name]["versions"]
        latest = next(v for v in versions if "latest" in v.get("aliases", ()))
        assert latest["name"] == "0.34" and latest["kernel_build"] == "vllm-0.34"
        assert re.search(r"847ef308bb7a6828c8117301f5a5a84a095a90e8", latest["kernel_build_source"])
    g = Checker("vllm-dsv4", "H200")
    assert g.kernel_build == "vllm-0.34"


# ------------------------------------------------------------------------------------ vLLM 0.34's own classes
# SchedulerOutput, NewRequestData and CachedRequestData are 0.34.0's dataclasses (tests/vllm_release.py); the
# engine core around EngineCore.step is a stand-in (the real one starts GPU executors)
OUT34 = vllm_release.sched_output("0.34.0")
needs_034 = pytest.mark.skipif(OUT34 is None, reason=vllm_release.source(vllm_release.OUTPUT, "0.34.0")[1])
CURRENT = (232448 // 4 - 1) // 4          # 4*(4b+1) <= 232448 B: the SM90 sparse scheduler's 14527 rows


def _fields(cls) -> set:
    import dataclasses
    return {f.name for f in dataclasses.fields(cls)}


def scheduler_output34(cached_reqs: dict, new_reqs: dict | None = None, drafts: int = 0, outputs: int = 7):
    """A real 0.34.0 ``SchedulerOutput``: ``cached_reqs`` {id: num_computed_tokens} each scheduled for
    ``1 + drafts`` tokens with ``drafts`` draft tokens; ``new_reqs`` {id: (prompt, computed, tokens)}."""
    new_reqs = new_reqs or {}
    ids = list(cached_reqs)
    c = OUT34.CachedRequestData(req_ids=ids, new_token_ids=[], new_block_ids=[None] * len(ids),
                                num_computed_tokens=list(cached_reqs.values()), num_output_tokens=[outputs] * len(ids))
    new = [OUT34.NewRequestData(req_id=r, prompt_token_ids=list(range(p)), prefill_token_ids=list(range(p)),
                                mm_features=[], sampling_params=None, pooling_params=None, block_ids=([],),
                                num_computed_tokens=comp, lora_request=None)
           for r, (p, comp, _) in new_reqs.items()]
    tokens = {**{r: 1 + drafts for r in ids}, **{r: t for r, (_, _, t) in new_reqs.items()}}
    spec = {r: list(range(drafts)) for r in ids} if drafts else {}
    return OUT34.SchedulerOutput(scheduled_new_reqs=new, scheduled_cached_reqs=c, num_scheduled_tokens=tokens,
                                 total_num_scheduled_tokens=sum(tokens.values()), scheduled_spec_decode_tokens=spec,
                                 scheduled_encoder_inputs={}, finished_req_ids=set(), free_encoder_mm_hashes=[])


@needs_034
def test_0_34_request_classes_are_what_the_adapter_reads():
    # the fields the adapter reads are there; 0.33's resumed_req_ids / all_token_ids are gone
    assert {"req_ids", "num_computed_tokens", "num_output_tokens"} <= _fields(OUT34.CachedRequestData)
    assert not {"resumed_req_ids", "all_token_ids"} & _fields(OUT34.CachedRequestData)
    assert {"req_id", "num_computed_tokens", "prompt_token_ids", "prefill_token_ids"} <= _fields(OUT34.NewRequestData)
    assert {"num_scheduled_tokens", "scheduled_spec_decode_tokens", "scheduled_new_reqs",
            "scheduled_cached_reqs"} <= _fields(OUT34.SchedulerOutput)


@needs_034
@pytest.mark.parametrize("engine, per", [("vllm-dsv4", 4), ("vllm-flashmla-sparse", 1)])
def test_real_0_34_spec_step_at_the_schedulers_row_limit(engine, per):
    sa = {"num_speculative_tokens": 3, **({} if engine == "vllm-dsv4" else FP8)}
    guard = Checker(engine, "H200", sa)                          # latest: 0.34, build vllm-0.34
    edge = CURRENT // per
    for n, legal in ((edge - 1, True), (edge, True), (edge + 1, False)):
        so = scheduler_output34({f"r{i}": 500 for i in range(n)}, drafts=3)
        v = guard.verdict(so)
        assert bool(v) is legal, n
        dec = {(c["call"]["b"], c["call"]["s_q"]) for c in calls(guard.check(so)) if c["route"] == "decode_kernel"}
        assert dec == ({(n * 4, 1)} if per == 4 else {(n, 4)})
        if not legal:
            assert "FMLA001" in v.report.codes


@needs_034
def test_real_0_34_mixed_step_runs_the_shortest_query_first():
    # two requests with drafts (4 tokens), a short extend of 100 tokens on 500 computed, a new 30-token prompt:
    # V2 sorts the drafted ones first, then 30, then 100 (model_runner.py:2579-2591); dense FlashMLA's uniform
    # decodes are the two drafted requests, the rest run MLA prefill
    so = scheduler_output34({"a": 900, "b": 900}, {"e": (600, 500, 100), "p": (30, 0, 30)}, drafts=3)
    r = Checker("vllm-flashmla", "H200", {"num_speculative_tokens": 3}).check(so)
    assert [(c["call"]["b"], c["call"]["s_q"]) for c in calls(r)] == [(2, 4)]
    assert r.context["routing"]["step"]["prefill_tokens"] == 130


@needs_034
def test_the_readme_hook_on_0_34s_engine_core_step():
    import logging

    from validate_batch import BatchIllegalError

    code = vllm_release.readme_hook_snippets()
    assert vllm_release.engine_core_methods(("_wait_for_output",), "0.34.0")      # 0.34.0's step waits through it

    big = scheduler_output34({f"r{i}": 500 for i in range(CURRENT // 4 + 1)}, drafts=3)
    ok = scheduler_output34({f"r{i}": 500 for i in range(10)}, drafts=3)
    core = vllm_release.StandInCore([ok, big], version="0.34.0")   # the engine core around 0.34.0's own step
    scope = {"engine_core": core, "logger": logging.getLogger("engine-under-test"), "max_num_seqs": 4096}
    exec(code["vllm-init"], scope)
    exec(code["vllm-hook"], scope)
    outputs, executed = core.step()                               # 0.34.0's EngineCore.step
    assert executed and core.executed == [ok]
    with pytest.raises(BatchIllegalError) as ei:
        core.step()
    assert core.executed == [ok] and "FMLA001" in ei.value.report.codes   # never reached execute_model
    exec(code["vllm-prevent"], scope)
    assert scope["max_num_seqs"] == CURRENT // 4

