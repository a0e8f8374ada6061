"""The rows rules' edges: a call derived every step skips each rows rule up to the rows it is silent for.

A FlashMLA call rule that reads only the call's rows (``reads="rows"``) promises to be silent from
one row up to an edge and to find something at every row count above it (the registry's notes).
The DeepSeek-V4 profiles (SGLang's and vLLM's) ask each rule for its edge once per call shape
(``validate_batch.engines.shapes.rows_edges``) and their step calls carry the rules silent at their
row count in ``quiet_rules``. Held here to:

* the promise itself, for every rows rule on sparse decode shapes of every build, GPU and kernel
  half: at rows sampled on both sides of the edge (and powers of two up to the largest row count)
  the rule, run on a plan built from scratch by ``plan()``, is silent exactly up to the edge;
* the real kernels: on the H200 the edge of FMLA001 is where FlashMLA 9241ae3's scheduler was
  measured to stop (``shared/oracle/flashmla_h200_probes.jsonl``: 11622 runs, 11623 exits), and
  sgl-flash-mla 1.0.0, whose scheduler was measured to run far beyond it, gets none;
* first-principles arithmetic: FMLA015's edge on sgl-flash-mla 1.0.0 is the fast scheduler's
  ``4*(3b+1) <= 232448`` bytes, FMLA010's the info line's tenth of the GPU's memory;
* the full check: with and without the skipping, DeepSeek-V4 steps at every edge - 1, edge and
  edge + 1 (and some random ones) get the same findings, codes, messages and legality, on several
  builds and GPUs, for both profiles; vLLM's decode calls also find what plans built from scratch
  find, with the same length ranges;
* sparse-prefill shapes (the profiles' ``flash_mla_sparse_fwd`` calls, whose rows are ``s_q``): the
  same promise on every build and GPU, the skipping against plans from scratch at sampled ``s_q``,
  and both profiles' prefill calls against the kernel calls written out from their sources.
"""
from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import oracle_path
from validate_batch import Checker
from validate_batch.engines import shapes as dsv4_shapes
from validate_batch.errors import InputError
from validate_batch.facts.knowledge import build_names, gpu_by_name, gpu_names
from validate_batch.flashmla.calls import MAX_ROWS, DecodeCall
from validate_batch.flashmla.plan import plan
from validate_batch.legality.ruleset import revision, rows_rules

ROOT = Path(__file__).resolve().parent.parent

SHAPES = [  # (s_q, h_q, d_qk, topk, extra_topk)
    (1, 64, 512, 128, None), (1, 64, 512, 128, 512), (1, 128, 576, 2048, None), (4, 16, 512, 128, 1024),
]


def _shape(build, gpu, use_legacy, s_q, h_q, d_qk, topk, extra):
    call = DecodeCall(kind="sparse", b=1, s_q=s_q, h_q=h_q, d_qk=d_qk, topk=topk, extra_topk=extra,
                      extra_page=64 if extra else None, use_legacy=use_legacy)
    return plan(call, gpu, build)


def _samples(edge: int, rng: random.Random) -> list[int]:
    near = [edge - 1, edge, edge + 1, edge + 2] if edge else [1, 2]
    powers = [1 << k for k in range(0, 25, 2)]
    return sorted({b for b in [1, 2, 3, *near, *powers, *(rng.randint(1, MAX_ROWS) for _ in range(3))]
                   if 1 <= b <= MAX_ROWS})


def test_every_rows_rule_is_silent_exactly_up_to_its_edge():
    rng = random.Random(20261203)
    rules = rows_rules()
    assert {r.code for r in rules} >= {"FMLA001", "FMLA010", "FMLA015", "FMLA016", "FMLA017"}
    shapes = edges_seen = 0
    finite = set()
    for build in build_names():
        for gpu in gpu_names():
            for legacy in (None, True, False):
                for s_q, h_q, d_qk, topk, extra in SHAPES:
                    try:
                        shape = _shape(build, gpu, legacy, s_q, h_q, d_qk, topk, extra)
                    except InputError:
                        continue            # no kernels of this half / arch on this build
                    shapes += 1
                    edges = dsv4_shapes.rows_edges(shape, revision())
                    for r in rules:
                        edge = edges[r.code]
                        for b in _samples(edge, rng):
                            fresh = plan(replace(shape.call, b=b), gpu, build)
                            silent = not r.func(fresh)
                            assert silent is (b <= edge), (build, gpu, legacy, shape.call.summary(), r.code, b, edge)
                        edges_seen += 1
                        if edge < MAX_ROWS:
                            finite.add(r.code)
    assert shapes >= 300, shapes
    assert edges_seen >= 300 * len(rules)
    # the edges below the largest row count that the samples bracketed: the scheduler's shared
    # memory (hard and fallback), the workspace's size, the static arrays' size
    assert {"FMLA001", "FMLA010", "FMLA015"} <= finite, finite


