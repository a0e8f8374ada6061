"""Plain-text account of a report: verdict, every finding with its code, numbers and fix, the split."""
from __future__ import annotations

from ..legality.report import Report
from .split_text import split_lines


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
    verdict = "legal" if report.legal else f"ILLEGAL ({len(report.errors)} limit(s) broken)"
    lines = [f"{what} is {verdict}" + (f": {', '.join(head)}" if head else "")]
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
