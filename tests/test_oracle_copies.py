"""``fixtures/oracle/`` holds copies of the recorded H200 ground truth, so that a clean clone runs the
oracle tests without ``shared/oracle/`` beside it. The copies must be the recorded files, byte for byte.
"""
from __future__ import annotations

from pathlib import Path

import conftest
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "fixtures" / "oracle"
SHARED = REPO_ROOT.parent / "shared" / "oracle"

# Every oracle file the tests and the benchmarks read.
READ_BY_TESTS = (conftest.CASES_FILE, conftest.PROBES_FILE, conftest.PREFILL_PROBES_FILE,
                 "flashmla_h200_sched_kernel_timing.json", "sglfm_h200_legacy_cases.jsonl",
                 "sglfm_h200_densefp8_cases.jsonl", "sglfm_h200_probes.jsonl")


@pytest.mark.parametrize("name", READ_BY_TESTS)
def test_fixtures_hold_every_file_the_tests_read(name):
    assert (FIXTURES / name).is_file(), f"copy {name} from shared/oracle/ into fixtures/oracle/"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir()))
def test_copy_equals_the_shared_file(name):
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present: nothing to compare the copies with")
    assert (SHARED / name).is_file(), f"fixtures/oracle/{name} has no counterpart in {SHARED}"
    assert (FIXTURES / name).read_bytes() == (SHARED / name).read_bytes(), f"fixtures/oracle/{name} differs"


def test_shared_is_preferred_and_fixtures_are_the_fallback(monkeypatch, tmp_path):
    missing = tmp_path / "shared" / "oracle"
    monkeypatch.setattr(conftest, "ORACLE_DIRS", (missing, FIXTURES))
    assert conftest.oracle_path(conftest.CASES_FILE) == FIXTURES / conftest.CASES_FILE
    missing.mkdir(parents=True)
    (missing / conftest.CASES_FILE).write_text("{}\n")
    assert conftest.oracle_path(conftest.CASES_FILE) == missing / conftest.CASES_FILE
    monkeypatch.setattr(conftest, "ORACLE_DIRS", (missing,))
    with pytest.raises(pytest.skip.Exception, match="not found in"):
        conftest.oracle_path(conftest.PROBES_FILE)