def _probe_edge(records, **shape) -> int:
    """The largest measured ok b whose b + 1 was measured to fail, among probes of this shape."""
    mine = [r for r in records if all(r.get(k) == v for k, v in shape.items())]
    ok = {r["b"] for r in mine if r["outcome"] == "ok"}
    bad = {r["b"] for r in mine if r["outcome"] != "ok"}
    edges = sorted(b for b in ok if b + 1 in bad)
    assert edges, shape
    return edges[-1]


def _records(name: str) -> list[dict]:
    with oracle_path(name).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.mark.parametrize("h_q,d_qk", [(64, 512), (128, 576)])
def test_the_scheduler_edge_is_where_the_h200_kernel_stopped(h_q, d_qk):
    measured = _probe_edge(_records("flashmla_h200_probes.jsonl"), kind="sparse", s_q=1, h_q=h_q)
    assert measured == 11622
    shape = _shape("flashmla-9241ae3", "H200", None, 1, h_q, d_qk, 128 if d_qk == 512 else 2048, None)
    edges = dsv4_shapes.rows_edges(shape, revision())
    assert edges["FMLA001"] == measured
    # sgl-flash-mla 1.0.0's legacy scheduler ran 1,000,000 rows (it falls back): FMLA001 never fires
    ran = max(r["b"] for r in _records("sglfm_h200_probes.jsonl")
              if r.get("kind") == "sparse" and r["outcome"] == "ok" and r.get("s_q") == 1)
    assert ran >= 1_000_000
    legacy = _shape("sgl-flash-mla-1.0.0", "H200", True, 1, 64, 512, 128, None)
    assert dsv4_shapes.rows_edges(legacy, revision())["FMLA001"] == MAX_ROWS


def test_edges_from_first_principles():
    h200 = gpu_by_name("H200")
    optin = h200.smem_optin
    legacy = _shape("sgl-flash-mla-1.0.0", "H200", True, 1, 64, 512, 128, None)
    edges = dsv4_shapes.rows_edges(legacy, revision())
    assert edges["FMLA015"] == (optin - 4) // 12            # the fast scheduler: 4*(3b+1) bytes
    # FMLA010's info line: fp32 lse_accum + o_accum of (b + P) rows over a tenth of the GPU's memory
    up = _shape("flashmla-9241ae3", "H200", None, 1, 64, 512, 128, 512)
    # the partitions the H200 kernel printed for this shape ("OK <num_sm_parts> <splits>")
    parts = {int(r["message"].split()[1]) for r in _records("flashmla_h200_probes.jsonl")
             if r["outcome"] == "ok" and r.get("kind") == "sparse" and r.get("s_q") == 1 and r.get("h_q") == 64}
    assert len(parts) == 1
    P = parts.pop()
    per_row = 1 * 64 * 4 * (1 + 512)
    tenth = h200.memory_bytes // 10
    assert dsv4_shapes.rows_edges(up, revision())["FMLA010"] == tenth // per_row - P


CONFIGS = [
    ("sglang-dsv4@pre-25418", "H200", None),
    ("sglang-dsv4@0.5.23", "H200", None),
    ("sglang-dsv4@pre-25418", "H200", "sgl-flash-mla-1.0.0"),
    ("sglang-dsv4@pre-25418", "H200", "vllm-0.33"),
    ("sglang-dsv4@0.5.23", "B200", None),
]


def _findings(report):
    return report.legal, report.codes, sorted((f.code, f.severity, f.message, f.subject) for f in report.findings)


