"""Human output for engine batches: what the engine will do, what breaks, and how to split."""
from __future__ import annotations

import os

from ..facts.provenance import one_line
from .plain import escape
from .render_findings import render_findings
from .split_text import piece, split_lines, step_items, wrapped


def as_written_line(aw: dict) -> str:
    """What the forward would be judged as one step (a chunked document's ``as_written``)."""
    mark = _mark(aw)
    return (f"as written (one step of {aw['query_rows']} rows, as a guard that sees it dispatched judges it): "
            f"{mark}; --as-written (as_written: true in the document) judges it so")


def _mark(st: dict) -> str:
    if st.get("verdict") == "not_modelled":
        return "NOT MODELLED"
    return "legal" if st["legal"] else "ILLEGAL " + ", ".join(st["codes"])


def render_batch(report, payload: dict, console) -> None:
    bp = report.batch_plan
    b = bp.batch
    eng = ", ".join(f"{k}@{v}" for k, v in bp.versions.items())
    console.print(f"batch: {escape(b.label) + ' - ' if b.label else ''}{b.forward_mode} forward, "
                  f"{len(b.requests)} request(s), {len(b.running)} running elsewhere; {eng} on {b.gpu.name}")
    for j in payload.get("judged_as") or ():
        as_ = j["release"] or j["version"]
        console.print(f"  judged as: {escape(j['profile'])} {escape(as_)}"
                      + (f" (entry {escape(j['version'])})" if as_ != j["version"] else "")
                      + f" - {escape(j['basis'])}; kernel build {escape(j['kernel_build'])} ({escape(j['kernel_build_basis'])})")
    for note in payload.get("notes") or ():
        console.print(f"  note: {escape(note)}")
    es = payload.get("engine_steps")
    if es:
        console.print(f"  as the engine runs it: {es['setting']} {es['chunk_size']} cuts the "
                      f"{es['requested_extend_tokens']} new tokens into {len(es['steps'])} steps; each is checked:")
        for st in es["steps"]:
            mark = _mark(st)
            shown = "  <- shown below" if st["step"] == es["shown_step"] else ""
            console.print(f"    step {st['step']}: {escape(step_items([piece(c) for c in st['pieces']], 'pieces'))} - "
                          f"{st['query_rows']} rows - {mark}{shown}")
        aw = es.get("as_written")
        if aw is not None:
            console.print(f"  {as_written_line(aw)}")
    for prof in bp.profiles:
        for line in prof.summary_lines(bp):
            console.print(line)
    verdict = ("[bold green]LEGAL[/]" if report.legal else "[bold yellow]NOT MODELLED[/]"
               if report.verdict == "not_modelled" else "[bold red]ILLEGAL[/]")
    n_err = len(report.errors)
    for r in report.not_modelled:
        console.print(f"  not modelled: {escape(r['why'])}: the engine runs {escape(r['path'])} "
                      f"({escape(r.get('source') or '')})")
    chunked = f" (as the engine's {len(es['steps'])} chunk steps)" if es else ""
    console.print(f"verdict: {verdict}{chunked}" + (f" - {n_err} limit(s) broken" if n_err else ""), markup=True)
    render_findings(report.findings, console, provenance=report.provenance)
    console.print(one_line(report.provenance), style="dim" if not report.rests_on_read_facts else None)
    if report.safe_split is not None:
        width = console.width if console.is_terminal or os.environ.get("COLUMNS") else None
        for line in wrapped(split_lines(report.safe_split.to_dict()), width):
            console.print(line)
