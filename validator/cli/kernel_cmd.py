"""Kernel-mode subcommands: ``kernel-check``, ``probe``, ``probe-slot`` and ``env`` (alias ``doctor``).

Each runs the real FlashMLA kernels (or a slot-indexed write) in child processes with a timeout and
prints the measurement next to the model's prediction. Results on stdout, progress on stderr.

Exit codes: 0 the kernel agrees with the model (``probe-slot``: the write ran), 1 a disagreement
(``probe-slot``: the write failed), 2 bad input, 3 kernel mode unavailable here (no torch, CUDA GPU
or FlashMLA build) or every call inconclusive (nothing measured about the batch), 4 internal error.
``check --kernel``: 1 when the batch is illegal or the kernel disagrees, else 3 when the kernel part
is unavailable or inconclusive, else 0. ``env``: 0 kernel mode can run, 3 it cannot.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import typer

from ..errors import InputError
from ..output.writer import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, Output  # noqa: F401 (EXIT_BAD_INPUT: Output.error)

EXIT_AGREE, EXIT_DISAGREE = 0, 1


def kernel_status(result: dict) -> str:
    """``agree`` | ``disagree`` | ``inconclusive`` | ``unavailable`` for a kernel-mode result: with several
    parts (FlashMLA, FlashInfer, DeepGEMM), ``disagree`` if any part disagrees, ``agree`` only if every
    part agrees, else the first part's state."""
    parts = [_part_status(result)] + [_part_status(p) for p in result.get("libraries") or ()]
    if "disagree" in parts:
        return "disagree"
    if all(s == "agree" for s in parts):
        return "agree"
    return next(s for s in parts if s != "agree")


def _part_status(result: dict) -> str:
    if not result.get("available"):
        return "unavailable"
    status = result.get("status") or (result.get("summary") or {}).get("status")
    if status is None:   # slot buffers only
        status = "agree" if result.get("all_agree", result.get("agreement")) else "disagree"
    slots = result.get("slot_buffers")
    if isinstance(slots, dict) and slots.get("available") and slots.get("all_agree") is False:
        status = "disagree"
    return status


def kernel_exit_code(result: dict) -> int:
    """kernel-check's exit code: 0 agree, 1 disagree, 3 unavailable or nothing conclusive."""
    return {"agree": EXIT_AGREE, "disagree": EXIT_DISAGREE}.get(kernel_status(result), EXIT_UNAVAILABLE)


def probe_exit_code(res: dict) -> int:
    """probe's exit code: 0 agree, 1 disagree, 3 unavailable or inconclusive."""
    if not res["measured"].get("available"):
        return EXIT_UNAVAILABLE
    status = res.get("status") or ("agree" if res.get("agree") else "disagree")
    return {"agree": EXIT_AGREE, "disagree": EXIT_DISAGREE}.get(status, EXIT_UNAVAILABLE)


def check_kernel_exit_code(legal: bool, result: dict | None, exit_zero: bool = False) -> int:
    """``check --kernel``: 1 illegal (0 with --exit-zero) or the kernel disagrees; 3 a legal verdict the
    kernel could not confirm (unavailable, inconclusive); else 0."""
    status = kernel_status(result) if result is not None else "agree"
    if status == "disagree":
        return EXIT_DISAGREE
    if not legal:
        return EXIT_AGREE if exit_zero else EXIT_DISAGREE
    return EXIT_AGREE if status == "agree" else EXIT_UNAVAILABLE

TIMEOUT_HELP = "Seconds each child process may run before its process group is killed (outcome 'timeout')."
JOBS_HELP = "Child processes run at once (each needs its own GPU memory; 1 = one after another)."
PROVIDER_HELP = "FlashMLA provider: auto (upstream flash_mla first, then sgl_kernel), flash_mla or sgl_kernel."
PYTHON_HELP = "Python interpreter for the child processes (one with torch and FlashMLA); default: this one."
BACKEND_HELP = "Child backend module or .py file (default: the torch backend); for testing the plumbing."


KERNEL_GEN_PROVIDER_HELP = ("The build to run: a vllm-* build (vllm-0.34, vllm-0.33) runs vLLM's bundled FlashMLA "
                            "(see --vllm-flashmla); other builds run the --provider given.")
VLLM_FLASHMLA_HELP = ("Folder holding vLLM's bundled FlashMLA (vllm/_flashmla_C*.so, vllm/_flashmla_extension_C*.so, "
                      "vllm/third_party/flashmla/flash_mla_interface.py) extracted from the wheel; default: "
                      "$VALIDATE_BATCH_VLLM_FLASHMLA, else the installed vllm.")


