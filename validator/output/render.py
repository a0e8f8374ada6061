"""Human-readable rendering of reports (through a console: rich, or its plain stand-in off a terminal)."""
from __future__ import annotations

from .render_batch import render_batch
from ..facts.provenance import one_line
from .render_findings import render_findings


def render_report(report, payload: dict, console) -> None:
    kind = payload.get("kind")
    if kind == "batch":
        render_batch(report, payload, console)
        return
    for i, p in enumerate(report.plans):
        impl = p.implementation.name if p.implementation else "none"
        extra = f", num_sm_parts {p.num_sm_parts}" if p.num_sm_parts is not None else ""
        console.print(f"call {i}: {p.call.summary()} on {p.gpu.name} ({impl}{extra})")
    verdict = "[bold green]LEGAL[/]" if report.legal else "[bold red]ILLEGAL[/]"
    n_err = len(report.errors)
    console.print(f"verdict: {verdict}" + (f" - {n_err} limit(s) broken" if n_err else ""), markup=True)
    render_findings(report.findings, console, provenance=report.provenance)
    console.print(one_line(report.provenance), style="dim" if not report.rests_on_read_facts else None)
