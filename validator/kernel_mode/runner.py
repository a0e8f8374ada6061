"""Run one kernel job in a fresh child process with a time limit; run many, a few at a time.

The child is ``python -m validate_batch.kernel_mode.worker`` (optionally with ``--backend FILE_OR_MODULE``).
It reads one JSON job on stdin and prints stage markers and one result line on stdout (see
:mod:`.outcome`). The child gets its own process group, so a timeout kills everything it started.

What the child writes is read with a deadline and kept within a cap: of each stream the first
``head`` and the last ``tail`` bytes (:data:`STDOUT_CAP`, :data:`STDERR_CAP`), with the number of
bytes dropped in between noted. At the timeout the child's process group and every process still
descending from it (one that called ``setsid()`` included) are killed, and reading stops
:data:`DRAIN_GRACE_S` later whether or not the pipes reached end of file: a process that escaped the
kill and holds the pipes open cannot keep the caller waiting.
"""
from __future__ import annotations

import json
import os
import queue
import threading
import selectors
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .outcome import RunResult, classify
from .protocol import BEGIN_PREFIX, RESULT_PREFIX

DEFAULT_TIMEOUT_S = 120.0
PACKAGE_ROOT = Path(__file__).resolve().parents[2]   # the folder that holds the ``validator`` package
MIB = 1 << 20
# (head, tail) bytes kept of each stream. The result line is the last line of stdout and holds the
# metadata read back (num_splits has b + 1 entries), hence the larger stdout tail.
STDOUT_CAP = (1 * MIB, 16 * MIB)
STDERR_CAP = (1 * MIB, 1 * MIB)
# How long reading goes on after the child has exited (or was killed) before the pipes are closed.
DRAIN_GRACE_S = 1.0
READ_CHUNK = 1 << 16
POLL_S = 0.05


class CappedBuffer:
    """The first ``head`` and the last ``tail`` bytes written to it, and how many bytes fell between."""

    def __init__(self, head: int, tail: int):
        self.head_cap, self.tail_cap = head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_cap:
                del self.tail[:len(self.tail) - self.tail_cap]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        if not self.dropped:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        note = f"\n[... {self.dropped} bytes of child output dropped ...]\n"
        return (self.head.decode("utf-8", errors="replace") + note
                + self.tail.decode("utf-8", errors="replace"))


@dataclass(frozen=True)
class ChildSpec:
    """How to start the child: which Python, which backend, extra environment variables."""

    python: str = sys.executable
    backend: str | None = None            # module name or .py path; None = the torch backend
    env: tuple = ()                       # ((name, value), ...)

    def command(self) -> list[str]:
        cmd = [self.python, "-m", "validate_batch.kernel_mode.worker"]
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


def descendants(pid: int) -> list[int]:
    """Processes descending from ``pid`` (Linux ``/proc``; empty where it cannot be read)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.append(c)
                todo.append(c)
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group and every process still descending from the child (one in a
    session or group of its own included), each group it leads as well."""
    if proc.poll() is None:
        for pid in descendants(proc.pid):
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError, OSError):
                    pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def _exchange(proc: subprocess.Popen, data: bytes, timeout: float) -> tuple[CappedBuffer, CappedBuffer, bool]:
    """Write ``data`` to the child's stdin and read its stdout and stderr into capped buffers until both
    reach end of file, or the child has been gone for :data:`DRAIN_GRACE_S`, or the time limit hits
    (then the child is killed and reading goes on for the grace only). Closes every pipe."""
    out, err = CappedBuffer(*STDOUT_CAP), CappedBuffer(*STDERR_CAP)
    sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    started = time.monotonic()
    deadline = started + timeout
    stop_at: float | None = None          # when reading stops, once the child is gone
    timed_out = False
    pos = 0
    sel = selectors.DefaultSelector()
    try:
        for fd in sinks:
            sel.register(fd, selectors.EVENT_READ)
        stdin_fd = proc.stdin.fileno()
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
        view = memoryview(data)
        while any(key.fd in sinks for key in sel.get_map().values()):
            now = time.monotonic()
            if stop_at is None:
                if proc.poll() is not None:
                    stop_at = now + DRAIN_GRACE_S
                elif now >= deadline:
                    timed_out = True
                    _kill_group(proc)
                    stop_at = now + DRAIN_GRACE_S
            if stop_at is not None and now >= stop_at:
                break
            limit = stop_at if stop_at is not None else deadline
            for key, _ in sel.select(max(0.0, min(POLL_S, limit - now))):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        pos += os.write(fd, view[pos:pos + READ_CHUNK])
                    except BlockingIOError:
                        continue
                    except OSError:          # the child closed its stdin or is gone
                        pos = len(data)
                    if pos >= len(data):
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except OSError:
                    chunk = b""
                if chunk:
                    sinks[fd].write(chunk)
                else:
                    sel.unregister(fd)
    finally:
        sel.close()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
    return out, err, timed_out


