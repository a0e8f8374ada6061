"""The plain console (validator/output/plain.py) writes what the rich console writes to a stream that
is not a terminal, byte for byte: ground truth is rich itself, configured as the command line
configures it (no highlighting, soft wrap, markup off unless a call asks for it, no emoji codes),
on the same inert stream."""
from __future__ import annotations

import io
import random

import pytest
from rich.markup import escape as rich_escape
from rich.table import Table

from validate_batch.output import writer
from validate_batch.output.plain import PlainConsole, escape, markup_text, renders_plain
from validate_batch.output.safe import SafeStream

TEXTS = [
    "", "verdict: LEGAL", "  trailing spaces   ", "tab\there\tand\t\tmore", "two\nlines\n",
    "[bold red]ILLEGAL[/] - 2 limit(s) broken", "[bold green]LEGAL[/]", "a [0, 1] list and [x] and [/]",
    "escaped \\[bold] tag", "two backslashes \\\\[bold]x[/bold]", "three \\\\\\[b] and end\\",
    "ids like [req-1] and [#3] and [@click]", "unicode: \u00e9\u4e2d\u6587 \u2014 dash", "control \x1b[31m and \x07 bell",
    "##[error] looks like a command", ":: leading colons", "emoji code :warning: and :smile:",
    "brackets [[nested]] and ] lone", "[dim]dim[/dim] then [link=https://x]link[/link]",
]


def _rich_out(text_args: list, **kw) -> str:
    buf = io.StringIO()
    console = writer._rich_console(SafeStream(buf))
    console.print(*text_args, **kw)
    return buf.getvalue()


def _plain_out(text_args: list, **kw) -> str:
    buf = io.StringIO()
    stream = SafeStream(buf)
    PlainConsole(stream, lambda: writer._rich_console(stream)).print(*text_args, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("kw", [{}, {"markup": False}, {"style": "dim"}, {"end": ""}, {"markup": False, "style": "bold"}])
def test_a_string_is_written_as_rich_writes_it(text, kw):
    assert _plain_out([text], **kw) == _rich_out([text], **kw)


@pytest.mark.parametrize("text", [t for t in TEXTS if "[/]" in t or "[/bold]" in t or "[/dim]" in t or "\\[" in t
                                  or "[x]" in t or "[0, 1]" in t])
def test_markup_is_written_as_rich_renders_it(text):
    assert _plain_out([text], markup=True) == _rich_out([text], markup=True)


def test_several_objects_and_separators():
    assert _plain_out(["a", "b", "c"], sep=" | ") == _rich_out(["a", "b", "c"], sep=" | ")
    assert _plain_out([]) == _rich_out([])


@pytest.mark.parametrize("text", TEXTS)
def test_escape_is_rich_s(text):
    assert escape(text) == rich_escape(text)


def _random_texts(n: int = 600):
    rng = random.Random(20261202)
    alphabet = list("ab[]/\\#@ =:\t\n")
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(n)]


@pytest.mark.parametrize("text", _random_texts())
def test_escape_and_markup_text_round_trip_as_rich_does(text):
    assert escape(text) == rich_escape(text)
    if "\\" not in text:      # (rich's own escape is no round trip with backslashes: '\\[' shows '[')
        assert markup_text(escape(text)) == text
    assert _plain_out([escape(text)], markup=True) == _rich_out([escape(text)], markup=True)


def test_a_table_goes_to_rich():
    t = Table("code", "title")
    t.add_row("FMLA001", "scheduler shared memory")
    buf = io.StringIO()
    stream = SafeStream(buf)
    made = []

    def rich_console():
        made.append(1)
        return writer._rich_console(stream)

    plain = PlainConsole(stream, rich_console)
    plain.print("before")
    assert not made                     # strings never make the rich console
    plain.print(t)
    plain.print("after")
    assert made == [1]
    assert buf.getvalue() == _rich_out(["before"]) + _rich_out([t]) + _rich_out(["after"])


def test_when_the_output_renders_plain():
    class Pipe(io.StringIO):
        def isatty(self):
            return False

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert renders_plain(Pipe(), {}) and not renders_plain(Tty(), {})
    assert not renders_plain(Pipe(), {"FORCE_COLOR": "1"}) and not renders_plain(Pipe(), {"TTY_COMPATIBLE": "1"})
    assert renders_plain(Pipe(), {"COLUMNS": "120"}) and not renders_plain(Pipe(), {"COLUMNS": "wide"})
