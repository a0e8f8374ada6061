"""The child side of kernel mode: ``python -m validate_batch.kernel_mode.worker [--backend FILE_OR_MODULE]``.

Reads one JSON job on stdin, hands it to a backend, and prints on stdout:

* ``@@validate-batch stage NAME`` before each step (so a crash can be placed: inputs, call, sync);
* ``@@validate-batch partial {...}`` for results obtained before a risky step;
* ``@@validate-batch result {...}`` once, at the end: ``{"status": "ok", ...}``,
  ``{"status": "python_exception", "error_type", "message"}``, or ``"unavailable"``/``"unsupported"``.

Then it leaves with ``os._exit(0)``: after a failed CUDA call, interpreter shutdown can hang or crash
in destructors, and the result has already been printed.

With ``--serve`` the child stays: it reads one JSON job per line, prints ``@@validate-batch begin N``
and then that job's lines as above, and takes the next job, until stdin ends. The parent
(:class:`validate_batch.kernel_mode.runner.WorkerPool`) retires a serving child after any outcome
that can leave the CUDA context poisoned, and runs calls predicted to be fatal in a child of their own.

A backend is a module with ``run(job, stage, partial) -> dict``. The default one,
:mod:`validate_batch.kernel_mode.torch_backend`, imports torch and FlashMLA; tests use a stand-in that mimics
the library's ways of failing without a GPU.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from validate_batch.kernel_mode.protocol import (BEGIN_PREFIX, PARTIAL_PREFIX, RESULT_PREFIX, STAGE_PREFIX, Unavailable,
                                                 Unsupported)

DEFAULT_BACKEND = "validate_batch.kernel_mode.torch_backend"
MAX_MESSAGE_CHARS = 4000


def _emit(prefix: str, text: str) -> None:
    sys.stdout.write(f"{prefix}{text}\n")
    sys.stdout.flush()


def stage(name: str) -> None:
    _emit(STAGE_PREFIX, name)


def partial(obj: dict) -> None:
    _emit(PARTIAL_PREFIX, json.dumps(obj, separators=(",", ":")))


def load_backend(spec: str):
    """A backend module by dotted name, or from a ``.py`` file path."""
    if spec.endswith(".py"):
        path = Path(spec)
        mod_spec = importlib.util.spec_from_file_location(f"_validate_batch_backend_{path.stem}", path)
        if mod_spec is None or mod_spec.loader is None:
            raise Unavailable(f"cannot load backend file {spec}")
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
        return mod
    return importlib.import_module(spec)


def execute(job: dict, backend) -> dict:
    """Run one job and return the result object (never raises)."""
    try:
        payload = backend.run(job, stage, partial)
        result = {"status": "ok"}
        result.update(payload or {})
        return result
    except Unavailable as e:
        return {"status": "unavailable", "message": str(e)[:MAX_MESSAGE_CHARS]}
    except Unsupported as e:
        return {"status": "unsupported", "message": str(e)[:MAX_MESSAGE_CHARS]}
    except BaseException as e:  # noqa: BLE001 - everything the library raises is a result
        return {"status": "python_exception", "error_type": type(e).__name__,
                "message": str(e).strip()[:MAX_MESSAGE_CHARS]}


def flush_c_stdio() -> None:
    """Flush the C library's stdout buffer: a kernel library's ``printf`` warnings (the low-smem fallback
    line) sit there when stdout is a pipe, and ``os._exit`` would drop them."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):
        pass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m validate_batch.kernel_mode.worker")
    ap.add_argument("--backend", default=DEFAULT_BACKEND, help="module name or .py file with run(job, stage, partial)")
    ap.add_argument("--serve", action="store_true", help="take one JSON job per line until stdin ends")
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.backend)
    try:
        job = json.loads(sys.stdin.read())
        if not isinstance(job, dict):
            raise ValueError("the job must be a JSON object")
        backend = load_backend(args.backend)
    except Exception as e:  # noqa: BLE001 - a broken job or backend is reported, never a traceback
        result = {"status": "unavailable", "message": f"worker setup failed: {type(e).__name__}: {e}"}
    else:
        result = execute(job, backend)
    flush_c_stdio()
    _emit(RESULT_PREFIX, json.dumps(result, separators=(",", ":")))
    flush_c_stdio()
    sys.stderr.flush()
    os._exit(0)


def serve(backend_spec: str) -> None:
    """Serve jobs, one JSON object per stdin line, each answered as a one-job child answers it."""
    try:
        backend = load_backend(backend_spec)
        setup_error = None
    except Exception as e:  # noqa: BLE001 - reported with every job
        backend, setup_error = None, f"worker setup failed: {type(e).__name__}: {e}"
    seq = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        _emit(BEGIN_PREFIX, str(seq))
        seq += 1
        try:
            job = json.loads(line)
            if not isinstance(job, dict):
                raise ValueError("the job must be a JSON object")
        except ValueError as e:
            result = {"status": "unavailable", "message": f"bad job line: {e}"}
        else:
            result = {"status": "unavailable", "message": setup_error} if backend is None else execute(job, backend)
        flush_c_stdio()
        _emit(RESULT_PREFIX, json.dumps(result, separators=(",", ":")))
        flush_c_stdio()
        sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    # Run through the importable module so that backends share its classes (Unavailable, ...).
    from validate_batch.kernel_mode import worker as _worker

    _worker.main()
