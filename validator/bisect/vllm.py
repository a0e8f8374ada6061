"""vLLM: its crash-time scheduler dump is the crashing step itself."""
from __future__ import annotations

from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..ingest.scan import LogEvidence
from .boundary import BisectChecker
from .evaluate import evaluate
from .results import Candidate, Diagnosis


def diagnose_vllm(ev: LogEvidence, cfg: EngineConfig, err: ErrorEvent | None, checker: BisectChecker,
                  notes: list[str]) -> Diagnosis:
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
    evaluate(c, checker, err)
    c.batch = {**(c.batch or {}), "vllm_step": c_batch}
    explained = c if c.is_illegal else None
    fixes = []
    if explained is not None and c.boundary and c.boundary.largest_legal:
        L = c.boundary.largest_legal
        fixes.append({"flag": "--max-num-batched-tokens", "value": L,
                      "why": f"caps the tokens of one step at {L} rows", "verified": checker(make(L)).legal})
    else:
        notes.append("the dumped step does not break a modelled limit")
    notes.append("engine: vLLM (crash-time scheduler dump)")
    return Diagnosis("vllm", ["flashmla-call"], err, False, "vLLM dumps the crashing step itself", [c], explained,
                     fixes, cfg, ev, None, notes)
