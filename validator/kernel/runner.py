"""Run one kernel job in a fresh child process with a time limit; run many, a few at a time.

The child is ``python -m validator.kernel.worker`` (optionally with ``--backend FILE_OR_MODULE``).
It reads one JSON job on stdin and prints stage markers and one result line on stdout (see
:mod:`.outcome`). The child gets its own process group, so a timeout kills everything it started.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .outcome import RunResult, classify

DEFAULT_TIMEOUT_S = 120.0
PACKAGE_ROOT = Path(__file__).resolve().parents[2]   # the folder that holds the ``validator`` package


@dataclass(frozen=True)
class ChildSpec:
    """How to start the child: which Python, which backend, extra environment variables."""

    python: str = sys.executable
    backend: str | None = None            # module name or .py path; None = the torch backend
    env: tuple = ()                       # ((name, value), ...)

    def command(self) -> list[str]:
        cmd = [self.python, "-m", "validator.kernel.worker"]
        if self.backend:
            cmd += ["--backend", self.backend]
        return cmd

    def environment(self) -> dict:
        env = dict(os.environ)
        parts = [str(PACKAGE_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(dict(self.env))
        return env


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def run_job(job: dict, timeout: float = DEFAULT_TIMEOUT_S, child: ChildSpec | None = None) -> RunResult:
    """Run ``job`` in a new child process; never raises for anything the child does."""
    child = child or ChildSpec()
    started = time.monotonic()
    try:
        proc = subprocess.Popen(child.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=child.environment(), start_new_session=True,
                                text=True, errors="replace")
    except OSError as e:
        return RunResult("unavailable", f"cannot start {child.python}: {e}")
    timed_out = False
    try:
        out, err = proc.communicate(json.dumps(job), timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:  # pragma: no cover - only on an unexpected exception above
            _kill_group(proc)
    elapsed = time.monotonic() - started
    return classify(proc.returncode, out or "", err or "", timed_out=timed_out, elapsed_s=elapsed)


def run_jobs(jobs: Sequence[dict], timeout: float = DEFAULT_TIMEOUT_S, child: ChildSpec | None = None,
             max_parallel: int = 1, on_done: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
    """Run each job in its own child, at most ``max_parallel`` at a time; results in input order."""
    results: list[RunResult | None] = [None] * len(jobs)

    def one(i: int) -> None:
        r = run_job(jobs[i], timeout, child)
        results[i] = r
        if on_done is not None:
            on_done(i, r)

    if max_parallel <= 1 or len(jobs) <= 1:
        for i in range(len(jobs)):
            one(i)
    else:
        with ThreadPoolExecutor(max_workers=max_parallel) as pool:
            list(pool.map(one, range(len(jobs))))
    return [r for r in results if r is not None]
