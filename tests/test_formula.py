"""The size-formula language of the data files (validator/facts/formula.py): precedence, functions,
refusals, vectorised evaluation and the inverse (largest b within a limit).

Expected values are written out here by hand or computed by a brute-force scan; never read from
the evaluator under test."""
from __future__ import annotations

import numpy as np
import pytest

from validate_batch.facts.formula import FormulaError, parse


@pytest.mark.parametrize("text, values, expected", [
    ("4*(5b+1)", {"b": 11622}, 4 * (5 * 11622 + 1)),
    ("2+3*4", {}, 14),                       # * before +
    ("10-2-3", {}, 5),                       # left to right
    ("20//2//5", {}, 2),                     # (20 // 2) // 5
    ("2*3//4", {}, 1),                       # (2*3) // 4, not 2 * (3 // 4) = 0
    ("4//2b", {"b": 1}, 2),                  # a coefficient binds tighter: 4 // (2*1)
    ("12//2b", {"b": 3}, 2),                 # 12 // 6, not (12 // 2) * 3 = 18
    ("-b+10", {"b": 3}, 7),
    ("-(b+1)*2", {"b": 3}, -8),
    ("7//2", {}, 3),
    ("cdiv(7, 2)", {}, 4),
    ("cdiv(8, 2)", {}, 4),
    ("align(33, 32)", {}, 64),
    ("align(32, 32)", {}, 32),
    ("align(0, 32)", {}, 0),
    ("min(b, 5, 9)", {"b": 7}, 5),
    ("max(b, 5)", {"b": 7}, 7),
    ("4*(5b+1+8P)", {"b": 2217, "P": 148}, 4 * (5 * 2217 + 1 + 8 * 148)),
    (" 4 * ( 3 * align( b , 32 ) + 1 ) ", {"b": 33}, 4 * (3 * 64 + 1)),
    ("2s_q*h_q", {"s_q": 2, "h_q": 64}, 256),
])
def test_values_and_precedence(text, values, expected):
    assert parse(text, "t")(**values) == expected


def test_the_text_is_shown_as_written():
    f = parse("4*(5b+1)", "flashmla.generations.x.sched_smem.bytes")
    assert str(f) == f.text == "4*(5b+1)"
    assert f.variables == {"b"}


def test_parsed_once_per_text():
    assert parse("4*(3b+1)", "a") is parse("4*(3b+1)", "a")


def test_vectorised_on_int64_arrays():
    b = np.array([0, 1, 31, 32, 33, 11622], dtype=np.int64)
    assert parse("4*(5b+1)", "t")(b=b).tolist() == [4 * (5 * v + 1) for v in b.tolist()]
    assert parse("4*align(b, 32)", "t")(b=b).tolist() == [0, 128, 128, 128, 256, 4 * 11648]
    assert parse("min(b, 32) + max(b, 32)", "t")(b=b).tolist() == [min(v, 32) + max(v, 32) for v in b.tolist()]


@pytest.mark.parametrize("text, words", [
    ("b.real", "unexpected '.'"),                       # no attribute access
    ("b.__class__", "unexpected '.'"),
    ("__import__(b)", "unknown function '__import__'"),
    ("__builtins__", "unknown name '__builtins__'"),
    ("os", "unknown name 'os'"),
    ("eval(b)", "unknown function 'eval'"),
    ("b[0]", "unexpected '['"),
    ("'b'", "unexpected \"'\""),
    ("b**2", "expected a number, a name or '('"),
    ("4/2", "unexpected '/'"),
    ("b;1", "unexpected ';'"),
    ("lambda: 1", "unexpected ':'"),
    ("", "got the end"),
    ("4 b", "unexpected 'b'"),                         # a coefficient is written together with its name
    ("(b+1", "expected ')'"),
    ("b+1)", "unexpected ')'"),
    ("min(b)", "min() takes two or more arguments, got 1"),
    ("cdiv(b)", "cdiv() takes 2 arguments, got 1"),
    ("align(b, 2, 3)", "align() takes 2 arguments, got 3"),
    ("1.5b", "unexpected '.'"),
])
def test_bad_formulas_are_refused_naming_the_field(text, words):
    with pytest.raises(FormulaError) as e:
        parse(text, "deepgemm.versions.v.metadata.9.bytes")
    assert e.value.field == "deepgemm.versions.v.metadata.9.bytes"
    assert str(e.value).startswith("deepgemm.versions.v.metadata.9.bytes: ")
    assert words in str(e.value)


