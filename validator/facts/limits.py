"""The limits every input is held to, in one place, and the checks that enforce them before work.

Input (documents, flags, logs, crash dumps) is untrusted: whatever it holds, reading it ends in a
result or in :class:`~validate_batch.errors.InputError` (exit 2, one line), within bounded time and
memory. The checks here never recurse on the input and never render a whole value: an echoed value
is cut to :data:`MAX_ECHO_CHARS`.
"""
from __future__ import annotations

from typing import Any

from ..errors import InputError

MAX_DOCUMENT_BYTES = 256 * 1024 * 1024   # one batch / call-record document (file or stdin)
MAX_DEPTH = 64                           # nesting of lists and mappings in a document or crash dump
MAX_NODES = 1 << 24                      # values of a document once YAML aliases / shared references are expanded
MAX_YAML_NODES = 1 << 18                 # values a YAML document builds (its loader is Python: JSON for larger)
MAX_DUMP_NODES = 1 << 20                 # values of a crash dump once shared references are expanded
MAX_STRING_CHARS = 1 << 20               # one string (scalar) of a document
MAX_INT_DIGITS = 20                      # digits of one integer in a log line or a flag (2**64 has 20)
MAX_DOCUMENT_INT_DIGITS = 1000           # digits of one integer in a document (its field's range check names it)
MAX_ECHO_CHARS = 80                      # characters of a value quoted in an error line
MAX_LOG_LINE_BYTES = 64 * 1024 * 1024    # one log line (only its first 1 MiB is kept): longer is not a log
MAX_LOG_BYTES = 1 << 40                  # bytes of one log (after decompression)
GZIP_FLOOR_BYTES = 1 << 20               # decompressed bytes always allowed for a .gz log; beyond them ...
GZIP_MAX_RATIO = 64                      # ... at most this many per compressed byte read
FIFO_WAIT_S = 1.0                        # how long a named pipe may stay without a writer
MAX_REPR_SCAN = 64 * 1024 * 1024         # characters the repr reader may visit for one value


