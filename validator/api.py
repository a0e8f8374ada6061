"""The Python API: ``plan``, ``check``, ``assert_legal`` - importable without torch."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from .batch import is_batch_like
from .errors import BatchIllegalError, InputError
from .flashmla.calls import DecodeCall, KernelCall, SparsePrefillCall, call_from_record
from .flashmla.plan import Plan, plan
from .knowledge import GPU, resolve_gpu
from .pipeline import check_batch
from .report import Finding, Report
from .ruleset import run_rules


def _as_call(c: Any, where: str) -> KernelCall:
    if isinstance(c, (DecodeCall, SparsePrefillCall)):
        return c
    if isinstance(c, Mapping):
        return call_from_record(c, where)
    raise InputError(where, f"expected a call record (JSON object) or a DecodeCall, got {type(c).__name__}")


def check_plan(p: Plan) -> list[Finding]:
    """All call-scope rules over one plan."""
    return run_rules("call", p)


def check_calls(calls: Iterable[Any], gpu: Any = "H200", kernel: str | None = None) -> Report:
    """Check kernel calls (records or DecodeCall objects) and return one Report covering all."""
    g = resolve_gpu(gpu)
    plans = []
    findings: list[Finding] = []
    for i, c in enumerate(calls):
        p = plan(_as_call(c, f"calls[{i}]"), g, kernel)
        plans.append(p)
        findings.extend(check_plan(p))
    return Report(findings, plans)


def check(obj: Any, gpu: Any = None, kernel: str | None = None, **kwargs) -> Report:
    """Check one call record, a list of call records, or an engine batch; never raises on illegal input.

    Raises :class:`InputError` (field named) when the input itself is malformed.
    """
    if is_batch_like(obj):
        return check_batch(obj, gpu=gpu, kernel=kernel, **kwargs)
    if isinstance(obj, (list, tuple)):
        return check_calls(obj, gpu or "H200", kernel)
    return check_calls([obj], gpu or "H200", kernel)


def assert_legal(obj: Any, gpu: Any = None, kernel: str | None = None, **kwargs) -> Report:
    """Like :func:`check`, but raise :class:`BatchIllegalError` (with findings and safe split) if illegal."""
    report = check(obj, gpu=gpu, kernel=kernel, **kwargs)
    if not report.legal:
        raise BatchIllegalError(report)
    return report


__all__ = ["plan", "check", "check_calls", "check_plan", "assert_legal", "Report", "Finding", "GPU",
           "InputError", "BatchIllegalError", "resolve_gpu"]
