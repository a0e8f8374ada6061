"""The ``validate-batch`` commands (typer) and their direct path; :mod:`validate_batch.cli.main` runs them.
Results go to stdout, diagnostics to stderr.

Exit codes: 0 legal, 1 illegal, 2 bad input (one line naming the field), 4 internal error (one line;
``VALIDATE_BATCH_DEBUG=1`` adds the traceback). Kernel mode adds 3 (unavailable here);
``--strict-provenance`` adds 5 (the verdict rests on a fact that is not measured on its build).
"""
from __future__ import annotations

import inspect
import os
import signal
import sys
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from . import bisect_cmd as cli_bisect, config, helptext, kernel_cmd as cli_kernel, map_cmd as cli_map
from ..output import formats
from ..api import check_plan
from ..errors import InputError
from ..flashmla.calls import calls_from_records
from ..flashmla.plan import plan as make_plan
from ..flashmla.plan import fast_rows_limit, sched_smem_formula
from ..output.formats import SCHEMA_VERSIONS, render_statistics
from ..inputs.documents import example_path
from ..facts.knowledge import build_record, build_names, generation, gpu_by_name, gpu_names, load
from ..facts.limits import echo
from ..engines.versions import release_key
from ..facts.modes import Mode
from ..output.safe import clean
from ..output.writer import (  # noqa: F401 (the exit codes)
    DEBUG_ENV,
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_READ_FACTS,
    EXIT_UNAVAILABLE,
    KERNEL_GEN_HELP,
    OUTPUT_FORMAT_HELP,
    Output,
    kernel_option,
)
from ..legality.pipeline import check_batch_document
from ..inputs.quick import batch_doc_from_flags
from ..output.render import render_report
from ..output.render_findings import render_findings
from ..kernel_mode.reproduce import reproduce_slot_findings
from ..legality.ruleset import all_rules, get_rule
from ..legality.standing import build_counts, rule_standing, worst
from .session import check_documents, split_device_header
from .version import version_line
from ..inputs.streaming import CallRecords

helptext.apply()      # FILE, INT, TEXT in --help (not {file}, <int>, <list[str]>, <bool>)

app = typer.Typer(
    name="validate-batch",
    add_completion=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode="markdown",
    help=(
        "Is this batch legal for the attention kernels? Which limit does it break, with the numbers and "
        "the source, and how should it be split?\n\n"
        "Examples:\n\n"
        "* `validate-batch check --example dsv4-prefill-3x4096`\n\n"
        "* `validate-batch metadata --json fixtures/oracle/flashmla_h200_cases.jsonl`\n\n"
        "* `echo '{\"kind\": \"sparse\", \"b\": 12288, \"s_q\": 1, \"h_q\": 64, \"d_qk\": 512, \"topk\": 512}' | validate-batch check -`\n\n"
        "* `validate-batch check --engine sglang-dsv4@pre-25418 --extend 3x4096 --decode 1`\n\n"
        "* `validate-batch bisect server.log` (which step crashed, which rule, the boundary)\n\n"
        "* `validate-batch check batches/ --output-format github` (every batch of a directory, as GitHub annotations)\n\n"
        "* `validate-batch probe -q b -t '{\"kind\": \"sparse\", \"s_q\": 1, \"h_q\": 64, \"d_qk\": 512, \"topk\": 128}'` (on a GPU)\n\n"
        "* `validate-batch rules` / `validate-batch explain FMLA001` / `validate-batch gpus`\n\n"
        "Exit codes: 0 legal, 1 illegal, 2 bad input, 3 kernel mode unavailable, 4 internal error.\n\n"
        "Also runs as `python -m validate_batch` (not `python -m validator`: that name is an unrelated PyPI package). "
        "Settings: flags, then VALIDATE_BATCH_* variables, then [tool.validate-batch] in pyproject.toml."
    ),
)

EXIT_LEGAL, EXIT_ILLEGAL = 0, 1


