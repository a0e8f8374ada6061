"""vLLM: its crash-time scheduler dump is the crashing step itself; which engine a log comes from."""
from __future__ import annotations

from ..ingest.crash_dump import CrashDump
from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..ingest.scan import LogEvidence
from ..knowledge import load
from .boundary import BisectChecker
from .data import in_model_family, vllm_profile_for
from .evaluate import evaluate
from .explain import build_explanation
from .results import Candidate, Diagnosis


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
    name = vllm_profile_for(str(cfg.get("model_path", "") or ""), in_model_family)
    if name in load("engines")["profiles"]:
        return (f"vLLM log: engine profile {name} applies to this model; a scheduler dump is still checked as "
                "FlashMLA calls (pass --engine to judge a batch document with the profile)")
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
    c = Candidate("DP0", "vllm", f"the step vLLM dumped at line {step.line_no} (the crashing step)", "query rows",
                  rows, rows, rows, step.complete, basis, make, None, [None])
    c_batch = {"requests": [r.to_dict() for r in step.requests]}
    evaluate(c, checker, targets)
    c.batch = {**(c.batch or {}), "vllm_step": c_batch}
    explained = c if c.is_illegal and c.matches_error else None
    fixes = []
    if explained is not None and c.boundary and c.boundary.largest_legal:
        L = c.boundary.largest_legal
        fixes.append({"flag": "--max-num-batched-tokens", "value": L,
                      "why": f"caps the tokens of one step at {L} rows", "verified": checker(make(L)).legal})
    elif not c.is_illegal:
        notes.append("the dumped step does not break a modelled limit")
    notes.append("engine: vLLM (crash-time scheduler dump)")
    d = Diagnosis("vllm", ["flashmla-call"], err, False, "vLLM dumps the crashing step itself", [c], explained,
                  fixes, cfg, ev, None, notes)
    d.explanation = build_explanation([c], explained, err, sigs, build)
    return d
