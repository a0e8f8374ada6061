"""The top-level help (``validate-batch``, ``--help``, ``-h``), written without typer.

The words are declared here once: typer's app (:mod:`validate_batch.cli.app`) takes its description
and its two options' help from this module, and :data:`COMMANDS` gives each command's line in the
listing, the opening words of its own ``--help``. :func:`text` lays them out as click's plain help
does (usage, description, options, commands), so the console script answers ``--help`` in the time
of a small tool instead of loading typer, click and the command modules (about 90 ms).
``tests/test_cli_tophelp.py`` holds the listing to typer's app: the same commands in the same
order, each line the start of that command's help, the same options and description.
"""
from __future__ import annotations

import os
import sys

USAGE = "Usage: validate-batch [OPTIONS] COMMAND [ARGS]..."

#: the description, in typer's markdown (paragraphs apart by a blank line, ``*`` items)
ABOUT = (
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
)

VERSION_HELP = "Print the version and whether the compiled helpers are in use, then exit."
DEBUG_HELP = "On an internal error (exit 4), print the traceback too."

#: the options of the top level as the help lists them (the two completion options are typer's own)
OPTIONS = (
    ("--version", VERSION_HELP),
    ("--debug", DEBUG_HELP),
    ("--install-completion", "Install completion for the current shell."),
    ("--show-completion", "Show completion for the current shell, to copy it or customize the installation."),
    ("-h, --help", "Show this message and exit."),
)

#: every command, in the order typer's app registers them, with the opening words of its help
COMMANDS = (
    ("metadata", "Compute what FlashMLA's scheduler would write for each call: num_sm_parts, "
                 "tile_scheduler_metadata, num_splits."),
    ("check", "Verdict for kernel calls or an engine batch."),
    ("builds", "List the FlashMLA builds the tool knows, with the kernels each runs and what is measured."),
    ("rules", "List every rule code with its severity, title and how it crashes."),
    ("explain", "Print a rule's documentation page: what it checks, why it crashes, example, fix, source."),
    ("schema", "Print a JSON schema of the tool's input or output (JSON Schema 2020-12; its `$id` is the version, "
               "e.g. `validate-batch/report/1`)."),
    ("gpus", "List the GPU profiles (SM count, compute capability, opt-in shared memory, source)."),
    ("engines", "List the engine profiles, their versions (what changes between them) and the releases read."),
    ("kernel-check", "Run each call on the real kernels (FlashMLA; FlashInfer's MLA plan; DeepGEMM's indexer "
                     "metadata) and diff with the model."),
    ("probe", "Find a limit on the hardware by bisection (one child process per probe), beside the model's answer."),
    ("probe-slot", "Write row SLOT of a slot-indexed buffer of ROWS rows on the GPU (child process) and report "
                   "how it fails."),
    ("env", "Which FlashMLA builds are installed, which one a check would use, torch, the GPU, what to install."),
    ("doctor", "Same as `env`: installed FlashMLA builds, torch, the GPU, what to install."),
    ("bisect", "Find the step that crashed an engine, the rule that explains it, and the boundary."),
    ("map", "Map where a step is legal, falls back or crashes, over two axes, for a FlashMLA build."),
)

#: the widest the help is laid out, as click's plain help (a wider terminal gets the same lines)
MAX_WIDTH = 80


def width(stream=None) -> int:
    """The columns to lay the help out in: ``COLUMNS`` if set, else the terminal's (80 when the output
    is not a terminal), at most :data:`MAX_WIDTH` and at least 50 (the usage line's width)."""
    try:
        cols = int(os.environ.get("COLUMNS", "") or 0)
    except ValueError:
        cols = 0
    if cols <= 0:
        try:
            cols = os.get_terminal_size((stream or sys.stdout).fileno()).columns
        except (OSError, AttributeError, ValueError):
            cols = MAX_WIDTH
    return max(50, min(cols, MAX_WIDTH))


def _wrap(text: str, cols: int, first: str, rest: str) -> list[str]:
    """``text`` filled to ``cols`` after the prefix ``first`` (``rest`` on the lines after it), at
    spaces only: a long word or a JSON token is never cut."""
    lines, line, empty = [], first, True
    for word in text.split():
        if not empty and len(line) + 1 + len(word) > cols:
            lines.append(line)
            line, empty = rest, True
        line, empty = (line + word if empty else line + " " + word), False
    lines.append(line)
    return lines


def _listing(rows, cols: int) -> list[str]:
    left = min(max(len(name) for name, _ in rows), 30) + 4      # two spaces before, two after
    out = []
    for name, help_ in rows:
        head = f"  {name}".ljust(left) if len(name) + 4 <= left else f"  {name}  "
        out += _wrap(help_, cols, head, " " * left)
    return out


def text(cols: int | None = None) -> str:
    """The help, laid out in ``cols`` columns (default: :func:`width`)."""
    cols = width() if cols is None else cols
    out = [USAGE, ""]
    for para in ABOUT.split("\n\n"):
        item = para.startswith("* ")
        out += _wrap(para, cols, "  ", "    " if item else "  ")
        out.append("")
    out.append("Options:")
    out += _listing(OPTIONS, cols)
    out += ["", "Commands:"]
    out += _listing(COMMANDS, cols)
    return "\n".join(out) + "\n"
