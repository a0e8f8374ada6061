"""The rule registry: stable codes, one small function each, metadata from ``rules/catalog.json``.

The registry holds what is registered; :mod:`validator.ruleset` imports the project's rule
modules and is what the rest of the code reads rules through. A rule is registered with
``@rule("FMLA001", scope="call")``; its docstring is its documentation
page (sections: What, Why it crashes, Example, Fix, Source) and ``validate-batch explain CODE``
prints it. Rules are pure: they read a plan and return findings; they never raise on bad numbers.

``reads`` declares the per-step quantities the rule depends on, from :data:`QUANTITIES`: the
guard decides a step without the full check only when every rule's quantities are ones the
engine profiles bound (see :mod:`validator.bounds`); a rule that declares nothing reads
``requests`` (anything about the step), so the guard runs the full check for it. A rule reading
``schedule`` may give ``safe_rows(plan)``: the largest ``b`` for which it provably finds nothing.

``subject`` names the kind of object a call rule reads (default ``"flashmla"``: a FlashMLA
:class:`~validator.flashmla.plan.Plan`); each kernel family's plans carry the same name as their
``rule_kind`` attribute, and :func:`run_rules` runs a call rule only on subjects of its kind.

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

#: what a rule may read: the configuration alone; the forward's query rows (and its mode and
#: routing); the largest request slot; the scheduler's output; the per-row cache lengths of a
#: call; anything else about the step's requests
QUANTITIES = frozenset({"config", "rows", "slots", "schedule", "lengths", "requests"})


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
    reads: frozenset = frozenset({"requests"})
    safe_rows: Callable | None = None
    subject: str = "flashmla"

    @property
    def split_helps(self) -> bool:
        """Whether splitting a forward into steps can make this rule's findings go away: not when
        it reads only the configuration or a request's own slot."""
        return not self.reads <= {"config", "slots"}

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.func.__doc__ or "")

    def finding(self, message: str, *, subject: str = "", numbers: dict | None = None, fix: str = "",
                severity: str | None = None, failure: str | None = None) -> Finding:
        return Finding(self.code, severity or self.severity, message, subject, numbers or {}, fix,
                       self.failure if failure is None else failure, self.source)


REGISTRY: dict[str, Rule] = {}
class RegistryState:
    """``generation`` changes whenever a rule is registered or removed: selections of rules and
    bounds derived from them record it and are rebuilt (or bypassed) when it moves."""

    __slots__ = ("generation",)

    def __init__(self):
        self.generation = 0


STATE = RegistryState()


def generation() -> int:
    """A number that changes whenever a rule is registered or removed."""
    return STATE.generation


def rule(code: str, scope: str = "call", shape_only: bool = False, reads=None, safe_rows: Callable | None = None,
         subject: str = "flashmla"):
    """Register a rule function under a stable code; metadata comes from the catalog.

    ``reads``: the per-step quantities it depends on (names from :data:`QUANTITIES`; default
    ``requests``); ``shape_only`` implies ``config``; ``subject``: the kind of plan a call rule
    reads (see the module's notes)."""
    if reads is None:
        reads = ("config",) if shape_only else ("requests",)
    reads = frozenset((reads,) if isinstance(reads, str) else reads)
    unknown = reads - QUANTITIES
    if unknown:
        raise KeyError(f"rule {code} reads unknown quantities {sorted(unknown)}; known: {sorted(QUANTITIES)}")
    if scope not in ("call", "batch"):
        raise KeyError(f"rule {code}: scope must be 'call' or 'batch', got {scope!r}")

    def deco(func):
        meta = load("catalog")["rules"].get(code)
        if meta is None:
            raise KeyError(f"rule {code} has no entry in rules/catalog.json")
        if code in REGISTRY:
            raise KeyError(f"rule code {code} registered twice")
        r = Rule(code, scope, func, meta["title"], meta["severity"], meta.get("failure", ""),
                 meta.get("source", ""), meta.get("family", code[:-3]), shape_only, reads, safe_rows,
                 subject if scope == "call" else "batch")
        REGISTRY[code] = r
        STATE.generation += 1
        func.rule = r
        return func

    return deco


def unregister(code: str) -> None:
    """Remove a rule (for rules registered at run time, e.g. by a test or a plugin)."""
    if REGISTRY.pop(code, None) is not None:
        STATE.generation += 1


def all_rules() -> list[Rule]:
    return [REGISTRY[c] for c in sorted(REGISTRY)]


#: the kinds of call subjects an engine forward derives by default (a profile names its own in
#: ``Profile.call_kinds``)
FORWARD_KINDS = frozenset({"flashmla"})


def forward_rules(kinds: frozenset = FORWARD_KINDS) -> list[Rule]:
    """The rules that can judge an engine forward: batch rules and the call rules of the kinds the
    engine profiles derive (``kinds``; rules over tensors an engine passes are checked on their own)."""
    return [r for r in all_rules() if r.scope == "batch" or r.subject in kinds]


def get_rule(code: str) -> Rule | None:
    return REGISTRY.get(code.upper())


@lru_cache(maxsize=64)
def _scope_rules(scope: str, gen: int, kind: str = "flashmla") -> tuple[Rule, ...]:
    # keyed by the registry's generation: a rule registered later gets a fresh selection
    return tuple(REGISTRY[c] for c in sorted(REGISTRY)
                 if REGISTRY[c].scope == scope and (scope != "call" or REGISTRY[c].subject == kind))


def rules_for(scope: str, kind: str = "flashmla") -> tuple[Rule, ...]:
    """The rules of one scope (call rules: of one subject kind), in code order (selected once,
    not on every call)."""
    return _scope_rules(scope, STATE.generation, kind)


def shape_rules() -> tuple[Rule, ...]:
    """The FlashMLA call rules declared ``shape_only``."""
    return tuple(r for r in rules_for("call") if r.shape_only)


@lru_cache(maxsize=256)
def _active_rules(scope: str, gen: int, skip: frozenset, only: frozenset | None, kind: str = "flashmla") -> tuple[Rule, ...]:
    return tuple(r for r in _scope_rules(scope, gen, kind) if r.code not in skip and (only is None or r.code in only))


def run_rules(scope: str, subject, only: frozenset | None = None) -> list[Finding]:
    """Every rule of ``scope`` over ``subject`` (``only``: just these codes). Call rules run on
    subjects of their own kind (``subject.rule_kind``, default ``"flashmla"``)."""
    out: list[Finding] = []
    skip = getattr(subject, "quiet_rules", None)
    kind = getattr(subject, "rule_kind", "flashmla") if scope == "call" else "flashmla"
    rules = _active_rules(scope, STATE.generation, skip or frozenset(), only, kind) if (skip or only is not None) \
        else rules_for(scope, kind)
    for r in rules:
        res: Iterable[Finding] | None = r.func(subject)
        if res:
            out.extend(res)
    if out:
        local = getattr(subject, "failure_for", None)   # a plan whose build fails its own way
        if local is not None:
            out = [local(f) for f in out]
    return out
