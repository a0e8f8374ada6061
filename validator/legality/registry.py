"""The rule registry: stable codes, one small function each, and everything said about a rule on its definition.

The registry holds what is registered; :mod:`validate_batch.legality.ruleset` imports the project's rule
modules and is what the rest of the code reads rules through. A rule is one definition::

    @rule("FMLA001", reads="rows", title="...", failure=Failure("process_exit", "..."), source="...",
          signatures=[{"file": "get_decoding_sched_meta.cu", "lines": [111, 111], ...}], page=values)
    def sched_smem(p): ...

its code, title, severity (default ``error``), failure class (:class:`~validate_batch.legality.failure.Failure`:
kind, site, message pattern, the prose findings print), sources, error signatures
(:mod:`validate_batch.legality.signature`) and its documentation page: the docstring (sections: What it checks,
Why it crashes, Example, Fix, Source, in that order) whose ``{{name}}`` placeholders are
filled from ``page()`` (numbers read from the knowledge files) when the page is shown
(``validate-batch explain CODE``). The catalog (``validate-batch rules --json``) is generated from
the definitions. Rules are pure: they read a plan and return findings; they never raise on bad numbers.

``reads`` declares the per-step quantities the rule depends on, from :data:`QUANTITIES`: the
guard decides a step without the full check only when every rule's quantities are ones the
engine profiles bound (see :mod:`validate_batch.legality.bounds`); a rule that declares nothing reads
``requests`` (anything about the step), so the guard runs the full check for it. A rule reading
``schedule`` may give ``safe_rows(plan)``: the largest ``b`` for which it provably finds nothing.

``subject`` names the kind of object a call rule reads (default ``"flashmla"``: a FlashMLA
:class:`~validate_batch.flashmla.plan.Plan`); each kernel family's plans carry the same name as their
``rule_kind`` attribute, and :func:`run_rules` runs a call rule only on subjects of its kind.

``shape_only=True`` declares that a call rule reads only the call's shape (heads, head dimension,
cache widths and layout, which length arrays are present, the GPU, the implementation and its
partitions), never ``b``, the per-request length values or the schedule. A plan may then carry
``quiet_rules``: codes of shape-only rules already found silent on a plan of the same shape, which
:func:`run_rules` skips (the engine profiles do this for the calls they derive every step).

A FlashMLA call rule that reads only ``rows`` (and the configuration) is a *rows rule*
(:func:`rows_rules`), and it keeps one promise about them: for calls of one shape it is silent from
one row up to some number of rows and finds something at every number above it (a limit on rows,
never a window). So the rows a rule is silent for, on a shape, are ``1..edge``, found once per shape
by asking the rule itself (:func:`silent_rows`), and a plan of that shape with at most ``edge`` rows
may carry the rule in its ``quiet_rules`` too (the DeepSeek-V4 profile's sparse decode calls do).
``tests/test_rows_quiet.py`` holds every rows rule to the promise on sparse decode shapes of every
build, GPU and kernel half.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import Callable, Iterable

from .failure import KINDS, Failure, failure_of
from .search import largest_legal
from ..facts.provenance import FactStatus, gpu_fact, rule_facts
from .finding import SEVERITIES, Finding
from .signature import Signature, parse_signature

#: what a rule may read: the configuration alone; the forward's query rows (and its mode and
#: routing); the largest request slot; the scheduler's output; the per-row cache lengths of a
#: call; anything else about the step's requests
QUANTITIES = frozenset({"config", "rows", "slots", "schedule", "lengths", "requests"})
#: a page placeholder: ``{{name}}``, filled from the rule's ``page()`` values
PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def fill_page(text: str, values: dict) -> str:
    """``text`` with every ``{{name}}`` that ``values`` holds replaced by its value (others stay)."""
    def one(m: re.Match) -> str:
        return str(values[m.group(1)]) if m.group(1) in values else m.group(0)

    return PLACEHOLDER.sub(one, text)


@dataclass(frozen=True)
class Rule:
    code: str
    scope: str            # "call" (reads a kernel-call Plan) or "batch" (reads a BatchPlan)
    func: Callable
    title: str
    severity: str
    failure: Failure
    source: str
    family: str
    shape_only: bool = False
    reads: frozenset = frozenset({"requests"})
    safe_rows: Callable | None = None
    subject: str = "flashmla"
    signatures: tuple[Signature, ...] = ()
    page: Callable[[], dict] | None = None
    added: int | None = None
    facts: tuple[str, ...] | Callable = ()

    @property
    def split_helps(self) -> bool:
        """Whether splitting a forward into steps can make this rule's findings go away: not when
        it reads only the configuration or a request's own slot."""
        return not self.reads <= {"config", "slots"}

    @cached_property
    def doc(self) -> str:
        """The rule's page: its docstring with the placeholders filled from ``page()``."""
        from inspect import cleandoc     # (only when a page is shown)

        text = cleandoc(self.func.__doc__ or "")
        return fill_page(text, self.page()) if self.page is not None else text

    def to_dict(self) -> dict:
        """The rule's catalog entry."""
        return {"code": self.code, "severity": self.severity, "title": self.title, "failure": str(self.failure),
                "source": self.source, "scope": self.scope, "family": self.family,
                "failure_class": self.failure.to_dict(),
                "signatures": [s.to_definition() for s in self.signatures], "facts": "per call" if callable(self.facts) else list(self.facts)}

    def finding(self, message: str, *, subject: str = "", numbers: dict | None = None, fix: str = "",
                severity: str | None = None, failure: str | None = None) -> Finding:
        return Finding(self.code, severity or self.severity, message, subject, numbers or {}, fix,
                       self.failure if failure is None else failure_of(failure), self.source)


