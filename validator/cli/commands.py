"""The bodies of the commonest commands, ``check``, ``metadata`` and ``rules``, and their direct path.

Nothing here imports typer or rich at module level: the console script (:mod:`validate_batch.cli.main`)
runs the common forms of these commands straight from here (:func:`direct_call`), without typer's
parsing and without loading the other commands. Each command loads the rooms it runs when it runs.
:mod:`validate_batch.cli.app` declares the same commands' options for typer (their flags and help) and
calls these functions; the two declarations of each parameter's default are held equal by the
tests. A command ends by raising :class:`SystemExit` with its exit code (0 legal, 1 illegal, 2 bad
input, 3 kernel mode unavailable, 5 a verdict resting on read facts).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

from . import config
from ..errors import InputError
from ..facts.limits import echo
from ..output.safe import clean
from ..output.writer import EXIT_BAD_INPUT, EXIT_READ_FACTS, Output, kernel_option

EXIT_LEGAL, EXIT_ILLEGAL = 0, 1


def _drained(items: list) -> Any:
    """The items in order, each dropped from the list as it is handed out (a call's schedule and rows
    go once it is written)."""
    for i in range(len(items)):
        item, items[i] = items[i], None
        yield item


def metadata(file: str, gpu: Optional[str] = None, build: Optional[str] = None, as_json: bool = False,
             quiet: bool = False, reference: bool = False, rows: int = 16, output_format: Optional[str] = None,
             select: Optional[str] = None, ignore: Optional[str] = None, stats: bool = False,
             output_file: Optional[str] = None) -> None:
    """``validate-batch metadata``: what FlashMLA's scheduler writes for each call record of ``file``."""
    from ..api import check_plan
    from ..flashmla.calls import calls_from_records
    from ..flashmla.plan import plan as make_plan
    from ..inputs.streaming import CallRecords
    from ..output import formats
    from ..output.formats import SCHEMA_VERSIONS, render_statistics
    from .session import split_device_header

    output = Output.for_flags(as_json, quiet, output_format, output_file)
    out = None
    if output.mode == "human":
        from rich.markup import escape
        from rich.table import Table

        from ..output.render_findings import render_findings

        out = output.console
    try:
        cfg = config.resolve({"gpu": gpu, "build": build, "select": select, "ignore": ignore})
        gpu, build, select, ignore = cfg["gpu"], cfg["build"], cfg["select"], cfg["ignore"]
        sel, ign = formats.parse_codes(select, "--select"), formats.parse_codes(ignore, "--ignore")
    except InputError as e:
        output.error(e)
    try:
        build = kernel_option(build, output)
        # JSON Lines: every record is checked by a first pass over the input, and planned again one at
        # a time while writing; any other input is read whole. Either way a bad record is found first.
        records = CallRecords(file, gpu, build)
        if records.streamed:
            plans = records.plans()
        else:
            docs, g = split_device_header(records.docs, gpu)
            del records
            if not docs:
                raise InputError("FILE", "no call records")
            calls = calls_from_records(docs)
            del docs                    # the records' lists, once every call is validated
            plans = _drained([make_plan(c, g, build) for c in calls])
            del calls
    except InputError as e:
        _fail_input(output, e, file)
    any_illegal = False
    units = []
    counts: dict = {}
    for i, p in enumerate(plans):
        findings = [f for f in check_plan(p) if formats.selected(f.code, sel, ign)]
        for f in findings:
            counts[f.code] = counts.get(f.code, 0) + 1
        legal = not any(f.is_error for f in findings)
        any_illegal |= not legal
        if output.is_ci:
            units.append({"file": file, "name": f"{file} call {i}", "status": "legal" if legal else "illegal",
                          "findings": [f.to_dict() for f in findings], "error": None})
            continue
        if output.is_quiet:
            continue
        sch = p.reference_schedule() if reference else p.schedule
        if output.mode in ("json", "jsonl"):
            output.json({
                "schema": SCHEMA_VERSIONS["metadata"],
                "index": i,
                "implementation": p.implementation.name if p.implementation else None,
                "num_sm_parts": p.num_sm_parts,
                "tile_scheduler_metadata": p.metadata_in_layout(sch).tolist() if sch is not None else None,
                "num_splits": sch.num_splits.tolist() if sch is not None else None,
                "legal": legal,
                "findings": [f.to_dict() for f in findings],
            })
            continue
        verdict = "[green]legal[/]" if legal else "[red]ILLEGAL[/]"
        out.print(f"[bold]call {i}[/]: {escape(p.call.summary())} on {escape(p.gpu.name)} -> {verdict}", markup=True)
        if p.implementation is None:
            out.print("  no implementation is selected: the kernel does not get as far as scheduling")
        else:
            out.print(f"  implementation {p.implementation.name}, num_sm_parts = {p.num_sm_parts} "
                      f"({p.implementation.parts_formula}), fixed overhead {p.fixed_overhead} blocks")
            out.print(f"  scheduler shared memory {p.sched_smem_bytes} B of {p.gpu.smem_optin} B; "
                      f"split-KV workspace {p.workspace_bytes} B")
        if sch is None:
            if p.is_decode:
                out.print("  no metadata: the scheduler would not run (see findings)")
        else:
            short = {"begin_req": "b_req", "end_req": "e_req", "begin_block": "b_blk", "end_block": "e_blk",
                     "begin_split": "b_split", "first_splitted": "f_spl", "last_splitted": "l_spl"}
            layout = p.gen.get("row_layout", [])
            t = Table("part", *(short[c] for c in layout))
            md = p.metadata_in_layout(sch)
            for r in range(min(rows, md.shape[0])):
                t.add_row(str(r), *(str(int(v)) for v in md[r, :len(layout)]))
            out.print(t)
            if md.shape[0] > rows:
                out.print(f"  ... {md.shape[0] - rows} more partitions (use --rows {md.shape[0]} or --json for all)")
            ns = sch.num_splits
            shown = ns[: min(len(ns), 24)].tolist()
            more = f" ... ({len(ns)} values; --json for all)" if len(ns) > 24 else ""
            out.print(f"  num_splits = {shown}{more}; split requests: {sch.num_split_events} extra pieces, "
                      f"largest split row {sch.max_split_row}")
        render_findings(findings, out)
    if output.is_ci:
        output.write(formats.render(output.mode, units))
    if stats and not output.is_quiet:
        render_statistics(dict(sorted(counts.items())), out if output.mode == "human" else output.err_console)
    raise SystemExit(EXIT_ILLEGAL if any_illegal else EXIT_LEGAL)


