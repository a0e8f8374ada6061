"""Human output for engine batches: what the engine will do, what breaks, and how to split."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from .render_findings import render_findings


def render_batch(report, payload: dict, console: Console) -> None:
    bp = report.batch_plan
    b = bp.batch
    eng = ", ".join(f"{k}@{v}" for k, v in bp.versions.items())
    console.print(f"batch: {escape(b.label) + ' - ' if b.label else ''}{b.forward_mode} forward, "
                  f"{len(b.requests)} request(s), {len(b.running)} running elsewhere; {eng} on {b.gpu.name}")
    for prof in bp.profiles:
        for line in prof.summary_lines(bp):
            console.print(line)
    verdict = "[bold green]LEGAL[/]" if report.legal else "[bold red]ILLEGAL[/]"
    n_err = len(report.errors)
    console.print(f"verdict: {verdict}" + (f" - {n_err} limit(s) broken" if n_err else ""), markup=True)
    render_findings(report.findings, console)
    sp = report.safe_split
    if sp is None:
        return
    console.print("safe split:")
    if not sp.possible:
        console.print(f"  none: {sp.reason}")
    else:
        if sp.steps is not None:
            console.print(f"  {len(sp.steps)} step(s), whole requests in order:")
            for i, st in enumerate(sp.steps, 1):
                console.print(f"    step {i}: {', '.join(st)}")
        elif sp.unchunked_reason:
            console.print(f"  without chunking: impossible - {sp.unchunked_reason}")
        if sp.chunked_steps is not None:
            console.print(f"  {len(sp.chunked_steps)} step(s) with chunked prefill:")
            for i, st in enumerate(sp.chunked_steps, 1):
                desc = ", ".join(f"{c['id']}" + ("" if c.get("decode") else f"[{c['start']}:{c['start'] + c['tokens']}]") for c in st)
                console.print(f"    step {i}: {desc}")
    if sp.naive is not None:
        nv = sp.naive
        tail = (f"still crashes: {', '.join(nv['illegal_steps'])} alone break(s) the limit" if nv["crashes"] else "legal here")
        console.print(f"  naive guard ({nv['rule']}): {nv['steps']} step(s); {tail}")
    for s in sp.settings:
        console.print(f"  prevent: {s['flag']} {s['value']} - {s['why']}")
