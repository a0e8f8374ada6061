"""Plain-text account of a report: verdict, every finding with its code, numbers and fix, the split."""
from __future__ import annotations

from .report import Report


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
    sp = report.safe_split
    if sp is not None:
        if not sp.possible:
            lines.append(f"safe split: none - {sp.reason}")
        else:
            if sp.steps is not None:
                lines.append(f"safe split: {len(sp.steps)} step(s), whole requests in order:")
                lines.extend(f"  step {i}: {', '.join(st)}" for i, st in enumerate(sp.steps, 1))
            elif sp.unchunked_reason:
                lines.append(f"safe split: {sp.unchunked_reason}")
            if sp.chunked_steps is not None and sp.steps is None:
                lines.append(f"chunked: {len(sp.chunked_steps)} step(s):")
                for i, st in enumerate(sp.chunked_steps, 1):
                    parts = [f"{c['id']}[{c['start']}:{c['start'] + c['tokens']}]" for c in st]
                    lines.append(f"  step {i}: {', '.join(parts)}")
        for st in sp.settings:
            lines.append(f"  prevent: {st['flag']} {st['value']} - {st['why']}")
    return "\n".join(lines)