def check(file: Optional[list[str]] = None, gpu: Optional[str] = None, build: Optional[str] = None,
          example: Optional[str] = None, as_json: bool = False, across_builds: bool = False, quiet: bool = False,
          run_kernel: bool = False, engine: Optional[str] = None, mode: str = "extend", extend: Optional[str] = None,
          prefix: Optional[str] = None, decodes: int = 0, seq_len: int = 1024, slots: Optional[str] = None,
          server_arg: tuple = (), env: tuple = (), exit_zero: bool = False, strict_provenance: bool = False,
          reproduce: bool = False, output_format: Optional[str] = None, select: Optional[str] = None,
          ignore: Optional[str] = None, stats: bool = False, recursive: bool = False,
          output_file: Optional[str] = None, as_written: bool = False) -> None:
    """``validate-batch check``: the verdict for call records, an engine batch (a file, ``--example``,
    or a quick batch from flags) or a corpus of files."""
    from ..facts.modes import Mode
    from ..inputs.documents import example_path
    from ..inputs.quick import batch_doc_from_flags
    from ..legality.pipeline import check_batch_document
    from ..output import formats
    from ..output.formats import SCHEMA_VERSIONS, render_statistics
    from .session import check_documents

    output = Output.for_flags(as_json, quiet, output_format, output_file)
    files = [file] if isinstance(file, str) else list(file or [])
    quick = engine is not None or extend is not None or decodes != 0
    try:
        # flags, then VALIDATE_BATCH_* variables, then [tool.validate-batch] in pyproject.toml
        cfg = config.resolve({"gpu": gpu, "build": build, "select": select, "ignore": ignore, "engine": engine})
        gpu, build, select, ignore = cfg["gpu"], cfg["build"], cfg["select"], cfg["ignore"]
        default_engine = cfg["engine"]
        if quick:
            engine = default_engine
        sel, ign = formats.parse_codes(select, "--select"), formats.parse_codes(ignore, "--ignore")
    except InputError as e:
        output.error(e)
    if quick and engine is None:
        output.fail("--engine: a quick batch (--extend, --decode) needs an engine profile "
                    "(--engine, VALIDATE_BATCH_ENGINE or [tool.validate-batch] engine)")
    if engine is None:
        # the quick-batch flags describe a batch made from flags: with a file or an example they would
        # be ignored silently (a document gives its own server_args, env and requests)
        given = [flag for flag, on in (("--mode", mode != Mode.EXTEND.value), ("--extend", extend is not None),
                                       ("--prefix", prefix is not None), ("--decode", decodes != 0),
                                       ("--seq-len", seq_len != 1024), ("--slots", slots is not None),
                                       ("--server-arg", bool(server_arg)), ("--env", bool(env))) if on]
        if given:
            output.fail(f"{given[0]}: a quick-batch flag, read only with --engine; a batch file gives its own "
                        "forward mode, requests, server_args and env")
    if files and engine is None and example is None and (len(files) > 1 or os.path.isdir(files[0])):
        if run_kernel or reproduce or across_builds:
            output.fail("--kernel, --reproduce and --across-builds check one file, not a directory or several files")
        try:
            build = kernel_option(build, output)
        except InputError as e:
            output.error(e)
        raise SystemExit(check_corpus(files, gpu, build, output, sel, ign, stats, exit_zero, recursive,
                                      default_engine, as_written))
    if len(files) > 1:
        output.fail("FILE: a quick batch (--engine) or --example is checked alone, without FILE arguments")
    file = files[0] if files else None
    try:
        build = kernel_option(build, output)
        if engine is not None:
            doc = batch_doc_from_flags(engine, mode, extend, prefix, decodes, seq_len, slots, server_arg, gpu, env)
            if as_written:
                doc["as_written"] = True

            def run(k):
                return check_batch_document(doc, gpu=gpu, build=k)
        else:
            if example:
                file = example_path(example)
            if file is None:
                raise InputError("FILE", "give a file, '-' for stdin, --example NAME, or a quick batch with --engine")

            def run(k):
                return check_documents(file, gpu, k, default_engine, as_written)
        report, payload = run(build)
        filter_findings(report, sel, ign)
        matrix = across(run, report, payload) if across_builds else None
        repro = None
        if reproduce:
            from ..kernel_mode.reproduce import reproduce_slot_findings

            repro = reproduce_slot_findings(report)
        kernel_result = None
        if run_kernel:
            from ..kernel_mode.check import kernel_check_report

            kernel_result = kernel_check_report(report, console=output.err_console)
    except InputError as e:
        _fail_input(output, e, name_of(file, engine, example))
    name = name_of(file, engine, example)
    if output.mode in ("json", "jsonl"):
        report.kernel, report.reproduction, report.across_builds = kernel_result, repro, matrix
        counts = formats.statistics([{"findings": [f.to_dict() for f in report.findings]}]) if stats else None
        output.json(report.document(SCHEMA_VERSIONS["report"], counts))
    elif output.is_ci:
        unit = report_unit(name, report)
        output.write(formats.render(output.mode, [unit]))
        if stats:
            render_statistics(formats.statistics([unit]), output.err_console)
    elif not output.is_quiet:
        from ..output.render import render_report

        out = output.console
        render_report(report, payload, out)
        if matrix is not None:
            render_across(matrix, out)
        for rp in repro or []:
            if not rp.get("available"):
                out.print(f"reproduction: skipped - {rp['reason']}")
            else:
                out.print(f"reproduction (PyTorch, CPU): {rp['buffer']} {rp['dtype']}{rp['shape']}, {rp['operation']} "
                          f"with indices {rp['index']} -> {rp.get('error_type', '')}: {rp['error'] or 'no error'}")
        if kernel_result is not None:
            from ..kernel_mode.check import render_kernel_result

            render_kernel_result(kernel_result, out)
        if stats:
            render_statistics(formats.statistics([{"findings": [f.to_dict() for f in report.findings]}]), out)
    if kernel_result is not None:
        from .kernel_cmd import check_kernel_exit_code

        raise SystemExit(check_kernel_exit_code(report.legal, kernel_result, exit_zero))
    if report.verdict == "not_modelled":
        raise SystemExit(not_modelled_exit(report, output))
    if strict_provenance and report.rests_on_read_facts:
        raise SystemExit(strict_provenance_exit(report, output))
    raise SystemExit(EXIT_LEGAL if report.legal or exit_zero else EXIT_ILLEGAL)