@pytest.mark.parametrize("engine,gpu,build", CONFIGS)
def test_the_check_finds_the_same_with_and_without_skipping(engine, gpu, build, monkeypatch):
    chk = Checker(engine=engine, gpu=gpu, build=build,
                  server_args={"chunked_prefill_size": 8192, "max_running_requests": 1 << 20})
    shape = chk._setup.parts[0][2].calls[0][3]
    edges = sorted({e for e in dsv4_shapes.rows_edges(shape, revision()).values() if 0 < e < 200_000})
    rng = random.Random(7)
    rows = sorted({b for e in edges for b in (e - 1, e, e + 1)} | {1, 2, 64, rng.randint(3, 4096)})
    assert len(rows) >= 7, rows
    skipped = []
    real_at = dsv4_shapes.QuietRules.at

    def count_at(self, b):
        out = real_at(self, b)
        skipped.append(len(out - self.base))
        return out

    def shape_only_at(self, b):         # what the calls skipped before: the silent shape-only rules
        real_at(self, b)
        return self.base

    for b in rows:
        seq = [rng.randint(1, 9000) for _ in range(b)]
        slots = list(range(1, b + 1))
        with monkeypatch.context() as m:
            m.setattr(dsv4_shapes.QuietRules, "at", count_at)
            fast = chk.check("decode", seq_lens=seq, req_pool_indices=slots)
        with monkeypatch.context() as m:
            m.setattr(dsv4_shapes.QuietRules, "at", shape_only_at)
            full = chk.check("decode", seq_lens=seq, req_pool_indices=slots)
        assert _findings(fast) == _findings(full), (engine, gpu, build, b)
    assert any(skipped), "the check skipped rows rules"


VLLM_CONFIGS = [("H200", None), ("H200", "flashmla-9241ae3"), ("H200", "sgl-flash-mla-1.0.0"), ("B200", None)]


@pytest.mark.parametrize("gpu,build", VLLM_CONFIGS)
def test_the_vllm_profile_skips_as_the_sglang_one_and_plans_as_from_scratch(gpu, build, monkeypatch):
    """vLLM's DeepSeek-V4 profile derives its decode calls from the same shapes and skips the same
    rules (:mod:`validate_batch.engines.shapes`): at every rows-rule edge - 1, edge and edge + 1 its
    full check finds what it finds without the skipping, and every decode call's plan finds what a
    plan built from scratch by ``plan()`` for the same call finds."""
    from validate_batch.api import check_plan

    chk = Checker(engine="vllm-dsv4", gpu=gpu, build=build)
    setup = chk._setup.parts[0][2]
    shape = setup.calls[0][4]
    assert shape.call.b == 1 and shape.call.kind == "sparse"
    edges = sorted({e for e in dsv4_shapes.rows_edges(shape, revision()).values() if 0 < e < 200_000})
    rng = random.Random(11)
    rows = sorted({b for e in edges for b in (e - 1, e, e + 1)} | {1, 2, 64, rng.randint(3, 4096)})
    if build in (None, "flashmla-9241ae3") and gpu == "H200":
        # the scheduler's limit is where the H200 kernel stopped: vLLM 0.33's bundled copy
        # (fixtures/measured/vllm033_h200_probes.jsonl: 14527 ran, 14528 raised) and 9241ae3
        if build is None:
            with (ROOT / "fixtures" / "measured" / "vllm033_h200_probes.jsonl").open(encoding="utf-8") as fh:
                probes = [json.loads(line) for line in fh if line.strip()]
        else:
            probes = _records("flashmla_h200_probes.jsonl")
        measured = _probe_edge(probes, kind="sparse", s_q=1, h_q=64)
        assert setup.max_rows in edges and setup.max_rows == measured
    real_at = dsv4_shapes.QuietRules.at
    skipped = []

    def count_at(self, b):
        out = real_at(self, b)
        skipped.append(len(out - self.base))
        return out

    def shape_only_at(self, b):
        real_at(self, b)
        return self.base

    for b in rows:
        seq = [rng.randint(1, 9000) for _ in range(b)]
        with monkeypatch.context() as m:
            m.setattr(dsv4_shapes.QuietRules, "at", count_at)
            fast = chk.check("decode", seq_lens=seq)
        with monkeypatch.context() as m:
            m.setattr(dsv4_shapes.QuietRules, "at", shape_only_at)
            full = chk.check("decode", seq_lens=seq)
        assert _findings(fast) == _findings(full), (gpu, build, b)
        if b <= 4096:
            calls = [c for c in full.batch_plan.calls if c.route == "decode_kernel"]
            assert len(calls) == 3, (gpu, build, b)
            for c in calls:
                fresh = plan(replace(c.call), gpu, build or "vllm-0.33")
                # the ranges the step gave its call are the ones the arrays have
                assert fresh.call.length_ranges == c.call.length_ranges, (gpu, build, b, c.name)
                assert (fresh.implementation.name, fresh.num_sm_parts) == (c.plan.implementation.name, c.plan.num_sm_parts)
                assert sorted(f.message for f in check_plan(fresh)) == sorted(f.message for f in check_plan(c.plan))
    assert any(skipped), "the check skipped rows rules"


