"""Kernel mode for a diagnosis: the crashing step's FlashMLA calls run on the real kernels."""
from __future__ import annotations

from typing import Any

from .boundary import BisectChecker
from .results import Candidate


def kernel_hook(c: Candidate | None, checker: BisectChecker, console: Any = None) -> dict:
    """Kernel mode: run the crashing step's FlashMLA calls on the real kernels through
    ``validate_batch.kernel_mode.check.kernel_check_report`` (one child process per call) and return its
    JSON-able result; when kernel mode is not built in, say so instead."""
    if c is None or c.batch is None:
        return {"available": False, "reason": "no crashing step to run"}
    try:
        from ..kernel_mode.check import kernel_check_report  # type: ignore[import-not-found]
    except ImportError as e:
        return {"available": False, "reason": f"kernel mode is not available in this build ({e})"}
    try:
        rep = checker(c.batch, split=False)
        return kernel_check_report(rep, console)
    except Exception as e:  # the kernel bridge drives real GPUs: report, never crash the diagnosis
        return {"available": False, "reason": f"kernel mode failed: {type(e).__name__}: {e}"}
