"""Human-readable rendering of reports (rich)."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape


def render_findings(findings, console: Console, indent: str = "  ") -> None:
    for f in findings:
        color = {"error": "red", "warning": "yellow"}.get(f.severity, "cyan")
        console.print(f"{indent}[bold {color}]{f.code}[/] {escape(f.message)}", markup=True)
        if f.subject:
            console.print(f"{indent}    on:    {f.subject}")
        if f.fix:
            console.print(f"{indent}    fix:   {f.fix}")
        if f.is_error and f.failure:
            console.print(f"{indent}    crash: {f.failure}")
        if f.source:
            console.print(f"{indent}    source: {f.source}", style="dim")


def render_report(report, payload: dict, console: Console) -> None:
    kind = payload.get("kind")
    if kind == "batch":
        from .batch import render_batch

        render_batch(report, payload, console)
        return
    for i, p in enumerate(report.plans):
        impl = p.implementation.name if p.implementation else "none"
        extra = f", num_sm_parts {p.num_sm_parts}" if p.num_sm_parts is not None else ""
        console.print(f"call {i}: {p.call.summary()} on {p.gpu.name} ({impl}{extra})")
    verdict = "[bold green]LEGAL[/]" if report.legal else "[bold red]ILLEGAL[/]"
    n_err = len(report.errors)
    console.print(f"verdict: {verdict}" + (f" - {n_err} limit(s) broken" if n_err else ""), markup=True)
    render_findings(report.findings, console)
