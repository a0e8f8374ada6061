"""How a kernel run is judged against the model: the metadata diff, the model's view of a call, the
agreement of the two, one call's line of a kernel-mode result and the tally (shared by FlashMLA's kernel
mode, :mod:`.check`, and the other libraries', :mod:`.libraries`). Nothing here imports torch.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from ..api import check_plan
from ..errors import InputError
from ..legality.failure import failure_of
from ..flashmla.calls import DecodeCall
from ..flashmla.plan import Plan
from ..flashmla.plan import plan as make_plan
from ..facts.knowledge import GPU
from .outcome import OUTCOMES, RunResult
from .runner import ChildSpec, run_jobs, run_jobs_served
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())

LEGAL_KEY = "(no error)"
# The failure kind (a rule's ``Failure.kind``) under which a kernel that happens to run is not a
# contradiction: the input is undefined behaviour, not a guaranteed crash.
UNDEFINED_BEHAVIOUR = "undefined_behaviour"

# ----------------------------------------------------------------------------- metadata diff

@dataclass(frozen=True)
class MetadataDiff:
    """Model versus kernel ``tile_scheduler_metadata`` (first ``columns`` columns) and ``num_splits``."""

    columns: int
    model_parts: int
    kernel_parts: int
    rows_differing: int
    first_row: int | None = None
    model_row: tuple | None = None
    kernel_row: tuple | None = None
    model_splits_len: int = 0
    kernel_splits_len: int = 0
    splits_differing: int = 0
    first_split: int | None = None
    model_split: int | None = None
    kernel_split: int | None = None

    @property
    def identical(self) -> bool:
        return (self.model_parts == self.kernel_parts and self.rows_differing == 0
                and self.model_splits_len == self.kernel_splits_len and self.splits_differing == 0)

    def describe(self) -> str:
        if self.identical:
            return (f"identical: {self.model_parts} partitions x {self.columns} columns, "
                    f"{self.model_splits_len} num_splits")
        parts = []
        if self.model_parts != self.kernel_parts:
            parts.append(f"num_sm_parts expected {self.model_parts}, got {self.kernel_parts}")
        if self.rows_differing:
            parts.append(f"{self.rows_differing} metadata row(s) differ; row {self.first_row} expected "
                         f"{list(self.model_row)}, got {list(self.kernel_row)}")
        if self.model_splits_len != self.kernel_splits_len:
            parts.append(f"num_splits length expected {self.model_splits_len}, got {self.kernel_splits_len}")
        if self.splits_differing:
            parts.append(f"{self.splits_differing} num_splits value(s) differ; index {self.first_split} "
                         f"expected {self.model_split}, got {self.kernel_split}")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        d = {"identical": self.identical, "columns": self.columns, "model_parts": self.model_parts,
             "kernel_parts": self.kernel_parts, "rows_differing": self.rows_differing,
             "splits_differing": self.splits_differing, "summary": self.describe()}
        if self.first_row is not None:
            d.update(first_row=self.first_row, model_row=list(self.model_row), kernel_row=list(self.kernel_row))
        if self.first_split is not None:
            d.update(first_split=self.first_split, model_split=self.model_split, kernel_split=self.kernel_split)
        return d


def diff_metadata(model_md: Any, model_ns: Any, kernel_md: Any, kernel_ns: Any, columns: int = 7) -> MetadataDiff:
    """Compare the first ``columns`` columns of two ``[P, 8]`` tables and two ``num_splits`` arrays."""
    mm = np.asarray(model_md, dtype=np.int64).reshape(-1, 8)[:, :columns]
    km = np.asarray(kernel_md, dtype=np.int64).reshape(-1, 8)[:, :columns]
    mn = np.asarray(model_ns, dtype=np.int64).ravel()
    kn = np.asarray(kernel_ns, dtype=np.int64).ravel()
    rows = min(len(mm), len(km))
    bad_rows = np.flatnonzero((mm[:rows] != km[:rows]).any(axis=1))
    n = min(len(mn), len(kn))
    bad_splits = np.flatnonzero(mn[:n] != kn[:n])
    first_row = int(bad_rows[0]) if len(bad_rows) else None
    first_split = int(bad_splits[0]) if len(bad_splits) else None
    return MetadataDiff(
        columns=columns, model_parts=len(mm), kernel_parts=len(km), rows_differing=len(bad_rows),
        first_row=first_row,
        model_row=tuple(int(v) for v in mm[first_row]) if first_row is not None else None,
        kernel_row=tuple(int(v) for v in km[first_row]) if first_row is not None else None,
        model_splits_len=len(mn), kernel_splits_len=len(kn), splits_differing=len(bad_splits),
        first_split=first_split,
        model_split=int(mn[first_split]) if first_split is not None else None,
        kernel_split=int(kn[first_split]) if first_split is not None else None,
    )


# ----------------------------------------------------------------------------- verdicts and agreement

@dataclass(frozen=True)
class ModelView:
    """The model's view of one call: verdict, error codes, the failure it predicts."""

    verdict: str                  # "legal" | "illegal"
    codes: tuple = ()             # error codes, in rule order
    warnings: tuple = ()          # warning/info codes
    expected_failure: str = ""    # failure class of the first error ("process_exit", ...)
    undefined_only: bool = False  # every error is undefined behaviour (may or may not crash)
    expected_failures: tuple = () # every failure class any error names (the first error's first)

    @property
    def predicted_classes(self) -> tuple:
        if self.expected_failures:
            return self.expected_failures
        return (self.expected_failure,) if self.expected_failure else ()


