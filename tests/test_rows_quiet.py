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
  find, with the same length ranges.
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
