"""Find a limit on the hardware by bisection, one child process per probe, next to the model's answer.

A *template* is a call record without the probed field (for ``--quantity b``: everything but ``b``).
The search keeps a known-legal value ``lo`` and a known-illegal value ``hi`` and probes up to
``max_parallel`` evenly spaced values between them per round (plain bisection when 1), until they are
adjacent. It does not assume monotonicity silently:

* the model's verdict is computed for every value of the range (cheap) and the result says whether
  the model itself predicts legality to be non-monotonic (the 32-bit o_accum limit is: whether the
  last partition splits a request depends on how b divides into partitions);
* the model's own first-illegal boundary (and, when non-monotonic, the first value where it predicts
  legality again) is probed in the first round with the end points, and the search runs below the
  lowest value measured illegal;
* every probe is reported with the model's prediction beside it, and any measured legal value above
  a measured illegal one is listed as non-monotonic evidence.

A template may carry ``use_legacy`` (sgl-flash-mla's kernel choice): it goes to every probe's child as
is and selects the build the model is planned for. A probe whose child printed the low-smem fallback
warning ran (legal), on the slower fallback kernel; the result counts those probes
(``measured.fallback``) and says so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ..api import check_plan
from ..errors import InputError
from ..flashmla.calls import call_from_record
from ..flashmla.plan import plan as make_plan
from ..facts.knowledge import resolve_gpu
from .check import call_record, gpu_from_device
from .outcome import RunResult
from .providers import detect
from .runner import DEFAULT_TIMEOUT_S, ChildSpec, run_jobs

MAX_MODEL_SCAN = 1 << 17          # values scanned exhaustively by the model
LIST_FIELDS = ("topk_length", "extra_topk_length", "seqlens")
LEGACY_KEY = "use_legacy"
DEFAULT_RANGES = {"b": (1, 16384), "s_q": (1, 1024), "topk": (64, 1 << 16), "extra_topk": (64, 1 << 16)}


@dataclass(frozen=True)
class Probe:
    """One measured value."""

    value: int
    verdict: str                 # legal | illegal | inconclusive
    outcome: str
    message: str = ""
    elapsed_s: float = 0.0
    model_verdict: str = ""
    model_codes: tuple = ()
    reason: str = "search"       # search | endpoint | model-boundary | model-legal-again
    fallback: dict | None = None  # the low-smem fallback warning the child printed, if any

    @property
    def agrees(self) -> bool | None:
        if self.verdict == "inconclusive" or not self.model_verdict:
            return None
        return self.verdict == self.model_verdict

    def to_dict(self) -> dict:
        return {"value": self.value, "verdict": self.verdict, "outcome": self.outcome, "message": self.message,
                "elapsed_s": round(self.elapsed_s, 3), "model_verdict": self.model_verdict,
                "model_codes": list(self.model_codes), "agrees": self.agrees, "reason": self.reason,
                "fallback_used": self.fallback is not None, "fallback": self.fallback}


def template_record(template: Any, quantity: str) -> dict:
    """Validate a template (JSON text or dict) for probing ``quantity``."""
    if isinstance(template, str):
        try:
            template = json.loads(template)
        except json.JSONDecodeError as e:
            raise InputError("--template", f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(template, dict):
        raise InputError("--template", f"expected a JSON object (a call record), got {type(template).__name__}")
    rec = {k: v for k, v in template.items() if k != LEGACY_KEY}
    if quantity == "b":
        for key in LIST_FIELDS:
            if rec.get(key) is not None:
                raise InputError(f"--template.{key}", "per-request lists have length b and cannot be probed over b")
    rec.pop(quantity, None)
    probe_value = DEFAULT_RANGES.get(quantity, (1, 2))[0]
    trial = dict(rec, **{quantity: probe_value})
    if "b" not in trial:
        trial["b"] = 1
    call_from_record(trial, "--template")   # raises InputError naming the field
    if not isinstance(trial.get(quantity), int):
        raise InputError("--quantity", f"{quantity!r} is not an integer field of the call")
    return rec


def template_use_legacy(template: Any) -> bool | None:
    """The template's ``use_legacy`` (None when it has none); JSON text or a dict."""
    if isinstance(template, str):
        try:
            template = json.loads(template)
        except json.JSONDecodeError:
            return None
    if not isinstance(template, dict) or template.get(LEGACY_KEY) is None:
        return None
    v = template[LEGACY_KEY]
    if not isinstance(v, bool):
        raise InputError(f"--template.{LEGACY_KEY}", f"expected true or false, got {v!r}")
    return v


def record_at(template: dict, quantity: str, value: int) -> dict:
    rec = dict(template)
    rec[quantity] = value
    return rec


