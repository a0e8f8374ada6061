"""``validate-batch --version``: the one line, without loading the commands."""
from __future__ import annotations

from .. import __version__, _accel


def version_line() -> str:
    """``validate-batch VERSION (which implementation runs)``: the package's own version (the one
    ``pyproject.toml`` gives the distribution, held equal by a test), without reading the install's
    metadata (importlib.metadata loads the email and zip packages, more than the rest of the line)."""
    return f"validate-batch {__version__} ({_accel.status()})"
