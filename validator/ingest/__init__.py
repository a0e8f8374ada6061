"""Reading crash evidence: engine logs (SGLang scheduler lines of every release, vLLM scheduler
dumps), SGLang crash dumps (restricted unpickling), launch commands and ``ServerArgs`` lines.
Error lines are read by one table of recognisers (:mod:`.recognisers`: a new error-line format
is a row there), the table kernel mode reads its children's output with too.

Nothing here judges a batch; :mod:`validate_batch.bisect` turns the evidence into candidate steps and
asks the checker.
"""
from __future__ import annotations

import io
import sys
from typing import Any, Iterable

from ..errors import InputError
from .crash_dump import CrashDump, read_crash_dump
from .launch import EngineConfig, entry_point, find_launch, parse_launch, parse_server_arg_overrides, unmarkdown
from .scan import LogEvidence, scan_file, scan_lines, scan_stream

__all__ = ["read_inputs", "build_config", "scan_file", "scan_lines", "read_crash_dump", "EngineConfig",
           "LogEvidence", "CrashDump"]


def _progress_scan(path: str, window: int, console: Any) -> LogEvidence:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("reading {task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=console, transient=True) as prog:
        task = prog.add_task(path, total=None)

        def tick(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)
        return scan_file(path, window, tick)


def read_inputs(log: str | None, dump: str | None, trust_pickle: bool = False, window: int = 64,
                progress_console: Any = None) -> tuple[LogEvidence | None, CrashDump | None]:
    """Scan the log (streaming) and read the crash dump. Raises :class:`InputError`."""
    evidence = None
    if log is not None:
        if log == "-":
            src = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else io.BytesIO(sys.stdin.read().encode())
            evidence = scan_stream(src, "<stdin>", window)
        elif progress_console is not None:
            evidence = _progress_scan(log, window, progress_console)
        else:
            evidence = scan_file(log, window)
    cdump = read_crash_dump(dump, trust=trust_pickle) if dump is not None else None
    return evidence, cdump


def build_config(evidence: LogEvidence | None, cdump: CrashDump | None, launch: str | None,
                 server_args: Iterable[str] = ()) -> EngineConfig:
    """Merge the settings, lowest precedence first: log (launch command < ServerArgs line), crash dump
    (launch_command < server_args), ``--launch``, ``--server-arg``."""
    cfg = EngineConfig()
    if evidence is not None:
        cfg.values.update(evidence.config.values)
        cfg.sources.update(evidence.config.sources)
        cfg.per_rank_chunk = evidence.config.per_rank_chunk
        cfg.engine = evidence.config.engine          # the engine its launch command / ServerArgs line names
        cfg.entry_point = evidence.config.entry_point
        cfg.notes.extend(evidence.config.notes)
    if cdump is not None:
        if cdump.launch_command:
            try:
                cfg.update(parse_launch(cdump.launch_command, "crash dump launch_command", cfg.notes),
                           "crash dump (launch_command)", per_rank_chunk=False)
            except InputError as e:
                cfg.notes.append(f"crash dump launch_command not read: {e}")
        if cdump.server_args:
            cfg.update(cdump.server_args, "crash dump (server_args)", per_rank_chunk=True)
        cfg.engine = cfg.engine or "sglang"
    if launch:
        vals = parse_launch(launch, "--launch", cfg.notes)
        if not vals and not cfg.notes:
            raise InputError("--launch", "no flags found in the launch command")
        cfg.update(vals, "--launch", per_rank_chunk=False)
        hit = find_launch(unmarkdown(launch))
        if hit is not None:
            cfg.engine = hit[0]
            cfg.entry_point = entry_point(unmarkdown(launch))
    overrides = parse_server_arg_overrides(server_args)
    if overrides:
        cfg.update(overrides, "--server-arg", per_rank_chunk=False)
    return cfg