def echo(value: Any, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, built without recursion and without rendering more
    than the limit (a deep, self-containing or huge value costs O(limit))."""
    out: list[str] = []
    size = 0
    stack: list[Any] = [value]
    seen: set[int] = set()
    while stack and size <= limit:
        x = stack.pop()
        if isinstance(x, _Text):
            piece = x.text
        elif isinstance(x, bool) or x is None or isinstance(x, float):
            piece = repr(x)
        elif isinstance(x, int):
            piece = repr(x) if x.bit_length() < 200 else f"<integer of about {int(x.bit_length() * 0.30103)} digits>"
        elif isinstance(x, (str, bytes, bytearray)):
            piece = repr(x[:limit + 1])
        elif isinstance(x, (list, tuple, dict, set, frozenset)):
            if id(x) in seen:
                piece = "[...]"
            else:
                seen.add(id(x))
                op, cl = ("{", "}") if isinstance(x, (dict, set, frozenset)) else ("(", ")") if isinstance(x, tuple) else ("[", "]")
                parts: list[Any] = [_Text(cl)]
                items = list(x.items()) if isinstance(x, dict) else list(x) if len(x) <= limit else list(x)[:limit]
                for j in range(len(items) - 1, -1, -1):
                    it = items[j]
                    if isinstance(x, dict):
                        parts += [it[1], _Text(": "), it[0]]
                    else:
                        parts.append(it)
                    if j:
                        parts.append(_Text(", "))
                stack.extend(parts)
                piece = op
        else:
            try:
                piece = repr(x)[:limit + 1]
            except Exception:
                piece = f"<{type(x).__name__}>"
        out.append(piece)
        size += len(piece)
    text = "".join(out)
    if size > limit or stack:
        text = text[:max(limit - 3, 1)] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class _Text:
    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


def parse_int(text: str, field: str, digits: int = MAX_INT_DIGITS) -> int:
    """A decimal integer written as text, refused (InputError naming ``field``) when it has more than
    ``digits`` digits, before ``int()`` ever sees it."""
    t = text.strip().replace("_", "")
    body = t[1:] if t[:1] in "+-" else t
    if len(body) > digits:
        raise InputError(field, f"an integer of {len(body)} digits is too long (at most {digits}): {echo(text)}")
    try:
        return int(t)
    except ValueError:
        raise InputError(field, f"expected an integer, got {echo(text)}") from None


def check_int(v: int, field: str, digits: int = MAX_INT_DIGITS) -> int:
    """An already-built integer with at most ``digits`` digits (magnitude below ``10**digits``)."""
    if v.bit_length() > 3.33 * digits and abs(v) >= 10 ** digits:
        raise InputError(field, f"{echo(v)} is too large (at most {digits} digits)")
    return v


def check_tree(value: Any, field: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES,
               max_string: int = MAX_STRING_CHARS, children: Any = None) -> int:
    """Walk ``value`` without recursion: nesting at most ``max_depth``, at most ``max_nodes`` values
    (a shared list counts once per reference, a list containing itself is refused), no string longer
    than ``max_string`` and no integer over :data:`MAX_DOCUMENT_INT_DIGITS` digits. ``children(x)``
    gives the parts of other objects (a tuple), or None for a leaf.

    Each distinct container is walked once: its expanded size and height are remembered, so a
    reference to it again adds them without a second walk (a tower of shared references is refused
    in time proportional to its distinct values, not to its expansion). Returns the number of values
    counted."""
    def too_many():
        return InputError(field, f"more than {max_nodes} values (counting repeated references)")

    nodes = 0
    done: dict[int, tuple[int, int]] = {}   # container id -> (expanded values, height), once walked
    keep: list[Any] = []                    # keeps walked containers alive while their ids are keys
    open_ids: set[int] = set()              # containers on the current path
    # entries: (value, depth) to visit, or (None, -1 - k) to close the container opened k-th
    stack: list[tuple[Any, int]] = [(value, 0)]
    opened: list[tuple[Any, int, int, int]] = []   # (container, depth, nodes at entry, deepest at entry)
    deepest = 0
    while stack:
        x, depth = stack.pop()
        if depth < 0:                          # closing a container: its size and height are known
            c, cdepth, at, outer = opened.pop()
            done[id(c)] = (nodes - at, deepest - cdepth)
            keep.append(c)
            open_ids.discard(id(c))
            deepest = max(deepest, outer)
            continue
        if depth > deepest:
            deepest = depth
        t = type(x)
        if t is int:
            nodes += 1
            if x.bit_length() > 64:
                check_int(x, field, MAX_DOCUMENT_INT_DIGITS)
        elif t is str:
            nodes += 1
            if len(x) > max_string:
                raise InputError(field, f"a string of {len(x)} characters (at most {max_string}): {echo(x)}")
            if not x.isascii():
                try:
                    x.encode("utf-8")
                except UnicodeEncodeError:
                    raise InputError(field, f"a string that is not valid Unicode (a lone surrogate): {echo(x)}") from None
        else:
            parts = None
            if t is list or t is tuple or t is dict:
                parts = x
            elif isinstance(x, int) and not isinstance(x, bool):
                nodes += 1
                check_int(x, field, MAX_DOCUMENT_INT_DIGITS)
            elif t.__name__ == "ndarray" and t.__module__ == "numpy" and x.ndim == 1 and x.dtype.kind in "iu":
                if depth >= max_depth:          # a list of integers the reader took in as an array:
                    raise InputError(field, f"nested deeper than {max_depth} levels")
                nodes += x.shape[0]             # counted as the list (itself, below, and its values)
                if x.shape[0] and depth + 1 > deepest:
                    deepest = depth + 1
            elif children is not None:
                parts = children(x)
            if parts is None:
                nodes += 1
            else:
                key = id(x)
                if key in open_ids:
                    raise InputError(field, "a value that contains itself")
                seen = done.get(key)
                if seen is not None:            # walked before: add its expansion
                    nodes += seen[0]
                    if depth + seen[1] > deepest:
                        deepest = depth + seen[1]
                    if depth + seen[1] > max_depth:
                        raise InputError(field, f"nested deeper than {max_depth} levels")
                else:
                    if depth >= max_depth:
                        raise InputError(field, f"nested deeper than {max_depth} levels")
                    nodes += 1
                    open_ids.add(key)
                    opened.append((x, depth, nodes - 1, deepest))
                    deepest = depth
                    stack.append((None, -1))
                    if t is dict:
                        for k, v in x.items():
                            stack.append((k, depth + 1))
                            stack.append((v, depth + 1))
                    elif (t is list or t is tuple) and _plain_numbers(x):
                        nodes += len(x)         # a column of plain numbers: counted without a push each
                        if x and depth + 1 > deepest:
                            deepest = depth + 1
                    elif t is list and depth + 1 < max_depth and _number_rows(x):
                        # a list of such columns (a table): each row counted as its values and itself,
                        # as walking it would (rows hold numbers only, so none contains another)
                        nodes += len(x) + sum(map(len, x))
                        if depth + 1 > deepest:
                            deepest = depth + (2 if any(x) else 1)
                    else:
                        stack.extend((v, depth + 1) for v in parts)
        if nodes > max_nodes:
            raise too_many()
    return nodes


_NUMBER_TYPES = (frozenset({int}), frozenset({float}), frozenset({int, float}), frozenset())


def _plain_numbers(x: list | tuple) -> bool:
    """Every value is a plain int in [-2**63, 2**64) or a float (a few C passes; the element loop
    only for lists mixing ints with floats)."""
    types = frozenset(map(type, x))
    if types not in _NUMBER_TYPES:
        return False
    if types == _NUMBER_TYPES[0]:
        return -(1 << 63) <= min(x) and max(x) < (1 << 64)
    if float not in types:
        return True       # empty
    return int not in types or all(type(v) is float or -(1 << 63) <= v < (1 << 64) for v in x)


def _number_rows(x: list) -> bool:
    """A non-empty list of lists, each one of :func:`_plain_numbers`."""
    return bool(x) and set(map(type, x)) == _LIST_TYPES and all(map(_plain_numbers, x))


_LIST_TYPES = frozenset({list})


def bounded_chunks(fh: Any, limit: int, name: str, field: str = "FILE", size: int = 1 << 20):
    """The bytes of a file object in chunks of at most ``size``; InputError once more than ``limit``
    bytes came (a device or pipe that never ends stops at the budget). Text chunks are encoded."""
    total = 0
    while True:
        chunk = fh.read(min(size, limit + 1 - total))
        if not chunk:
            return
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", "surrogateescape")
        total += len(chunk)
        if total > limit:
            raise InputError(field, f"{name}: larger than {limit} bytes")
        yield chunk


def read_bounded(fh: Any, limit: int, name: str, field: str = "FILE") -> bytes:
    """At most ``limit`` bytes from a binary file object, read in chunks; InputError once it holds
    more (a device or pipe that never ends stops at the budget)."""
    return b"".join(bounded_chunks(fh, limit, name, field))
