"""The ``bisect`` subcommand: from a crashed server's log / crash dump / launch command to the step
that crashed, the rule that explains it, the boundary, and the settings that prevent it."""
from __future__ import annotations

from typing import List, Optional

import typer

from ..errors import InputError
from ..output.writer import EXIT_BAD_INPUT, KERNEL_GEN_HELP, OUTPUT_FORMAT_HELP, Output, kernel_option  # noqa: F401 (EXIT_BAD_INPUT: Output.error)

EXIT_NOTHING_ILLEGAL, EXIT_EXPLAINED = 0, 1

HELP = """Find the step that crashed an engine, the rule that explains it, and the boundary.

Reads an SGLang scheduler log (any release's format, per DP rank), a vLLM log with its crash-time
SchedulerOutput dump, and/or an SGLang crash dump (--dump, read with a restricted unpickler that
runs nothing). Candidate crashing steps are checked with the project's rules and the varying
quantity (query rows, slot index, batch size) is bisected to its largest legal value.

Examples:

* `validate-batch bisect server.log`

* `validate-batch bisect server.log --sglang-version 0.5.12 --json`

* `validate-batch bisect decode.log --server-arg max_running_requests=32 --server-arg disaggregation_decode_extra_slots=64`

* `validate-batch bisect server.log --launch "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V4 --chunked-prefill-size 16384"`

* `validate-batch bisect --dump crash_dump_2026-04-28_10-12-05.pkl --launch "sglang serve ..."`

A rule explains the crash only when the error line matches one of its signatures (`validate-batch rules --json`)
and it breaks on the crashing step; other rules that break are reported as "also illegal, does not
explain this error"; an error no rule matches is "not explained", with what was recognised in it.
A step the log shows completed is never the crashing step.

Exit codes: 1 the crash is explained by a rule, 0 not explained (or nothing illegal found),
2 bad input (one line naming the field or line), 4 internal error.
"""