# ------------------------------------------------------------------ sparse-prefill call shapes
PREFILL_SHAPES = [(64, 512, 512), (64, 512, 640), (128, 512, 1024), (32, 512, 512), (64, 576, 2048)]


def _prefill_samples(edge: int, rng: random.Random) -> list[int]:
    near = [edge - 1, edge, edge + 1] if 0 < edge < MAX_ROWS else []
    return sorted({b for b in [1, 2, 3, 64, 200_000, MAX_ROWS, *near, *(1 << k for k in range(0, 25, 3)),
                               *(rng.randint(1, MAX_ROWS) for _ in range(3))] if 1 <= b <= MAX_ROWS})


def test_prefill_shapes_keep_the_promise_and_skip_only_silent_rules():
    """The DeepSeek-V4 profiles plan their ``flash_mla_sparse_fwd`` calls from a shape of one query row
    (``prefill_shape_plan``) and skip what ``QuietRules`` says is silent at the step's ``s_q``. On every
    build and GPU, for several prefill shapes: every rows rule is silent on plans built from scratch by
    ``plan()`` exactly up to its edge, and at every sampled ``s_q`` the rules run with the skipping find
    what every rule finds on the plan from scratch."""
    from validate_batch.api import check_plan
    from validate_batch.flashmla.calls import SparsePrefillCall

    rng = random.Random(20261204)
    rules = rows_rules()
    seen = skipped = 0
    for build in build_names():
        for gpu in gpu_names():
            for h_q, d_qk, topk in PREFILL_SHAPES:
                shape = dsv4_shapes.prefill_shape_plan(gpu_by_name(gpu), build, h_q, d_qk, topk, "x prefill")
                assert shape.call == SparsePrefillCall(s_q=1, h_q=h_q, d_qk=d_qk, topk=topk, label="x prefill")
                edges = dsv4_shapes.rows_edges(shape, revision())
                quiet = dsv4_shapes.QuietRules(shape, False, False)
                for b in sorted({b for e in edges.values() for b in _prefill_samples(e, rng)}):
                    fresh = plan(SparsePrefillCall(s_q=b, h_q=h_q, d_qk=d_qk, topk=topk, label="x prefill"), gpu, build)
                    for r in rules:
                        assert (not r.func(fresh)) is (b <= edges[r.code]), (build, gpu, h_q, topk, r.code, b)
                    fast = dsv4_shapes.step_plan(shape, b, None, None, None, None, quiet.at(b))
                    assert fast.call == fresh.call and fast.gen is fresh.gen
                    assert sorted((f.code, f.message) for f in check_plan(fast)) == \
                        sorted((f.code, f.message) for f in check_plan(fresh)), (build, gpu, h_q, topk, b)
                    seen += 1
                    skipped += len(quiet.at(b))
    assert seen >= 1000 and skipped, (seen, skipped)
    with pytest.raises(ValueError):         # a prefill call has no per-row length arrays
        SparsePrefillCall(s_q=4, h_q=64).with_rows(8, [1] * 8, None)


def _scratch_prefill_findings(dc, gpu, build):
    from validate_batch.api import check_plan
    from validate_batch.flashmla.calls import SparsePrefillCall

    c = dc.call
    fresh = plan(SparsePrefillCall(s_q=c.s_q, h_q=c.h_q, d_qk=c.d_qk, topk=c.topk, label=c.label), gpu, build)
    return sorted((f.code, f.message) for f in check_plan(fresh))