def model_verdicts(template: dict, quantity: str, values: Iterable[int], gpu: Any, generation: str | None) -> dict:
    """``{value: (verdict, error codes)}`` from the model."""
    out = {}
    for v in values:
        p = make_plan(call_from_record(record_at(template, quantity, v)), gpu, generation)
        errors = [f.code for f in check_plan(p) if f.is_error]
        out[v] = ("illegal" if errors else "legal", tuple(dict.fromkeys(errors)))
    return out


@dataclass(frozen=True)
class ModelScan:
    """The model's verdict over a range: first illegal value, and whether legality comes back."""

    lo: int
    hi: int
    first_illegal: int | None
    legal_again: tuple = ()      # first values (up to 10) above first_illegal that the model calls legal
    codes_at_first_illegal: tuple = ()
    scanned: bool = True         # False when the range was too large to scan exhaustively

    @property
    def last_legal(self) -> int | None:
        if self.first_illegal is None:
            return self.hi
        return self.first_illegal - 1 if self.first_illegal > self.lo else None

    @property
    def monotonic(self) -> bool:
        return not self.legal_again

    def to_dict(self) -> dict:
        return {"range": [self.lo, self.hi], "first_illegal": self.first_illegal, "last_legal": self.last_legal,
                "codes_at_first_illegal": list(self.codes_at_first_illegal), "monotonic": self.monotonic,
                "legal_again": list(self.legal_again), "scanned_every_value": self.scanned}


def scan_model(verdict_of: Callable[[int], tuple], lo: int, hi: int) -> ModelScan:
    """Scan ``[lo, hi]`` with the model (exhaustively up to MAX_MODEL_SCAN values, else by bisection)."""
    if hi - lo + 1 <= MAX_MODEL_SCAN:
        first = None
        again: list[int] = []
        codes: tuple = ()
        for v in range(lo, hi + 1):
            verdict, c = verdict_of(v)
            if first is None:
                if verdict == "illegal":
                    first, codes = v, c
            elif verdict == "legal" and len(again) < 10:
                again.append(v)
        return ModelScan(lo, hi, first, tuple(again), codes)
    # Too many values: bisect the model too (monotonicity unknown, said so).
    if verdict_of(lo)[0] == "illegal":
        return ModelScan(lo, hi, lo, (), verdict_of(lo)[1], scanned=False)
    if verdict_of(hi)[0] == "legal":
        return ModelScan(lo, hi, None, (), (), scanned=False)
    a, b = lo, hi
    while b - a > 1:
        m = (a + b) // 2
        if verdict_of(m)[0] == "legal":
            a = m
        else:
            b = m
    return ModelScan(lo, hi, b, (), verdict_of(b)[1], scanned=False)


