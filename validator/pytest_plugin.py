"""pytest plugin (entry point ``validate_batch``): assert in engine test suites that batches are legal.

Installed with the package, so any test suite can use it without configuration::

    def test_prefill_batches_fit(batch_validator):
        batch = build_prefill_batch(...)                 # an SGLang ScheduleBatch, a vLLM
        batch_validator.assert_legal(batch)              # SchedulerOutput, a Batch or a batch document

    from validate_batch.pytest_plugin import assert_batch_legal
    assert_batch_legal(doc, engine="sglang-dsv4@0.5.10", gpu="H200", server_args={...})

A failure lists every broken limit with its code, the numbers and the fix, then the minimal safe
split, instead of a bare ``assert False``. ``assert report == LEGAL`` / ``assert verdict ==
LEGAL`` comparisons are explained the same way.

Configuration, most specific first: keyword arguments of the call; the
``@pytest.mark.validate_batch(engine=..., gpu=..., server_args=...)`` marker; the ini options
``validate_batch_engine`` and ``validate_batch_gpu``; the defaults: ``rules/engines.json``'s
``default_profile`` (``sglang-dsv4``) on ``H200``.

The plugin is loaded by every pytest run in an environment where the package is installed, so it
imports the package's modules only when a test uses them (function-level imports on purpose).
"""
from __future__ import annotations

from typing import Any

import pytest

ENGINE_KEYS = ("engine", "gpu", "server_args", "model", "buffers", "kernel")


def _checker(**engine):
    from .guard.checker import Checker

    unknown = set(engine) - set(ENGINE_KEYS)
    if unknown:
        raise TypeError(f"unknown engine setting(s) {', '.join(sorted(unknown))}; known: {', '.join(ENGINE_KEYS)}")
    return Checker(**{k: v for k, v in engine.items() if v is not None})


def _report(batch: Any, checker, as_written: bool | None = None):
    from .legality.report import Report

    if isinstance(batch, Report):
        return batch
    if hasattr(batch, "legal") and hasattr(batch, "report") and not isinstance(batch, type):  # a Verdict
        return batch.report if batch.report is not None else Report([])
    return checker.check(batch, as_written=as_written)


def _legal_message(report) -> str:
    """Why a batch expected to be illegal is legal: with the engine's chunk steps, when it was judged by them."""
    from .output.explain import chunk_lines

    ctx = report.context or {}
    extra = chunk_lines(ctx)
    return "expected an illegal batch, but it is legal" + ("\n" + "\n".join(extra) if extra else "")


def failure_message(report, what: str = "batch") -> str:
    from .output.explain import explain

    return explain(report, what=what)


def assert_batch_legal(batch: Any, *, as_written: bool | None = None, **engine):
    """Fail the calling test, with the findings and the safe split, if ``batch`` is illegal.

    ``batch``: an engine object, a :class:`~validate_batch.inputs.batch.Batch`, a batch document, a Report or a
    Verdict. ``engine``: ``engine``, ``gpu``, ``server_args``, ``model``, ``buffers``, ``kernel``
    (a document's own fields win over these). ``as_written=True``: a batch document the engine
    would chunk is judged as one step, as written (see :meth:`Checker.check`). Returns the report when legal.
    """
    __tracebackhide__ = True        # the failure points at the calling test's line
    report = _report(batch, _checker(**engine), as_written)
    if not report.legal:
        pytest.fail(failure_message(report))
    return report


def assert_batch_illegal(batch: Any, *codes: str, as_written: bool | None = None, **engine):
    """Fail the calling test unless ``batch`` is illegal (and, if given, breaks every rule in ``codes``).

    ``codes``: rule codes that must each be broken (case-insensitive); other broken rules are
    allowed. ``engine``: as for :func:`assert_batch_legal`. Returns the report."""
    __tracebackhide__ = True
    report = _report(batch, _checker(**engine), as_written)
    if report.legal:
        pytest.fail(_legal_message(report))
    if report.verdict == "not_modelled":        # not legal, but not known to be illegal either
        pytest.fail(failure_message(report))
    missing = sorted(set(c.upper() for c in codes) - {f.code for f in report.errors})
    if missing:
        pytest.fail(f"expected rule(s) {', '.join(missing)} to be broken; got:\n{failure_message(report)}")
    return report