def not_modelled_exit(report, output: Output) -> int:
    """A step on a path the profiles do not model: its report is written as any other, then the one
    line on stderr (``error: FIELD: not modelled: ...``, with where the engine's source says so); exit 2."""
    e = report.refusal()
    print(f"error: {clean(' '.join(str(e).split()))} ({clean(e.source or '')})", file=sys.stderr)
    return EXIT_BAD_INPUT


def strict_provenance_exit(report, output: Output) -> int:
    """``--strict-provenance``: one line on stderr naming the read facts behind the verdict; exit 5."""
    read = report.read_facts_behind_verdict()
    codes = sorted({c for r in read for c in r["rules"]})
    builds = sorted({r["build"] for r in read})
    verdict = "legal" if report.legal else "illegal"
    output.err_console.print(
        f"strict provenance: the {verdict} verdict rests on {len(read)} fact(s) not measured on "
        f"{', '.join(builds)} (rules {', '.join(codes)}); --json lists them under provenance.read_facts",
        markup=False, highlight=False)
    return EXIT_READ_FACTS


def name_of(file: Optional[str], engine: Optional[str], example: Optional[str]) -> str:
    """What the CI formats call the checked input: the file, ``example:NAME`` or ``-`` (a quick batch)."""
    return "-" if engine is not None else ("example:" + example if example else (file or "-"))


