"""FMLA002 (the 32-bit ``o_accum`` row offset) needs the schedule only above its safe rows.

A split request's partial results go to ``o_accum`` rows ``num_splits[r] .. num_splits[r+1]-1``, and
``num_splits[b] = b + (split events)`` with at most one event per active partition but the last, so
no row exceeds ``(b - 1) + (P - 1)``. ``oaccum_safe_rows`` turns that into the largest ``b`` whose
rows all stay within the offset's int32 range: below it FMLA002 returns without walking the
schedule. Held here to:

* the real kernels (``shared/oracle``): every recorded ``num_splits`` of FlashMLA 9241ae3 and of
  sgl-flash-mla 1.0.0's legacy scheduler, and every successful limit probe's printed
  ``num_splits[b]``, keeps its largest row within ``b + P - 2``;
* the rule walked without the shortcut: at ``safe - 1``, ``safe`` and ``safe + 1`` rows of shapes
  whose safe rows are small (s_q = 8, h_q = 128: 2^31 // (8 * 128 * 512) = 4096 rows of offset),
  and on every recorded call, the findings are the same, and the largest split row of a walked
  schedule at ``safe`` rows is within the offset.
"""
from __future__ import annotations

import json
import random

import pytest

from conftest import oracle_path
from validate_batch.facts.knowledge import resolve_gpu
from validate_batch.flashmla import rules as fmla
from validate_batch.flashmla.plan import plan

INT32_MAX = (1 << 31) - 1


def _records(name: str) -> list[dict]:
    with oracle_path(name).open(encoding="utf-8") as fh:
        recs = [json.loads(line) for line in fh if line.strip()]
    return [r for r in recs if "kind" in r]


@pytest.mark.parametrize("name", ["flashmla_h200_cases.jsonl", "sglfm_h200_legacy_cases.jsonl"])
def test_the_kernels_split_rows_stay_within_b_plus_p_less_two(name):
    checked = 0
    for rec in _records(name):
        if "num_splits" not in rec:
            continue
        ns, P, b = rec["num_splits"], len(rec["tile_scheduler_metadata"]), rec["b"]
        rows = [ns[r + 1] - 1 for r in range(b) if ns[r + 1] - ns[r] > 1]
        assert ns[-1] - b <= P - 1, (rec.get("i"), ns[-1], b, P)
        if rows:
            assert max(rows) <= b + P - 2, (rec.get("i"), max(rows), b, P)
            checked += 1
    assert checked >= 50, "the file holds calls with split requests"


def test_the_probes_printed_split_counts_stay_within_p_less_one():
    seen = 0
    for rec in _records("flashmla_h200_probes.jsonl"):
        msg = rec.get("message", "")
        if rec.get("outcome") == "ok" and msg.startswith("OK "):
            P, total = map(int, msg.split()[1:3])
            assert 0 <= total - rec["b"] <= P - 1, rec
            seen += 1
    assert seen >= 10


def _findings(p, shortcut: bool, monkeypatch):
    """FMLA002's findings on ``p``, with or without its safe-rows shortcut (a fresh plan each time:
    the schedule is a cached property)."""
    with monkeypatch.context() as m:
        if not shortcut:
            m.setattr(fmla, "oaccum_safe_rows", lambda p: None)
        out = fmla.oaccum_offset(p)
    return [(f.code, f.message) for f in out or ()]


def _record(b, s_q, h_q, rng, uniform=False):
    topk = 512
    lengths = [topk] * b if uniform else [rng.choice([0, 1, 64, 100, 511, topk]) for _ in range(b)]
    return {"kind": "sparse", "b": b, "s_q": s_q, "h_q": h_q, "d_qk": 512, "topk": topk, "topk_length": lengths}


def test_the_shortcut_never_changes_a_finding(monkeypatch):
    h200 = resolve_gpu("H200")
    rng = random.Random(2026)
    for s_q, h_q in ((8, 128), (4, 128), (8, 64), (2, 128)):
        probe = plan(_record(1, s_q, h_q, rng), h200)
        stride = s_q * h_q * 512
        assert probe.oaccum_max_row == INT32_MAX // stride      # first principles, not the code's formula
        for b in (2000, 3000):
            # the safe rows follow the partitions of each b: computed on a plan of that b
            safe = fmla.oaccum_safe_rows(plan(_record(b, s_q, h_q, rng, True), h200))
            assert safe == INT32_MAX // stride - plan(_record(b, s_q, h_q, rng, True), h200).num_sm_parts + 1
        big = plan(_record(3000, s_q, h_q, rng, True), h200)
        safe = fmla.oaccum_safe_rows(big)
        compared = 0
        for b in (safe - 1, safe, safe + 1, safe + 64):
            for uniform in (True, False):
                rec = _record(b, s_q, h_q, rng, uniform)
                p = plan(rec, h200)
                if p.num_sm_parts != big.num_sm_parts:
                    continue
                want = _findings(plan(rec, h200), False, monkeypatch)
                assert _findings(p, True, monkeypatch) == want, (s_q, h_q, b, uniform)
                compared += b in (safe, safe + 1)
                sch = plan(rec, h200).schedule
                if b <= safe and sch is not None:
                    assert sch.max_split_row * stride <= INT32_MAX, (s_q, h_q, b)
        assert compared >= 2, (s_q, h_q)      # the boundary itself was compared, not only skipped
    for name in ("flashmla_h200_cases.jsonl", "sglfm_h200_legacy_cases.jsonl"):
        for rec in _records(name):
            if "num_splits" in rec:
                rec = {k: v for k, v in rec.items() if k not in ("tile_scheduler_metadata", "num_splits", "i")}
                p = plan(rec, h200)
                assert _findings(p, True, monkeypatch) == _findings(plan(rec, h200), False, monkeypatch), rec


def test_the_measured_offset_boundary_is_found_with_the_shortcut(monkeypatch):
    """The H200 probes at s_q = 8, h_q = 128 (split row 4095 ran, 4096 wrapped the offset: combine.cu:197)
    are above the safe rows; FMLA002 names exactly the ones the kernel failed, with and without the
    shortcut."""
    h200 = resolve_gpu("H200")
    probes = [r for r in _records("flashmla_h200_probes.jsonl") if (r["s_q"], r["h_q"]) == (8, 128)
              and r.get("kind") == "sparse" and "topk_length" not in r and "extra_topk_length" not in r]
    wrapped = [r for r in probes if "combine.cu:197" in r.get("message", "")]
    assert wrapped and len(probes) > len(wrapped)
    for r in probes:
        rec = {k: r[k] for k in ("kind", "b", "s_q", "h_q", "d_qk", "topk") + (("extra_topk",) if "extra_topk" in r else ())}
        got = _findings(plan(rec, h200), True, monkeypatch)
        assert got == _findings(plan(rec, h200), False, monkeypatch), r["b"]
        assert bool(got) == (r in wrapped), (r["b"], r.get("message"))
        if r in wrapped:
            assert r["b"] > fmla.oaccum_safe_rows(plan(rec, h200))