REGISTRY: dict[str, Rule] = {}
class RegistryState:
    """``revision`` changes whenever a rule is registered or removed: selections of rules and
    bounds derived from them record it and are rebuilt (or bypassed) when it moves."""

    __slots__ = ("revision",)

    def __init__(self):
        self.revision = 0


STATE = RegistryState()


def revision() -> int:
    """A number that changes whenever a rule is registered or removed."""
    return STATE.revision


def rule(code: str, scope: str = "call", shape_only: bool = False, reads=None, safe_rows: Callable | None = None,
         subject: str = "flashmla", *, title: str, failure: Failure | str = "", source: str = "",
         severity: str = "error", family: str | None = None, signatures: Iterable[dict] = (),
         page: Callable[[], dict] | None = None, added: int | None = None, facts: Iterable[str] = ()):
    """Register a rule function under a stable code, with everything said about it.

    ``reads``: the per-step quantities it depends on (names from :data:`QUANTITIES`; default
    ``requests``); ``shape_only`` implies ``config``; ``subject``: the kind of plan a call rule
    reads (see the module's notes). ``title``, ``severity``, ``failure`` (how the process fails),
    ``source`` (where the limit is written or measured), ``family`` (default: the code's letters),
    ``signatures`` (the error lines the failure prints, :mod:`validate_batch.legality.signature`), ``page``
    (the values of the page's ``{{name}}`` placeholders) and ``added`` (the rule's place in the
    order the codes were assigned; bisect tries signatures in that order, rules without it after).
    ``facts``: the knowledge-file records its limit and failure class are read from, as dotted paths
    in the plan's fact scope (a FlashMLA generation; ``build.<key>`` for the build's own record; see
    :mod:`validate_batch.facts.provenance`), or a function of the plan giving them (none on plans the
    rule cannot fire on); ``""`` is the scope record's own provenance."""
    if reads is None:
        reads = ("config",) if shape_only else ("requests",)
    reads = frozenset((reads,) if isinstance(reads, str) else reads)
    unknown = reads - QUANTITIES
    if unknown:
        raise KeyError(f"rule {code} reads unknown quantities {sorted(unknown)}; known: {sorted(QUANTITIES)}")
    if scope not in ("call", "batch"):
        raise KeyError(f"rule {code}: scope must be 'call' or 'batch', got {scope!r}")
    if severity not in SEVERITIES:
        raise KeyError(f"rule {code}: severity must be one of {', '.join(SEVERITIES)}, got {severity!r}")
    failure = failure_of(failure)
    if failure.unknown_kinds():
        raise KeyError(f"rule {code}: failure kind(s) {failure.unknown_kinds()} unknown; known: {', '.join(KINDS)}")
    sigs = tuple(parse_signature(code, i, raw) for i, raw in enumerate(signatures))

    def deco(func):
        if code in REGISTRY:
            raise KeyError(f"rule code {code} registered twice")
        r = Rule(code, scope, func, title, severity, failure, source, family or code.rstrip("0123456789"),
                 shape_only, reads, safe_rows, subject if scope == "call" else "batch", sigs, page, added,
                 facts if callable(facts) else tuple((facts,) if isinstance(facts, str) else facts))
        REGISTRY[code] = r
        STATE.revision += 1
        func.rule = r
        return func

    return deco


def unregister(code: str) -> None:
    """Remove a rule (for rules registered at run time, e.g. by a test or a plugin)."""
    if REGISTRY.pop(code, None) is not None:
        STATE.revision += 1


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


@lru_cache(maxsize=8)
def _signatures(gen: int) -> tuple[Signature, ...]:
    order = {c: i for i, c in enumerate(REGISTRY)}
    ranked = sorted(REGISTRY.values(), key=lambda r: (r.added is None, r.added or 0, order[r.code]))
    return tuple(s for r in ranked for s in r.signatures)


def all_signatures() -> tuple[Signature, ...]:
    """Every registered rule's error signatures: by the rules' ``added`` order (then registration),
    each rule's in the order it lists them."""
    return _signatures(STATE.revision)


