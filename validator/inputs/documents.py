"""Reading user input: JSON, JSONL or YAML documents from a file or stdin, with line-precise errors."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from ..facts.knowledge import DATA_PACKAGE, data_dir
from ..facts import limits
from ..errors import InputError
from ..facts.limits import echo

MAX_INPUT_BYTES = limits.MAX_DOCUMENT_BYTES
DEVICE_KEYS = frozenset({"device", "num_sms", "cc", "smem_optin", "name", "memory_bytes", "flashmla"})  # flashmla: what recorded it


def read_text(path: str, limit: int | None = None) -> tuple[str, str]:
    """Return (text, display name) of a file, or of stdin when ``path`` is ``-``; at most ``limit``
    bytes (default :data:`MAX_INPUT_BYTES`) are read, whatever the file claims its size is."""
    limit = MAX_INPUT_BYTES if limit is None else limit
    if path == "-":
        src = getattr(sys.stdin, "buffer", sys.stdin)
        data = limits.read_bounded(src, limit, "<stdin>")
        name = "<stdin>"
    else:
        p = Path(path)
        if not p.exists():
            raise InputError("FILE", f"{echo(path)}: no such file")
        if p.is_dir():
            raise InputError("FILE", f"{echo(path)}: is a directory")
        try:
            with open(p, "rb") as fh:
                data = limits.read_bounded(fh, limit, path)
        except OSError as e:
            raise InputError("FILE", f"{echo(path)}: {e.strerror or e}") from None
        name = path
    return data.decode("utf-8", errors="replace"), name


def _json_int(text: str) -> int:
    return limits.parse_int(text, "FILE", limits.MAX_DOCUMENT_INT_DIGITS)


# (a run is tried from its first digit only: the search stays linear on text full of long runs)
_LONG_DIGITS = re.compile(r"(?<![0-9])[0-9]{%d}" % (limits.MAX_DOCUMENT_INT_DIGITS + 1))


def _object(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise InputError("FILE", f"the key {echo(key)} appears twice in one object (JSON keeps only the last)")
    return d


def _loads(text: str) -> Any:
    # the integer hook is a Python call per integer; a text with no run of digits longer than an
    # integer may have parses the same without it (JSON integers are plain digit runs), at C speed.
    # A key given twice in one object is refused (json keeps the last one silently).
    arrays: dict[str, Any] = {}
    long_digits = None
    if len(text) >= MIN_ARRAY_TEXT:
        text, long_digits = _lift_int_lists(text, arrays)
    if long_digits is None:
        long_digits = _LONG_DIGITS.search(text) is not None
    if not long_digits:
        doc = json.loads(text, object_pairs_hook=_object)
    else:
        doc = json.loads(text, parse_int=_json_int, object_pairs_hook=_object)
    return _put_back(doc, arrays) if arrays else doc


#: texts at least this long have their long lists of integers read straight into int64 arrays
MIN_ARRAY_TEXT = 1 << 20
_MIN_LIST_CHARS = 64
# a token at a time, left to right: a string (to its closing quote, or to the end of its line when it
# has none: the match never fails, so the scan stays linear), or a bracketed run of the characters a
# list of integers is written with
_TOKENS = re.compile(r'"(?:[^"\\\n]|\\[^\n])*"?|\[([-0-9, \t\n\r]{%d,})\]' % _MIN_LIST_CHARS)
_JSON_INT = "-?(?:0|[1-9][0-9]{0,17})"          # at most 18 digits: every one fits in int64
_INT_LIST = re.compile("%s(?:,%s)*" % (_JSON_INT, _JSON_INT))
_GAP = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")
_BLANK = str.maketrans("-0123456789,]", " " * 13)


def _lift_int_lists(text: str, arrays: dict) -> tuple[str, bool | None]:
    """``text`` with each long JSON list of integers replaced by a string naming it (one that no input
    can know in advance), padded so that every other character keeps its line and column (a JSON
    error reads the same); the lists, as int64 arrays, go into ``arrays``.

    A Python int and a list slot cost about 36 bytes where the text spent 3 to 8: a 68 MB dense
    record with a block table peaked at 1.0 GB read as lists, 0.3 GB read this way. Only exact JSON integer lists are lifted (no leading zeros, no
    floats, at most 18 digits); anything else stays for the JSON reader and its errors. The flag
    says whether the text outside the lifted lists holds a digit run longer than a document's
    integers may be (None when nothing was lifted)."""
    from secrets import token_hex      # (only for a document with lists to lift)

    nonce = token_hex(8)
    while nonce in text:
        nonce = token_hex(8)
    out: list[str] = []
    blanks: dict[int, str] = {}                     # one padding string per length
    at = 0
    for m in _TOKENS.finditer(text):
        if m.start(1) < 0:
            continue                                # a string
        values = _int_array(text, m.start(1), m.end(1))
        if values is None:
            continue
        name = f'"{nonce}{len(arrays):x}"'
        arrays[name[1:-1]] = values
        start, end = m.span()
        out.append(text[at:start])
        out.append(name)
        if text.find("\n", start, end) >= 0:
            out.append(text[start + len(name):end].translate(_BLANK))   # its newlines stay where they were
        else:
            pad = blanks.get(end - start - len(name))
            if pad is None:
                pad = blanks[end - start - len(name)] = " " * (end - start - len(name))
            out.append(pad)
        at = end
    if not arrays:
        return text, None
    out.append(text[at:])
    # the pieces between lifted lists are the only text that can hold a long digit run
    long_digits = any(_LONG_DIGITS.search(piece) is not None for piece in out[::3])
    return "".join(out), long_digits


_INT_LIST_PIECE = 1 << 16


def _int_array(text: str, start: int, end: int) -> Any:
    """The integers of ``text[start:end]`` (the inside of a JSON list) as an int64 array, or None
    when it is not exactly JSON integers separated by commas. Read a piece of about 64 KiB at a
    time, cut at a comma: the regex engine keeps a backtracking record per repetition (one match
    over millions of values took gigabytes), and no copy of the whole list is made."""
    import numpy as np

    out = np.empty(text.count(",", start, end) + 1, dtype=np.int64)
    filled = 0
    at = start
    while True:
        cut = text.find(",", at + _INT_LIST_PIECE, end) if end - at > _INT_LIST_PIECE else -1
        if cut < 0:
            cut = end
        piece = text[at:cut].strip(" \t\n\r").replace(", ", ",")
        if _has_space(piece):
            piece = _GAP.sub(",", piece)
            if _has_space(piece):
                return None                         # a space inside a number: not JSON
        if _INT_LIST.fullmatch(piece) is None:
            return None                             # (an empty piece too: ",," or a trailing comma)
        values = np.fromstring(piece, dtype=np.int64, sep=",")
        if values.shape[0] != piece.count(",") + 1 or filled + values.shape[0] > out.shape[0]:
            return None                             # (the pattern admits only these)
        out[filled:filled + values.shape[0]] = values
        filled += values.shape[0]
        if cut == end:
            return out if filled == out.shape[0] else None
        at = cut + 1


def _has_space(s: str) -> bool:
    return " " in s or "\n" in s or "\t" in s or "\r" in s


def _put_back(doc: Any, arrays: dict) -> Any:
    """``doc`` with each string that names a lifted list replaced by its array (no recursion)."""
    if type(doc) is str:                   # a whole document that is one list stays a list of documents
        return arrays[doc].tolist() if doc in arrays else doc
    stack = [doc] if type(doc) is dict or type(doc) is list else []
    while stack:
        x = stack.pop()
        for k, v in (x.items() if type(x) is dict else enumerate(x)):
            t = type(v)
            if t is str:
                if v in arrays:
                    x[k] = arrays[v]
            elif t is dict or t is list:
                stack.append(v)
    return doc


def loads_document(text: str) -> Any:
    """One JSON document (a JSON Lines record), its integers held to the document's digit limit."""
    return _loads(text)