def spaced_points(lo: int, hi: int, k: int) -> list[int]:
    """Up to ``k`` distinct integers strictly between ``lo`` and ``hi``, evenly spaced."""
    inner = hi - lo - 1
    if inner <= 0:
        return []
    k = min(k, inner)
    pts = sorted({lo + (hi - lo) * (i + 1) // (k + 1) for i in range(k)})
    return [p for p in pts if lo < p < hi]


@dataclass(frozen=True)
class SearchResult:
    status: str                  # "found" | "lo_illegal" | "hi_legal" | "inconclusive"
    last_legal: int | None
    first_illegal: int | None
    measured: dict               # value -> (verdict, RunResult | None)


def bisect(lo: int, hi: int, measure: Callable[[Sequence[int], Any], dict], max_parallel: int = 1,
           seeds: dict | None = None) -> SearchResult:
    """Search ``[lo, hi]`` for adjacent values (legal, illegal); ``measure(values, reasons)`` -> {v: verdict}.

    The first round measures ``lo``, ``hi`` and the ``seeds`` (value -> reason, e.g. the model's own
    boundary) together. The search then runs below the *lowest* value measured illegal, from the
    highest value measured legal under it, so a failure that comes back and goes away again above
    (non-monotonic legality) cannot hide the first transition when a seed lands near it. Each round
    probes up to ``max_parallel`` points and keeps the lowest illegal point and the highest legal
    point below it. Inconclusive points are dropped; a round with only inconclusive points ends the
    search as ``inconclusive``.
    """
    first = {lo: "endpoint", hi: "endpoint"}
    for v, why in (seeds or {}).items():
        if lo < v < hi:
            first.setdefault(v, why)
    seen: dict[int, str] = dict(measure(list(first), first))
    if seen.get(lo) == "illegal":
        return SearchResult("lo_illegal", None, lo, seen)
    if seen.get(lo) != "legal":
        return SearchResult("inconclusive", None, None, seen)
    illegal = sorted(v for v, verdict in seen.items() if verdict == "illegal")
    if not illegal:
        status = "hi_legal" if seen.get(hi) == "legal" else "inconclusive"
        return SearchResult(status, hi if status == "hi_legal" else None, None, seen)
    b = illegal[0]
    a = max(v for v, verdict in seen.items() if verdict == "legal" and v < b)
    while b - a > 1:
        pts = spaced_points(a, b, max(1, max_parallel))
        got = measure(pts, "search")
        seen.update(got)
        decided = [p for p in pts if got.get(p) in ("legal", "illegal")]
        if not decided:
            return SearchResult("inconclusive", a, b, seen)
        bad = [p for p in decided if got[p] == "illegal"]
        if bad:
            b = min(bad)
        legal_below = [p for p in decided if got[p] == "legal" and p < b]
        if legal_below:
            a = max(a, max(legal_below))
    return SearchResult("found", a, b, seen)


def non_monotonic_pairs(probes: Sequence[Probe]) -> list[tuple[int, int]]:
    """(illegal value, legal value above it) pairs among measured probes; empty if monotonic."""
    ordered = sorted((p for p in probes if p.verdict in ("legal", "illegal")), key=lambda p: p.value)
    out = []
    lowest_illegal = None
    for p in ordered:
        if p.verdict == "illegal" and lowest_illegal is None:
            lowest_illegal = p.value
        elif p.verdict == "legal" and lowest_illegal is not None:
            out.append((lowest_illegal, p.value))
    return out


def fallback_summary(probes: Sequence[Probe]) -> dict:
    """How many probes ran on the low-smem fallback kernel, the lowest and highest such value, and the
    highest legal value measured without it below the lowest."""
    with_fb = sorted(p.value for p in probes if p.fallback is not None)
    if not with_fb:
        return {"probes": 0, "lowest": None, "highest": None, "highest_without": None, "text": None}
    below = [p.value for p in probes if p.fallback is None and p.verdict == "legal" and p.value < with_fb[0]]
    text = next(p.fallback.get("text") for p in probes if p.fallback is not None)
    return {"probes": len(with_fb), "lowest": with_fb[0], "highest": with_fb[-1],
            "highest_without": max(below) if below else None, "text": text}


def probe_boundary(template: Any, quantity: str = "b", lo: int | None = None, hi: int | None = None, *,
                   gpu: Any = "H200", provider: str = "auto", timeout: float = DEFAULT_TIMEOUT_S,
                   max_parallel: int = 1, child: ChildSpec | None = None, progress=None,
                   runner: Callable[[list[dict], int], list[RunResult]] | None = None) -> dict:
    """Measure the boundary of ``quantity`` for ``template`` on the GPU, beside the model's prediction.

    ``runner(jobs, max_parallel)`` may replace the child runner (tests). Returns a JSON-able dict; when
    kernel mode is unavailable, ``measured`` is ``{"available": false, "reason": ...}`` and the model
    part is still filled in.
    """
    tmpl = template_record(template, quantity)
    use_legacy = template_use_legacy(template)
    d_lo, d_hi = DEFAULT_RANGES.get(quantity, (1, 1 << 14))
    lo = d_lo if lo is None else lo
    hi = d_hi if hi is None else hi
    if lo < 0 or hi <= lo:
        raise InputError("--lo/--hi", f"expected 0 <= lo < hi, got lo={lo}, hi={hi}")
    g = resolve_gpu(gpu)
    result: dict[str, Any] = {"quantity": quantity, "template": tmpl, "range": [lo, hi]}
    if use_legacy is not None:
        result["use_legacy"] = use_legacy
    det = None
    generation = None
    if runner is None:
        det = detect(provider, child, timeout)
        if det.available:
            g = gpu_from_device(det.device, g)
            generation = det.provider.generation_for(use_legacy)
    result["gpu"] = g.to_dict()
    cache: dict[int, tuple] = {}

    def verdict_of(v: int) -> tuple:
        if v not in cache:
            cache.update(model_verdicts(tmpl, quantity, [v], g, generation))
        return cache[v]

    scan = scan_model(verdict_of, lo, hi)
    result["model"] = scan.to_dict()
    result["model_generation"] = generation
    if runner is None and not det.available:
        result["measured"] = {"available": False, "reason": det.reason}
        result["probes"] = []
        result["agree"] = None
        result["status"] = "unavailable"
        return result

    probes: dict[int, Probe] = {}
    inconclusive_reasons: dict[int, str] = {}

    def run_values(values: Sequence[int], reasons: Any) -> dict:
        values = [v for v in dict.fromkeys(values) if v not in probes]
        if not values:
            return {}
        jobs = []
        for v in values:
            rec = record_at(tmpl, quantity, v)
            call = call_from_record(rec)
            job = {"op": "decode" if call.kind != "prefill" else "prefill", "record": call_record(call)}
            if det is not None:
                job["provider"] = det.provider.to_job()
            if use_legacy is not None:
                job[LEGACY_KEY] = use_legacy
                job["record"][LEGACY_KEY] = use_legacy
            jobs.append(job)
        if runner is not None:
            results = runner(jobs, max_parallel)
        else:
            results = run_jobs(jobs, timeout, child, max_parallel)
        out = {}
        for v, r in zip(values, results):
            mv, codes = verdict_of(v)
            reason = reasons.get(v, "search") if isinstance(reasons, dict) else reasons
            p = Probe(v, r.verdict, r.outcome, r.message if not r.is_ok else r.payload.get("message", ""),
                      r.elapsed_s, mv, codes, reason, r.fallback)
            probes[v] = p
            if not r.is_conclusive:
                inconclusive_reasons[v] = f"{r.inconclusive_reason}: {r.message}" if r.message else r.inconclusive_reason
            out[v] = r.verdict
            if progress is not None:
                progress(p)
        return out

    seeds: dict[int, str] = {}
    if scan.first_illegal is not None and scan.first_illegal > lo:
        seeds[scan.first_illegal - 1] = "model-boundary"
        seeds[scan.first_illegal] = "model-boundary"
    if scan.legal_again:
        seeds[scan.legal_again[0]] = "model-legal-again"
    search = bisect(lo, hi, run_values, max_parallel, seeds)
    ordered = sorted(probes.values(), key=lambda p: p.value)
    pairs = non_monotonic_pairs(ordered)
    measured_pair = None
    if search.status == "found":
        measured_pair = [search.last_legal, search.first_illegal]
    decided = [p for p in ordered if p.agrees is not None]
    boundary_is_model_transition = None
    if measured_pair is not None:
        boundary_is_model_transition = (verdict_of(measured_pair[0])[0] == "legal"
                                        and verdict_of(measured_pair[1])[0] == "illegal")
    first_fail = probes.get(search.first_illegal) if search.first_illegal is not None else None
    result["measured"] = {
        "available": True,
        "status": search.status,
        "last_legal": search.last_legal,
        "first_illegal": search.first_illegal,
        "failure": first_fail.outcome if first_fail else None,
        "failure_message": first_fail.message if first_fail else None,
        "non_monotonic": [list(p) for p in pairs],
        "num_probes": len(ordered),
        "fallback": fallback_summary(ordered),
    }
    if det is not None:
        result["provider"] = det.provider.to_dict()
        result["device"] = det.device
    result["probes"] = [p.to_dict() for p in ordered]
    result["boundary_is_model_transition"] = boundary_is_model_transition
    result["agree"] = bool(decided) and all(p.agrees for p in decided) and bool(boundary_is_model_transition
                                                                              or search.status != "found")
    contradicted = any(p.agrees is False for p in decided) or boundary_is_model_transition is False
    if contradicted:
        result["status"] = "disagree"
    elif not decided or search.status == "inconclusive":
        result["status"] = "inconclusive"
        reasons = sorted({r for r in inconclusive_reasons.values() if r})
        result["measured"]["inconclusive_reasons"] = reasons
    else:
        result["status"] = "agree"
    notes = []
    if not scan.monotonic:
        notes.append(f"the model predicts legality is not monotonic in {quantity}: first illegal at "
                     f"{scan.first_illegal}, legal again at {', '.join(map(str, scan.legal_again[:5]))}; "
                     f"bisection finds one transition, so the model's boundary was probed as well")
    if not scan.scanned:
        notes.append(f"the range has more than {MAX_MODEL_SCAN} values: the model was bisected too, "
                     "so its monotonicity was not checked")
    span = hi - lo + 1
    if len(ordered) < span:
        notes.append(f"{len(ordered)} of {span} values were measured; legality between measured values is "
                     "inferred, not measured")
    fb = result["measured"]["fallback"]
    if fb["probes"]:
        notes.append(f"the low-smem fallback kernel ran in {fb['probes']} of {len(ordered)} probes "
                     f"({quantity} = {fb['lowest']}..{fb['highest']}"
                     + (f"; none at or below {fb['highest_without']}" if fb["highest_without"] is not None else "")
                     + "): those calls ran, slower, and are legal")
    if pairs:
        notes.append("measured legality is not monotonic: " + "; ".join(
            f"{quantity}={b} ran although {quantity}={a} failed" for a, b in pairs[:5]))
    result["notes"] = notes
    return result