def kernel_provider(provider: str, kernel_gen: Optional[str], vllm_flashmla: Optional[str]) -> str:
    """The provider a kernel-mode command runs: ``--build vllm-*`` picks vLLM's bundled copy;
    ``--vllm-flashmla DIR`` is passed to the children through the environment."""
    from ..kernel_mode.providers import provider_for_build
    from ..kernel_mode.vllm_bundle import ENV_VAR

    if kernel_gen is not None:
        from ..facts.knowledge import build_record

        build_record(kernel_gen)      # an unknown build is an InputError naming --build's value
    if vllm_flashmla is not None:
        if not os.path.isdir(vllm_flashmla):
            raise InputError("--vllm-flashmla", f"{vllm_flashmla} is not a folder")
        os.environ[ENV_VAR] = os.path.abspath(vllm_flashmla)
    return provider_for_build(kernel_gen, provider)


FLASHINFER_HELP = ("Folder holding flashinfer/ (a flashinfer-python wheel unzipped, its dist-info beside it) for "
                   "mla_plan calls; default: $VALIDATE_BATCH_FLASHINFER, else the installed flashinfer.")
DEEPGEMM_HELP = ("Folder holding deep_gemm/ (or an extracted vLLM wheel with vllm/third_party/deep_gemm) for "
                 "paged_mqa_logits_metadata calls; default: $VALIDATE_BATCH_DEEP_GEMM, else the installed deep_gemm, "
                 "else the copy inside an installed vllm.")


def library_folders(flashinfer: Optional[str], deep_gemm: Optional[str]) -> None:
    """``--flashinfer DIR`` / ``--deep-gemm DIR``: checked here, passed to the children through the environment."""
    from ..kernel_mode.libraries import DEEPGEMM, FLASHINFER, locate_deep_gemm, locate_flashinfer, ENVS

    for flag, folder, find, name in (("--flashinfer", flashinfer, locate_flashinfer, FLASHINFER),
                                     ("--deep-gemm", deep_gemm, locate_deep_gemm, DEEPGEMM)):
        if folder is None:
            continue
        lib, why = find(folder)
        if lib is None:
            raise InputError(flag, why)
        os.environ[ENVS[name]] = os.path.abspath(folder)


def _child(python: Optional[str], backend: Optional[str]):
    from ..kernel_mode.runner import ChildSpec

    spec = ChildSpec()
    return ChildSpec(python=python or spec.python, backend=backend)


