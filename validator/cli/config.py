"""Settings for ``check`` and ``metadata`` from ``[tool.validate-batch]`` in ``pyproject.toml`` and
from environment variables, for CI that runs the same command on every pull request.

Precedence, highest first: the command-line flag; the environment variable; the
``[tool.validate-batch]`` table of the nearest ``pyproject.toml`` (the current directory, then each
parent); nothing (the command's own default). A value from the environment or the file is used as if
the flag had been given. ``engine`` names the engine profile of a quick batch given without
``--engine`` and of a batch document that names none.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError

#: setting -> environment variable
ENV = {"engine": "VALIDATE_BATCH_ENGINE", "gpu": "VALIDATE_BATCH_GPU", "build": "VALIDATE_BATCH_BUILD",
       "select": "VALIDATE_BATCH_SELECT", "ignore": "VALIDATE_BATCH_IGNORE"}
TABLE = "tool.validate-batch"


def find_pyproject(start: Optional[str] = None) -> Optional[Path]:
    """The nearest ``pyproject.toml``: in ``start`` (default: the current directory) or a parent."""
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        p = d / "pyproject.toml"
        if p.is_file():
            return p
    return None


def names_table(text: str) -> bool:
    """Whether ``text`` can hold a ``validate-batch`` key at all: TOML spells that key as written
    (bare or quoted) or through a ``\\u``/``\\U`` escape in a quoted key, so a file with neither
    cannot hold the table and is not parsed (a project's pyproject.toml without it costs no
    TOML parser at start-up)."""
    return "validate-batch" in text or "\\u" in text or "\\U" in text


def _toml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(str(path), f"cannot read [{TABLE}]: {' '.join(str(e).split())}") from None
    if not names_table(text):
        return {}
    try:
        import tomllib  # noqa: PLC0415 (Python >= 3.11)
    except ImportError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # noqa: PLC0415
        except ImportError:
            return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(str(path), f"cannot read [{TABLE}]: {' '.join(str(e).split())}") from None


def _value(key: str, v: Any, where: str) -> Optional[str]:
    """A setting as the flag's string: a list (select, ignore) joined by commas."""
    if key in ("select", "ignore") and isinstance(v, list) and all(isinstance(x, str) for x in v):
        return ",".join(v)
    if isinstance(v, str) and v.strip():
        return v.strip()
    raise InputError(where, f"expected {'a list of rule codes or ' if key in ('select', 'ignore') else ''}"
                            f"a non-empty string, got {v!r:.80}")


def file_settings(path: Optional[Path]) -> dict[str, str]:
    """``[tool.validate-batch]`` of ``path`` (empty when there is none); an unknown key is bad input."""
    if path is None:
        return {}
    table = _toml(path).get("tool", {}).get("validate-batch")
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise InputError(f"{path} [{TABLE}]", "expected a table")
    unknown = sorted(set(table) - set(ENV))
    if unknown:
        raise InputError(f"{path} [{TABLE}]", f"unknown key(s) {', '.join(unknown)}; known: {', '.join(ENV)}")
    return {k: _value(k, v, f"{path} [{TABLE}] {k}") for k, v in table.items()}


def resolve(flags: dict[str, Optional[str]], start: Optional[str] = None) -> dict[str, Optional[str]]:
    """Each setting of ``flags`` (``None``: not given) from the flag, else the environment, else the file."""
    out = dict(flags)
    missing = [k for k, v in flags.items() if v is None]
    if not missing:
        return out
    from_file: Optional[dict] = None
    for k in missing:
        env = os.environ.get(ENV[k], "").strip()
        if env:
            out[k] = env
            continue
        if from_file is None:
            from_file = file_settings(find_pyproject(start))
        out[k] = from_file.get(k)
    return out
