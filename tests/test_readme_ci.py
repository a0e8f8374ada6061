"""The README's CI workflow, run: its ``run:`` steps in a fresh virtual environment, against a wheel
built from this checkout (the install the README gives, since validate-batch is not on PyPI)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def readme_workflow() -> dict:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    (wf,) = [b for b in blocks if b.startswith("# .github/workflows/batches.yml")]
    return yaml.safe_load(wf)


def test_the_workflow_installs_from_a_wheel_not_pypi():
    steps = readme_workflow()["jobs"]["validate"]["steps"]
    runs = [s["run"] for s in steps if "run" in s]
    assert runs[0].startswith("pip install wheels/validate_batch-") and runs[0].endswith(".whl")
    assert any(s.get("uses", "").startswith("github/codeql-action/upload-sarif") for s in steps)
    assert readme_workflow()["jobs"]["validate"]["permissions"]["security-events"] == "write"


def _sh(cmd: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_workflow_runs_against_a_local_wheel(tmp_path):
    if os.environ.get("VALIDATE_BATCH_SKIP_WHEEL"):
        pytest.skip("VALIDATE_BATCH_SKIP_WHEEL is set")
    work = tmp_path / "repo"
    (work / "tests").mkdir(parents=True)
    shutil.copytree(ROOT / "fixtures" / "batches", work / "tests" / "batches")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "wheels"), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        pytest.skip(f"the wheel could not be built here: {built.stderr.strip()[-300:]}")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    for k in [k for k in env if k.startswith("VALIDATE_BATCH_")]:
        env.pop(k)
    steps = [s for s in readme_workflow()["jobs"]["validate"]["steps"] if "run" in s]
    install, annotate, sarif = steps
    r = _sh(install["run"], work, env)
    if r.returncode != 0:
        pytest.skip(f"the wheel's dependencies could not be installed here: {r.stderr.strip()[-300:]}")
    assert shutil.which("validate-batch", path=env["PATH"]).startswith(str(venv))
    # the fixtures hold illegal batches: the gate fails (exit 1) with one annotation per illegal file
    r = _sh(annotate["run"], work, env)
    assert r.returncode == 1, r.stderr
    errors = [ln for ln in r.stdout.splitlines() if ln.startswith("::error file=tests/batches/")]
    assert len(errors) == 3 and all("title=" in e for e in errors), r.stdout
    assert sarif.get("if") == "always()"
    r = _sh(sarif["run"], work, env)
    assert r.returncode == 0 and r.stdout == "", (r.stdout, r.stderr)
    log = json.loads((work / "batches.sarif").read_text())
    run = log["runs"][0]
    assert run["tool"]["driver"]["version"] == "0.1.0" and run["tool"]["driver"]["informationUri"]
    assert all(rule["help"]["text"] for rule in run["tool"]["driver"]["rules"])
    uris = {res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for res in run["results"]}
    assert uris and all(u.startswith("tests/batches/") for u in uris)
    assert all(res["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1 for res in run["results"])
    # the module entry point of the installed wheel
    r = _sh("python -m validate_batch check tests/batches/dsv4-1x4096.yaml", work, env)
    assert r.returncode == 0 and "verdict: LEGAL" in r.stdout