def failure_class(failure: str) -> str:
    """The kind of a finding's failure (``"process_exit: ..."`` -> ``process_exit``)."""
    return failure_of(failure).kind


FAILURE_WORDS = tuple(OUTCOMES) + (UNDEFINED_BEHAVIOUR,)


def failure_classes(failure: str) -> tuple:
    """Every failure kind of a finding's failure that a kernel run can show, its kind first
    (``"process_crash for h_q ...; python_exception for d_qk ..."`` -> both)."""
    return tuple(k for k in failure_of(failure).kinds if k in FAILURE_WORDS)


def model_view(p: Plan) -> ModelView:
    findings = check_plan(p)
    errors = [f for f in findings if f.is_error]
    classes = [failure_class(f.failure) for f in errors]
    every = tuple(dict.fromkeys(c for f in errors for c in failure_classes(f.failure)))
    return ModelView(
        verdict="illegal" if errors else "legal",
        codes=tuple(dict.fromkeys(f.code for f in errors)),
        warnings=tuple(dict.fromkeys(f.code for f in findings if not f.is_error)),
        expected_failure=classes[0] if classes else "",
        undefined_only=bool(errors) and all(c == UNDEFINED_BEHAVIOUR for c in classes),
        expected_failures=every,
    )


def failure_matches(expected: str, run: RunResult) -> bool | None:
    """Does the observed failure have the class the model predicts? None when not applicable."""
    if not expected or not run.failed:
        return None
    if expected == UNDEFINED_BEHAVIOUR:
        return True
    if expected == "illegal_memory_access":
        return run.outcome == "illegal_memory_access"
    if expected == "process_exit":
        return run.outcome in ("process_exit", "illegal_memory_access") and run.exit_code not in (None, 0)
    return run.outcome == expected or run.oracle_outcome == expected


