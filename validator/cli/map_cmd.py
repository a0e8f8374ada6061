"""The ``map`` subcommand: a legality map of one configuration over two axes, per build."""
from __future__ import annotations

from contextlib import contextmanager

import json
from pathlib import Path
from typing import List, Optional

import typer
from ..errors import InputError
from ..legality.map_axes import AXES, IMAGE_FORMATS, PAIRS
from ..output.writer import KERNEL_GEN_HELP, Output, kernel_option

HELP = """Map where a step is legal, falls back or crashes, over two axes, for a FlashMLA build.

Axis pairs (--x is searched exactly, one row per --y value): prefill_tokens x running_decodes
(running decodes are merged into the step under enable_mixed_chunk), requests x draft_tokens
(target verify), b x s_q (a kernel call record as template). Each row's region edges are found
by the boundary search over the full check and verified at the edge and one past it.

Examples:

* `validate-batch map --example dsv4-prefill-3x4096`

* `validate-batch map --example dsv4-prefill-3x4096 --across-builds -o map.png`

* `validate-batch map --engine sglang-dsv4@pre-25418 --server-arg enable_mixed_chunk=true --y-max 64 -o edges.csv`

* `validate-batch map --engine sglang-dsv4@post-25418 --server-arg speculative_num_draft_tokens=4 --x requests --y draft_tokens -o verify.json`

* `echo '{"kind": "sparse", "b": 8192, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}' | validate-batch map - --x b --y s_q`

Output by -o's extension: .png / .svg (needs matplotlib: pip install matplotlib, or from a checkout pip install '.[map]'),
.json, .csv (one line per region segment); without -o a character grid on the terminal.
Exit codes: 0 map written, 2 bad input, 4 internal error.
"""

GLYPH = {"legal": (".", "green"), "fallback": ("~", "yellow"), "illegal": ("X", "red")}


def _point(text: Optional[str]) -> Optional[tuple]:
    if text is None:
        return None
    try:
        x, y = (int(v) for v in text.split(","))
    except ValueError:
        raise InputError("--mark", f"expected X,Y (two integers), got {text!r:.40}") from None
    return (x, y)


def render_terminal(maps, console, columns: int = 64, rows: int = 16) -> None:
    from rich.text import Text

    """A coarse character grid per map (highest row value on top) and each row's edges."""
    for m in maps:
        console.print(Text(f"{m.build}: {m.x_axis} {m.x_range[0]}..{m.x_range[1]} (across) x {m.y_axis} (up)",
                           style="bold"))
        xs, cells = m.grid(columns)
        idx = list(range(len(cells))) if len(cells) <= rows else sorted({i * (len(cells) - 1) // (rows - 1)
                                                                          for i in range(rows)})
        for i in reversed(idx):
            y, line = m.rows[i].y, cells[i]
            t = Text(f"{y:>7} ")
            for s in line:
                g, style = GLYPH[s.kind]
                t.append(g, style=style)
            console.print(t)
        console.print(Text(f"{'':8}{xs[0]}" + f"{xs[-1]:>{max(1, len(xs) - len(str(xs[0])))}}"))
        seen = []
        for r in m.rows:
            desc = ", ".join(f"{s.start}..{s.end} {s.kind}" + (f" ({'+'.join(s.codes)})" if s.codes else "")
                             for s in r.segments)
            if not seen or seen[-1][1] != desc:
                seen.append((r.y, desc))
        for y, desc in seen[:6]:
            console.print(Text(f"  {m.y_axis}={y}: {desc}"))
        if len(seen) > 6:
            console.print(Text(f"  ... {len(seen) - 6} more row pattern(s): -o FILE.json has every row"))
        if m.seed:
            console.print(Text(f"  seed batch at {m.seed}: {_at(m, m.seed)}"))
        if m.point:
            console.print(Text(f"  your batch at {m.point}: {_at(m, m.point)}"))
    console.print(Text(". legal  ~ fallback (FMLA015, slow)  X illegal"))


def _at(m, p) -> str:
    try:
        s = m.verdict(*p)
    except KeyError:
        return "outside the map"
    return s.kind + (f" ({'+'.join(s.codes)})" if s.codes else "")