@lru_cache(maxsize=64)
def _scope_rules(scope: str, gen: int, kind: str = "flashmla") -> tuple[Rule, ...]:
    # keyed by the registry's revision: a rule registered later gets a fresh selection
    return tuple(REGISTRY[c] for c in sorted(REGISTRY)
                 if REGISTRY[c].scope == scope and (scope != "call" or REGISTRY[c].subject == kind))


def rules_for(scope: str, kind: str = "flashmla") -> tuple[Rule, ...]:
    """The rules of one scope (call rules: of one subject kind), in code order (selected once,
    not on every call)."""
    return _scope_rules(scope, STATE.revision, kind)


def shape_rules() -> tuple[Rule, ...]:
    """The FlashMLA call rules declared ``shape_only``."""
    return tuple(r for r in rules_for("call") if r.shape_only)


#: what a rows rule may read
ROWS_READS = frozenset({"rows", "config"})


def rows_rules() -> tuple[Rule, ...]:
    """The FlashMLA call rules that read the call's rows and nothing else about the step (see the
    module's notes: each is silent up to an edge of rows on a shape, and finds something above it)."""
    return tuple(r for r in rules_for("call") if not r.shape_only and "rows" in r.reads and r.reads <= ROWS_READS)


def silent_rows(rule_func: Callable, plan_at: Callable[[int], object], hint: int | None, top: int) -> int:
    """The largest ``b`` in ``0..top`` such that the rows rule ``rule_func`` finds nothing on
    ``plan_at(b')`` for every ``b'`` in ``1..b`` (0: it finds something at one row). ``hint``: where
    the edge is believed to be (asked first). Relies on the rows rules' promise (the module's notes):
    ``top`` is asked first, then the hint and the row past it, then a bisection."""
    def silent(b: int) -> bool:
        return not rule_func(plan_at(b))

    if silent(top):
        return top if silent(1) else 0
    start = hint if hint is not None and 1 <= hint < top else None
    good, _ = largest_legal(silent, 1, start, top, exact_hint=start is not None)
    return 0 if good is None else good


@lru_cache(maxsize=256)
def _active_rules(scope: str, gen: int, skip: frozenset, only: frozenset | None, kind: str = "flashmla") -> tuple[Rule, ...]:
    return tuple(r for r in _scope_rules(scope, gen, kind) if r.code not in skip and (only is None or r.code in only))


#: (scope, kind, skipped codes, selected codes) -> (registry revision, the functions of the rules to run)
_RULE_FUNCS: dict = {}


def _rule_funcs(key: tuple) -> tuple:
    """The functions :func:`run_rules` calls for ``key``, in code order (selected at this revision)."""
    scope, kind, skip, only = key
    rev = STATE.revision
    rules = _active_rules(scope, rev, skip or frozenset(), only, kind) if (skip or only is not None) \
        else rules_for(scope, kind)
    funcs = tuple(r.func for r in rules)
    if len(_RULE_FUNCS) >= 1024:
        _RULE_FUNCS.clear()
    _RULE_FUNCS[key] = (rev, funcs)
    return funcs


def run_rules(scope: str, subject, only: frozenset | None = None) -> list[Finding]:
    """Every rule of ``scope`` over ``subject`` (``only``: just these codes). Call rules run on
    subjects of their own kind (``subject.rule_kind``, default ``"flashmla"``)."""
    out: list[Finding] = []
    key = (scope, getattr(subject, "rule_kind", "flashmla") if scope == "call" else "flashmla",
           getattr(subject, "quiet_rules", None), only)
    hit = _RULE_FUNCS.get(key)
    for func in (hit[1] if hit is not None and hit[0] == STATE.revision else _rule_funcs(key)):
        res: Iterable[Finding] | None = func(subject)
        if res:
            out.extend(res)
    if out:
        local = getattr(subject, "failure_for", None)   # a plan whose build fails its own way
        if local is not None:
            out = [_with_failure_class(local(f)) for f in out]
    return out


def _with_failure_class(f: Finding) -> Finding:
    """``f`` with its failure as a :class:`Failure` (a build's own failure comes as a knowledge file's text)."""
    return f if isinstance(f.failure, Failure) else replace(f, failure=failure_of(f.failure))


def verdict_facts(plans, batch_plan=None) -> list[tuple[str, FactStatus]]:
    """``(rule code, fact standing)`` for every rule a verdict ran: the call rules of each plan's
    kind on that plan (and the plan's GPU), and the batch rules on the batch plan (see
    :mod:`validate_batch.facts.provenance`)."""
    out: list[tuple[str, FactStatus]] = []
    for p in plans:
        for r in rules_for("call", getattr(p, "rule_kind", "flashmla")):
            out.extend((r.code, st) for st in rule_facts(r, p))
        gpu = getattr(p, "gpu", None)
        if gpu is not None:
            out.append(("GPU", gpu_fact(gpu.name)))
    if batch_plan is not None:
        for r in rules_for("batch"):
            out.extend((r.code, st) for st in rule_facts(r, batch_plan))
    return out
