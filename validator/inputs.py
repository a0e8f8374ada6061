"""Reading user input: JSON, JSONL or YAML documents from a file or stdin, with line-precise errors."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .errors import InputError

MAX_INPUT_BYTES = 256 * 1024 * 1024
DEVICE_KEYS = frozenset({"device", "num_sms", "cc", "smem_optin", "name", "memory_bytes", "flashmla"})  # flashmla: what recorded it


def read_text(path: str) -> tuple[str, str]:
    """Return (text, display name) of a file, or of stdin when ``path`` is ``-``."""
    if path == "-":
        data = sys.stdin.read(MAX_INPUT_BYTES + 1)
        name = "<stdin>"
    else:
        p = Path(path)
        if not p.exists():
            raise InputError("FILE", f"{path}: no such file")
        if p.is_dir():
            raise InputError("FILE", f"{path}: is a directory")
        if p.stat().st_size > MAX_INPUT_BYTES:
            raise InputError("FILE", f"{path}: larger than {MAX_INPUT_BYTES} bytes")
        data = p.read_text(encoding="utf-8", errors="replace")
        name = path
    if len(data) > MAX_INPUT_BYTES:
        raise InputError("FILE", f"{name}: larger than {MAX_INPUT_BYTES} bytes")
    return data, name


def parse_documents(text: str, name: str = "<input>") -> list[Any]:
    """One JSON value, JSON Lines, or YAML -> list of documents (a top-level JSON array is one list)."""
    stripped = text.strip()
    if not stripped:
        raise InputError("FILE", f"{name}: empty input")
    try:
        doc = json.loads(stripped)
        return doc if isinstance(doc, list) else [doc]
    except json.JSONDecodeError as first_err:
        lines = [ln for ln in stripped.splitlines()]
        first_is_record = False
        if len(lines) > 1:
            try:
                json.loads(lines[0])
                first_is_record = True
            except json.JSONDecodeError:
                pass
        if stripped[0] in "{[" and first_is_record:
            docs = []
            for no, ln in enumerate(lines, 1):
                if not ln.strip():
                    continue
                try:
                    docs.append(json.loads(ln))
                except json.JSONDecodeError as e:
                    raise InputError("FILE", f"{name}:{no}: invalid JSON Lines record: {e.msg} (column {e.colno})") from None
            return docs
        if stripped[0] in "{[":
            raise InputError("FILE", f"{name}:{first_err.lineno}: invalid JSON: {first_err.msg} (column {first_err.colno})") from None
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a dependency
        raise InputError("FILE", f"{name}: not JSON, and PyYAML is not installed to read YAML") from None
    try:
        docs = [d for d in yaml.safe_load_all(stripped) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise InputError("FILE", f"{name}{where}: neither JSON nor valid YAML: {getattr(e, 'problem', e)}") from None
    if len(docs) == 1 and isinstance(docs[0], list):
        return docs[0]
    return docs


def is_device_header(doc: Any) -> bool:
    return isinstance(doc, dict) and bool(doc) and set(doc) <= DEVICE_KEYS and "num_sms" in doc


def load_documents(path: str) -> list[Any]:
    text, name = read_text(path)
    return parse_documents(text, name)
