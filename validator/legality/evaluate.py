"""Plan one forward through its engine profiles and run the rules over the plan.

:func:`engine_setup` resolves what depends on the configuration alone (once per configuration);
:func:`plan_batch` derives the step's kernel calls and slot buffers; :func:`evaluate` runs the
rules (all, or a selection) and returns the :class:`~validate_batch.legality.report.Report` without a split.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..inputs.batch import Batch
from ..facts.knowledge import build_record
from ..engines import BatchPlan, get_profile, release_key, resolve_version
from .report import BatchContext, Finding, Report
from .ruleset import rules_for, run_rules


@dataclass(frozen=True)
class EngineSetup:
    """What :func:`plan_batch` derives from a batch's configuration alone (profiles and their
    versions, GPU, model, server args, buffers): a :class:`validate_batch.Checker` builds it once and
    passes it with every step of that configuration. ``parts``: ``(profile, version entry, setup)``
    in profile order."""

    versions: tuple                     # (profile, version label) in profile order
    parts: tuple
    judged: tuple = ()                  # per profile: what it was judged as and why (resolve_version's judged_as)

    @cached_property
    def profiles(self) -> tuple:
        return tuple(p for p, _, _ in self.parts)

    def providing(self, quantity: str):
        """The configuration part of the profile that provides ``quantity`` (None when none does)."""
        return next((s for p, _, s in self.parts if quantity in p.provides), None)

    @property
    def provides(self) -> frozenset:
        return frozenset().union(*(p.provides for p in self.profiles)) if self.parts else frozenset()

    @property
    def kernel_build(self) -> str:
        """The FlashMLA build the calls run on (named, or the one the engine version ships); for
        profiles that derive only FlashInfer calls, the FlashInfer version whose facts judge them."""
        for _, _, part in self.parts:
            k = getattr(part, "kernel", None)
            if k is not None:
                return build_record(k)["name"]
        if self.parts and "flashmla" not in self.call_kinds:
            fi = next((getattr(part, "flashinfer", None) for _, _, part in self.parts
                       if getattr(part, "flashinfer", None) is not None), None)
            from ..flashinfer.calls import version as flashinfer_version   # (loaded with such a profile)

            return flashinfer_version(fi)["name"]
        return build_record(None)["name"]

    @property
    def call_kinds(self) -> frozenset:
        """The kinds of call rules the profiles' derived calls are judged by."""
        return frozenset().union(*(p.call_kinds for p in self.profiles)) if self.parts else frozenset({"flashmla"})

    @property
    def guarantees(self) -> frozenset:
        """Rule inputs every profile of the batch keeps within their limits."""
        gs = [p.guarantees for p in self.profiles]
        return frozenset.intersection(*gs) if gs else frozenset()


def engine_setup(batch: Batch, build: str | None = None) -> EngineSetup:
    """``build``: the FlashMLA build to judge by; None: the batch's own, else its engine version's."""
    build = build or batch.kernel_build
    versions, parts = [], []
    for name, ver in batch.profiles:
        v = resolve_version(name, ver)
        versions.append((name, (v["judged_as"]["release"] or v["name"]) if ver and release_key(ver) else v["name"]))
        prof = get_profile(name)
        parts.append((prof, v, prof.setup(batch, v, build)))
    setup = EngineSetup(tuple(versions), tuple(parts))
    build_name = setup.kernel_build
    judged = tuple({**v["judged_as"], "kernel_build": build_name, "kernel_build_basis": _build_basis(build, v)}
                   for _, v, _ in parts)
    return EngineSetup(setup.versions, setup.parts, judged)


def _build_basis(build: str | None, v: dict) -> str:
    if build:
        return "named by the batch or the command"
    if v.get("kernel_build") and v.get("release"):
        return f"the build {v['release']} ships" + (f": {v['kernel_build_pin']}" if v.get("kernel_build_pin") else "")
    if v.get("kernel_build"):
        return f"the build entry {v['name']!r} names"
    return "the default build (this version names none)"


def version_notes(setup: EngineSetup) -> tuple:
    """Notes a report carries about the versions it was judged as: one per warning (a release
    newer than any known judged as the newest)."""
    return tuple(f"{j['profile']}: {j['basis']}" for j in setup.judged if j.get("warning"))


def plan_batch(batch: Batch, build: str | None = None, memo=None, setup: EngineSetup | None = None,
               rows_only: bool = False, probe: bool = False) -> BatchPlan:
    """Derive every kernel call and slot buffer of the forward. ``memo``: a
    :class:`~validate_batch.flashmla.schedule.WalkMemo` to reuse schedule walks across steps (a Checker's own);
    ``setup``: :func:`engine_setup` of this batch's configuration, when the caller keeps it."""
    if setup is None:
        setup = engine_setup(batch, build)
    bp = BatchPlan(batch, dict(setup.versions), profiles=setup.profiles, rows_only=rows_only, probe=probe)
    for prof, version, part in setup.parts:
        prof.derive(batch, version, part, bp, build, memo)
    return bp


def call_findings(bp: BatchPlan, only: frozenset | None = None) -> list[Finding]:
    """Run the kernel rules on every derived call; one finding per distinct message, naming all calls."""
    merged: dict[tuple, list] = {}
    order = []
    for dc in bp.calls:
        for f in run_rules("call", dc.plan, only):
            key = (f.code, f.message)
            if key not in merged:
                merged[key] = [f, []]
                order.append(key)
            merged[key][1].append(dc.name)
    out = []
    for key in order:
        f, names = merged[key]
        lib = next((getattr(dc.plan, "library", "FlashMLA") for dc in bp.calls if dc.name in names), "FlashMLA")
        subj = f"{lib} call(s) {', '.join(names)} of this {bp.batch.forward_mode} forward"
        out.append(Finding(f.code, f.severity, f.message, subj, f.numbers, f.fix, f.failure, f.source))
    return out


#: what the batch rules that describe the modelled path read
_STEP_PATH_READS = frozenset({"rows", "schedule", "lengths"})


def _modelled_rules(bp: BatchPlan, only: frozenset | None) -> frozenset | None:
    """The batch rules to run: on a step with a path not modelled, not those that read the step's
    rows, schedule or per-row lengths (they describe the path the engine does not take)."""
    if not bp.unmodelled:
        return only
    keep = frozenset(r.code for r in rules_for("batch", "flashmla") if not r.reads & _STEP_PATH_READS)
    return keep if only is None else keep & only


def evaluate(batch: Batch, build: str | None = None, memo=None, setup: EngineSetup | None = None,
             only: frozenset | None = None, rows_only: bool = False, probe: bool = False) -> Report:
    """The report of one forward, without a split (``only``: run just these rule codes;
    ``rows_only``: they read only rows and the configuration, so no per-row lengths are built;
    ``probe``: a bounds probe, judged on the modelled path even where the step would not be)."""
    bp = plan_batch(batch, build, memo, setup, rows_only, probe)
    findings = call_findings(bp, only) + run_rules("batch", bp, _modelled_rules(bp, only))
    return Report.deferred(findings, [c.plan for c in bp.calls], bp, lambda: BatchContext(
        {"label": batch.label, "gpu": batch.gpu.to_dict(), "requests": len(batch.requests), "running": len(batch.running)},
        setup.kernel_build, bp.to_dict(), tuple(batch.notes) + version_notes(setup), judged_as=list(setup.judged)))
