"""What the hostile-input tests share: a timed command-line run and the check that it was refused at once.

Not a speed target (bench/ measures those): a bound that tells "refused at once" from the unbounded work
hostile inputs caused before (tens of seconds to minutes), with room for a loaded machine.
"""
from __future__ import annotations

import os
import time

from typer.testing import CliRunner

from validate_batch.cli.main import app

TIME_BOUND_S = 10.0
FUZZ_EXAMPLES = int(os.environ.get("VALIDATE_BATCH_FUZZ_EXAMPLES", "40"))


def cli(args, stdin=None):
    """The command's result and how long it took."""
    t0 = time.monotonic()
    r = CliRunner().invoke(app, [str(a) for a in args], input=stdin)
    return r, time.monotonic() - t0


def refused(r, took, needle=None, max_chars=None):
    """Exit 2 with exactly one ``error:`` line on stderr (naming ``needle``; at most ``max_chars`` long),
    within the time bound."""
    assert r.exit_code == 2, (r.exit_code, r.stdout[-300:], r.stderr[-300:], r.exception)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr[:500]
    assert lines[0].startswith("error: ")
    if max_chars is not None:
        assert len(lines[0]) < max_chars, lines[0][:500]
    if needle is not None:
        assert needle in lines[0], lines[0]
    assert took < TIME_BOUND_S, took
