"""A tolerant reader for Python-``repr``-like text printed in engine logs.

Engines print configuration and crash state as object reprs: ``server_args=ServerArgs(tp_size=8, ...)``
(SGLang) or ``SchedulerOutput(scheduled_new_reqs=[NewRequestData(req_id=abc,...)], ...)`` (vLLM).
Those are not valid Python (request ids are unquoted, dict keys are bare words, some values are
``<object at 0x...>``), and they must never be ``eval``-ed. This module parses them into plain data:

* ``Name(k=v, ...)`` -> :class:`Call` (name, positional args, keyword args)
* ``[...]`` -> list, ``(...)`` -> tuple, ``{k: v}`` -> dict, ``{a, b}`` / ``set()`` -> list
* quoted strings -> str; ``None``/``null``, ``True``/``true``, ``False``/``false`` -> the constants;
  integers and floats -> numbers
* anything else (bare words, ``<...>`` blobs, enum members) -> the raw text as a str

Depth and size are bounded; a value that cannot be read is kept as raw text rather than guessed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..facts.limits import parse_int

MAX_DEPTH = 64
_NUM = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?$")
_INT = re.compile(r"[+-]?\d+$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_CONSTS = {"None": None, "null": None, "True": True, "true": True, "False": False, "false": False}
_OPEN = {"(": ")", "[": "]", "{": "}", "<": ">"}


class ReprParseError(ValueError):
    """The text is not a readable repr; ``pos`` is the character offset of the problem."""

    def __init__(self, message: str, pos: int):
        self.pos = pos
        super().__init__(f"{message} at character {pos}")


@dataclass
class Call:
    """``Name(arg, key=value, ...)`` as data."""

    name: str
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    complete: bool = True   # False when the text ended before the closing parenthesis

    def get(self, key: str, default: Any = None) -> Any:
        return self.kwargs.get(key, default)


def scalar(text: str) -> Any:
    """A bare token -> int / float / bool / None, or the stripped text itself."""
    t = text.strip()
    if t in _CONSTS:
        return _CONSTS[t]
    if _INT.match(t):
        return parse_int(t, "value")
    if _NUM.match(t):
        return float(t)
    if t in ("inf", "-inf", "nan"):
        return float(t)
    return t


class _Reader:
    def __init__(self, text: str, partial: bool):
        self.s = text
        self.n = len(text)
        self.partial = partial

    def ws(self, i: int) -> int:
        while i < self.n and self.s[i] in " \t\r\n":
            i += 1
        return i

    def string(self, i: int) -> tuple[str, int]:
        q = self.s[i]
        out = []
        j = i + 1
        while j < self.n:
            c = self.s[j]
            if c == "\\" and j + 1 < self.n:
                nxt = self.s[j + 1]
                out.append({"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}.get(nxt, "\\" + nxt))
                j += 2
                continue
            if c == q:
                return "".join(out), j + 1
            out.append(c)
            j += 1
        raise ReprParseError("unterminated string", i)

    def skip_balanced(self, i: int) -> int:
        """Skip a bracketed blob starting at ``i`` (``<...>``, or ``(``/``[``/``{`` with quoted strings
        skipped whole); return the index after it."""
        stack = [_OPEN[self.s[i]]]
        j = i + 1
        while j < self.n and stack:
            c = self.s[j]
            if c in "'\"" and stack[-1] != ">":
                _, j = self.string(j)
                continue
            if c in _OPEN and not (c == "<" and stack[-1] != ">"):
                stack.append(_OPEN[c])
            elif c == stack[-1]:
                stack.pop()
            j += 1
        if stack:
            raise ReprParseError("unbalanced bracket", i)
        return j

    def bare(self, i: int, stops: str) -> tuple[str, int]:
        j = i
        while j < self.n:
            c = self.s[j]
            if c in stops:
                break
            if c == "<":
                j = self.skip_balanced(j)
                continue
            if c in "([{":
                j = self.skip_balanced(j)
                continue
            j += 1
        return self.s[i:j].strip(), j

    def value(self, i: int, depth: int, stops: str = ",)]}") -> tuple[Any, int]:
        if depth > MAX_DEPTH:
            raise ReprParseError(f"nesting deeper than {MAX_DEPTH}", i)
        i = self.ws(i)
        if i >= self.n:
            raise ReprParseError("unexpected end of text", i)
        c = self.s[i]
        if c in "'\"":
            return self.string(i)
        if c == "[":
            items, j, _ = self.seq(i + 1, "]", depth)
            return items, j
        if c == "(":
            items, j, _ = self.seq(i + 1, ")", depth)
            return tuple(items), j
        if c == "{":
            return self.braces(i + 1, depth)
        if c == "<":
            j = self.skip_balanced(i)
            return self.s[i:j], j
        m = _NAME.match(self.s, i)
        if m:
            j = self.ws(m.end())
            if j < self.n and self.s[j] == "(":
                return self.call(m.group(0), j + 1, depth)
        tok, j = self.bare(i, stops)
        if not tok:
            raise ReprParseError("expected a value", i)
        return scalar(tok), j

    def seq(self, i: int, close: str, depth: int) -> tuple[list, int, bool]:
        items: list = []
        while True:
            i = self.ws(i)
            if i >= self.n:
                if self.partial:
                    return items, i, False
                raise ReprParseError(f"missing {close!r}", i)
            if self.s[i] == close:
                return items, i + 1, True
            try:
                v, i = self.value(i, depth + 1)
            except ReprParseError:
                if self.partial:
                    return items, self.n, False
                raise
            items.append(v)
            i = self.ws(i)
            if i < self.n and self.s[i] == ",":
                i += 1
            elif i < self.n and self.s[i] != close:
                raise ReprParseError(f"expected ',' or {close!r}", i)

    def braces(self, i: int, depth: int) -> tuple[Any, int]:
        i = self.ws(i)
        if i < self.n and self.s[i] == "}":
            return {}, i + 1
        out_d: dict = {}
        out_s: list = []
        is_dict = None
        while True:
            i = self.ws(i)
            if i >= self.n:
                if self.partial:
                    return (out_d if is_dict is not False else out_s), i
                raise ReprParseError("missing '}'", i)
            if self.s[i] == "}":
                return (out_d if is_dict else out_s), i + 1
            k, i = self.value(i, depth + 1, stops=",:}")
            i = self.ws(i)
            if i < self.n and self.s[i] == ":" and is_dict is not False:
                is_dict = True
                v, i = self.value(i + 1, depth + 1)
                try:
                    out_d[k] = v
                except TypeError:
                    out_d[repr(k)] = v
            else:
                is_dict = False
                out_s.append(k)
            i = self.ws(i)
            if i < self.n and self.s[i] == ",":
                i += 1

    def call(self, name: str, i: int, depth: int) -> tuple[Any, int]:
        if name in ("set", "frozenset"):
            j = self.ws(i)
            if j < self.n and self.s[j] == ")":
                return [], j + 1
        node = Call(name)
        while True:
            i = self.ws(i)
            if i >= self.n:
                if self.partial:
                    node.complete = False
                    return node, i
                raise ReprParseError(f"missing ')' of {name}(", i)
            if self.s[i] == ")":
                return node, i + 1
            m = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)").match(self.s, i)
            try:
                if m:
                    v, i = self.value(m.end(), depth + 1)
                    node.kwargs[m.group(1)] = v
                else:
                    v, i = self.value(i, depth + 1)
                    node.args.append(v)
            except ReprParseError:
                if self.partial:
                    node.complete = False
                    return node, self.n
                raise
            i = self.ws(i)
            if i < self.n and self.s[i] == ",":
                i += 1
            elif i < self.n and self.s[i] != ")":
                if self.partial:
                    node.complete = False
                    return node, self.n
                raise ReprParseError("expected ',' or ')'", i)


def parse_repr(text: str, partial: bool = False) -> Any:
    """Parse one repr value. With ``partial``, a value cut off at the end of the text is returned as
    far as it goes (calls get ``complete=False``) instead of raising."""
    r = _Reader(text, partial)
    v, i = r.value(0, 0)
    return v


def parse_call_at(text: str, name: str, partial: bool = True) -> Call | None:
    """Find ``name(`` in ``text`` and parse that call; ``None`` when the name is absent."""
    m = re.search(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"\(", text)
    if not m:
        return None
    r = _Reader(text, partial)
    v, _ = r.call(name, m.end(), 0)
    return v


def to_plain(v: Any) -> Any:
    """Turn :class:`Call` nodes into ``{"__call__": name, **kwargs}`` dicts (for JSON output)."""
    if isinstance(v, Call):
        d = {"__call__": v.name, **{k: to_plain(x) for k, x in v.kwargs.items()}}
        if v.args:
            d["__args__"] = [to_plain(x) for x in v.args]
        return d
    if isinstance(v, dict):
        return {str(k): to_plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_plain(x) for x in v]
    return v
