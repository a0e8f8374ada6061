"""Text for a reader that is not a terminal (a pipe, a file, a CI log), written as the rich console
writes it there, without loading rich.

Human output is strings printed through a console, some with rich's markup (``[bold red]ILLEGAL[/]``)
and the user's values escaped for it (:func:`escape`). Where the output is not a terminal rich writes
no colour and no style: each string becomes its text with the markup's tags dropped and its escapes
undone, then ``end``. :class:`PlainConsole` does exactly that, and hands anything that is not a
string (a table) to a rich console made on first use. ``tests/test_plain_console.py`` holds both to
the same bytes.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable

from .safe import clean_lines

#: a markup tag as rich reads one: ``[`` then a letter, ``#``, ``/`` or ``@``, up to the first ``]``
#: with no ``[`` before it; the backslashes before it decide whether it is escaped
_TAG = re.compile(r"(\\*)\[([a-z#/@][^[]*?)\]")


def escape(text: str) -> str:
    """``text`` for markup: every ``[`` that would open a tag gets a backslash (the backslashes already
    before it doubled), and a single trailing backslash is doubled, so that the text reads as itself."""
    def one(m: re.Match) -> str:
        return m.group(1) * 2 + "\\[" + m.group(2) + "]"

    out = _TAG.sub(one, text)
    if out.endswith("\\") and not out.endswith("\\\\"):
        out += "\\"
    return out


def markup_text(markup: str) -> str:
    """The text ``markup`` shows: its tags dropped, an escaped tag shown as written, each pair of
    backslashes before a tag shown as one, and an escaped ``[`` that opens no tag shown as ``[``."""
    out = []
    pos = 0
    for m in _TAG.finditer(markup):
        out.append(markup[pos:m.start()].replace("\\[", "["))
        backslashes, escaped = divmod(len(m.group(1)), 2)
        out.append("\\" * backslashes)
        if escaped:
            out.append(f"[{m.group(2)}]")
        pos = m.end()
    out.append(markup[pos:].replace("\\[", "["))
    return "".join(out)


def renders_plain(stream: Any, environ=os.environ) -> bool:
    """Whether rich would write ``stream`` as a plain file: not a terminal, and no setting that makes
    it treat one as a terminal (``FORCE_COLOR``, ``TTY_COMPATIBLE=1``) or size it (``COLUMNS``
    that is not a number, read from the real terminal then)."""
    if environ.get("FORCE_COLOR") is not None or environ.get("TTY_COMPATIBLE") == "1":
        return False
    columns = environ.get("COLUMNS")
    if columns is not None and not columns.isdigit():
        return False
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return False


class PlainConsole:
    """The part of a rich console that human output uses, for a stream that is not a terminal:
    :meth:`print` of strings (with or without markup; styles draw nothing there), :attr:`width` and
    :attr:`is_terminal`. Anything else printed goes to ``rich_console()``, made once when first needed."""

    is_terminal = False
    color_system = None

    def __init__(self, stream, rich_console: Callable[[], Any], tab_size: int = 8):
        self._stream = stream
        self._make_rich = rich_console
        self._rich = None
        self.tab_size = tab_size

    def rich(self):
        """The rich console behind this one (made on first use)."""
        if self._rich is None:
            self._rich = self._make_rich()
        return self._rich

    @property
    def width(self) -> int:
        columns = os.environ.get("COLUMNS")
        if columns is not None and columns.isdigit():
            return int(columns)
        return self.rich().width

    def print(self, *objects: Any, sep: str = " ", end: str = "\n", style: Any = None, markup: bool | None = None,
              highlight: bool | None = None, **options: Any) -> None:
        if options or any(o.__class__ is not str for o in objects):
            self.rich().print(*objects, sep=sep, end=end, style=style, markup=markup, highlight=highlight, **options)
            return
        text = clean_lines(sep.join(objects))
        if markup:
            text = markup_text(text)
        if "\t" in text:
            text = text.expandtabs(self.tab_size)
        self._stream.write(text + end)
        self._stream.flush()


def columns(headers: tuple[str, ...], rows: list[tuple[str, ...]], gap: int = 2) -> str:
    """A table for a reader that is not a terminal: the header, then one line per row, each cell
    whole (never wrapped or cut, so that ``grep`` finds a row on one line), each column as wide as its
    widest cell and ``gap`` spaces apart; the last column is not padded. Lines end with ``\\n``."""
    n = len(headers)
    if any(len(r) != n for r in rows):
        raise ValueError(f"every row needs {n} cells (the headers), got {sorted({len(r) for r in rows})}")
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lines = []
    for r in (headers, *rows):
        cells = [str(c).ljust(w) for c, w in zip(r[:-1], widths)] + [str(r[-1])]
        lines.append((" " * gap).join(cells).rstrip())
    return "\n".join(lines) + "\n"