def _version(value: bool) -> None:
    if value:
        print(version_line())
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and whether the compiled helpers are in use, then exit."),
    debug: bool = typer.Option(False, "--debug", help="On an internal error (exit 4), print the traceback too."),
) -> None:
    """Is this batch legal for the attention kernels?"""
    if debug:
        os.environ[DEBUG_ENV] = "1"


GPU_HELP = "GPU profile name (H100-SXM, H800, H20, H200, B200, GB200, ...) or raw numbers 'num_sms=132,cc=9.0,smem_optin=232448'. Overrides a device header in the input."


def _drained(items: list) -> Any:
    """The items in order, each dropped from the list as it is handed out (a call's schedule and rows
    go once it is written)."""
    for i in range(len(items)):
        item, items[i] = items[i], None
        yield item


@app.command()
def metadata(
    file: str = typer.Argument(..., help="Call record(s): a JSON object, a JSON array, or JSON Lines ('-' = stdin). A first line with only device fields is a device header."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help=GPU_HELP),
    build: Optional[str] = typer.Option(None, "--build", "--kernel-gen", help=KERNEL_GEN_HELP),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per call, in input order."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No output; the exit code is the verdict."),
    reference: bool = typer.Option(False, "--reference", help="Compute with the plain reference loop instead of the fast path."),
    rows: int = typer.Option(16, "--rows", help="Human mode: partitions shown per call (the rest are counted, never dropped silently)."),
    output_format: Optional[str] = typer.Option(None, "--output-format", "-f", help=OUTPUT_FORMAT_HELP + "; json and jsonl: one object per call"),
    select: Optional[str] = typer.Option(None, "--select", help="Only these rule codes count (comma-separated; prefixes allowed)."),
    ignore: Optional[str] = typer.Option(None, "--ignore", help="Rule codes (or prefixes) whose findings are dropped."),
    stats: bool = typer.Option(False, "--statistics", help="At the end, the number of findings per rule code (on stderr in the machine formats)."),
    output_file: Optional[str] = typer.Option(None, "--output-file", help="Write the results to this file instead of stdout (diagnostics stay on stderr)."),
):
    """Compute what FlashMLA's scheduler would write for each call: num_sm_parts, tile_scheduler_metadata, num_splits.

    Examples:

    * `validate-batch metadata --json fixtures/oracle/flashmla_h200_cases.jsonl`

    * `echo '{"kind": "dense", "b": 4, "s_q": 2, "h_q": 128, "seqlens": [10, 0, 100, 7]}' | validate-batch metadata -`
    """
    output = Output.for_flags(as_json, quiet, output_format, output_file)
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
    raise typer.Exit(EXIT_ILLEGAL if any_illegal else EXIT_LEGAL)


