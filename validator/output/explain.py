"""Plain-text account of a report: verdict, every finding with its code, numbers and fix, the split."""
from __future__ import annotations

from ..legality.report import Report
from .split_text import split_lines


def chunk_lines(ctx) -> list[str]:
    """How the engine's chunked prefill entered the verdict: the steps it was judged as (and the
    forward's own verdict as one step), or the note that a step was judged as written."""
    es = ctx.get("engine_steps")
    out = []
    if es:
        marks = "; ".join(f"step {st['step']}: {st['query_rows']} rows "
                          + ("legal" if st["legal"] else "NOT MODELLED" if st.get("verdict") == "not_modelled"
                             else "ILLEGAL " + ", ".join(st["codes"])) for st in es["steps"])
        out.append(f"  judged as the engine runs it: {es['setting']} {es['chunk_size']} cuts the "
                   f"{es['requested_extend_tokens']} new tokens into {len(es['steps'])} steps ({marks})")
        aw = es.get("as_written")
        if aw is not None:
            out.append(f"  as written, one step of {aw['query_rows']} rows is "
                       + ("legal" if aw["legal"] else "ILLEGAL (" + ", ".join(aw["codes"]) + ")")
                       + ": as_written=True (as_written: true in the document, --as-written) judges it so")
    for note in ctx.get("notes") or ():
        if note.startswith("judged as one step, as written"):
            out.append(f"  {note}")
    return out


def explain(report: Report, what: str = "batch") -> str:
    """Plain-text account of a report: verdict, every finding with its code, numbers and fix, the split."""
    ctx = report.context or {}
    head = []
    if ctx.get("forward_mode"):
        head.append(f"{ctx['forward_mode']} forward")
    b = ctx.get("batch") or {}
    if "requests" in b:
        head.append(f"{b['requests']} request(s)")
    if ctx.get("query_rows") is not None:
        head.append(f"{ctx['query_rows']} query rows")
    if ctx.get("versions"):
        head.append(", ".join(f"{k} {v}" for k, v in ctx["versions"].items()))
    if b.get("gpu"):
        head.append(f"on {b['gpu']['name']}")
    verdict = ("legal" if report.legal else "NOT MODELLED" if report.verdict == "not_modelled"
               else f"ILLEGAL ({len(report.errors)} limit(s) broken)")
    lines = [f"{what} is {verdict}" + (f": {', '.join(head)}" if head else "")]
    for r in report.not_modelled:
        lines.append(f"  not modelled: {r['why']}: the engine runs {r['path']} ({r.get('source') or ''})")
    lines.extend(chunk_lines(ctx))
    for f in report.findings:
        subj = f" [{f.subject}]" if f.subject else ""
        lines.append(f"  {f.code} {f.severity}{subj}: {f.message}")
        if f.fix:
            lines.append(f"      fix: {f.fix}")
        if f.failure and f.is_error:
            lines.append(f"      on the GPU: {f.failure}")
    if report.safe_split is not None:
        lines.extend(split_lines(report.safe_split.to_dict()))
    return "\n".join(lines)