def test_a_field_may_allow_fewer_names():
    assert parse("4*(5b+1+8P)", "f", ("b", "P"))(b=1, P=2) == 4 * (5 + 1 + 16)
    with pytest.raises(FormulaError, match=r"unknown name 's_q' \(a formula here may name: P, b\)"):
        parse("b*s_q", "f", ("b", "P"))


def test_deep_nesting_and_long_texts_are_refused():
    with pytest.raises(FormulaError, match="nested deeper"):
        parse("(" * 100 + "b" + ")" * 100, "f")
    with pytest.raises(FormulaError, match="at most"):
        parse("1+" * 300 + "1", "f")
    with pytest.raises(FormulaError, match="expected a formula string, got int"):
        parse(20, "f")


def test_evaluation_errors_name_the_field():
    with pytest.raises(FormulaError, match=r"^g: no value given for 'P'"):
        parse("4*(5b+1+8P)", "g")(b=1)
    with pytest.raises(FormulaError, match=r"^g: no value given for 'b'"):
        parse("4*(5b+1)", "g")()
    with pytest.raises(FormulaError, match=r"^g: no value given for 'b'"):
        parse("b*b", "g")(P=1)
    with pytest.raises(FormulaError, match=r"^g: division by zero"):
        parse("b//P", "g")(b=1, P=0)
    with pytest.raises(FormulaError, match=r"^g: division by zero"):
        parse("cdiv(b, P)", "g")(b=1, P=0)
    with pytest.raises(FormulaError, match=r"^g: no value given for 'P'"):
        parse("4*(5b+1+8P)", "g").largest("b", 1000)


# ------------------------------------------------------------------------------------------------
# the inverse: the largest b whose value fits a limit
# ------------------------------------------------------------------------------------------------
def brute_largest(fn, limit: int, lo: int = 0, top: int = 100_000) -> int:
    best = lo - 1
    for b in range(lo, top):
        if fn(b) <= limit:
            best = b
    return best