def run_job(job: dict, timeout: float = DEFAULT_TIMEOUT_S, child: ChildSpec | None = None) -> RunResult:
    """Run ``job`` in a new child process; never raises for anything the child does."""
    child = child or ChildSpec()
    started = time.monotonic()
    try:
        proc = subprocess.Popen(child.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=child.environment(), start_new_session=True)
    except OSError as e:
        return RunResult("unavailable", f"cannot start {child.python}: {e}")
    try:
        out, err, timed_out = _exchange(proc, json.dumps(job).encode(), timeout)
        if not timed_out:
            try:    # the pipes are closed; the child may still be running
                proc.wait(timeout=max(0.01, started + timeout - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        try:
            proc.wait(timeout=DRAIN_GRACE_S)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL does not end
            pass
    elapsed = time.monotonic() - started
    return classify(proc.returncode, out.text(), err.text(), timed_out=timed_out, elapsed_s=elapsed,
                    dropped={"stdout": out.dropped, "stderr": err.dropped})


def run_jobs(jobs: Sequence[dict], timeout: float = DEFAULT_TIMEOUT_S, child: ChildSpec | None = None,
             max_parallel: int = 1, on_done: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
    """Run each job in its own child, at most ``max_parallel`` at a time; results in input order."""
    results: list[RunResult | None] = [None] * len(jobs)

    def one(i: int) -> None:
        r = run_job(jobs[i], timeout, child)
        results[i] = r
        if on_done is not None:
            on_done(i, r)

    _each(one, len(jobs), max_parallel)
    return [r for r in results if r is not None]


def _each(one: Callable[[int], None], n: int, max_parallel: int) -> None:
    """``one(i)`` for every i below ``n``, at most ``max_parallel`` at a time."""
    if max_parallel <= 1 or n <= 1:
        for i in range(n):
            one(i)
    else:
        with ThreadPoolExecutor(max_workers=max_parallel) as pool:
            list(pool.map(one, range(n)))


# ----------------------------------------------------------------------------- long-lived children

#: outcomes after which a serving child is kept: nothing in them can have poisoned its CUDA context
KEEP_AFTER = frozenset({"ok", "python_exception", "unsupported", "unavailable"})


def poisons(res: RunResult) -> bool:
    """Whether a child that produced ``res`` must not take another job: any process-level failure, a
    timeout or unreadable output, and a Python exception that names a CUDA error (its context may
    be left in an error state)."""
    if res.outcome not in KEEP_AFTER:
        return True
    return res.outcome == "python_exception" and "cuda" in (res.message or "").lower()


class ServingChild:
    """One ``worker --serve`` child: jobs go in one per line, each job's lines come back between its
    ``begin`` marker and its result line, and are classified as a one-job child's would be."""

    def __init__(self, child: ChildSpec):
        self.spec = child
        self.jobs = 0
        self.proc = subprocess.Popen(child.command() + ["--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=child.environment(), start_new_session=True)
        for f in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(f.fileno(), False)
        self._line = bytearray()

    def close(self) -> None:
        """End the child (its stdin closed first, so an idle one leaves by itself) and reap it."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=DRAIN_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            _kill_group(self.proc)
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=DRAIN_GRACE_S)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass

    def run(self, job: dict, timeout: float) -> tuple[RunResult, bool]:
        """Run one job; ``(result, whether the child can take another)``. Never raises for anything
        the child does."""
        started = time.monotonic()
        deadline = started + timeout
        out, err = CappedBuffer(*STDOUT_CAP), CappedBuffer(*STDERR_CAP)
        data = memoryview((json.dumps(job) + "\n").encode())
        pos = 0
        done = timed_out = False
        stop_at: float | None = None
        sel = selectors.DefaultSelector()
        out_fd, err_fd, in_fd = self.proc.stdout.fileno(), self.proc.stderr.fileno(), self.proc.stdin.fileno()
        sel.register(out_fd, selectors.EVENT_READ)
        sel.register(err_fd, selectors.EVENT_READ)
        try:
            os.set_blocking(in_fd, False)
            sel.register(in_fd, selectors.EVENT_WRITE)
        except (OSError, ValueError):
            pos = len(data)
        try:
            while not done:
                now = time.monotonic()
                if stop_at is None:
                    if self.proc.poll() is not None:
                        stop_at = now + DRAIN_GRACE_S
                    elif now >= deadline:
                        timed_out = True
                        _kill_group(self.proc)
                        stop_at = now + DRAIN_GRACE_S
                if stop_at is not None and now >= stop_at:
                    break
                if not any(k.fd in (out_fd, err_fd) for k in sel.get_map().values()):
                    break
                limit = stop_at if stop_at is not None else deadline
                for key, _ in sel.select(max(0.0, min(POLL_S, limit - now))):
                    if key.fd == in_fd:
                        try:
                            pos += os.write(in_fd, data[pos:pos + READ_CHUNK])
                        except BlockingIOError:
                            continue
                        except OSError:
                            pos = len(data)
                        if pos >= len(data):
                            sel.unregister(in_fd)
                        continue
                    try:
                        chunk = os.read(key.fd, READ_CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    if key.fd == err_fd:
                        err.write(chunk)
                        continue
                    self._line += chunk
                    while b"\n" in self._line:
                        ln, _, rest = bytes(self._line).partition(b"\n")
                        self._line = bytearray(rest)
                        text = ln.decode("utf-8", errors="replace")
                        if text.startswith(BEGIN_PREFIX):
                            continue
                        out.write(ln + b"\n")
                        if text.startswith(RESULT_PREFIX):
                            done = True
            if done:      # what the job printed on stderr before its result has arrived by now, or soon
                end = time.monotonic() + 0.02
                while time.monotonic() < end:
                    try:
                        chunk = os.read(err_fd, READ_CHUNK)
                    except (BlockingIOError, OSError):
                        break
                    if not chunk:
                        break
                    err.write(chunk)
        finally:
            sel.close()
        self.jobs += 1
        elapsed = time.monotonic() - started
        dropped = {"stdout": out.dropped, "stderr": err.dropped}
        if done:
            res = classify(0, out.text(), err.text(), elapsed_s=elapsed, dropped=dropped)
            return res, not poisons(res)
        if self.proc.poll() is None:
            _kill_group(self.proc)
        try:
            self.proc.wait(timeout=DRAIN_GRACE_S)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        res = classify(self.proc.returncode, out.text(), err.text(), timed_out=timed_out, elapsed_s=elapsed,
                       dropped=dropped)
        return res, False


def run_jobs_served(jobs: Sequence[dict], timeout: float = DEFAULT_TIMEOUT_S, child: ChildSpec | None = None,
                    max_parallel: int = 1, on_done: Callable[[int, RunResult], None] | None = None,
                    alone: Callable[[int], bool] | None = None) -> list[RunResult]:
    """Like :func:`run_jobs`, with up to ``max_parallel`` long-lived children that serve many jobs each.

    A child is replaced after any outcome that may poison its CUDA context (:func:`poisons`); jobs
    for which ``alone(i)`` holds (calls the model predicts to be fatal) run in a fresh child of their
    own, as :func:`run_job` runs them. Results in input order, classified as :func:`run_job`'s."""
    child = child or ChildSpec()
    results: list[RunResult | None] = [None] * len(jobs)
    idle: "queue.SimpleQueue[ServingChild]" = queue.SimpleQueue()
    started: list[ServingChild] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        if alone is not None and alone(i):
            r = run_job(jobs[i], timeout, child)
        else:
            try:
                w = idle.get_nowait()
            except queue.Empty:
                try:
                    w = ServingChild(child)
                except OSError as e:
                    r = RunResult("unavailable", f"cannot start {child.python}: {e}")
                    w = None
                else:
                    with lock:
                        started.append(w)
            if w is not None:
                r, keep = w.run(jobs[i], timeout)
                if keep:
                    idle.put(w)
                else:
                    w.close()
        results[i] = r
        if on_done is not None:
            on_done(i, r)

    try:
        _each(one, len(jobs), max_parallel)
    finally:
        for w in started:
            w.close()
    return [r for r in results if r is not None]
