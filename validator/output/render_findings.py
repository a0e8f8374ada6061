"""The findings of a report, for people (through a console: rich, or its plain stand-in off a terminal)."""
from __future__ import annotations

from .plain import escape


def render_findings(findings, console, indent: str = "  ", provenance: dict | None = None) -> None:
    by_rule = (provenance or {}).get("rules", {})
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
        got = by_rule.get(f.code)
        if got is not None:
            console.print(f"{indent}    limit: {escape(got['says'])}", style="dim" if got["status"] != "read" else None)