def register(app) -> None:
    @app.command("bisect", help=HELP)
    def bisect_cmd(
        log: Optional[str] = typer.Argument(None, help="Engine log (plain or .gz; '-' = stdin)."),
        dump: Optional[str] = typer.Option(None, "--dump", help="SGLang crash dump (.pkl from --crash-dump-folder)."),
        trust_pickle: bool = typer.Option(False, "--trust-pickle", help="Load --dump with Python's normal unpickler (runs code from the file: only for files you made)."),
        launch: Optional[str] = typer.Option(None, "--launch", help="The server's launch command (adds to / overrides the log's)."),
        server_arg: List[str] = typer.Option([], "--server-arg", help="KEY=VALUE engine setting, repeatable (command-line semantics: chunked_prefill_size is the global value)."),
        sglang_version: Optional[str] = typer.Option(None, "--sglang-version", help="SGLang release of the server (decides whether Prefill lines follow their forward; default: from the line format)."),
        engine: List[str] = typer.Option([], "--engine", help="Engine profile(s) to check with (sglang-dsv4, sglang-slots); default: from the model and error."),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU profile (default H200)."),
        kernel_gen: Optional[str] = typer.Option(None, "--build", "--kernel-gen", help=KERNEL_GEN_HELP),
        rank: Optional[str] = typer.Option(None, "--rank", help="Only this DP rank (e.g. DP2)."),
        window: int = typer.Option(64, "--window", min=4, max=100000, help="Steps kept per rank while streaming."),
        as_json: bool = typer.Option(False, "--json", help="Machine-readable diagnosis on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No output; the exit code is the verdict."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar on stderr."),
        run_kernel: bool = typer.Option(False, "--kernel", help="Also run the crashing step's FlashMLA calls on a GPU (kernel mode)."),
        output_format: Optional[str] = typer.Option(None, "--output-format", "-f", help=OUTPUT_FORMAT_HELP + "; for github, junit and sarif an explained crash is a failure"),
        select: Optional[str] = typer.Option(None, "--select", help="Only these rule codes count (comma-separated; prefixes allowed): the other rules neither explain the crash nor bound it."),
        ignore: Optional[str] = typer.Option(None, "--ignore", help="Rule codes (or prefixes) whose findings are dropped before the crash is explained."),
        stats: bool = typer.Option(False, "--statistics", help="At the end, the number of findings per rule code over the steps checked (on stderr in the machine formats)."),
        output_file: Optional[str] = typer.Option(None, "--output-file", help="Write the results to this file instead of stdout (diagnostics stay on stderr)."),
    ):
        from ..bisect import BisectOptions, diagnose
        from ..facts.knowledge import resolve_gpu
        from ..ingest import build_config, read_inputs
        from ..inputs.batch import parse_engine
        from ..output import formats

        output = Output.for_flags(as_json, quiet, output_format, output_file)
        err_console = output.err_console
        try:
            sel, ign = formats.parse_codes(select, "--select"), formats.parse_codes(ignore, "--ignore")
            if log is None and dump is None:
                raise InputError("LOG", "give a log file, '-' for stdin, or --dump FILE")
            kernel_gen = kernel_option(kernel_gen, output)
            if gpu:
                resolve_gpu(gpu)
            if sglang_version:
                from ..ingest.sglang_log import parse_version

                parse_version(sglang_version)
            for e in engine:
                parse_engine(e)
            show = not (no_progress or quiet or output.mode != "human") and err_console.is_terminal
            evidence, cdump = read_inputs(log, dump, trust_pickle, window, err_console if show else None)
            cfg = build_config(evidence, cdump, launch, server_arg)
            opts = BisectOptions(sglang_version, list(engine) or None, gpu, kernel_gen, rank, run_kernel,
                                 err_console if not quiet else None,
                                 (lambda code: formats.selected(code, sel, ign)) if sel or ign else None)
            diag = diagnose(evidence, cfg, cdump, opts)
        except InputError as e:
            name = log if log is not None else dump
            if output.is_ci and name:
                output.write(formats.render(output.mode, [formats.bad_input_unit(name, e)]))
            output.error(e)
        counts = formats.statistics([{"findings": c.findings} for c in diag.candidates])
        if output.mode in ("json", "jsonl"):
            d = {"schema": formats.SCHEMA_VERSIONS["bisect"], **diag.to_dict()}
            if stats:
                d["statistics"] = counts
            output.json(d, default=str)
        elif output.is_ci:
            name = log if log is not None else dump
            ex = diag.explained
            # the error line of the log (when a log was read) is where annotations point
            line = diag.error.line_no if diag.error is not None and log is not None and log != "-" else None
            output.write(formats.render(output.mode, [{
                "file": name, "name": name, "status": "illegal" if ex is not None else "legal",
                "findings": [f for f in (ex.findings if ex is not None else [])], "error": None, "line": line}]))
            if stats:
                formats.render_statistics(counts, output.err_console)
        elif not output.is_quiet:
            render_diagnosis(diag, output.console)
            if stats:
                formats.render_statistics(counts, output.console)
        raise typer.Exit(EXIT_EXPLAINED if diag.explained is not None else EXIT_NOTHING_ILLEGAL)


# ------------------------------------------------------------------------------------ the story
def _recognised_text(err) -> str:
    r = err.recognised()
    parts = [err.kind]
    if r.get("library"):
        parts.append(f"from {r['library']}")
    if r.get("owner") and r.get("owner") != r.get("library"):
        parts.append(f"attributed to {r['owner']} ({r.get('owner_from', 'its context')})")
    if r.get("prose"):
        parts.append("a report in prose (low confidence)")
    if err.file:
        parts.append(f"at {err.file}" + (f":{err.source_line}" if err.source_line is not None else " (line cut off)"))
    elif r.get("cut_off"):
        parts.append(f"cut off after {r.get('path_fragment')!r}")
    if r.get("function"):
        parts.append(f"in {r['function']}")
    parts.append(f"failure {err.failure or 'unknown'}")
    if r.get("zero_extent"):
        parts.append("the TMA descriptor has a zero extent (an empty tensor)")
    return ", ".join(parts)


def _fmt_cfg(cfg) -> str:
    from ..facts.names import SUMMARY_SETTINGS

    parts = [f"{k}={cfg.values[k]}" for k in SUMMARY_SETTINGS if cfg.values.get(k) is not None]
    if cfg.dp_attention and cfg.chunk_per_rank() is not None:
        parts.append(f"(chunked prefill per DP rank: {cfg.chunk_per_rank()})")
    return ", ".join(parts) if parts else "(none found: pass --launch or --server-arg)"


def render_diagnosis(diag, console) -> None:
    """The human story: what was read, the error, the timeline, the step, the rule, the numbers, the fix."""
    from ..output.split_text import split_summary

    ev = diag.evidence
    p = console.print
    if ev is not None:
        n_steps = sum(tl.num_prefill + tl.num_decode for tl in ev.ranks.values())
        unparsed = ev.counts.get("unparsed_batch_line", 0)
        p(f"read {ev.name}: {ev.total_lines} lines, {n_steps} scheduler steps on {len(ev.ranks)} rank(s)"
          + (f", {len(ev.vllm_steps)} vLLM scheduler dump(s)" if ev.vllm_steps else "")
          + f", {ev.counts.get('error', 0)} error line(s), {unparsed} batch line(s) not parsed"
          + (f", {ev.truncated_lines} over-long line(s) cut" if ev.truncated_lines else ""))
        if unparsed:
            for ex in (ev.unparsed_examples + list(ev.unparsed_last))[:4]:
                p(f"  not parsed, line {ex['line']}: {ex['reason']}: {ex['text'][:120]}")
    if diag.dump is not None:
        d = diag.dump
        p(f"read crash dump {d.path}: {len(d.requests)} request(s), {len(d.unfinished)} unfinished"
          + (f"; launch command: {d.launch_command[:160]}" if d.launch_command else ""))
    after = {True: "a Prefill line is printed AFTER its forward (the crashing batch is not in the log)",
             False: "a Prefill line is printed BEFORE its forward (the last one is the crashing batch)",
             None: "print order unknown"}[diag.after_forward]
    if diag.engine == "vllm" and diag.candidates:
        p("engine: vLLM; its crash-time SchedulerOutput dump is the crashing step itself")
    elif diag.engine == "vllm":
        p(f"engine: vLLM; {diag.version_basis}")
    else:
        p(f"engine: SGLang; {diag.version_basis}; {after}")
    p(f"settings: {_fmt_cfg(diag.config)}")
    err = diag.error
    xp = diag.explanation
    if err is not None:
        where = f", {err.rank}" + (" (inferred from the preceding line)" if err.rank_inferred else "") if err.rank else ""
        p(f"error (line {err.line_no}{where}): {err.text[:300]}")
        p(f"  recognised: {_recognised_text(err)}")
        if xp is not None and xp.signature_rules:
            p(f"  signature of: {', '.join(xp.signature_rules)}")
            for line in dict.fromkeys(str(s.get("line", "")) for s in xp.signatures if s.get("line")):
                p(f"    {line}")
        elif xp is not None and xp.possible:
            p(f"  cut off: the visible part fits {', '.join(xp.possible)} (not confirmed)")
        else:
            p("  no rule's signature matches this error line")
    else:
        p("error: none found in the input (the log may end before the crash)")
    ex = diag.explained
    if ev is not None and ex is not None and ex.rank in ev.ranks:
        tl = ev.ranks[ex.rank]
        cut = err.line_no if err is not None else None
        tail = tl.before(cut) if cut else list(tl.steps)
        if tail:
            p(f"timeline ({ex.rank}, last {min(len(tail), 6)} of {tl.num_prefill + tl.num_decode} steps):")
            for s in tail[-6:]:
                mark = "   <- crashing step" if ex.step is s and ex.exact and ex.kind == "prefill" and ex.lo == ex.hi else ""
                p(f"  line {s.line_no:>7}  {s.timestamp or '':19}  {s.summary()}{mark}")
    if ex is None:
        p(f"verdict: {xp.summary}" if xp is not None else "verdict: no candidate step breaks a modelled limit")
        for c in diag.candidates[:4]:
            head = (f"; legal up to {c.boundary.largest_legal}" if c.boundary is not None
                    and c.boundary.largest_legal is not None else "")
            p(f"  checked: {c.rank} {c.label}: {c.verdict} at {c.value} {c.quantity}{head}"
              + (f" ({c.check_error})" if c.check_error else ""))
    else:
        if ex.lo == ex.hi or ex.exact:
            rng = f"{ex.value}"
        else:
            rng = f"{ex.lo}..{ex.hi}" + (f", most likely {ex.likely}" if ex.likely else "")
        p(f"crashing step ({ex.rank}): {ex.label} [{'exact' if ex.exact else 'reconstructed'}]")
        for line in ex.basis:
            p(f"  - {line}")
        p(f"  {ex.quantity}: {rng}; checked as {', '.join(diag.profile)}" + (f"@{ex.version}" if ex.version else ""))
        for j in ex.judged_as:
            p(f"  judged as: {j['profile']} {j['release'] or j['version']} - {j['basis']}; kernel build "
              f"{j['kernel_build']} ({j['kernel_build_basis']})")
        if len(ex.version_notes) > 1:
            p(f"  engine version not known exactly; checked under each: {'; '.join(ex.version_notes)}")
        p(f"rule: {', '.join(ex.explains)} ({ex.verdict}; its signature matches the error)")
        for f in [f for f in ex.findings if f["code"] in ex.explains][:3]:
            p(f"  {f['code']} {f['message']}")
        for a in ex.assumptions:
            p(f"  {a}")
        b = ex.boundary
        if b is not None:
            if b.largest_legal is not None:
                at_least = "" if ex.exact or ex.likely is not None else "at least "
                over = f"; over by {at_least}{b.margin}" if b.margin is not None and b.margin > 0 else ""
                p(f"boundary: largest legal {b.quantity} = {b.largest_legal}, first illegal = {b.first_illegal}"
                  f"{over} ({b.evaluations} checks)")
            elif b.note:
                p(f"boundary: {b.note}")
        if ex.safe_split:
            line = split_summary(ex.safe_split)
            if line:
                p(line)
    if diag.fixes:
        p("fix:")
        for f in diag.fixes:
            tag = {True: "verified by the checker", False: "NOT verified by the checker", None: "advice"}[f["verified"]]
            p(f"  {f['flag']} {f['value']}  [{tag}] - {f['why']}")
    if xp is not None and xp.also_illegal:
        p("also illegal, does not explain this error:" if err is not None else "illegal steps (not confirmed: no error line):")
        for a in xp.also_illegal[:6]:
            p(f"  {a['rank']}: {a['step']}: {', '.join(a['codes'])} at {a['at']} {a['quantity']} - {a['reason']}")
    others = [c for c in diag.candidates if c is not ex] if ex is not None else []
    if others:
        p("other candidates:")
        for c in others[:6]:
            p(f"  {c.rank}: {c.label}: {c.verdict}" + (f" {','.join(c.codes)}" if c.codes else "")
              + f" at {c.value} {c.quantity}")
    for n in diag.notes:
        p(f"note: {n}")
    if diag.kernel is not None:
        try:
            from ..kernel_mode.check import render_kernel_result

            render_kernel_result(diag.kernel, console)
        except ImportError:
            p(f"kernel mode: {diag.kernel.get('reason', diag.kernel)}")