def _one_line(text: Any) -> str:
    return echo_text(" ".join(str(text).split()), 200)


def echo_text(text: str, limit: int = limits.MAX_ECHO_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


# plain scalars PyYAML's safe loader resolves as YAML 1.1 octal or base-60 (sexagesimal) numbers
_YAML11_ONLY = re.compile(r"[-+]?0[0-7_]+|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")


def _yaml_precheck(yaml: Any, text: str, name: str) -> None:
    """One pass over the YAML events (the parser is iterative): nesting, the size once aliases are
    expanded, scalar lengths and integer digits, before anything is built."""
    sizes: dict[str, tuple[int, int]] = {}      # anchor -> (expanded values, depth below it)
    stack: list[list] = []                      # [anchor, values, depth below, mapping keys, next is a key]
    total = 0
    big_int = re.compile(r"[-+]?(?:0x[0-9a-fA-F_]{%d,}|0o[0-7_]{%d,}|[0-9_]{%d,})" % (
        limits.MAX_DOCUMENT_INT_DIGITS + 1, limits.MAX_DOCUMENT_INT_DIGITS + 1, limits.MAX_DOCUMENT_INT_DIGITS + 1))
    built = 0                                   # nodes the loader will build (aliases share theirs)
    for ev in yaml.parse(text, Loader=_loader(yaml)):
        kind = type(ev).__name__
        if kind in ("MappingStartEvent", "SequenceStartEvent", "ScalarEvent"):
            built += 1
            if built > limits.MAX_YAML_NODES:
                raise InputError("FILE", f"{name}: more than {limits.MAX_YAML_NODES} values in a YAML document "
                                         "(write a larger one as JSON)")
        if stack and stack[-1][3] is not None and kind != "MappingEndEvent" and kind != "SequenceEndEvent":
            top = stack[-1]                     # in a mapping: keys and values alternate
            if top[4]:
                if kind == "ScalarEvent":
                    key = (ev.tag, ev.value)
                    if key in top[3]:
                        raise InputError("FILE", f"{name}:{ev.start_mark.line + 1}: the key {echo(ev.value)} appears "
                                                 "twice in one mapping (YAML keeps only the last)")
                    top[3].add(key)
            top[4] = not top[4]
        if kind in ("MappingStartEvent", "SequenceStartEvent"):
            if len(stack) >= limits.MAX_DEPTH:
                raise InputError("FILE", f"{name}: nested deeper than {limits.MAX_DEPTH} levels")
            stack.append([ev.anchor, 1, 0, set() if kind == "MappingStartEvent" else None, True])
            continue
        if kind in ("MappingEndEvent", "SequenceEndEvent"):
            anchor, n, below = stack.pop()[:3]
            if anchor is not None:
                sizes[anchor] = (n, below + 1)
            n_here, depth_here = n, below + 1
        elif kind == "ScalarEvent":
            v = ev.value
            if len(v) > limits.MAX_STRING_CHARS:
                raise InputError("FILE", f"{name}: a string of {len(v)} characters (at most {limits.MAX_STRING_CHARS})")
            if not ev.style and len(v) > limits.MAX_DOCUMENT_INT_DIGITS and big_int.fullmatch(v):
                raise InputError("FILE", f"{name}: an integer of {len(v)} characters is too long "
                                         f"(at most {limits.MAX_DOCUMENT_INT_DIGITS} digits): {echo(v)}")
            if not ev.style and ev.tag is None and _YAML11_ONLY.fullmatch(v):
                # YAML 1.1 reads 012000 as octal (5120) and 1:20 as base 60 (80): JSON, YAML 1.2 and a
                # person read them as decimal or as text; refused rather than read one way silently
                raise InputError("FILE", f"{name}: {echo(v)} is an octal or base-60 number in YAML 1.1; "
                                         f"write it without the leading zero or colon, or quote it")
            if ev.anchor is not None:
                sizes[ev.anchor] = (1, 0)
            n_here, depth_here = 1, 0
        elif kind == "AliasEvent":
            n_here, depth_here = sizes.get(ev.anchor, (1, 0))
        else:
            continue
        total += n_here
        if total > limits.MAX_NODES:
            raise InputError("FILE", f"{name}: more than {limits.MAX_NODES} values once YAML aliases are expanded")
        if stack:
            top = stack[-1]
            top[1] += n_here
            top[2] = max(top[2], depth_here)
            if top[1] > limits.MAX_NODES:
                raise InputError("FILE", f"{name}: more than {limits.MAX_NODES} values once YAML aliases are expanded")
            if len(stack) + depth_here > limits.MAX_DEPTH:
                raise InputError("FILE", f"{name}: nested deeper than {limits.MAX_DEPTH} levels")


def _loader(yaml: Any) -> Any:
    """PyYAML's safe loader, on libyaml's parser when PyYAML was built with it (the same resolver and
    constructors; scanning and parsing in C)."""
    return getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


def _yaml_documents(text: str, name: str) -> list[Any]:
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a dependency
        raise InputError("FILE", f"{name}: not JSON, and PyYAML is not installed to read YAML") from None
    try:
        _yaml_precheck(yaml, text, name)
        docs = [d for d in yaml.load_all(text, Loader=_loader(yaml)) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or (getattr(e, "reason", None) if hasattr(e, "reason") else None) or e
        if "maximum nesting depth" in str(what):       # libyaml's own limit, above this one
            raise InputError("FILE", f"{name}: nested deeper than {limits.MAX_DEPTH} levels") from None
        raise InputError("FILE", f"{name}{where}: neither JSON nor valid YAML: {_one_line(what)}") from None
    except InputError:
        raise
    except (ValueError, OverflowError, RecursionError, KeyError, IndexError, AttributeError, TypeError) as e:
        # a tag over a scalar its constructor does not expect (``!!bool 1``, ``!!int ''``, ``!!timestamp 1``)
        raise InputError("FILE", f"{name}: a YAML value that cannot be read: {_one_line(e)}") from None
    return docs


def parse_documents(text: str, name: str = "<input>") -> list[Any]:
    """One JSON value, JSON Lines, or YAML -> list of documents (a top-level JSON array is one list).
    Every document is held to :mod:`validate_batch.facts.limits` (depth, values, string length, integer digits)."""
    docs = _parse_documents(text, name)
    limits.check_tree(docs, "FILE", max_depth=limits.MAX_DEPTH + 1)
    return docs


def _parse_documents(text: str, name: str) -> list[Any]:
    stripped = text.lstrip()        # (trailing space changes no position; not copying a large text)
    if not stripped:
        raise InputError("FILE", f"{name}: empty input")
    try:
        doc = _loads(stripped)
        return doc if isinstance(doc, list) else [doc]
    except RecursionError:
        raise InputError("FILE", f"{name}: nested deeper than {limits.MAX_DEPTH} levels") from None
    except json.JSONDecodeError as first_err:
        lines = [ln for ln in stripped.split("\n")]
        first_is_record = False
        if len(lines) > 1:
            try:
                _loads(lines[0])
                first_is_record = True
            except (json.JSONDecodeError, RecursionError):
                pass
        if stripped[0] in "{[" and first_is_record:
            docs = []
            for no, ln in enumerate(lines, 1):
                if not ln.strip():
                    continue
                try:
                    docs.append(_loads(ln))
                except json.JSONDecodeError as e:
                    raise InputError("FILE", f"{name}:{no}: invalid JSON Lines record: {e.msg} (column {e.colno})") from None
                except RecursionError:
                    raise InputError("FILE", f"{name}:{no}: nested deeper than {limits.MAX_DEPTH} levels") from None
            return docs
        at = stripped[first_err.pos:first_err.pos + 1]
        if stripped[0] in "{[" and not (at.isalpha() or at in "_'!&*"):
            raise InputError("FILE", f"{name}:{first_err.lineno}: invalid JSON: {first_err.msg} (column {first_err.colno})") from None
        if stripped[0] in "{[":
            try:   # a YAML flow document ({kind: sparse}): JSON stopped at a bare word
                docs = _yaml_documents(stripped, name)
            except InputError as e:
                if "YAML aliases" in e.message or "nested deeper" in e.message or "too long" in e.message:
                    raise
                raise InputError("FILE", f"{name}:{first_err.lineno}: invalid JSON: {first_err.msg} "
                                         f"(column {first_err.colno})") from None
        else:
            docs = _yaml_documents(stripped, name)
    if len(docs) == 1 and isinstance(docs[0], list):
        return docs[0]
    return docs


def is_device_header(doc: Any) -> bool:
    return isinstance(doc, dict) and bool(doc) and set(doc) <= DEVICE_KEYS and "num_sms" in doc


def load_documents(path: str) -> list[Any]:
    text, name = read_text(path)
    return parse_documents(text, name)


def example_path(name: str) -> str:
    """The file of a built-in example (``rules/examples/NAME.{json,yaml,jsonl}``); InputError naming
    ``--example`` and the known names otherwise."""
    folder = data_dir()
    if folder is not None:
        base = Path(folder, "examples")
    else:
        from importlib import resources     # (only off a plain folder: it loads tempfile and more)

        base = resources.files(DATA_PACKAGE).joinpath("examples")
    names = sorted(p.name.rsplit(".", 1)[0] for p in base.iterdir() if p.name.endswith((".json", ".yaml", ".jsonl")))
    for ext in (".json", ".yaml", ".jsonl"):
        cand = base.joinpath(name + ext)
        if name in names and cand.is_file():
            return str(cand)
    raise InputError("--example", f"unknown example {echo(name)}; built-in examples: {', '.join(names)}")