@contextmanager
def _progress(console, wanted: Optional[bool]):
    """A ``progress(done, total)`` callback for the map's rows: a bar on a terminal, else (when asked
    for with --progress) a line at every tenth of the rows; None when not wanted."""
    if wanted is False or (wanted is None and not console.is_terminal):
        yield None
        return
    if console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn  # noqa: PLC0415

        with Progress(TextColumn("map rows"), BarColumn(), MofNCompleteColumn(), console=console, transient=True) as bar:
            task = bar.add_task("map", total=None)
            yield lambda done, total: bar.update(task, completed=done, total=total)
        return
    shown = [0]

    def line(done: int, total: int) -> None:
        step = max(1, total // 10)
        if done == total or done - shown[0] >= step:
            shown[0] = done
            console.print(f"map: {done}/{total} rows", markup=False, highlight=False)

    yield line


def register(app) -> None:
    @app.command("map", help=HELP)
    def map_cmd(
        file: Optional[str] = typer.Argument(None, help="An engine batch or one call record (JSON/YAML; '-' = stdin)."),
        example: Optional[str] = typer.Option(None, "--example", help="A built-in example instead of FILE (e.g. dsv4-prefill-3x4096)."),
        engine: Optional[str] = typer.Option(None, "--engine", help="No batch: an engine profile, e.g. sglang-dsv4@pre-25418."),
        server_arg: List[str] = typer.Option([], "--server-arg", help="With --engine: engine flag KEY=VALUE (repeatable)."),
        x: str = typer.Option("prefill_tokens", "--x", help=f"Searched axis: {', '.join(a for a, _ in PAIRS)}."),
        y: str = typer.Option("running_decodes", "--y", help=f"Row axis: {', '.join(b for _, b in PAIRS)}."),
        x_min: Optional[int] = typer.Option(None, "--x-min", help="Lowest value of --x (default: the axis's own)."),
        x_max: Optional[int] = typer.Option(None, "--x-max", help="Highest value of --x (default: prefill tokens 24576, requests 4096, b 24576)."),
        y_min: Optional[int] = typer.Option(None, "--y-min", help="Lowest value of --y."),
        y_max: Optional[int] = typer.Option(None, "--y-max", help="Highest value of --y (default: running decodes 256, draft tokens 8, s_q 4)."),
        y_step: Optional[int] = typer.Option(None, "--y-step", help="Step between rows (default: at most 65 rows)."),
        mark: Optional[str] = typer.Option(None, "--mark", help="Also mark your own batch at X,Y."),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU profile (default: the batch's, else H200)."),
        kernel_gen: Optional[str] = typer.Option(None, "--build", "--kernel-gen", help=KERNEL_GEN_HELP),
        across_builds: bool = typer.Option(False, "--across-builds", help="The same map on every known FlashMLA build, side by side."),
        out_file: Optional[str] = typer.Option(None, "-o", "--output", help="Write .png, .svg, .json or .csv (by extension); none: the terminal."),
        progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Rows mapped so far, on stderr (default: when stderr is a terminal)."),
    ):
        from ..inputs.documents import example_path, load_documents
        from ..inputs.quick import batch_doc_from_flags
        from ..legality.maps import (boundary_csv, engine_source, legality_map, maps_across_builds, save_image,
                                     source_from_documents)

        output = Output()
        try:
            for name, flag in ((x, "--x"), (y, "--y")):
                if name not in AXES:
                    raise InputError(flag, f"unknown axis {name!r:.40}; axes: {', '.join(AXES)}")
            ext = out_file.rsplit(".", 1)[-1].lower() if out_file and "." in out_file else None
            if out_file is not None and ext not in IMAGE_FORMATS + ("json", "csv"):
                raise InputError("-o", f"expected a .png, .svg, .json or .csv file, got {out_file!r:.80}")
            kernel = kernel_option(kernel_gen, output)
            if engine is not None:
                if file or example:
                    raise InputError("--engine", "give a FILE, --example or --engine, not several")
                doc = batch_doc_from_flags(engine, "extend", "1", None, 0, 1024, None, server_arg, gpu)
                src = engine_source(engine, doc["server_args"], gpu)
            else:
                if example:
                    file = example_path(example)
                if file is None:
                    raise InputError("FILE", "give a batch file, '-' for stdin, --example NAME, or --engine PROFILE")
                src = source_from_documents(load_documents(file), gpu)
            kw = dict(x_min=x_min, x_max=x_max, y_min=y_min, y_max=y_max, y_step=y_step, point=_point(mark))
            with _progress(output.err_console, progress) as tick:
                maps = (maps_across_builds(src, x, y, progress=tick, **kw) if across_builds
                        else [legality_map(src, x, y, kernel_build=kernel, progress=tick, **kw)])
            if ext in IMAGE_FORMATS:
                save_image(maps, out_file)
            elif ext == "json":
                Path(out_file).write_text(json.dumps({"maps": [m.to_dict() for m in maps]}, indent=1) + "\n")
            elif ext == "csv":
                Path(out_file).write_text(boundary_csv(maps))
        except InputError as e:
            output.error(e)
        except OSError as e:
            output.fail(f"-o: cannot write {out_file}: {e.strerror}")
        if out_file is None:
            render_terminal(maps, output.console)
        else:
            output.err_console.print(f"wrote {out_file} ({len(maps)} map(s), {sum(m.checks for m in maps)} full checks)")
