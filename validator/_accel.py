"""The optional compiled helpers (``validator/_walk.c``), or None.

The install builds them when a C compiler is available; without one it still succeeds and every
caller takes its pure-Python path, with the same results (the tests run both). Setting the
environment variable ``VALIDATE_BATCH_PURE_PYTHON`` (to anything non-empty) before the first import
of :mod:`validator` turns them off. Callers read :data:`compiled` at call time.
"""
from __future__ import annotations

import os

compiled = None
reason = ""
if os.environ.get("VALIDATE_BATCH_PURE_PYTHON"):
    reason = "turned off by VALIDATE_BATCH_PURE_PYTHON"
else:
    try:
        from . import _walk as compiled
    except ImportError as e:
        from importlib.util import find_spec

        if find_spec(f"{__package__}._walk") is None:   # no C compiler at install time
            reason = "not built at install: no C compiler then?"
        else:                                           # built, but it does not load here
            reason = f"built but not loadable: {e}"


def status() -> str:
    """One line for ``--version``-style output and benchmarks: which implementation runs."""
    return "compiled walk and list checks" if compiled is not None else f"pure Python ({reason})"