def judge(model: ModelView, run: RunResult) -> tuple[str, str]:
    """``(agreement, reason)``; agreement is ``agree`` | ``agree_ub`` | ``disagree`` | ``inconclusive``
    (module docstring); the reason says why for anything but a plain ``agree``."""
    if not run.is_conclusive:
        return "inconclusive", run.inconclusive_reason or f"the kernel run ended as {run.outcome}"
    if model.verdict == "legal":
        if run.is_ok:
            return "agree", ""
        return "disagree", f"the model calls the call legal; the kernel failed ({run.outcome})"
    predicted = model.predicted_classes
    if run.is_ok:
        if model.undefined_only:
            return "agree_ub", "undefined behaviour that did not crash this time"
        return "disagree", f"the model predicts {' or '.join(predicted) or 'a failure'}; the kernel ran"
    if not predicted:
        return "inconclusive", f"the kernel failed ({run.outcome}); the model names no failure class to compare"
    if any(failure_matches(c, run) for c in predicted):
        return "agree", ""
    return "disagree", (f"both say illegal, but the kernel failed as {run.outcome} and the model predicts "
                        f"{' or '.join(predicted)}")


def agreement(model: ModelView, run: RunResult) -> str:
    """``agree`` | ``agree_ub`` (undefined behaviour that did not crash this time) | ``disagree`` | ``inconclusive``."""
    return judge(model, run)[0]


# ----------------------------------------------------------------------------- the check

def gpu_from_device(device: dict, fallback: GPU) -> GPU:
    cc = device.get("cc") or list(fallback.cc)
    return GPU(device.get("name") or fallback.name, int(device.get("num_sms") or fallback.num_sms),
               (int(cc[0]), int(cc[1])), int(device.get("smem_optin") or fallback.smem_optin),
               "measured by the kernel-mode child", device.get("memory_bytes") or fallback.memory_bytes)


def same_gpu(a: GPU, b: GPU) -> bool:
    return (a.num_sms, tuple(a.cc), a.smem_optin) == (b.num_sms, tuple(b.cc), b.smem_optin)


def replan(p: Plan, gpu: GPU, generation: str | None) -> Plan:
    """The same call planned for the device and generation that actually ran it."""
    gen = generation or p.gen.get("name")
    try:
        return make_plan(p.call, gpu, gen)
    except InputError:
        return make_plan(p.call, gpu, p.gen.get("name"))


def compare_call(index: int, p: Plan, run: RunResult, keep_output: bool = False) -> dict:
    """One call's line of the result: model, kernel, metadata diff, agreement (``keep_output``: with
    everything the kernel wrote, as the child reported it)."""
    mv = model_view(p)
    verdict, why = judge(mv, run)
    matches = [failure_matches(c, run) for c in mv.predicted_classes]
    entry: dict[str, Any] = {
        "index": index,
        "call": p.call.label or p.call.summary(),
        "model": {"verdict": mv.verdict, "codes": list(mv.codes), "warnings": list(mv.warnings),
                  "expected_failure": mv.expected_failure or None,
                  "expected_failures": list(mv.predicted_classes), "num_sm_parts": p.num_sm_parts,
                  "generation": p.gen.get("name")},
        "kernel": run.to_dict(with_payload=keep_output),
        "kernel_verdict": run.verdict,
        "agreement": verdict,
        "agreement_reason": why or None,
        "failure_class_match": (True if any(matches) else False if matches and run.failed else None),
        "fallback_used": run.fallback_used,
        "metadata": None,
    }
    got = run.payload if run.payload.get("tile_scheduler_metadata") is not None else run.partial
    if isinstance(p.call, DecodeCall) and got.get("tile_scheduler_metadata") is not None:
        md = p.metadata_in_layout() if hasattr(p, "metadata_in_layout") else (p.schedule.metadata if p.schedule else None)
        if md is None:
            entry["metadata"] = {"identical": False, "summary": "the kernel wrote metadata but the model says "
                                 "its scheduler never runs"}
        else:
            cols = len(p.gen.get("row_layout") or range(7))
            d = diff_metadata(md, p.schedule.num_splits, got["tile_scheduler_metadata"], got.get("num_splits", []), cols)
            entry["metadata"] = d.to_dict()
    return entry


