"""Shared fixtures: the H200 oracle (ground truth recorded from the real FlashMLA kernels) and GPUs.

The oracle lives in ``shared/oracle/`` beside the checkout (``<repo>/../shared/oracle``); a clean
clone without it reads the copies in ``fixtures/oracle/``. A test that needs a file neither holds is
skipped, with both paths in the reason.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_ORACLE_DIR = REPO_ROOT.parent / "shared" / "oracle"
FIXTURE_ORACLE_DIR = REPO_ROOT / "fixtures" / "oracle"
ORACLE_DIRS = (SHARED_ORACLE_DIR, FIXTURE_ORACLE_DIR)       # first that holds a file wins

CASES_FILE = "flashmla_h200_cases.jsonl"
PROBES_FILE = "flashmla_h200_probes.jsonl"
PREFILL_PROBES_FILE = "flashmla_h200_sparse_prefill_probes.jsonl"


def oracle_path(name: str) -> Path:
    """``name`` in ``shared/oracle`` when it is there, else in ``fixtures/oracle``; skips when neither has it."""
    for d in ORACLE_DIRS:
        if (d / name).is_file():
            return d / name
    pytest.skip(f"oracle file {name} not found in {' or '.join(map(str, ORACLE_DIRS))}")


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="session")
def oracle_dir() -> Path:
    """The directory that holds the cases file: ``shared/oracle`` beside the checkout, else
    ``fixtures/oracle``; skips the test when neither does."""
    return oracle_path(CASES_FILE).parent


@pytest.fixture(scope="session")
def oracle_device(oracle_dir: Path) -> dict:
    """The device header (first line) of the cases file: name, num_sms, cc, smem_optin."""
    with (oracle_dir / CASES_FILE).open(encoding="utf-8") as fh:
        return json.loads(fh.readline())


@pytest.fixture(scope="session")
def oracle_cases(oracle_dir: Path) -> list[dict]:
    """Every call record of the cases file (the device header removed)."""
    recs = _read_jsonl(oracle_dir / CASES_FILE)
    assert "num_sms" in recs[0] and "kind" not in recs[0], "first line of the cases file is the device header"
    return recs[1:]


@pytest.fixture(scope="session")
def oracle_probes() -> list[dict]:
    return _read_jsonl(oracle_path(PROBES_FILE))


@pytest.fixture(scope="session")
def oracle_prefill_probes() -> list[dict]:
    return _read_jsonl(oracle_path(PREFILL_PROBES_FILE))


@pytest.fixture(scope="session")
def h200():
    """The H200 profile as the project resolves it (132 SMs, cc 9.0, 232448 B opt-in shared memory)."""
    from validate_batch.facts.knowledge import resolve_gpu

    g = resolve_gpu("H200")
    # The facts the tests rely on, stated independently of the profile file.
    assert (g.num_sms, g.cc, g.smem_optin) == (132, (9, 0), 232448)
    return g


@pytest.fixture(params=["python", "compiled"])
def impl(request, monkeypatch) -> str:
    """Runs the test with the pure-Python paths and again with the compiled helpers (the schedule
    walk and the list checks); the compiled run is skipped when they were not built."""
    from validate_batch import _accel

    if request.param == "python":
        monkeypatch.setattr(_accel, "compiled", None)
    elif _accel.compiled is None:
        pytest.skip(f"compiled helpers {_accel.reason}")
    return request.param


@pytest.fixture
def pure_python(monkeypatch) -> None:
    """The pure-Python paths only (for tests of what only they do, such as reusing walks)."""
    from validate_batch import _accel

    monkeypatch.setattr(_accel, "compiled", None)


# The quick subset (`pytest -m quick`, README "Tests"): a module or two per part of the tool - the
# recorded H200 ground truth, the rules, the engine batches and chunking, the command line and its CI
# formats, the log reader - under a minute on two cores. Each of its tests also runs in the full suite.
QUICK_MODULES = frozenset({
    "test_oracle", "test_rules_fmla", "test_formula", "test_flashmla_data", "test_rule_definitions",
    "test_modes", "test_engine_batches", "test_chunked_prefill", "test_one_step_verdict",
    "test_cli_quick", "test_ci_github", "test_install_hints", "test_yaml_speed", "test_split_text",
    "test_report_context", "test_server_arg_names", "test_ingest_sglang_log", "test_bisect_cli",
})


def pytest_collection_modifyitems(config, items):
    quick = pytest.mark.quick
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        if name in QUICK_MODULES and item.get_closest_marker("slow") is None:
            item.add_marker(quick)
