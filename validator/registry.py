"""The rule registry: stable codes, one small function each, metadata from ``rules/catalog.json``.

A rule is registered with ``@rule("FMLA001", scope="call")``; its docstring is its documentation
page (sections: What, Why it crashes, Example, Fix, Source) and ``validate-batch explain CODE``
prints it. Rules are pure: they read a plan and return findings; they never raise on bad numbers.

``shape_only=True`` declares that a call rule reads only the call's shape (heads, head dimension,
cache widths and layout, which length arrays are present, the GPU, the implementation and its
partitions), never ``b``, the per-request length values or the schedule. A plan may then carry
``quiet_rules``: codes of shape-only rules already found silent on a plan of the same shape, which
:func:`run_rules` skips (the engine profiles do this for the calls they derive every step).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable

from .knowledge import load
from .report import Finding


@dataclass(frozen=True)
class Rule:
    code: str
    scope: str            # "call" (reads a kernel-call Plan) or "batch" (reads a BatchPlan)
    func: Callable
    title: str
    severity: str
    failure: str
    source: str
    family: str
    shape_only: bool = False

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.func.__doc__ or "")

    def finding(self, message: str, *, subject: str = "", numbers: dict | None = None, fix: str = "",
                severity: str | None = None, failure: str | None = None) -> Finding:
        return Finding(self.code, severity or self.severity, message, subject, numbers or {}, fix,
                       self.failure if failure is None else failure, self.source)


REGISTRY: dict[str, Rule] = {}


def rule(code: str, scope: str = "call", shape_only: bool = False):
    """Register a rule function under a stable code; metadata comes from the catalog."""

    def deco(func):
        meta = load("catalog")["rules"].get(code)
        if meta is None:
            raise KeyError(f"rule {code} has no entry in rules/catalog.json")
        if code in REGISTRY:
            raise KeyError(f"rule code {code} registered twice")
        r = Rule(code, scope, func, meta["title"], meta["severity"], meta.get("failure", ""),
                 meta.get("source", ""), meta.get("family", code[:-3]), shape_only)
        REGISTRY[code] = r
        func.rule = r
        return func

    return deco


def all_rules() -> list[Rule]:
    _load_rule_modules()
    return [REGISTRY[c] for c in sorted(REGISTRY)]


def get_rule(code: str) -> Rule | None:
    _load_rule_modules()
    return REGISTRY.get(code.upper())


@lru_cache(maxsize=None)
def _scope_rules(scope: str, num_registered: int) -> tuple[Rule, ...]:
    # keyed by the registry's size: a rule registered later gets a fresh selection
    return tuple(REGISTRY[c] for c in sorted(REGISTRY) if REGISTRY[c].scope == scope)


def rules_for(scope: str) -> tuple[Rule, ...]:
    """The rules of one scope, in code order (selected once, not on every call)."""
    _load_rule_modules()
    return _scope_rules(scope, len(REGISTRY))


def shape_rules() -> tuple[Rule, ...]:
    """The call rules declared ``shape_only``."""
    return tuple(r for r in rules_for("call") if r.shape_only)


@lru_cache(maxsize=256)
def _active_rules(scope: str, num_registered: int, skip: frozenset) -> tuple[Rule, ...]:
    return tuple(r for r in _scope_rules(scope, num_registered) if r.code not in skip)


def run_rules(scope: str, subject) -> list[Finding]:
    out: list[Finding] = []
    skip = getattr(subject, "quiet_rules", None)
    rules = _active_rules(scope, len(REGISTRY), skip) if skip else rules_for(scope)
    for r in rules:
        res: Iterable[Finding] | None = r.func(subject)
        if res:
            out.extend(res)
    return out


_loaded = False


def _load_rule_modules() -> None:
    global _loaded
    if not _loaded:
        from . import rules_fmla, rules_engine  # noqa: F401  (registration side effect)
        _loaded = True
