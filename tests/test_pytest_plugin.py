"""The pytest plugin, run inside throwaway test suites (pytester).

The seed batch (3 x 4096 prompt tokens) needs 4*(5*12288+1) bytes of scheduler shared memory, more
than an H200's 232448: illegal on a build that sends every forward to the decode kernel.
"""
from __future__ import annotations

pytest_plugins = ["pytester"]

SEED = """
SEED = {"engine": "sglang-dsv4@pre-25418", "gpu": "H200", "forward_mode": "extend",
        "requests": [{"id": "p1", "extend_tokens": 4096}, {"id": "p2", "extend_tokens": 4096},
                     {"id": "p3", "extend_tokens": 4096}]}
SMALL = {**SEED, "requests": [{"id": "p1", "extend_tokens": 4096}]}
"""


def run(pytester, *args):
    return pytester.runpytest("-p", "validate_batch", "-p", "no:cacheprovider", *args)


def test_fixture_failure_shows_codes_fixes_and_the_split(pytester):
    pytester.makepyfile(SEED + """
def test_seed(batch_validator):
    batch_validator.assert_legal(SEED)

def test_small(batch_validator):
    report = batch_validator(SMALL)
    assert report.legal
""")
    res = run(pytester)
    res.assert_outcomes(passed=1, failed=1)
    out = res.stdout.str()
    assert "batch is ILLEGAL" in out
    assert "FMLA001" in out and "SGL001" in out
    assert "query rows 12288 exceed the scheduler's limit 11622" in out
    assert "fix: split into at least 2 calls" in out
    assert "step 1: p1, p2" in out and "step 2: p3" in out
    assert "pytest_plugin.py" not in out          # a clean message, not the plugin's traceback


def test_marker_and_ini_choose_the_engine(pytester):
    pytester.makeini("""
[pytest]
validate_batch_engine = sglang-dsv4@pre-25418
""")
    pytester.makepyfile(SEED + """
import pytest

DOC = {k: v for k, v in SEED.items() if k != "engine"}   # the engine comes from the configuration

def test_ini_engine_has_no_routing(batch_validator):
    batch_validator.assert_illegal(DOC, "FMLA001", "SGL001")

@pytest.mark.validate_batch(engine="sglang-dsv4@post-25418", kernel="flashmla-9241ae3")
def test_marker_engine_routes_large_prefills(batch_validator):
    rep = batch_validator.check({**DOC, "requests": [{"id": "big", "extend_tokens": 20000}]})
    assert rep.legal and rep.context["routing"]["routed"]

@pytest.mark.validate_batch(engine="sglang-dsv4@post-25418", kernel="flashmla-9241ae3")
def test_marker_engine_gap(batch_validator):
    batch_validator.assert_illegal({**DOC, "requests": [{"id": "gap", "extend_tokens": 11640}]}, "SGL001")

def test_headroom_from_the_fixture(batch_validator):
    assert batch_validator.headroom("extend", [4096, 4096]).more_rows == 11622 - 8192
""")
    res = run(pytester)
    res.assert_outcomes(passed=4)


def test_helper_functions(pytester):
    pytester.makepyfile(SEED + """
from validate_batch.pytest_plugin import assert_batch_legal, assert_batch_illegal

def test_helper_passes():
    rep = assert_batch_legal(SMALL)
    assert rep.legal

def test_helper_fails():
    assert_batch_legal(SEED)

def test_helper_with_engine_settings():
    assert_batch_legal({k: v for k, v in SEED.items() if k != "engine"}, engine="sglang-dsv4@post-25418", kernel="flashmla-9241ae3",
                       gpu="H200")

def test_illegal_expectation_wrong_code():
    assert_batch_illegal(SEED, "SLOT002")

def test_illegal_expectation_but_legal():
    assert_batch_illegal(SMALL)
""")
    res = run(pytester)
    res.assert_outcomes(passed=2, failed=3)
    out = res.stdout.str()
    assert "expected rule(s) SLOT002 to be broken" in out
    assert "expected an illegal batch, but it is legal" in out
    assert out.count("step 1: p1, p2") >= 2


def test_assert_comparison_is_explained(pytester):
    pytester.makepyfile(SEED + """
import validate_batch

def test_report():
    assert validate_batch.check(SEED) == validate_batch.LEGAL

def test_verdict():
    c = validate_batch.Checker(engine="sglang-dsv4@pre-25418")
    assert c.verdict("extend", [4096, 4096, 4096], rids=["p1", "p2", "p3"]) == validate_batch.LEGAL

def test_legal_report_equals_legal():
    assert validate_batch.check(SMALL) == validate_batch.LEGAL
    c = validate_batch.Checker(engine="sglang-dsv4@pre-25418")
    assert c.verdict("extend", [4096]) == validate_batch.LEGAL
""")
    res = run(pytester)
    res.assert_outcomes(passed=1, failed=2)
    out = res.stdout.str()
    assert out.count("batch is illegal: FMLA001, SGL001") >= 2  # once per failing test (CI runs show untruncated text)
    assert "fix: split into at least 2 calls" in out
    assert out.count("safe split: step 1: p1, p2 | step 2: p3") >= 2


def test_bad_marker_is_a_usage_error(pytester):
    pytester.makepyfile("""
import pytest

@pytest.mark.validate_batch("sglang-dsv4")
def test_x(batch_validator):
    pass
""")
    res = run(pytester)
    res.assert_outcomes(errors=1)
    assert "validate_batch marker takes keyword arguments" in res.stdout.str()


def test_unknown_engine_setting_is_reported(pytester):
    pytester.makepyfile(SEED + """
from validate_batch.pytest_plugin import assert_batch_legal

def test_x():
    assert_batch_legal(SMALL, engines="typo")
""")
    res = run(pytester)
    res.assert_outcomes(failed=1)
    assert "unknown engine setting(s) engines" in res.stdout.str()


def test_failures_point_at_the_tests_own_line(pytester):
    pytester.makepyfile(SEED + """
from validate_batch.pytest_plugin import assert_batch_legal, assert_batch_illegal

def test_helper():
    assert_batch_legal(SEED)          # THE-HELPER-LINE

def test_fixture(batch_validator):
    batch_validator.assert_legal(SEED)    # THE-FIXTURE-LINE

def test_illegal_expected(batch_validator):
    batch_validator.assert_illegal(SMALL, "FMLA001")    # THE-ILLEGAL-LINE
""")
    res = run(pytester, "--tb=short")
    res.assert_outcomes(failed=3)
    out = res.stdout.str()
    for marker in ("THE-HELPER-LINE", "THE-FIXTURE-LINE", "THE-ILLEGAL-LINE"):
        assert marker in out, marker                 # the failing line of the test is shown
    assert "pytest_plugin.py" not in out             # the plugin's frames are hidden


def test_an_unconfigured_fixture_warns_once(pytester):
    pytester.makepyfile(SEED + """
def test_a(batch_validator):
    batch_validator.assert_legal({k: v for k, v in SMALL.items() if k != "engine"})

def test_b(batch_validator):
    batch_validator.assert_legal({k: v for k, v in SMALL.items() if k != "engine"})
""")
    res = run(pytester, "-W", "always")
    res.assert_outcomes(passed=2)
    out = res.stdout.str()
    assert out.count("UnconfiguredEngineWarning") == 1 and "validate_batch_engine" in out
    pytester.makeini("[pytest]\nvalidate_batch_engine = sglang-dsv4@pre-25418\n")
    res = run(pytester, "-W", "always")
    res.assert_outcomes(passed=2)
    assert "UnconfiguredEngineWarning" not in res.stdout.str()
