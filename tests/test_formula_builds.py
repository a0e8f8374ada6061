"""A kernel build whose scheduler shared memory is a non-linear formula is a data change only.

A copy of the 9241ae3 generation is added to the loaded rules/flashmla.json at run time with a
quadratic term in its ``sched_smem.bytes``; no code changes. The plan, FMLA001, the ``gpus``
table, bisect's boundary search, the Checker's bounds and the legality map must then all put the
row limit where the formula's arithmetic, scanned here by brute force, says it is.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from validate_batch.facts import knowledge
from validate_batch.api import check_calls
from validate_batch.bisect import BisectChecker, find_boundary
from validate_batch.cli.main import app
from validate_batch.flashmla.plan import plan
from validate_batch.guard.checker import Checker
from validate_batch.legality.maps import Source, legality_map

EXAMPLE = Path(__file__).resolve().parent.parent / "rules" / "examples" / "dsv4-prefill-3x4096.yaml"
NAME = "flashmla-quadratic-test"
FORMULA = "4*(5b+1) + b*b//64"
H200_SMEM = 232448


def quadratic_bytes(b: int) -> int:
    return 4 * (5 * b + 1) + b * b // 64


# the largest b with 4*(5b+1) + b^2//64 <= 232448, by scanning every b (about 3270: the root of
# b^2/64 + 20b + 4 = 232448)
LIMIT = max(b for b in range(0, 20_000) if quadratic_bytes(b) <= H200_SMEM)


def _clear():
    knowledge.generation.cache_clear()
    knowledge.decode_archs.cache_clear()


@pytest.fixture
def quadratic_build(monkeypatch):
    """The new generation (its own name is a build of it) in the loaded data, removed afterwards."""
    data = knowledge.load("flashmla")
    gen = copy.deepcopy(data["generations"]["flashmla-9241ae3"])
    gen["sched_smem"]["bytes"] = FORMULA
    monkeypatch.setitem(data["generations"], NAME, gen)
    _clear()
    yield data
    _clear()


def sparse(b: int) -> dict:
    return {"kind": "sparse", "b": b, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}


def engine_doc(tokens: int) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["requests"] = [{"id": "p1", "extend_tokens": tokens, "prefix_len": 0}]
    return doc


def test_the_limit_is_where_the_arithmetic_puts_it():
    assert quadratic_bytes(LIMIT) <= H200_SMEM < quadratic_bytes(LIMIT + 1)
    assert 3000 < LIMIT < (H200_SMEM - 4) // 20     # the quadratic term lowers 9241ae3's 11622


def test_plan_and_fmla001(quadratic_build):
    p = plan(sparse(LIMIT), "H200", NAME)
    assert p.sched_smem_bytes == quadratic_bytes(LIMIT)
    assert p.fast_sched_rows == p.max_sched_rows == LIMIT
    assert [f for f in check_calls([sparse(LIMIT)], "H200", NAME).findings if f.code == "FMLA001"] == []
    for b in (LIMIT + 1, 3 * LIMIT):
        [f] = [f for f in check_calls([sparse(b)], "H200", NAME).findings if f.code == "FMLA001"]
        assert f.numbers == {"b": b, "max_b": LIMIT, "smem_bytes": quadratic_bytes(b), "smem_limit": H200_SMEM}
        assert f"expected {FORMULA} <= {H200_SMEM} B" in f.message


def test_gpus_table(quadratic_build, monkeypatch):
    monkeypatch.setitem(quadratic_build, "default", NAME)      # the table shows the default build's limit
    monkeypatch.setenv("COLUMNS", "200")                      # one line per row
    _clear()
    out = CliRunner().invoke(app, ["gpus"]).output
    _clear()
    assert f"max FlashMLA rows ({NAME})" in out
    row = next(line for line in out.splitlines() if "H200 " in line)
    assert f" {LIMIT} " in row and " 11622 " not in row


def test_bisect_boundary(quadratic_build):
    b = find_boundary(engine_doc, BisectChecker("H200", NAME), 1, 12288, None, "rows")
    assert (b.largest_legal, b.first_illegal) == (LIMIT, LIMIT + 1)
    assert "FMLA001" in b.codes


def test_checker_bounds_and_verdicts(quadratic_build):
    c = Checker(engine="sglang-dsv4@pre-25418", gpu="H200", build=NAME)
    assert c.max_rows == LIMIT
    assert c.verdict(engine_doc(LIMIT)).legal and not c.verdict(engine_doc(LIMIT + 1)).legal


def test_legality_map(quadratic_build):
    m = legality_map(Source("engine", engine_doc(4096)), kernel_build=NAME, y_max=0)
    assert m.row(0).largest_legal == LIMIT
    assert m.verdict(LIMIT, 0).kind == "legal"
    bad = m.verdict(LIMIT + 1, 0)
    assert bad.kind == "illegal" and "FMLA001" in bad.codes


def test_a_formula_may_read_the_calls_partitions(quadratic_build, monkeypatch):
    """4*(5b+1) + 8P with P = num_sm_parts: the sparse SM90 kernels at s_q = 1, h_q = 64 take
    132 // 1 // (64 // 64) = 132 partitions on an H200, so b <= (232448 - 4 - 8*132) // 20 = 11569;
    at s_q = 2, P = 66 and b <= (232448 - 4 - 8*66) // 20 = 11595."""
    monkeypatch.setitem(quadratic_build["generations"][NAME]["sched_smem"], "bytes", "4*(5b+1) + 8P")
    _clear()
    for s_q, parts, limit in ((1, 132, 11569), (2, 66, 11595)):
        rec = {**sparse(limit + 1), "s_q": s_q}
        p = plan(rec, "H200", NAME)
        assert p.num_sm_parts == parts and p.fast_sched_rows == limit
        assert 4 * (5 * limit + 1) + 8 * parts <= H200_SMEM < 4 * (5 * (limit + 1) + 1) + 8 * parts
        [f] = [f for f in check_calls([rec], "H200", NAME).findings if f.code == "FMLA001"]
        assert f.numbers["max_b"] == limit and f.numbers["smem_bytes"] == 4 * (5 * (limit + 1) + 1) + 8 * parts
    monkeypatch.setitem(quadratic_build, "default", NAME)
    monkeypatch.setenv("COLUMNS", "200")
    _clear()
    out = CliRunner().invoke(app, ["gpus"]).output
    _clear()
    assert "per call" in next(line for line in out.splitlines() if "H200 " in line)
