"""``validate-batch --version``: the one line, without loading the commands."""
from __future__ import annotations

from .. import _accel


def version_line() -> str:
    """``validate-batch VERSION (which implementation runs)``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("validate-batch")
    except PackageNotFoundError:
        v = "(not installed)"
    return f"validate-batch {v} ({_accel.status()})"
