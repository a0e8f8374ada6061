"""Whether a rule explains the crash: its signature must match the error line, and it must break on the
crashing step; the rest is said as it is ("also illegal, does not explain this error", "not explained").

Also here: when the log shows that a step completed (so it is never the crashing step).
"""
from __future__ import annotations

from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..ingest.scan import RankTimeline
from ..ingest.sglang_log import Step
from ..ingest.signatures import corroboration, matching, possible, why_not
from .results import Candidate, Explanation

LIBRARY_NAMES = {"flashinfer": "FlashInfer", "flashmla": "FlashMLA", "deepgemm": "DeepGEMM", "cutlass": "CUTLASS",
                 "fa3": "FlashAttention-3", "sglang": "SGLang", "vllm": "vLLM", "tvm-ffi": "TVM-FFI"}


def error_targets(err: ErrorEvent | None, build: str | None) -> tuple[set[str], list[dict]]:
    """The rule codes whose signature matches the error line, and those signatures, each with what the
    printed source line says about it (the version it fits, or another version's line)."""
    sigs = matching(err, build)
    ln = err.source_line if err is not None else None
    if ln is not None:      # of a rule's matching signatures, those whose recorded line the error shows
        fitting = {s.code for s in sigs if s.fits(ln)}
        sigs = [s for s in sigs if s.code not in fitting or s.fits(ln) or not s.ranges]
    return {s.code for s in sigs}, [{**s.to_dict(), "line": corroboration(s, err)} for s in sigs if err is not None]


def _other_version(sigs: list[dict]) -> str:
    """'; matches FI002's message at another version's line ...' when a matched signature's line is no
    recorded version's, else ''."""
    notes = list(dict.fromkeys(s["line"] for s in sigs if str(s.get("line", "")).startswith("matches ")))
    return ("; " + "; ".join(notes)) if notes else ""


def completed_reason(tl: RankTimeline, step: Step, cut: int | None, cfg: EngineConfig) -> str | None:
    """Why the log shows ``step`` (printed before its forward) completed, or None when it may still have run.

    With overlap scheduling SGLang schedules and launches the next batch before it processes the
    previous batch's result (sglang 0.5.23 srt/managers/scheduler.py:2061-2130, event_loop_overlap),
    so one later scheduler line does not prove the step finished; a second one does. With
    ``--disable-overlap-schedule`` one later line does."""
    later = [s for s in tl.steps if s.line_no > step.line_no and (cut is None or s.line_no < cut)]
    need = 1 if cfg.get("disable_overlap_schedule") is True else 2
    if len(later) < need:
        return None
    lines = ", ".join(str(s.line_no) for s in later[:4]) + (", ..." if len(later) > 4 else "")
    why = "" if need == 1 else " (with overlap scheduling the next batch starts before this one's result is read; a second line proves it)"
    return (f"{len(later)} later scheduler line(s) on {tl.rank} before the error (line {lines}): this step "
            f"completed{why}")


def _also(c: Candidate, codes: list[str], reason: str) -> dict:
    return {"rank": c.rank, "step": c.label, "codes": codes, "verdict": c.verdict,
            "at": c.value, "quantity": c.quantity, "reason": reason}


def build_explanation(cands: list[Candidate], explained: Candidate | None, err: ErrorEvent | None,
                      sigs: list[dict], build: str | None) -> Explanation:
    """The explanation of the crash from the judged candidates and the error's signature matches."""
    sig_rules = list(dict.fromkeys(s["rule"] for s in sigs))
    also: list[dict] = []
    for c in cands:
        if not c.is_illegal:
            continue
        if c.completed:
            also.append(_also(c, list(c.codes), f"completed before the error: {c.completed}; not the crashing step"))
            continue
        if err is None:
            also.append(_also(c, list(c.codes), "no error line to match: not confirmed as the crash"))
            continue
        if c is not explained and c.explains:
            other = f" ({explained.rank}: {explained.label})" if explained is not None else ""
            also.append(_also(c, list(c.explains), "breaks a rule whose signature matches the error, but another "
                                                   f"candidate fits the evidence better{other}"))
        rest = [x for x in c.codes if x not in c.explains]
        if rest:
            also.append(_also(c, rest, "also illegal, does not explain this error (" + "; ".join(
                f"{x}: {why_not(x, err, build)}" for x in rest) + ")"))
    recog = err.recognised() if err is not None else None
    maybe = possible(err)
    if err is None:
        status, summary = "no_error", "no error line: nothing to explain; the verdicts are for the last steps logged"
    elif explained is not None:
        status = "explained"
        verb = "explains" if len(explained.explains) == 1 else "explain"
        summary = (f"{', '.join(explained.explains)} {verb} the error on line {err.line_no}: the signature matches "
                   f"and the rule breaks on {explained.label}" + _other_version(sigs))
        if explained.deduction:
            summary += ("; this is a deduction from the error's numbers and the settings, not read from the log ("
                        + "; ".join(a for a in explained.assumptions if a.startswith("assumption: index")) + ")")
    else:
        status = "not_explained"
        lib = LIBRARY_NAMES.get(str(err.owner or (recog or {}).get("library")), "")
        what = f"{lib} {err.kind}".strip() if lib else err.kind
        where = f" at {err.file}:{err.source_line}" if err.file and err.source_line is not None else (
            f" in {err.file}" if err.file else "")
        if sig_rules:
            summary = (f"not explained: the error ({what}{where}) has the signature of {', '.join(sig_rules)}, but no "
                       "reconstructed step breaks it" + _other_version(sigs))
        elif err.numbers.get("prose"):
            summary = (f"not explained: line {err.line_no} only describes an error in prose "
                       f"({str(err.numbers.get('report', ''))[:120]!r}): low-confidence evidence, matched by no rule's "
                       "signature")
        elif err.numbers.get("cut_off"):
            summary = (f"not explained: the error line is cut off ({err.numbers.get('path_fragment', '')!r}); no rule's "
                       "signature can be confirmed" + (f" (the visible part fits {', '.join(maybe)})" if maybe else ""))
        else:
            summary = f"not explained: no rule's signature matches the error ({what}{where}, failure {err.failure or 'unknown'})"
    return Explanation(status, list(explained.explains) if explained is not None else [], sig_rules, sigs, maybe,
                       recog, also, summary)