def _fail_input(output: Output, e: InputError, name: Optional[str]) -> None:
    """Bad input: in the github, junit and sarif formats also one bad-input unit on stdout; then the
    one line on stderr and exit 2."""
    from ..output import formats

    if output.is_ci and name:
        output.write(formats.render(output.mode, [formats.bad_input_unit(name, e)]))
    output.error(e)


def filter_findings(report, select: list[str], ignore: list[str]) -> None:
    """Keep only the findings of the selected rule codes (``--select`` / ``--ignore``); the verdict
    follows them. The safe split was computed with every rule."""
    from ..output import formats

    if select or ignore:
        report.findings = [f for f in report.findings if formats.selected(f.code, select, ignore)]


def report_unit(name: str, report) -> dict:
    """A checked file as a unit of the CI formats (a step on a path not modelled is a bad-input unit, as a
    configuration refused as not modelled is)."""
    from ..output import formats

    if report.verdict == "not_modelled":
        e = report.refusal()
        unit = formats.bad_input_unit(name, e)
        unit["error"] = f"{unit['error']} ({e.source})" if e.source else unit["error"]
        return unit
    return {"file": name, "name": name, "status": "legal" if report.legal else "illegal",
            "findings": [f.to_dict() for f in report.findings], "error": None}




CORPUS_SUFFIXES = (".yaml", ".yml", ".json", ".jsonl")


