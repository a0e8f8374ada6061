"""The ``validate-batch`` commands as typer declares them (flags, help, examples); :mod:`validate_batch.cli.main`
runs them. The bodies of check, metadata and rules are in :mod:`validate_batch.cli.commands`, the other
commands' here or next to the code they drive; each loads the rooms it runs when it runs, so that
``--help`` loads none of them. Results go to stdout, diagnostics to stderr.

Exit codes: 0 legal, 1 illegal, 2 bad input (one line naming the field), 4 internal error (one line;
``VALIDATE_BATCH_DEBUG=1`` adds the traceback). Kernel mode adds 3 (unavailable here);
``--strict-provenance`` adds 5 (the verdict rests on a fact that is not measured on its build).
"""
from __future__ import annotations

import os
import sys
from typing import Optional

import typer

from . import bisect_cmd as cli_bisect, commands, helptext, kernel_cmd as cli_kernel, map_cmd as cli_map, tophelp
from ..output.safe import clean
from .commands import EXIT_ILLEGAL, EXIT_LEGAL  # noqa: F401 (the exit codes, with the writer's below)
from ..output.writer import (  # noqa: F401
    DEBUG_ENV, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_READ_FACTS, EXIT_UNAVAILABLE, KERNEL_GEN_HELP,
    OUTPUT_FORMAT_HELP, Output,
)
from .version import version_line

helptext.apply()      # FILE, INT, TEXT in --help (not {file}, <int>, <list[str]>, <bool>)

app = typer.Typer(
    name="validate-batch",
    add_completion=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode="markdown",
    help=tophelp.ABOUT,
)



def _version(value: bool) -> None:
    if value:
        print(version_line())
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help=tophelp.VERSION_HELP),
    debug: bool = typer.Option(False, "--debug", help=tophelp.DEBUG_HELP),
) -> None:
    """Is this batch legal for the attention kernels?"""
    if debug:
        os.environ[DEBUG_ENV] = "1"


GPU_HELP = "GPU profile name (H100-SXM, H800, H20, H200, B200, GB200, ...) or raw numbers 'num_sms=132,cc=9.0,smem_optin=232448'. Overrides a device header in the input."


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
    commands.metadata(**locals())


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
    commands.check(**locals())


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
    from rich.table import Table

    from ..facts.knowledge import build_names, build_record
    from ..legality.standing import build_counts

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
    commands.rules_cmd(**locals())


@app.command()
def explain(code: str = typer.Argument(..., help="A rule code, e.g. FMLA001.")):
    """Print a rule's documentation page: what it checks, why it crashes, example, fix, source.

    Example: `validate-batch explain FMLA001`
    """
    from ..legality.ruleset import all_rules, get_rule
    from ..legality.standing import rule_standing, worst

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
    from ..output import formats

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
    from rich.table import Table

    from ..facts.knowledge import build_record, generation, gpu_by_name, gpu_names
    from ..flashmla.plan import fast_rows_limit, sched_smem_formula

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
    from ..engines.versions import release_key
    from ..facts.knowledge import load

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


def run(argv: list[str], args: Optional[list[str]] = None) -> None:
    """Run one command line through typer (``argv``: the words after the program's name; ``args``: what
    the caller of :func:`validate_batch.cli.main.main` passed, None for ``sys.argv``) and exit with its
    code. :mod:`validate_batch.cli.main` runs the common forms of check, metadata and rules without it
    (:func:`validate_batch.cli.commands.direct_call`)."""
    markup = app.rich_markup_mode
    try:
        if not _is_terminal(sys.stdout):
            # help read by a program or a pager comes as click's plain text: rich, and typer's rich
            # help (markdown and all, about a third of the start-up), load only for a terminal
            app.rich_markup_mode = None
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
    except Exception as exc:  # noqa: BLE001 - the last resort: anything not handled above is a bug
        sys.exit(Output().internal(exc))
    finally:
        app.rich_markup_mode = markup       # (a caller in the same process gets the app as declared)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):      # a stand-in or closed stream
        return False
