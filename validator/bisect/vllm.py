"""vLLM: its crash-time scheduler dump is the crashing step itself; which engine a log comes from."""
from __future__ import annotations

from ..errors import InputError
from ..ingest.crash_dump import CrashDump
from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..ingest.scan import LogEvidence
from ..facts.knowledge import load
from ..engines import resolve_version
from .boundary import BisectChecker
from .data import in_model_family, vllm_profile_for
from .candidates import evaluate
from .attribution import build_explanation
from .results import Candidate, Diagnosis

#: the settings a vLLM profile reads, passed from the log's configuration
PROFILE_SETTINGS = ("kv_cache_dtype", "tp_size", "num_speculative_tokens", "context_length")


def vllm_profile(cfg: EngineConfig) -> str | None:
    """The vLLM profile the launch command names (``recognised_by`` in ``rules/engines.json``: the
    attention backend, or a model path naming the model family); None when not recognisable."""
    backend = str(cfg.get("attention_backend", "") or "").strip().lower()
    model = str(cfg.get("model_path", "") or "").lower()
    profiles = [(n, p.get("recognised_by", {})) for n, p in load("engines")["profiles"].items()
                if p.get("engine") == "vllm"]
    for name, rec in profiles:
        if backend and backend in rec.get("attention_backend", []):
            return name
    for name, rec in profiles:
        if model and any(m in model for m in rec.get("model_path", [])):
            return name
    return None


def _profile_engine(profile: str, version: str | None) -> tuple[str | None, str]:
    """``(engine spec, why not)``: the profile at the log's release, or None with the reason."""
    try:
        resolve_version(profile, version)
    except InputError as e:
        return None, (f"{profile} has no version for vLLM {version} ({e.message}): the dump is judged by the raw "
                      f"row model")
    return (f"{profile}@{version}" if version else profile), ""


def profile_candidate(step, cfg: EngineConfig, engine: str) -> Candidate:
    """The dumped step as a batch of the vLLM profile ``engine``: the backend's own reorder, split
    and calls. The varying quantity is the step's tokens, grown or shrunk in its largest request."""
    sa = {k: cfg.get(k) for k in PROFILE_SETTINGS if cfg.get(k) is not None}
    reqs = [{"id": r.id, "extend_tokens": r.num_scheduled, "prefix_len": r.num_computed} for r in step.requests]
    rows = step.total_rows
    big = max(range(len(reqs)), key=lambda i: reqs[i]["extend_tokens"])
    base = rows - reqs[big]["extend_tokens"]

    def make(v: int, version: str | None = None) -> dict:
        rs = [dict(r) for r in reqs]
        rs[big]["extend_tokens"] = max(v - base, 1)
        return {"engine": engine, "server_args": sa, "forward_mode": "extend", "requests": rs,
                "label": f"vLLM step with {base + rs[big]['extend_tokens']} scheduled tokens"}

    dec = sum(1 for r in step.requests if r.is_decode)
    basis = [f"line {step.line_no}: SchedulerOutput with {len(step.requests)} request(s) ({dec} decoding), "
             f"{rows} scheduled tokens",
             f"judged by the {engine} profile: the backend's reorder and split, its decode and prefill calls "
             f"(settings: {', '.join(f'{k}={v}' for k, v in sa.items()) or 'defaults'})"] + list(step.notes)
    return Candidate("DP0", "vllm", f"the step vLLM dumped at line {step.line_no} (the crashing step)", "query rows",
                     base + 1, rows, rows, step.complete, basis, make, None, [None])


def engine_of(ev: LogEvidence | None, cfg: EngineConfig, dump: CrashDump | None) -> tuple[str | None, str]:
    """The engine that wrote the evidence, and where that comes from: the log's own format (its
    scheduler lines, vLLM's line format or scheduler dump) outranks a launch command."""
    log_engine = ev.engine if ev is not None else None
    cmd = cfg.engine
    if log_engine and cmd and log_engine != cmd:
        return log_engine, (f"engine: {log_engine}, from the log's line format (the launch command given is "
                            f"{cmd}'s: the log decides)")
    if log_engine:
        return log_engine, ""
    if cmd:
        return cmd, f"engine: {cmd}, from the launch command"
    return ("sglang" if dump is not None else None), ""


def vllm_profile_note(cfg: EngineConfig) -> str:
    """Which vLLM engine profile judges this model, and whether this build has it."""
    name = vllm_profile(cfg) or vllm_profile_for(str(cfg.get("model_path", "") or ""), in_model_family)
    if name in load("engines")["profiles"]:
        return (f"vLLM log: engine profile {name} applies to this model (a scheduler dump of a release it models "
                "is judged by it; other dumps as FlashMLA calls)")
    return (f"vLLM log: judged with the vLLM profile {name} when it is present; this build has no such profile, so a "
            "scheduler dump is checked as FlashMLA calls and nothing else of the log is judged")