def corpus_files(directory: str, recursive: bool = False, skipped: Optional[list] = None) -> list[str]:
    """The batch and call-record files of a directory, sorted by path. Symlinked directories are not
    entered; a symlink, FIFO or other entry that is not a regular file inside the tree, and a
    directory that cannot be read, is listed in ``skipped`` as ``(path, why)`` instead of read."""
    found = []
    skipped = [] if skipped is None else skipped
    top = os.path.realpath(directory)

    def unreadable(e: OSError) -> None:
        skipped.append((e.filename or directory, f"cannot be read ({e.strerror or e})"))

    for root, dirs, names in os.walk(directory, onerror=unreadable):
        dirs.sort()
        for n in names:
            if not n.lower().endswith(CORPUS_SUFFIXES):
                continue
            path = os.path.join(root, n)
            real = os.path.realpath(path)
            if os.path.islink(path) and not os.path.exists(path):
                skipped.append((path, "a dangling symlink"))
            elif not os.path.isfile(path):
                skipped.append((path, "not a regular file"))
            elif os.path.commonpath([top, real]) != top:
                skipped.append((path, "a symlink out of the directory"))
            else:
                found.append(path)
        if not recursive:
            break
    return sorted(found)


def check_corpus(inputs, gpu, build, output: Output, select: list[str], ignore: list[str],
                 stats: bool, exit_zero: bool, recursive: bool = False, engine: Optional[str] = None,
                 as_written: bool = False) -> int:
    """Corpus mode: check every file of ``inputs`` (a directory, or a list of files and directories,
    each directory's files sorted); a bad file is listed with its one-line error and the others are
    still checked. Returns the exit code: 2 any bad input, 1 any illegal, else 0."""
    from ..output import formats
    from ..output.formats import SCHEMA_VERSIONS, render_statistics

    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    files = []
    skipped: list = []
    for item in inputs:
        if os.path.isdir(item):
            found = corpus_files(item, recursive, skipped)
            if not found:
                output.fail(f"FILE: no *.yaml, *.yml, *.json or *.jsonl files in directory {echo(item)}")
            files.extend(found)
        else:
            files.append(item)      # a missing or unreadable file is that file's bad input
    for path, why in skipped:
        output.err_console.print(f"skipped {clean(path)}: {why}", markup=False)
    directory = inputs[0] if len(inputs) == 1 else " ".join(inputs)
    units, reports = [], []
    from .session import check_documents

    for path in files:
        try:
            report, _ = check_documents(path, gpu, build, engine, as_written)
        except InputError as e:
            units.append(formats.bad_input_unit(path, e))
            reports.append(None)
            continue
        filter_findings(report, select, ignore)
        units.append(report_unit(path, report))
        reports.append(report.document(SCHEMA_VERSIONS["report"]))
    counts = formats.statistics(units)
    if output.mode == "json":
        doc = {"schema": SCHEMA_VERSIONS["corpus"], "directory": directory, "inputs": inputs,
               "files": [{"file": u["file"], "status": u["status"],
                          "codes": sorted({f["code"] for f in u["findings"]}), "error": u["error"], "report": r}
                         for u, r in zip(units, reports)],
               "summary": {k: sum(u["status"] == k for u in units) for k in ("legal", "illegal", "bad_input")}}
        doc["summary"]["files"] = len(units)
        if stats:
            doc["statistics"] = counts
        output.json(doc, default=str)
    elif output.mode == "jsonl":
        output.write(formats.jsonl([r if r is not None else
                                    {"schema": SCHEMA_VERSIONS["report"], "file": u["file"], "bad_input": True,
                                     "error": u["error"]} for u, r in zip(units, reports)]))
    elif output.is_ci:
        output.write(formats.render(output.mode, units))
        if stats:
            render_statistics(counts, output.err_console)
    elif not output.is_quiet:
        from rich.table import Table
        from rich.text import Text

        out = output.console
        t = Table("file", "verdict", "rules", title=f"{len(units)} file(s) in {directory}" if len(inputs) == 1
                  and os.path.isdir(inputs[0]) else f"{len(units)} file(s)")
        style = {"legal": "green", "illegal": "red", "bad_input": "yellow"}
        for u in units:
            rules = (u["error"] or "") if u["status"] == "bad_input" else \
                ", ".join(sorted({f["code"] for f in u["findings"]})) or "-"
            word = {"legal": "legal", "illegal": "ILLEGAL", "bad_input": "bad input"}[u["status"]]
            t.add_row(Text(clean(u["file"]), overflow="fold"), Text(word, style=style[u["status"]]), Text(clean(rules)))
        out.print(t)
        n = {k: sum(u["status"] == k for u in units) for k in ("legal", "illegal", "bad_input")}
        out.print(f"{len(units)} file(s): {n['legal']} legal, {n['illegal']} illegal, {n['bad_input']} bad input")
        for u in units:
            if u["error"]:
                out.print(f"error: {u['file']}: {u['error']}")
        if stats:
            render_statistics(counts, out)
    return formats.exit_code(units, exit_zero)