def kernel_check_cmd(
    file: str = typer.Argument(..., help="Call records in the oracle format: JSON, JSON array or JSON Lines ('-' = stdin); an optional first line with device fields is a device header."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: provider, device, per-call outcome, metadata diff, agreement."),
    timeout: float = typer.Option(120.0, "--timeout", help=TIMEOUT_HELP),
    jobs: int = typer.Option(1, "--jobs", "-j", help=JOBS_HELP),
    provider: str = typer.Option("auto", "--provider", help=PROVIDER_HELP),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU profile for the model (default: the device header, else H200); the calls are re-planned for the device that runs them."),
    python: Optional[str] = typer.Option(None, "--python", help=PYTHON_HELP),
    backend: Optional[str] = typer.Option(None, "--backend", help=BACKEND_HELP, hidden=True),
    limit: Optional[int] = typer.Option(None, "--limit", help="Run only the first N calls."),
    sample: Optional[int] = typer.Option(None, "--sample", help="Run N calls spread evenly over the file (first and last included)."),
    kernel_gen: Optional[str] = typer.Option(None, "--build", "--kernel-gen", help=KERNEL_GEN_PROVIDER_HELP),
    vllm_flashmla: Optional[str] = typer.Option(None, "--vllm-flashmla", help=VLLM_FLASHMLA_HELP),
    flashinfer: Optional[str] = typer.Option(None, "--flashinfer", help=FLASHINFER_HELP),
    deep_gemm: Optional[str] = typer.Option(None, "--deep-gemm", help=DEEPGEMM_HELP),
    keep_output: bool = typer.Option(False, "--keep-output", help="In --json, keep everything each call's kernel wrote (FlashMLA's metadata, FlashInfer's plan_info and planned arrays, DeepGEMM's metadata ends), to record it."),
    fresh_children: bool = typer.Option(False, "--fresh-children", help="One new child process per call (slower: a torch import and CUDA context each), instead of long-lived children replaced after any fatal outcome."),
):
    """Run each call on the real kernels (FlashMLA; FlashInfer's MLA plan; DeepGEMM's indexer metadata) and
    diff with the model.

    Long-lived child processes take the calls (one per --jobs slot); a child is replaced after any
    outcome that can poison its CUDA context, and a call the model expects to be fatal runs in a
    child of its own (--fresh-children: every call in its own).

    Reports per call the kernel's outcome (ok, python_exception, process_exit with the CUDA error's
    file:line, illegal_memory_access, process_crash with the signal, timeout), whether
    tile_scheduler_metadata and num_splits match the model bit for bit, and whether the model's
    verdict agrees; then agreement per rule code. Exit 0 all agree, 1 disagreement, 2 bad input,
    3 kernel mode unavailable or every call inconclusive.

    Examples:

    * `validate-batch kernel-check fixtures/oracle/flashmla_h200_cases.jsonl --sample 40 -j 4`

    * `echo '{"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}' | validate-batch kernel-check -`

    * `echo '{"kind": "mla_plan", "qo_indptr": [0, 1, 2], "kv_indptr": [0, 3, 5], "kv_len": [130, 70], "h_q": 16, "page_size": 64}' | validate-batch kernel-check --flashinfer DIR -`
      (FlashInfer's plan, its 18 plan_info numbers and every planned array against the model's)

    * `echo '{"kind": "paged_mqa_logits_metadata", "batch": 58113}' | validate-batch kernel-check --deep-gemm DIR -`
      (DIR: vLLM's bundled deep_gemm extracted from its wheel, or any folder holding deep_gemm/)
    """
    from ..kernel_mode.check import kernel_check_report, render_kernel_result
    output = Output.for_flags(as_json)
    try:
        from .session import check_documents

        report, _payload = check_documents(file, gpu, None)
        if limit is not None:
            if limit < 1:
                raise InputError("--limit", f"expected >= 1, got {limit}")
            report.plans = report.plans[:limit]
        if sample is not None:
            if sample < 1:
                raise InputError("--sample", f"expected >= 1, got {sample}")
            report.plans = [report.plans[i] for i in spread_indices(len(report.plans), sample)]
        if jobs < 1:
            raise InputError("--jobs", f"expected >= 1, got {jobs}")
        if timeout <= 0:
            raise InputError("--timeout", f"expected > 0 seconds, got {timeout}")
        provider = kernel_provider(provider, kernel_gen, vllm_flashmla)
        library_folders(flashinfer, deep_gemm)
    except InputError as e:
        output.error(e)
    result = kernel_check_report(report, output.err_console, provider=provider, timeout=timeout, max_parallel=jobs,
                                 child=_child(python, backend), served=not fresh_children, keep_output=keep_output)
    if output.is_json:
        output.json(result)
    else:
        render_kernel_result(result, output.console)
    raise typer.Exit(kernel_exit_code(result))


def spread_indices(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)``, first and last included (all when k >= n)."""
    if k >= n:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _render_probe(res: dict, out) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    q = res["quantity"]
    m = res["model"]
    tmpl = json.dumps(res["template"], separators=(",", ":"))
    out.print(f"probe {q} over [{res['range'][0]}, {res['range'][1]}] for {escape(tmpl)}", markup=True)
    codes = ",".join(m["codes_at_first_illegal"]) or "-"
    if m["first_illegal"] is None:
        out.print("  model:    legal over the whole range")
    else:
        out.print(f"  model:    largest legal {q} = {m['last_legal']} (first illegal {m['first_illegal']}: {codes})"
                  + ("" if m["monotonic"] else f"; NOT monotonic, legal again at "
                     f"{', '.join(map(str, m['legal_again'][:5]))}"))
    meas = res["measured"]
    if not meas.get("available"):
        out.print(f"  measured: unavailable - {escape(str(meas.get('reason')))}", markup=True)
        return
    t = Table(q, "measured", "outcome", "model", "model codes", "agrees", "why probed")
    for p in res["probes"]:
        ag = {True: Text("yes", style="green"), False: Text("NO", style="bold red"), None: Text("-")}[p["agrees"]]
        oc = p["outcome"] + (" (fallback kernel)" if p.get("fallback_used") else "")
        t.add_row(str(p["value"]), p["verdict"], oc, p["model_verdict"], ",".join(p["model_codes"]) or "-",
                  ag, p["reason"])
    out.print(t)
    st = meas["status"]
    if st == "found":
        out.print(f"  measured: largest legal {q} = {meas['last_legal']}, first illegal {meas['first_illegal']} "
                  f"({meas['failure']}: {escape(str(meas['failure_message'] or ''))})", markup=True)
    elif st == "hi_legal":
        fb = meas.get("fallback") or {}
        if q == "b":
            out.print(f"  measured: no row limit up to the cap (b = {res['range'][1]})"
                      + (f"; fallback used: the low-smem fallback kernel ran from b = {fb['lowest']}"
                         f" ({fb['probes']} probe(s))" if fb.get("probes") else ""))
        else:
            out.print(f"  measured: legal up to the top of the range ({res['range'][1]})"
                      + (f"; fallback used in {fb['probes']} probe(s)" if fb.get("probes") else ""))
    elif st == "lo_illegal":
        out.print(f"  measured: already illegal at the bottom of the range ({res['range'][0]})")
    else:
        out.print("  measured: inconclusive (timeouts or unavailable probes)")
    for n in res.get("notes", []):
        out.print(f"  note: {escape(n)}", markup=True)
    status = res.get("status") or ("agree" if res.get("agree") else "disagree")
    verdict = {"agree": "[bold green]AGREE[/]", "disagree": "[bold red]DISAGREE[/]",
               "inconclusive": "[bold yellow]INCONCLUSIVE[/]"}.get(status, status)
    out.print(f"  kernel vs model: {verdict} ({meas['num_probes']} probes, one child process each)", markup=True)
    for why in meas.get("inconclusive_reasons") or []:
        out.print(f"  inconclusive: {escape(why)}", markup=True)


def probe_cmd(
    quantity: str = typer.Option("b", "--quantity", "-q", help="The integer field to probe: b (query rows), s_q, topk, ..."),
    template: str = typer.Option(..., "--template", "-t", help="Call record without the probed field, e.g. '{\"kind\": \"sparse\", \"s_q\": 1, \"h_q\": 64, \"d_qk\": 512, \"topk\": 128}'."),
    lo: Optional[int] = typer.Option(None, "--lo", help="Lower end of the search (default 1 for b)."),
    hi: Optional[int] = typer.Option(None, "--hi", help="Upper end of the search (default 16384 for b)."),
    as_json: bool = typer.Option(False, "--json", help="The result as one JSON object."),
    timeout: float = typer.Option(120.0, "--timeout", help=TIMEOUT_HELP),
    jobs: int = typer.Option(1, "--jobs", "-j", help=JOBS_HELP + " With N > 1 each round probes N values."),
    provider: str = typer.Option("auto", "--provider", help=PROVIDER_HELP),
    gpu: str = typer.Option("H200", "--gpu", help="GPU profile for the model when no GPU is detected."),
    python: Optional[str] = typer.Option(None, "--python", help=PYTHON_HELP),
    backend: Optional[str] = typer.Option(None, "--backend", help=BACKEND_HELP, hidden=True),
):
    """Find a limit on the hardware by bisection (one child process per probe), beside the model's answer.

    Every probe is listed with the model's prediction next to it; the model's own boundary is probed
    too, and legality that is not monotonic (as the 32-bit o_accum offset limit is) is reported,
    never assumed away. Exit 0 agree, 1 disagree, 2 bad input, 3 no GPU/FlashMLA or every probe
    inconclusive (the model's answer is still printed). A probe that ran on the low-smem fallback
    kernel is legal and marked "fallback kernel"; with none failing up to --hi, b has "no row limit up
    to the cap".

    Examples:

    * `validate-batch probe --quantity b --template '{"kind": "sparse", "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}'`

    * `validate-batch probe -q b -t '{"kind": "sparse", "s_q": 8, "h_q": 128, "d_qk": 512, "topk": 2048}' --hi 8192 -j 4`
    """
    from ..kernel_mode.probe import probe_boundary

    output = Output.for_flags(as_json)
    err = output.err_console
    if jobs < 1:
        output.error(InputError("--jobs", f"expected >= 1, got {jobs}"))

    def progress(p) -> None:
        err.print(f"probe {quantity}={p.value}: {p.outcome} (model: {p.model_verdict}"
                  f"{' ' + ','.join(p.model_codes) if p.model_codes else ''}) in {p.elapsed_s:.1f} s")

    try:
        res = probe_boundary(template, quantity, lo, hi, gpu=gpu, provider=provider, timeout=timeout,
                             max_parallel=jobs, child=_child(python, backend), progress=progress)
    except InputError as e:
        output.error(e)
    if output.is_json:
        output.json(res)
    else:
        _render_probe(res, output.console)
    raise typer.Exit(probe_exit_code(res))


def probe_slot_cmd(
    rows: int = typer.Option(..., "--rows", help="Rows of the slot-indexed buffer (e.g. max_running_requests + 1)."),
    slot: int = typer.Option(..., "--slot", help="The slot index written (e.g. a req_pool_idx from the bigger table)."),
    width: int = typer.Option(1, "--width", help="Second dimension of the bf16 [rows, width, 128] buffer."),
    device: str = typer.Option("cuda", "--device", help="cuda or cpu."),
    as_json: bool = typer.Option(False, "--json", help="The result as one JSON object."),
    timeout: float = typer.Option(60.0, "--timeout", help=TIMEOUT_HELP),
    python: Optional[str] = typer.Option(None, "--python", help=PYTHON_HELP),
    backend: Optional[str] = typer.Option(None, "--backend", help=BACKEND_HELP, hidden=True),
):
    """Write row SLOT of a slot-indexed buffer of ROWS rows on the GPU (child process) and report how it fails.

    Prints the device-side failure next to the CPU one (`index 96 is out of bounds for dimension 0 with
    size 33`). Exit 0 the write ran, 1 it failed, 2 bad input, 3 unavailable.

    Example: `validate-batch probe-slot --rows 33 --slot 96 --width 4`
    """
    from ..kernel_mode.slot_probe import probe_slot_index

    output = Output.for_flags(as_json)
    out = output.console
    try:
        res = probe_slot_index(rows, width, slot, device=device, timeout=timeout, child=_child(python, backend))
    except InputError as e:
        output.error(e)
    if output.is_json:
        output.json(res)
    else:
        where = "in bounds" if res["in_bounds"] else "OUT OF BOUNDS"
        out.print(f"slot {slot} of a [{rows}, {width}, 128] bf16 buffer ({where})")
        if not res.get("available"):
            out.print(f"  {device}: unavailable - {res.get('reason')}")
        else:
            out.print(f"  {device}: {res['outcome']}" + (f" - {res['message']}" if res.get("message") else ""))
        cpu = res.get("cpu")
        if cpu:
            out.print(f"  cpu:  {cpu['outcome']}" + (f" - {cpu['message']}" if cpu.get("message") else ""))
        if res.get("expected_cpu_message"):
            ran = res.get("available") and (cpu is not None or device == "cpu")
            said = ("torch's CPU bounds check says" if ran else
                    "torch's CPU bounds check would say (its message, written out here: torch did not run)")
            out.print(f"  {said}: {res['expected_cpu_message']}")
    if not res.get("available"):
        raise typer.Exit(EXIT_UNAVAILABLE)
    raise typer.Exit(EXIT_AGREE if res.get("outcome") == "ok" else EXIT_DISAGREE)


def env_cmd(
    as_json: bool = typer.Option(False, "--json", help="The report as one JSON object."),
    no_gpu: bool = typer.Option(False, "--no-gpu", help="Do not start the child process that looks at the GPU."),
    timeout: float = typer.Option(60.0, "--timeout", help=TIMEOUT_HELP),
    python: Optional[str] = typer.Option(None, "--python", help=PYTHON_HELP),
    backend: Optional[str] = typer.Option(None, "--backend", help=BACKEND_HELP, hidden=True),
):
    """Which FlashMLA builds are installed, which one a check would use, torch, the GPU, what to install.

    Builds come from package metadata and files (nothing is imported here): name (as in
    rules/flashmla.json), version, module path and API. `--build auto` is the installed build,
    else the default generation. The GPU is read in a child process (skip with --no-gpu).
    Exit 0 kernel mode can run here, 3 it cannot (or, with --no-gpu, was not determined and cannot).

    Examples: `validate-batch env`, `validate-batch doctor --json --no-gpu`
    """
    from ..kernel_mode.env import environment, render_environment

    output = Output.for_flags(as_json)
    if timeout <= 0:
        output.error(InputError("--timeout", f"expected > 0 seconds, got {timeout}"))
    env = environment(check_gpu=not no_gpu, timeout=timeout, child=_child(python, backend))
    if output.is_json:
        output.json(env)
    else:
        render_environment(env, output.console)
    available = (env.get("kernel_mode") or {}).get("available")
    raise typer.Exit(EXIT_AGREE if available or (available is None and no_gpu) else EXIT_UNAVAILABLE)


def register(app) -> None:
    """Add the kernel-mode commands to the ``validate-batch`` app."""
    app.command("kernel-check")(kernel_check_cmd)
    app.command("probe")(probe_cmd)
    app.command("probe-slot")(probe_slot_cmd)
    app.command("env")(env_cmd)
    app.command("doctor", help="Same as `env`: installed FlashMLA builds, torch, the GPU, what to install.")(env_cmd)
