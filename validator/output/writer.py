"""The command line's one output object: results on stdout, diagnostics on stderr.

Modes:

* ``human``: text and tables on stdout (rich on a terminal; elsewhere the same text through
  :class:`~validate_batch.output.plain.PlainConsole`, rich only for a table);
* ``json``: one compact JSON document per result on stdout;
* ``quiet``: nothing on stdout; the exit code is the answer.

Errors and progress go to stderr in every mode. Exit codes shared by every command: 2 bad input
(one line naming the field), 4 internal error (one line; the traceback with ``VALIDATE_BATCH_DEBUG=1``).
"""
from __future__ import annotations

import json
import os
import sys
from functools import lru_cache
from typing import Any, Callable, NoReturn, Optional

from ..errors import InputError
from ..facts.knowledge import build_record
from .plain import PlainConsole, renders_plain
from .safe import SafeStream, clean, clean_lines

EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERNAL = 4
#: ``--strict-provenance``: the verdict rests on a fact read from source or a binary, not measured
EXIT_READ_FACTS = 5

DEBUG_ENV = "VALIDATE_BATCH_DEBUG"
MODES = ("human", "json", "quiet", "jsonl", "github", "junit", "sarif")
OUTPUT_FORMAT_HELP = ("text (default), json (one object; --json), jsonl (one object per file or call), github "
                      "(GitHub Actions annotations), junit (JUnit XML), sarif (SARIF 2.1.0)")


@lru_cache(maxsize=1)
def _safe_console_class():
    """A rich console whose text is made inert (:mod:`validate_batch.output.safe`): every string it
    renders, and every line it writes. Defined on first use: rich loads only when something is
    rendered for a terminal or a table is written."""
    from rich.console import Console

    class SafeConsole(Console):
        def render_str(self, text: str, *args: Any, **kwargs: Any):
            return super().render_str(clean_lines(text), *args, **kwargs)

    return SafeConsole


def _console(stderr: bool):
    """The console for stdout or stderr. Results on a stdout that is not a terminal go through a
    :class:`~validate_batch.output.plain.PlainConsole`, which writes what rich would write there
    without loading it (a table still loads it)."""
    stream = SafeStream(sys.stderr if stderr else sys.stdout)
    if not stderr and renders_plain(sys.stdout):
        return PlainConsole(stream, lambda: _rich_console(stream))
    return _rich_console(stream)


def _rich_console(stream):
    # (emoji off: a user's text such as ':warning:' is written as it is, not as a picture)
    console = _safe_console_class()(file=stream, highlight=False, soft_wrap=True, markup=False, emoji=False)
    stream._keep_sgr = console.color_system is not None
    return console


def _inert(text: str, mode: str) -> str:
    """Raw output made inert for its format: JSON and XML keep their syntax (``##[`` as an escape of
    the format), the GitHub format keeps its own ``::`` commands (its values are encoded already)."""
    if mode in ("json", "jsonl", "sarif"):
        return text.replace("##[", "##\\u005b")
    if mode == "junit":
        return text.replace("##[", "##&#91;")
    if mode == "github":
        return clean_lines(text, commands=False)
    return clean_lines(text)