def across(run, report, payload) -> list[dict]:
    """One verdict per known build for the same input; ``runs_here`` marks the build the check used."""
    from ..facts.knowledge import build_names, build_record

    used = payload.get("kernel_build") or (report.plans[0].gen["build"] if report.plans else None)
    rows = []
    for name in build_names():
        rep = report if name == used else run(name)[0]
        errors = sorted({f.code for f in rep.findings if f.is_error})
        warnings = sorted({f.code for f in rep.findings if f.severity == "warning"})
        if rep.legal:
            outcome = "legal, falls back (slow)" if "FMLA015" in warnings else "legal"
        elif errors == ["FMLA013"]:
            outcome = "cannot run on this GPU"
        elif rep.verdict == "not_modelled":
            outcome = "not modelled"
        else:
            outcome = "illegal"
        rows.append({"build": name, "legal": rep.legal, "errors": errors, "warnings": warnings, "outcome": outcome,
                     "status": build_record(name).get("status", ""), "runs_here": name == used})
    return rows


def render_across(matrix: list[dict], out) -> None:
    from rich.table import Table
    from rich.text import Text

    t = Table("build", "verdict", "rules", title="the same input on every known FlashMLA build")
    for r in matrix:
        style = "red" if not r["legal"] else ("yellow" if r["warnings"] else "green")
        t.add_row(Text(("* " if r["runs_here"] else "  ") + r["build"], overflow="fold"), Text(r["outcome"], style=style),
                  ", ".join(r["errors"] + r["warnings"]) or "-")
    out.print(t)
    out.print("* the build this check judged by (named with --build, or the one the engine version ships); "
              "`validate-batch builds` says what is measured and what is read from source or binary")

def crash_kinds(entry: dict) -> tuple:
    """A catalog entry's failure kinds, read back through the rule's own :class:`Failure`."""
    from ..legality.failure import Failure

    fc = entry["failure_class"]
    return Failure(fc["kind"], also=tuple(fc.get("also", ()))).kinds


def rules_cmd(as_json: bool = False) -> None:
    """``validate-batch rules``: every rule code with its severity, title and how it crashes. A fresh
    process lists the shipped catalog (:mod:`validate_batch.legality.catalog`) without loading the
    rules; to a terminal it is a rich table, elsewhere one whole line per rule."""
    from ..legality.catalog import current

    output = Output.for_flags(as_json)
    entries = current()
    if output.is_json:
        output.json(entries)
        return
    if output.renders_plain:      # (the title last: the one cell that runs long)
        from ..output.plain import columns

        output.write(columns(("code", "severity", "crash class", "title"),
                             [(e["code"], e["severity"], " or ".join(crash_kinds(e)), e["title"]) for e in entries]))
    else:
        from rich.table import Table

        t = Table("code", "severity", "title", "crash class")
        for e in entries:
            t.add_row(e["code"], e["severity"], e["title"], " or ".join(crash_kinds(e)))
        output.result(t)
    output.result("`validate-batch explain CODE` prints a rule's page.")