@pytest.mark.parametrize("gpu,build", VLLM_CONFIGS)
def test_vllm_prefill_calls_are_the_kernel_calls_from_first_principles(gpu, build):
    """vLLM 0.33's DeepSeek-V4 prefill (models/deepseek_v4/nvidia/flashmla.py:316, :390): one
    ``flash_mla_sparse_fwd`` call per layer type over the step's prefill tokens, its index width
    the window's top-k plus the layer's compressed top-k, rounded up to a multiple of 128. Each derived
    call is that call, and finds what a plan built from scratch finds."""
    from types import SimpleNamespace

    from validate_batch.facts.knowledge import load

    dflt = load("engines")["profiles"]["vllm-dsv4"]["defaults"]
    ctx = dflt["context_length"]
    c128 = -(-(-(-ctx // 128)) // 64) * 64          # ceil(ctx / 128) rounded up to 64
    want_topk = sorted(-(-(dflt["swa_topk"] + e) // 128) * 128 for e in (0, dflt["c4_extra_topk"], c128))
    chk = Checker(engine="vllm-dsv4", gpu=gpu, build=build, server_args={"num_speculative_tokens": 1})
    rng = random.Random(5)
    for rows in (3, 4, 127, 128, 4000, rng.randint(5, 60000), 200_000):   # (above the 2-token decode threshold)
        # a SchedulerOutput-shaped stand-in (vLLM 0.33's attribute names; the release's own class is
        # read in tests/test_vllm_reading.py): three running decodes of 2 tokens and one new prefill
        ids = ["d0", "d1", "d2"]
        step = SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id="p", prompt_token_ids=list(range(rows + 5)), num_computed_tokens=0)],
            scheduled_cached_reqs=SimpleNamespace(req_ids=ids, num_computed_tokens=[900, 901, 902], num_output_tokens=[3] * 3),
            num_scheduled_tokens={**{i: 2 for i in ids}, "p": rows}, total_num_scheduled_tokens=6 + rows,
            scheduled_spec_decode_tokens={i: [0] for i in ids})
        r = chk.check(step)
        pre = [c for c in r.batch_plan.calls if c.route == "sparse_prefill"]
        assert sorted(c.call.topk for c in pre) == want_topk, (gpu, build, rows)
        for c in pre:
            assert (c.call.s_q, c.call.h_q, c.call.d_qk) == (rows, dflt["h_q"], dflt["d_qk"])
            assert c.name == c.call.label and c.call.label.endswith(" prefill")
            mine = sorted((f.code, f.message) for f in r.findings if c.name in f.subject)
            assert [m for m in mine if m[0].startswith("FMLA")] == \
                [f for f in _scratch_prefill_findings(c, gpu, build or "vllm-0.33")], (gpu, build, rows)


@pytest.mark.parametrize("build", [None, "flashmla-9241ae3", "sgl-flash-mla-1.0.0"])
def test_sglang_routed_prefill_calls_are_the_kernel_calls_from_first_principles(build):
    """SGLang 0.5.23's DeepSeek-V4 backend with its sparse-prefill switch on (the release's default)
    sends an extend forward to ``flash_mla_sparse_fwd``: one call per compression ratio over the
    forward's tokens, its index width the window's top-k plus the ratio's compressed top-k (no
    rounding). Each derived call is that call, and finds what a plan built from scratch finds."""
    import validate_batch
    from validate_batch.facts.knowledge import load

    dflt = load("engines")["profiles"]["sglang-dsv4"]["defaults"]
    ctx = dflt["context_length"]
    c128 = -(-(-(-ctx // 128)) // 64) * 64
    want_topk = sorted(dflt["swa_topk"] + e for e in (0, dflt["c4_extra_topk"], c128))
    for rows in (1, 2, 4096, 11623, 60000):
        doc = {"engine": "sglang-dsv4@0.5.23", "gpu": "H200", "forward_mode": "extend", "as_written": True,
               "server_args": {"chunked_prefill_size": 1 << 20, "max_prefill_tokens": 1 << 20},
               "requests": [{"id": "p", "extend_tokens": rows, "prefix_len": 0}]}
        r = validate_batch.check(doc, build=build)
        pre = [c for c in r.batch_plan.calls if c.route == "sparse_prefill"]
        assert sorted(c.call.topk for c in pre) == want_topk, (build, rows)
        for c in pre:
            assert (c.call.s_q, c.call.d_qk) == (rows, dflt["d_qk"]) and c.name == c.call.label
            mine = sorted((f.code, f.message) for f in r.findings if c.name in f.subject and f.code.startswith("FMLA"))
            assert mine == _scratch_prefill_findings(c, "H200", build or r.context["kernel_build"]), (build, rows)