class Output:
    """Where a command's results and diagnostics go, in one of :data:`MODES`."""

    def __init__(self, mode: str = "human", output_file: Optional[str] = None):
        if mode not in MODES:
            raise ValueError(f"output mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self._out = None            # the rich consoles, made on first use
        self._err = None
        self._file = None
        if output_file is not None:
            try:        # created (and emptied) at once: an empty result is still a file
                self._file = open(output_file, "w", encoding="utf-8")  # noqa: SIM115 (closed at exit)
            except OSError as e:
                self.fail(f"--output-file: cannot write {output_file!r}: {e.strerror or e}")

    @classmethod
    def for_flags(cls, as_json: bool = False, quiet: bool = False, output_format: Optional[str] = None,
                  output_file: Optional[str] = None) -> "Output":
        """The mode a command's ``--json`` / ``--quiet`` / ``--output-format`` flags ask for (``--json``
        wins, then ``--quiet``; ``text`` is ``human``). An unknown format is bad input (exit 2).
        ``output_file``: the results go to that file instead of stdout (diagnostics stay on stderr)."""
        if as_json:
            return cls("json", output_file)
        if quiet:
            return cls("quiet")
        fmt = (output_format or "text").strip().lower()
        if fmt == "text":
            fmt = "human"
        if fmt not in MODES or fmt == "quiet":
            cls("human").fail(f"--output-format: expected one of text, json, jsonl, github, junit, sarif, got {output_format!r}")
        return cls(fmt, output_file)

    @property
    def stdout(self):
        """Where results go: the ``--output-file``, else stdout."""
        return self._file if self._file is not None else sys.stdout

    @property
    def is_ci(self) -> bool:
        """One of the per-unit CI formats: github, junit, sarif."""
        return self.mode in ("github", "junit", "sarif")

    @property
    def is_json(self) -> bool:
        return self.mode == "json"

    @property
    def is_quiet(self) -> bool:
        return self.mode == "quiet"

    @property
    def renders_plain(self) -> bool:
        """Whether results go where rich would write plain text (a file, a pipe: not a terminal)."""
        return self._file is not None or renders_plain(sys.stdout)

    @property
    def console(self):
        """stdout, for human-mode results (markup off unless a call asks for it): a rich Console."""
        if self._out is None:
            if self._file is None:
                self._out = _console(stderr=False)
            else:
                from rich.console import Console

                self._out = Console(file=self._file, highlight=False, soft_wrap=True, markup=False, width=100)
        return self._out

    @property
    def err_console(self):
        """stderr, for progress and diagnostics."""
        if self._err is None:
            self._err = _console(stderr=True)
        return self._err

    def result(self, obj: Any) -> None:
        """A result: printed as text (or a rich table) in human mode, as JSON in json mode, not at all
        when quiet."""
        if self.mode == "json":
            self.json(obj)
        elif self.mode == "human":
            self.console.print(obj)

    def write(self, text: str) -> None:
        """Raw text on stdout (nothing when quiet)."""
        if self.mode != "quiet":
            self.stdout.write(_inert(text, self.mode))
            if self._file is not None:
                self._file.flush()

    def json(self, obj: Any, default: Optional[Callable[[Any], Any]] = None) -> None:
        """One compact JSON document and a newline on stdout (nothing when quiet)."""
        if self.mode != "quiet":
            self.write(json.dumps(obj, separators=(",", ":"), default=default) + "\n")

    def fail(self, message: str) -> NoReturn:
        """Bad input: ``error: MESSAGE`` on stderr, exit 2."""
        line = clean(" ".join(str(message).split()))
        print(f"error: {line}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)

    def error(self, e: InputError) -> NoReturn:
        """Bad input: one line on stderr naming the field (``error: FIELD: MESSAGE``), exit 2."""
        self.fail(str(e))

    def internal(self, exc: BaseException) -> int:
        """An unexpected exception: one line on stderr (its type and message, and where to report it),
        the traceback before it when ``VALIDATE_BATCH_DEBUG`` is set; returns the exit code (4)."""
        debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
        if debug:
            import traceback

            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        message = clean(" ".join(str(exc).split()))
        if len(message) > 200:
            message = message[:200] + f"... ({len(message)} characters)"
        what = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        hint = "" if debug else f"; --debug or {DEBUG_ENV}=1 shows the traceback"
        print(f"internal error: {what} (a bug in validate-batch: please report it with the command and its input{hint})",
              file=sys.stderr)
        return EXIT_INTERNAL


KERNEL_GEN_HELP = ("FlashMLA build to judge by: a name from `validate-batch builds`, or `auto` (the build installed "
                   "here, read from package metadata); default: the one the engine version ships, else "
                   "rules/flashmla.json's default")


def kernel_option(value: str | None, output: "Output") -> str | None:
    """``--build``: a known build name (InputError otherwise), ``auto`` resolved to the installed
    build (said on stderr), or None."""
    if value is None:
        return None
    if value.strip().lower() == "auto":
        from ..kernel_mode.env import auto_generation  # kernel mode's detection: only when asked for
        from ..kernel_mode.providers import find_providers

        providers = find_providers()
        if not any(p.api is not None for p in providers):
            if not output.is_quiet:
                output.err_console.print("--build auto: no FlashMLA build is installed here; judging by the build "
                                         "the engine version ships (or rules/flashmla.json's default)", markup=False)
            return None
        got = auto_generation(providers)
        if not output.is_quiet:
            output.err_console.print(f"--build auto: {got['generation']} ({got['why']})", markup=False)
        return got["generation"]
    try:
        return build_record(value)["name"]
    except InputError as e:
        raise InputError("--build", e.message) from None