# The commonest invocations run from here, without typer's parsing (whose conversion of every
# parameter loads pydantic) and without the other commands: `check` and `metadata` with at most one
# FILE, and `rules`, with the options of the table below, each given once as separate words. Anything
# else (other options, --help, --opt=value, a repeated option, --) goes through typer
# (:mod:`validate_batch.cli.app`); the two paths give the same output and exit code
# (tests/test_cli_direct.py).
_DIRECT_COMMON = {"--json": ("as_json", False), "--quiet": ("quiet", False), "-q": ("quiet", False),
                  "--gpu": ("gpu", True), "--build": ("build", True), "--kernel-gen": ("build", True),
                  "--output-format": ("output_format", True), "-f": ("output_format", True),
                  "--select": ("select", True), "--ignore": ("ignore", True), "--statistics": ("stats", False),
                  "--output-file": ("output_file", True)}
#: per command: its function and the options the direct path reads, word -> (parameter, whether a
#: value follows); any other word that does not start with "-", or "-" itself, is the FILE
DIRECT_COMMANDS = {"check": (check, {**_DIRECT_COMMON, "--example": ("example", True), "--exit-zero": ("exit_zero", False),
                                     "--strict-provenance": ("strict_provenance", False),
                                     "--as-written": ("as_written", False), "--across-builds": ("across_builds", False),
                                     "--recursive": ("recursive", False), "-r": ("recursive", False)}),
                   "metadata": (metadata, _DIRECT_COMMON),
                   "rules": (rules_cmd, {"--json": ("as_json", False)})}


def _direct_words(words: list[str], options: dict) -> dict | None:
    """``{parameter: value}`` of the words after the command, read by the table (None: typer reads them)."""
    given: dict = {}
    it = iter(words)
    for w in it:
        opt = options.get(w)
        if opt is None:
            if w != "-" and w.startswith("-"):
                return None
            name, value = "file", w
        else:
            name, takes_value = opt
            value = True
            if takes_value:
                value = next(it, None)
                if value is None or value.startswith("-"):
                    return None
        if name in given:
            return None
        given[name] = value
    return given


def direct_call(argv: list[str]):
    """``(command function, keyword arguments)`` for an invocation the direct path takes, else None:
    the words read by :data:`DIRECT_COMMANDS`, every other parameter at its default."""
    if not argv or argv[0] not in DIRECT_COMMANDS:
        return None
    fn, options = DIRECT_COMMANDS[argv[0]]
    given = _direct_words(argv[1:], options)
    if given is None:
        return None
    code = fn.__code__                  # (its parameters, read without loading inspect)
    names = code.co_varnames[:code.co_argcount]
    defaults = dict(zip(names[len(names) - len(fn.__defaults__ or ()):], fn.__defaults__ or ()))
    if not given.keys() <= set(names):
        return None                   # a word the command does not take (a FILE to `rules`): typer says so
    kwargs = {}
    for name in names:
        if name in given:
            kwargs[name] = given[name]
            continue
        if name not in defaults:
            return None               # a required argument is missing: typer says so
        d = defaults[name]
        kwargs[name] = list(d) if isinstance(d, tuple) else d
    return fn, kwargs


def run_direct(fn, kwargs: dict) -> None:
    """Run a command found by :func:`direct_call` and exit with its code; an unexpected exception
    exits 4 with one line on stderr."""
    try:
        fn(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the last resort: anything not handled is a bug
        sys.exit(Output().internal(exc))
    sys.exit(0)
