"""vLLM: its crash-time scheduler dump is the crashing step itself."""
from __future__ import annotations

from ..api import check
from ..errors import InputError
from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..ingest.scan import LogEvidence
from ..knowledge import load
from .boundary import BisectChecker
from .evaluate import evaluate
from .results import Candidate, Diagnosis


def vllm_profile(cfg: EngineConfig) -> str | None:
    """The vLLM profile the launch command names (``recognised_by`` in ``rules/engines.json``: the
    attention backend, or a model path naming the model family); None when not recognisable."""
    backend = str(cfg.get("attention_backend", "") or "").strip().lower()
    model = str(cfg.get("model_path", "") or "").lower()
    profiles = [(n, p.get("recognised_by", {})) for n, p in load("engines")["profiles"].items() if p.get("engine") == "vllm"]
    for name, rec in profiles:
        if backend and backend in rec.get("attention_backend", []):
            return name
    for name, rec in profiles:
        if model and any(m in model for m in rec.get("model_path", [])):
            return name
    return None


def profile_verdict(step, cfg: EngineConfig, profile: str, gpu, version: str | None) -> str:
    """The dumped step judged by a vLLM profile (at the release the log names), as one line of the
    diagnosis' basis."""
    sa = {k: cfg.get(k) for k in ("kv_cache_dtype", "tp_size", "num_speculative_tokens", "context_length")
          if cfg.get(k) is not None}
    reqs = [{"id": r.id, "extend_tokens": r.num_scheduled, "prefix_len": r.num_computed} for r in step.requests]
    try:
        engine = f"{profile}@{version}" if version else profile
        rep = check({"engine": engine, "gpu": gpu, "server_args": sa, "forward_mode": "extend", "requests": reqs},
                    split=False)
    except InputError as e:
        return f"{profile}: the dumped step cannot be judged by this profile ({e})"
    calls = ", ".join(f"{c['name']} b={c['call'].get('b', 1)} s_q={c['call']['s_q']}" for c in rep.context["kernel_calls"])
    verdict = "ILLEGAL (" + ", ".join(rep.codes) + ")" if not rep.legal else "legal"
    at = f" at vLLM {version}" if version else ""
    return f"judged by the {profile} profile{at} (vLLM's backend split): {verdict}; calls: {calls or 'none'}"


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
    profile = vllm_profile(cfg)
    if profile is not None:
        basis.append(profile_verdict(step, cfg, profile, checker.gpu or "H200", ev.engine_version))
        notes.append(f"vLLM profile: {profile} (from the log's settings)")
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
