"""The ``validate-batch`` command line: the console script's entry point.

Results go to stdout, diagnostics to stderr. Exit codes: 0 legal, 1 illegal, 2 bad input (one line
naming the field), 4 internal error (one line; ``VALIDATE_BATCH_DEBUG=1`` adds the traceback).
Kernel mode adds 3 (unavailable here); ``--strict-provenance`` adds 5 (the verdict rests on a fact
that is not measured on its build).

This module loads nothing heavy: ``--version`` and the top-level help (:mod:`validate_batch.cli.tophelp`)
are answered here, before any command is loaded; the
common forms of ``check``, ``metadata`` and ``rules`` run from :mod:`validate_batch.cli.commands`
without typer (:func:`~validate_batch.cli.commands.direct_call`); every other command line goes to
typer's app in :mod:`validate_batch.cli.app`. The names of both are also reachable from here.
"""
from __future__ import annotations

import sys

try:                    # the signal module's own import loads enum for its constants: not needed here
    import _signal as _sig
except ImportError:     # (an interpreter without the C module)
    import signal as _sig


#: the commands :func:`validate_batch.cli.commands.direct_call` may run without typer (its
#: ``DIRECT_COMMANDS``; a test holds the two equal): any other command line loads typer's app alone
DIRECT = frozenset({"check", "metadata", "rules"})


def main(args: list[str] | None = None) -> None:
    """The ``validate-batch`` console script: exit codes 0-3 as above; an unexpected exception exits
    4 with one line on stderr (``VALIDATE_BATCH_DEBUG=1`` adds the traceback). A reader that closes
    the output pipe early (``| head``) ends the process as it ends ``cat``: quietly, by SIGPIPE."""
    if hasattr(_sig, "SIGPIPE"):
        _sig.signal(_sig.SIGPIPE, _sig.SIG_DFL)
    argv = sys.argv[1:] if args is None else list(args)
    if argv == ["--version"]:
        from .version import version_line

        print(version_line())
        sys.exit(0)
    if argv in ([], ["--help"], ["-h"]):       # the top-level help: as typer's app gives it, without typer
        from .tophelp import text

        sys.stdout.write(text())
        sys.exit(2 if not argv else 0)         # (a bare command line is a usage error that shows the help)
    if argv and argv[0] in DIRECT:
        from . import commands

        call = commands.direct_call(argv)
        if call is not None:
            commands.run_direct(*call)
    from . import app

    app.run(argv, args)


def __getattr__(name: str):
    # the commands' names (``app``, ``check``, ``direct_call``, ...), for callers that import them from
    # here: the direct path's bodies first, then typer's declarations
    if name.startswith("__"):         # (the import system asks for __path__ and the like)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import commands

    if hasattr(commands, name):
        return getattr(commands, name)
    from . import app

    try:
        return getattr(app, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


if __name__ == "__main__":
    main()