@app.command()
def check(
    file: Optional[list[str]] = typer.Argument(None, help="Call record(s) or an engine batch (JSON/JSONL/YAML; '-' = stdin); or several files, or a directory (every *.yaml, *.yml, *.json, *.jsonl in it, sorted): corpus mode, one verdict per file."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help=GPU_HELP),
    build: Optional[str] = typer.Option(None, "--build", "--kernel-gen", help=KERNEL_GEN_HELP),
    example: Optional[str] = typer.Option(None, "--example", help="Check a built-in example instead of FILE (e.g. dsv4-prefill-3x4096)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable verdict: legal, findings, calls, safe_split."),
    across_builds: bool = typer.Option(False, "--across-builds", help="Also judge the same input by every known FlashMLA build: one verdict each (crash, fallback, fine)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No output; the exit code is the verdict."),
    run_kernel: bool = typer.Option(False, "--kernel", help="Also run the real FlashMLA kernels (needs a GPU and a FlashMLA build) and diff them with the model."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Quick batch without a file: engine profile, e.g. sglang-dsv4@pre-25418 or vllm-flashmla-sparse (validate-batch engines lists them)."),
    mode: str = typer.Option("extend", "--mode", help="Quick batch: forward mode (extend, decode, mixed, target_verify, draft_extend)."),
    extend: Optional[str] = typer.Option(None, "--extend", help="Quick batch: new tokens per request, e.g. 4096,4096,4096 or 3x4096."),
    prefix: Optional[str] = typer.Option(None, "--prefix", help="Quick batch: cached prefix per request (one value for all, or one each)."),
    decodes: int = typer.Option(0, "--decode", help="Quick batch: running decode requests (or, with --mode decode, the batch size)."),
    seq_len: int = typer.Option(1024, "--seq-len", help="Quick batch: sequence length of decode requests."),
    slots: Optional[str] = typer.Option(None, "--slots", help="Quick batch: req_pool_idx per request, comma-separated."),
    server_arg: list[str] = typer.Option([], "--server-arg", help="Quick batch: engine flag KEY=VALUE (repeatable), e.g. enable_mixed_chunk=true."),
    env: list[str] = typer.Option([], "--env", help="Quick batch: engine environment switch NAME=VALUE as set in the environment (repeatable), e.g. SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=0."),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even when the batch is illegal (bad input still exits 2)."),
    strict_provenance: bool = typer.Option(False, "--strict-provenance", help="Exit 5 when the verdict rests on a fact read from source or a binary rather than measured on the build (an illegal verdict: the broken rules' facts; a legal one: every rule's)."),
    reproduce: bool = typer.Option(False, "--reproduce", help="For slot findings, build the real buffers with PyTorch on the CPU and do the engine's index (needs torch)."),
    output_format: Optional[str] = typer.Option(None, "--output-format", "-f", help=OUTPUT_FORMAT_HELP),
    select: Optional[str] = typer.Option(None, "--select", help="Only these rule codes count (comma-separated; a prefix such as SLOT selects a family). The findings are filtered after the check: the safe split still considers every rule."),
    ignore: Optional[str] = typer.Option(None, "--ignore", help="Rule codes (or prefixes) whose findings are dropped after the check; the safe split still considers every rule."),
    stats: bool = typer.Option(False, "--statistics", help="At the end, the number of findings per rule code."),
    recursive: bool = typer.Option(False, "--recursive", "-r", help="Corpus mode: also the files in subdirectories."),
    output_file: Optional[str] = typer.Option(None, "--output-file", help="Write the results to this file instead of stdout (diagnostics stay on stderr)."),
    as_written: bool = typer.Option(False, "--as-written", help="Judge an engine batch as one step, as written, even where the engine's chunked prefill would cut it into several steps (the default judges those steps and shows both)."),
):
    """Verdict for kernel calls or an engine batch. Exit 0 legal, 1 illegal, 2 bad input or a step the
    engine runs on a kernel the profile does not model ("not modelled": the report says which, stderr
    one line), 5 (with --strict-provenance) the verdict rests on a fact read from source or a binary,
    not measured.

    With --kernel: 1 also when the kernel disagrees, 3 when the batch is legal but the kernel could not
    confirm it (kernel mode unavailable, or every call inconclusive).

    Examples:

    * `validate-batch check --example dsv4-prefill-3x4096`

    * `validate-batch check batch.yaml --json`

    * `validate-batch check --engine sglang-dsv4@pre-25418 --extend 3x4096 --decode 1`

    * `validate-batch check --engine sglang-dsv4@pre-25418 --extend 4096,4096,4096 --decode 1 --server-arg enable_mixed_chunk=true`

    * `validate-batch check --engine vllm-dsv4 --mode target_verify --decode 2906 --server-arg speculative_num_draft_tokens=4 --server-arg num_speculative_tokens=3`

    * `validate-batch check --engine sglang-dsv4@0.5.23 --extend 11640 --env SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=0 --build flashmla-9241ae3`

    * `validate-batch check --engine sglang-dsv4@pre-25418 --extend 20000,3000 --server-arg chunked_prefill_size=16384` (checked as the engine's chunk steps)

    * `validate-batch check --example pd-decode-slot-96 --reproduce`

    * `validate-batch check --example dsv4-prefill-3x4096 --across-builds`

    * `validate-batch check --example dsv4-prefill-3x4096 --build sgl-flash-mla-1.0.0`

    * `validate-batch check --example dsv4-prefill-3x4096 --strict-provenance` (exit 5 unless every fact behind the verdict was measured on the build)

    * `echo '{"kind": "sparse", "b": 11623, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}' | validate-batch check -`
    """
    output = Output.for_flags(as_json, quiet, output_format, output_file)
    out = output.console
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
        raise typer.Exit(check_corpus(files, gpu, build, output, sel, ign, stats, exit_zero, recursive,
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
        raise typer.Exit(cli_kernel.check_kernel_exit_code(report.legal, kernel_result, exit_zero))
    if report.verdict == "not_modelled":
        raise typer.Exit(not_modelled_exit(report, output))
    if strict_provenance and report.rests_on_read_facts:
        raise typer.Exit(strict_provenance_exit(report, output))
    raise typer.Exit(EXIT_LEGAL if report.legal or exit_zero else EXIT_ILLEGAL)


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
    if output.is_ci and name:
        output.write(formats.render(output.mode, [formats.bad_input_unit(name, e)]))
    output.error(e)


def filter_findings(report, select: list[str], ignore: list[str]) -> None:
    """Keep only the findings of the selected rule codes (``--select`` / ``--ignore``); the verdict
    follows them. The safe split was computed with every rule."""
    if select or ignore:
        report.findings = [f for f in report.findings if formats.selected(f.code, select, ignore)]


def report_unit(name: str, report) -> dict:
    """A checked file as a unit of the CI formats (a step on a path not modelled is a bad-input unit, as a
    configuration refused as not modelled is)."""
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
    t = Table("build", "verdict", "rules", title="the same input on every known FlashMLA build")
    for r in matrix:
        style = "red" if not r["legal"] else ("yellow" if r["warnings"] else "green")
        t.add_row(Text(("* " if r["runs_here"] else "  ") + r["build"], overflow="fold"), Text(r["outcome"], style=style),
                  ", ".join(r["errors"] + r["warnings"]) or "-")
    out.print(t)
    out.print("* the build this check judged by (named with --build, or the one the engine version ships); "
              "`validate-batch builds` says what is measured and what is read from source or binary")


def kernels_text(kernels: dict) -> str:
    """A build's kernels by use_legacy / path, one per line: ``path: kernel``, a per-SM-generation
    choice as ``path (SM90): kernel``; ``*`` is every path."""
    lines = []
    for path, k in kernels.items():
        if isinstance(k, dict):
            lines.extend(f"{path} (SM{gen}0): {v}" for gen, v in k.items())
        else:
            lines.append(f"{path}: {k}")
    return "\n".join(lines)


@app.command("builds")
def builds_cmd(as_json: bool = typer.Option(False, "--json", help="The builds as JSON.")):
    """List the FlashMLA builds the tool knows, with the kernels each runs and what is measured.

    Example: `validate-batch builds`
    """
    output = Output.for_flags(as_json)
    rows = []
    for name in build_names():
        b = build_record(name)
        rows.append({"build": name, "kernels": b["kernels"], "status": b.get("status", ""),
                     "source": b.get("source", ""), "provenance": build_counts(name)})
    if output.is_json:
        output.json(rows)
        return
    t = Table("build", "kernels (by use_legacy / path)", "facts", "rule facts measured / read")
    for r in rows:
        c = r["provenance"]
        t.add_row(r["build"], kernels_text(r["kernels"]), r["status"],
                  "\n".join(f"{gpu}: {n['measured']} / {n['read']}" for gpu, n in c.items()))
    output.console.print(t)
    output.console.print("`validate-batch explain CODE` says which of a rule's facts are measured on which build.")


@app.command("rules")
def rules_cmd(as_json: bool = typer.Option(False, "--json", help="The catalog as JSON.")):
    """List every rule code with its severity, title and how it crashes.

    Example: `validate-batch rules`
    """
    output = Output.for_flags(as_json)
    rs = all_rules()
    if output.is_json:
        output.json([r.to_dict() for r in rs])
        return
    t = Table("code", "severity", "title", "crash class")
    for r in rs:
        t.add_row(r.code, r.severity, r.title, " or ".join(r.failure.kinds))
    output.result(t)
    output.result("`validate-batch explain CODE` prints a rule's page.")


@app.command()
def explain(code: str = typer.Argument(..., help="A rule code, e.g. FMLA001.")):
    """Print a rule's documentation page: what it checks, why it crashes, example, fix, source.

    Example: `validate-batch explain FMLA001`
    """
    output = Output()
    r = get_rule(code)
    if r is None:
        output.fail(f"unknown rule code {code!r}; known: {', '.join(x.code for x in all_rules())}")
    output.result(f"{r.code} - {r.title}  (severity: {r.severity})\n")
    output.result(r.doc)
    output.result(f"\nHow it fails: {r.failure}\nCited source: {r.source}")
    standing = rule_standing(r)
    if standing:
        output.result("\n## Provenance (per build: the facts this rule rests on)")
        for build, facts in standing.items():
            output.result(f"- {build}: {worst(facts)}")
            for st in facts:
                output.result(f"    {st.fact}: {st.line}")


@app.command("schema")
def schema_cmd(name: str = typer.Argument("report", help="report (check and bisect output), batch (the batch document) or metadata (metadata output).")):
    """Print a JSON schema of the tool's input or output (JSON Schema 2020-12; its `$id` is the version,
    e.g. `validate-batch/report/1`).

    Example: `validate-batch schema batch > batch.schema.json`
    """
    output = Output()
    try:
        output.write(formats.schema_text(name.strip().lower()))
    except ValueError as e:
        output.fail(str(e))


@app.command()
def gpus(as_json: bool = typer.Option(False, "--json", help="The profiles as JSON.")):
    """List the GPU profiles (SM count, compute capability, opt-in shared memory, source).

    Example: `validate-batch gpus`; then `validate-batch check --gpu H20 FILE`.
    """
    output = Output.for_flags(as_json)
    gs = [gpu_by_name(n) for n in gpu_names()]
    if output.is_json:
        output.json([{**g.to_dict(), "memory_bytes": g.memory_bytes, "source": g.source} for g in gs])
        return
    gen = generation()      # the default build's scheduler
    per_call = sched_smem_formula(gen).variables - {"b", "num_sms"}    # rows that depend on the call's shape
    t = Table("name", "SMs", "cc", "smem opt-in (B)", f"max FlashMLA rows ({build_record()['name']})", "memory (GB)")
    for g in gs:
        mem = f"{g.memory_bytes / 1e9:.0f}" if g.memory_bytes else "-"
        rows = "per call" if per_call else fast_rows_limit(gen, g.smem_optin, {"num_sms": g.num_sms})
        t.add_row(g.name, str(g.num_sms), f"{g.cc[0]}.{g.cc[1]}", str(g.smem_optin), str(rows), mem)
    output.result(t)
    output.result("Sources: validate-batch gpus --json (or rules/gpus.json).")


@app.command()
def engines(as_json: bool = typer.Option(False, "--json", help="The profiles as JSON.")):
    """List the engine profiles, their versions (what changes between them) and the releases read.

    Example: `validate-batch engines`; then `engine: sglang-dsv4@post-25418` in a batch file.
    """
    output = Output.for_flags(as_json)
    data = load("engines")["profiles"]
    if output.is_json:
        output.json(data)
        return
    out = output.console
    for name, prof in data.items():
        out.print(f"{name}: {prof['title']}")
        for v in prof["versions"]:
            aliases = ", ".join(v.get("aliases", []))
            rng = " ".join(x for x in (f">= {v['min_release']}" if v.get("min_release") else "",
                                        f"<= {v['max_release']}" if v.get("max_release") else "") if x)
            out.print(f"  @{v['name']} (also {aliases}{'; releases ' + rng if rng else ''}): {v['note']}")
        for r in sorted(prof.get("releases", []), key=lambda r: release_key(r["release"])):
            build = r.get("kernel_build") or next(v for v in prof["versions"] if v["name"] == r["version"]).get("kernel_build")
            out.print(f"  release {r['release']}: @{r['version']}, kernel build {build} ({', '.join(r.get('pins', []))})")


# Subcommands defined next to the code they drive.

cli_kernel.register(app)
cli_bisect.register(app)
cli_map.register(app)


# The commonest invocations run without typer's parsing, whose conversion of each parameter loads
# pydantic (about a third of the start-up): `check` and `metadata` with at most one FILE, and
# `rules`, with the options of the table below, each given once as separate words. Anything else (other options,
# --help, --opt=value, a repeated option, --) goes through typer; the two paths give the same
# output and exit code (tests/test_cli_direct.py).
_DIRECT_COMMON = {"--json": ("as_json", False), "--quiet": ("quiet", False), "-q": ("quiet", False),
                  "--gpu": ("gpu", True), "--build": ("build", True), "--kernel-gen": ("build", True), "--output-format": ("output_format", True),
                  "-f": ("output_format", True)}
#: per command: its function and the options the direct path reads, word -> (parameter, whether a
#: value follows); any other word that does not start with "-", or "-" itself, is the FILE
DIRECT_COMMANDS = {"check": (check, {**_DIRECT_COMMON, "--example": ("example", True)}),
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
    the words read by :data:`DIRECT_COMMANDS`, every other parameter at the default its typer
    option declares."""
    if not argv or argv[0] not in DIRECT_COMMANDS:
        return None
    fn, options = DIRECT_COMMANDS[argv[0]]
    given = _direct_words(argv[1:], options)
    if given is None:
        return None
    params = inspect.signature(fn).parameters    # (typer has imported inspect)
    if not given.keys() <= params.keys():
        return None                   # a word the command does not take (a FILE to `rules`): typer says so
    kwargs = {}
    for name, param in params.items():
        if name in given:
            kwargs[name] = given[name]
            continue
        default = getattr(param.default, "default", param.default)  # a typer option carries its default
        if default is ... or default is inspect.Parameter.empty:
            return None               # a required argument is missing: typer says so
        kwargs[name] = list(default) if isinstance(default, list) else default
    return fn, kwargs


def run(argv: list[str], args: Optional[list[str]] = None) -> None:
    """Run one command line (``argv``: the words after the program's name; ``args``: what the
    caller of :func:`validate_batch.cli.main.main` passed, None for ``sys.argv``) and exit with its code."""
    try:
        call = direct_call(argv)
        if call is None:
            try:
                rv = app(args=args, standalone_mode=False)
            except Exception as exc:  # noqa: BLE001 - the parser's usage errors, as one line
                if not (hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int)):
                    raise
                message = " ".join(str(exc.format_message()).split())
                if message:               # (none when the help was shown for a bare command)
                    print(f"error: {clean(message)}", file=sys.stderr)
                sys.exit(exc.exit_code)
            sys.exit(rv if type(rv) is int else 0)
        else:
            fn, kwargs = call
            try:
                fn(**kwargs)
            except typer.Exit as e:
                sys.exit(e.exit_code)
            sys.exit(0)
    except Exception as exc:  # noqa: BLE001 - the last resort: anything not handled above is a bug
        sys.exit(Output().internal(exc))