@pytest.mark.parametrize("text, fn", [
    ("4*(5b+1)", lambda b: 4 * (5 * b + 1)),
    ("4*align(b, 32)", lambda b: 4 * (-(-b // 32) * 32)),
    ("4*(3*align(b, 32)+1)", lambda b: 4 * (3 * (-(-b // 32) * 32) + 1)),
    ("b*b//8 + 4*(5b+1)", lambda b: b * b // 8 + 4 * (5 * b + 1)),
    ("max(b, 100) * 3", lambda b: max(b, 100) * 3),
    ("cdiv(b, 7) * 64 + 16", lambda b: -(-b // 7) * 64 + 16),
])
@pytest.mark.parametrize("limit", [0, 3, 4, 5, 299, 300, 301, 1000, 5003, 23333, 40000])
def test_largest_matches_a_scan(text, fn, limit):
    expected = brute_largest(fn, limit, top=20_000)
    assert expected < 20_000 - 1                    # the scan went past the edge
    assert parse(text, "t").largest("b", limit) == expected


def test_largest_respects_lo_and_hi():
    f = parse("4*(5b+1)", "t")
    assert f.largest("b", 3) == -1                 # 4*(5*0+1) = 4 > 3: none from 0 up
    assert f.largest("b", 1000, lo=100) == 99      # none from 100 up: lo - 1
    assert f.largest("b", 232448, hi=5000) == 5000
    q = parse("b*b", "t")
    assert q.largest("b", 99, lo=10) == 9 and q.largest("b", 10**6, hi=50) == 50


def test_a_formula_that_never_exceeds_has_no_largest_without_hi():
    with pytest.raises(FormulaError, match="stays <= 100 for every b"):
        parse("min(b, 10)", "t").largest("b", 100)
    assert parse("min(b, 10)", "t").largest("b", 100, hi=777) == 777
    assert parse("0", "t").largest("b", 5, hi=9) == 9


def test_a_decreasing_linear_formula_is_refused():
    with pytest.raises(FormulaError, match="decreases as b grows"):
        parse("1000-4b", "t").largest("b", 10)


def test_linear_coefficients():
    assert parse("4*(5b+1+8P)", "t").linear("b", P=148) == (20, 4 + 32 * 148)
    assert parse("4*align(b, 32)", "t").linear("b") is None
    assert parse("b*b", "t").linear("b") is None


# First principles for the real builds: bytes(limit) <= smem < bytes(limit + 1), written out here.
H200_SMEM = 232448


@pytest.mark.parametrize("text, limit, at_limit, above", [
    # 9241ae3 and the Oct 2025 build: 4*(5b+1) <= 232448  <=>  b <= (232448 - 4) // 20 = 11622
    ("4*(5b+1)", 11622, 4 * (5 * 11622 + 1), 4 * (5 * 11623 + 1)),
    # sgl-flash-mla 1.0.0's legacy fast path: 4*(3b+1): (232448 - 4) // 12 = 19370
    ("4*(3b+1)", 19370, 4 * (3 * 19370 + 1), 4 * (3 * 19371 + 1)),
    # the 2026-09-30 build: 4*(4b+1): (232448 - 4) // 16 = 14527
    ("4*(4b+1)", 14527, 4 * (4 * 14527 + 1), 4 * (4 * 14528 + 1)),
    # DeepGEMM SM90 metadata: 4*align(b, 32): 232448 // 4 = 58112 = 1816 * 32
    ("4*align(b, 32)", 58112, 4 * 58112, 4 * (58112 + 32)),
    # DeepGEMM 88965b0 varlen: 4*(3*align(b, 32)+1): (232448 - 4) // 12 = 19370 -> 605 * 32 = 19360
    ("4*(3*align(b, 32)+1)", 19360, 4 * (3 * 19360 + 1), 4 * (3 * 19392 + 1)),
    # DeepGEMM 54e2261 on SM100: 8b: 232448 // 8 = 29056
    ("8b", 29056, 8 * 29056, 8 * 29057),
])
def test_the_real_builds_limits(text, limit, at_limit, above):
    f = parse(text, "t")
    assert at_limit <= H200_SMEM < above
    assert f.largest("b", H200_SMEM) == limit
    assert f(b=limit) == at_limit <= H200_SMEM and f(b=limit + 1) == above > H200_SMEM
    assert f(b=limit - 1) <= at_limit
    assert f.largest("b", at_limit) == limit and f.largest("b", at_limit - 1) < limit


def test_sglang_precompute_window_on_b200():
    """4*(5b+1+8P) with P = 148 SMs // s_q 1: the guard admits b <= (49152 - 4 - 32*148) // 20 = 2220;
    with the kernel's 48 static bytes (49152 - 48 - 4 - 32*148) // 20 = 2218 fit."""
    f = parse("4*(5b+1+8P)", "t")
    assert f.largest("b", 49152, P=148) == 2220 == (49152 - 4 - 32 * 148) // 20
    assert f.largest("b", 49152 - 48, P=148) == 2218 == (49152 - 48 - 4 - 32 * 148) // 20
    assert f(b=2220, P=148) <= 49152 < f(b=2221, P=148)
    assert f(b=2218, P=148) + 48 <= 49152 < f(b=2219, P=148) + 48