def summarize(entries: Sequence[dict]) -> dict:
    outcomes: dict[str, int] = {}
    agree: dict[str, int] = {"agree": 0, "agree_ub": 0, "disagree": 0, "inconclusive": 0}
    per_rule: dict[str, dict] = {}
    md = {"compared": 0, "identical": 0, "differing": 0}
    inconclusive_reasons: dict[str, int] = {}
    fallback = 0
    for e in entries:
        if e["agreement"] == "inconclusive":
            why = e.get("agreement_reason") or "inconclusive"
            inconclusive_reasons[why] = inconclusive_reasons.get(why, 0) + 1
        fallback += bool(e.get("fallback_used"))
        oc = e["kernel"]["outcome"]
        outcomes[oc] = outcomes.get(oc, 0) + 1
        agree[e["agreement"]] += 1
        codes = e["model"]["codes"] or [LEGAL_KEY]
        for code in codes:
            r = per_rule.setdefault(code, {"calls": 0, "kernel_ok": 0, "kernel_failed": 0, "inconclusive": 0,
                                           "agree": 0, "agree_ub": 0, "disagree": 0, "failure_class_match": 0})
            r["calls"] += 1
            kv = e["kernel_verdict"]
            r["kernel_ok" if kv == "legal" else "kernel_failed" if kv == "illegal" else "inconclusive"] += 1
            if e["agreement"] in ("agree", "agree_ub", "disagree"):
                r[e["agreement"]] += 1
            if e["failure_class_match"]:
                r["failure_class_match"] += 1
        m = e.get("metadata")
        if m is not None:
            md["compared"] += 1
            md["identical" if m.get("identical") else "differing"] += 1
    if agree["disagree"] or md["differing"]:
        status = "disagree"
    elif agree["agree"] + agree["agree_ub"] == 0:
        status = "inconclusive"
    else:
        status = "agree"
    return {"calls": len(entries), "outcomes": outcomes, "agreement": agree, "per_rule": per_rule, "metadata": md,
            "status": status, "all_agree": status == "agree", "inconclusive_reasons": inconclusive_reasons,
            "fallback_used": fallback}


def predicted_fatal(p: Plan) -> bool:
    """Whether the model expects the call to fail in a way that can end or poison its process (all
    but a recoverable Python exception): such a call runs in a child of its own."""
    mv = model_view(p)
    return mv.verdict != "legal" and any(k != "python_exception" for k in (mv.expected_failures or ("?",)))


def run_judged(plans: Sequence[Any], jobs: Sequence[dict], *, timeout: float, child: ChildSpec | None,
               max_parallel: int, console=None, served: bool = True) -> tuple[list[RunResult], float]:
    """Run one job per plan and return the results and the wall time. ``served``: long-lived children take
    the calls the model expects to run or to raise, a call it expects to be fatal a fresh child of its own;
    otherwise a fresh child per call. ``console``: one progress line per result, with calls/s and ETA."""
    lock = threading.Lock()
    done = [0]
    t0 = time.monotonic()

    def progress(i: int, r: RunResult) -> None:
        if console is None:
            return
        with lock:
            done[0] += 1
            rate = done[0] / max(time.monotonic() - t0, 1e-9)
            eta = (len(jobs) - done[0]) / rate
            msg = f": {r.message}" if r.message and not r.is_ok else ""
            console.print(f"kernel [{done[0]}/{len(jobs)}, {rate:.1f} calls/s, ETA {eta:.0f} s] call {i} "
                          f"({plans[i].call.summary()}): {r.outcome} in {r.elapsed_s:.2f} s{msg}",
                          markup=False, highlight=False)

    if served:
        fatal = [predicted_fatal(p) for p in plans]
        results = run_jobs_served(jobs, timeout, child, max_parallel, progress, alone=fatal.__getitem__)
    else:
        results = run_jobs(jobs, timeout, child, max_parallel, progress)
    return results, time.monotonic() - t0