class BatchValidator:
    """What the ``batch_validator`` fixture gives a test: checks against one engine configuration.

    Calls may override the configuration with keyword arguments (``engine``, ``gpu``,
    ``server_args``, ...). Checkers are built once per configuration and reused.
    """

    def __init__(self, **engine):
        self.engine = {k: v for k, v in engine.items() if v is not None}
        self._checkers: dict = {}

    def checker(self, **overrides):
        cfg = {**self.engine, **{k: v for k, v in overrides.items() if v is not None}}
        key = repr(sorted(cfg.items()))
        if key not in self._checkers:
            self._checkers[key] = _checker(**cfg)
        return self._checkers[key]

    def check(self, batch: Any, as_written: bool | None = None, **overrides):
        """The full report (never fails the test)."""
        return _report(batch, self.checker(**overrides), as_written)

    def assert_legal(self, batch: Any, as_written: bool | None = None, **overrides):
        """Fail the test (at its own line), with the findings and the split, unless ``batch`` is legal."""
        __tracebackhide__ = True
        report = self.check(batch, as_written, **overrides)
        if not report.legal:
            pytest.fail(failure_message(report))
        return report

    __call__ = assert_legal

    def assert_illegal(self, batch: Any, *codes: str, as_written: bool | None = None, **overrides):
        """Fail the test unless ``batch`` is illegal and breaks every rule in ``codes`` (e.g.
        ``assert_illegal(doc, "FMLA001", "SGL001")``); returns the report."""
        __tracebackhide__ = True
        return assert_batch_illegal(self.check(batch, as_written, **overrides), *codes)

    def headroom(self, *args, **kwargs):
        return self.checker().headroom(*args, **kwargs)


# ----------------------------------------------------------------------------------- hooks
def pytest_addoption(parser):
    parser.addini("validate_batch_engine", "engine profile for the batch_validator fixture (e.g. sglang-dsv4@0.5.10)",
                  default="")
    parser.addini("validate_batch_gpu", "GPU for the batch_validator fixture", default="H200")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "validate_batch(engine=..., gpu=..., server_args=...): engine configuration of batch_validator")


class UnconfiguredEngineWarning(pytest.PytestWarning):
    """``batch_validator`` was used with no engine named by a marker or the ini option."""


_WARNED = pytest.StashKey[bool]()


@pytest.fixture
def batch_validator(request) -> BatchValidator:
    """Checks batches against the test's engine configuration (marker, then ini options).

    With neither, it warns once per run (:class:`UnconfiguredEngineWarning`) and uses
    ``rules/engines.json``'s default profile: name the engine with
    ``@pytest.mark.validate_batch(engine="sglang-dsv4@0.5.23")`` or ``validate_batch_engine = ...``
    in the ini file, since a verdict is only true for the engine version (and its FlashMLA build).
    """
    from .inputs.batch import default_profile

    marks = list(request.node.iter_markers("validate_batch"))
    ini_engine = request.config.getini("validate_batch_engine")
    if not ini_engine and not any("engine" in m.kwargs for m in marks) and not request.config.stash.get(_WARNED, False):
        request.config.stash[_WARNED] = True     # once per run
        request.node.warn(UnconfiguredEngineWarning(
            f"batch_validator: no engine configured; using the default profile {default_profile()!r}. Name one with "
            "@pytest.mark.validate_batch(engine='sglang-dsv4@0.5.23') or 'validate_batch_engine = ...' in the ini file"))
    cfg: dict = {"engine": ini_engine or default_profile(),
                 "gpu": request.config.getini("validate_batch_gpu") or "H200"}
    for mark in reversed(marks):  # closest marker wins
        unknown = set(mark.kwargs) - set(ENGINE_KEYS)
        if unknown or mark.args:
            raise pytest.UsageError(f"validate_batch marker takes keyword arguments {', '.join(ENGINE_KEYS)}; "
                                    f"got {mark.args or sorted(unknown)}")
        cfg.update(mark.kwargs)
    return BatchValidator(**cfg)


def _short(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _compact(report) -> list[str]:
    """A few short lines (pytest truncates long explanations unless -vv): codes, fixes, the split."""
    errs = report.errors
    lines = [f"batch is illegal: {', '.join(sorted({f.code for f in errs}))} (full account: validate_batch.explain(report))"]
    for f in errs[:3]:
        lines.append(_short(f"{f.code}: {f.message}"))
        if f.fix:
            lines.append(_short(f"  fix: {f.fix}"))
    sp = report.safe_split
    if sp is not None:
        if not sp.possible:
            lines.append(_short(f"safe split: none - {sp.reason}"))
        elif sp.steps is not None:
            lines.append(_short("safe split: " + " | ".join(f"step {i}: {', '.join(st)}" for i, st in enumerate(sp.steps, 1))))
        elif sp.chunked_steps is not None:
            lines.append(_short(f"safe split: {len(sp.chunked_steps)} chunked step(s)"))
    return lines


def _explained(obj) -> list[str] | None:
    from .guard.checker import Verdict
    from .legality.report import Report

    if isinstance(obj, Verdict) and not obj.legal:
        return _compact(obj.report)
    if isinstance(obj, Report) and not obj.legal:
        return _compact(obj)
    return None


def pytest_assertrepr_compare(config, op, left, right):
    """Explain ``assert <report or verdict> == LEGAL`` (or ``== True``) with the findings and the split."""
    if op != "==":
        return None
    from .guard.checker import LEGAL

    for obj, other in ((left, right), (right, left)):
        if other is LEGAL or other is True:
            lines = _explained(obj)
            if lines is not None:
                return lines
    return None