def diagnose_vllm_without_dump(ev: LogEvidence | None, cfg: EngineConfig, err: ErrorEvent | None, notes: list[str],
                               sigs: list[dict], build: str | None) -> Diagnosis:
    """A vLLM log with no SchedulerOutput dump: vLLM logs no per-step composition, so there is no step to
    reconstruct; what the error line says is reported."""
    notes.append(vllm_profile_note(cfg))
    notes.append("no SchedulerOutput dump in the log: vLLM prints the crashing step only there, so no step is judged")
    d = Diagnosis("vllm", [], err, False, "vLLM log without a scheduler dump", [], None, [], cfg, ev, None, notes)
    d.explanation = build_explanation([], None, err, sigs, build)
    return d


def diagnose_vllm(ev: LogEvidence, cfg: EngineConfig, err: ErrorEvent | None, checker: BisectChecker,
                  notes: list[str], targets: set[str], sigs: list[dict], build: str | None) -> Diagnosis:
    """vLLM's dump IS the crashing step; its rows are checked as one FlashMLA call with b = total
    scheduled tokens (vLLM's FP8 sparse MLA runs a whole mixed batch through the decode kernel)."""
    step = ev.vllm_steps[-1]
    rows = step.total_rows
    h_q = 64
    topk = 2048

    def make(v: int, version: str | None = None) -> dict:
        rec = {"kind": "sparse", "b": max(v, 1), "s_q": 1, "h_q": h_q, "d_qk": 512, "topk": topk,
               "label": f"vLLM step with {v} scheduled tokens"}
        return rec
    dec = sum(1 for r in step.requests if r.is_decode)
    basis = [f"line {step.line_no}: SchedulerOutput with {len(step.requests)} request(s) ({dec} decoding), "
             f"{rows} scheduled tokens" + (f" (total_num_scheduled_tokens={step.total_num_scheduled_tokens})"
                                           if step.total_num_scheduled_tokens is not None else ""),
             f"checked as one FlashMLA sparse decode call with b = {rows} rows (s_q 1, h_q {h_q}, topk {topk}): "
             "vLLM's FP8 sparse MLA treats the whole batch as decode rows"]
    basis += step.notes
    profile = vllm_profile(cfg)
    if profile is not None:
        notes.append(f"vLLM profile: {profile} (from the log's settings)")
        engine, why = _profile_engine(profile, ev.engine_version)
        if engine is None:
            notes.append(why)
        else:
            return _diagnosis(profile_candidate(step, cfg, engine), ev, cfg, err, checker, notes, targets, sigs, build)
    c = Candidate("DP0", "vllm", f"the step vLLM dumped at line {step.line_no} (the crashing step)", "query rows",
                  rows, rows, rows, step.complete, basis, make, None, [None])
    return _diagnosis(c, ev, cfg, err, checker, notes, targets, sigs, build)


def _diagnosis(c: Candidate, ev: LogEvidence, cfg: EngineConfig, err: ErrorEvent | None, checker: BisectChecker,
               notes: list[str], targets: set[str], sigs: list[dict], build: str | None) -> Diagnosis:
    """Judge the dumped step's candidate, its boundary and the token cap that keeps it legal."""
    step = ev.vllm_steps[-1]
    make = c.make
    c_batch = {"requests": [r.to_dict() for r in step.requests]}
    evaluate(c, checker, targets)
    c.batch = {**(c.batch or {}), "vllm_step": c_batch}
    explained = c if c.is_illegal and c.matches_error else None
    fixes = []
    if explained is not None and c.boundary and c.boundary.largest_legal:
        L = c.boundary.largest_legal
        fixes.append({"flag": "--max-num-batched-tokens", "value": L,
                      "why": f"caps the tokens of one step at {L} rows", "verified": checker(make(L)).legal})
    elif explained is not None:
        notes.append("the step's token count is not what breaks the limit (see the findings and the safe split)")
    elif not c.is_illegal:
        notes.append("the dumped step does not break a modelled limit")
    notes.append("engine: vLLM (crash-time scheduler dump)")
    d = Diagnosis("vllm", ["flashmla-call"], err, False, "vLLM dumps the crashing step itself", [c], explained,
                  fixes, cfg, ev, None, notes)
    d.explanation = build_explanation([c], explained, err, sigs, build)
    return d
