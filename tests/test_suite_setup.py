"""The test suite a new user runs: the quick subset exists and is a real subset; collection works
without the test extra (a GPU host's `pytest -m gpu` must not stop at an import)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import QUICK_MODULES

ROOT = Path(__file__).resolve().parent.parent

BLOCKER = '''
import importlib.abc, sys
BLOCKED = {"jsonschema", "hypothesis"}
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: no test extra)", name=name)
        return None
sys.meta_path.insert(0, _Block())
'''


def test_quick_modules_exist_and_are_a_subset():
    files = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    assert QUICK_MODULES <= files, sorted(QUICK_MODULES - files)
    assert len(QUICK_MODULES) < len(files) / 2
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python -m pytest -q -m quick" in readme and "-n auto" in readme


@pytest.mark.slow
def test_gpu_selection_collects_without_the_test_extra(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    # (hypothesis's own pytest plugin is not there either without the extra)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                        "--collect-only", "-m", "gpu",
                        str(ROOT / "tests")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "ERROR collecting" not in r.stdout and "errors" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
    assert "test_kernel_gpu.py" in r.stdout
