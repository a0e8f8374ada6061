"""Text that reaches a terminal or a CI log, made inert.

Names, labels, ids, keys and log lines come from the user's input. Printed as they are, a control
character could drive the terminal (an escape sequence), a newline could start a line of its own, and
a CI runner reads some lines as commands: GitHub Actions takes a line whose first non-blank characters
are ``::`` as a workflow command, and ``##[`` anywhere in a line as an older form of one.

:func:`clean` writes one value on one line: control characters (C0 but tab, DEL, C1), the Unicode
direction overrides and lone surrogates as backslash escapes, ``##[`` as ``##\\[`` and a leading ``::``
as ``\\::``. :func:`clean_lines` keeps newlines (and tabs) and treats each line the same way.
:class:`SafeStream` does it to everything written to a stream, line by line, keeping only the SGR
colour sequences of a rich console that colours its output.
"""
from __future__ import annotations

import re
from typing import Any

# C0 controls but tab and newline, DEL, C1 controls, bidi embeddings/overrides/isolates, line/paragraph separators
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_NL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SGR = re.compile(r"\x1b\[[0-9;]*m")
_LEADING_COMMAND = re.compile(r"^([ \t]*(?:\x1b\[[0-9;]*m)*[ \t]*)::", re.MULTILINE)


def _escape(m: re.Match) -> str:
    c = m.group(0)
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def _commands(text: str, leading: bool = True) -> str:
    text = text.replace("##[", "##\\[")
    return _LEADING_COMMAND.sub(r"\1\\::", text) if leading and "::" in text else text


def _surrogates(text: str) -> str:
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clean(value: Any) -> str:
    """``str(value)`` on one line, inert in a terminal and a CI log."""
    text = _surrogates(_CONTROL_NL.sub(_escape, str(value)))
    return _commands(text)


def clean_lines(text: str, keep_sgr: bool = False, commands: bool = True) -> str:
    """``text`` with its newlines kept, each line inert; ``keep_sgr`` keeps colour sequences;
    ``commands=False`` leaves a leading ``::`` (output that is itself workflow commands)."""
    if keep_sgr and "\x1b" in text:
        parts = []
        last = 0
        for m in _SGR.finditer(text):
            parts.append(_CONTROL.sub(_escape, text[last:m.start()]))
            parts.append(m.group(0))
            last = m.end()
        parts.append(_CONTROL.sub(_escape, text[last:]))
        text = "".join(parts)
    else:
        text = _CONTROL.sub(_escape, text)
    return _commands(_surrogates(text), commands)


class SafeStream:
    """A text stream whose writes are made inert line by line (:func:`clean_lines`) before they
    reach ``target``; a line is held until its newline or the next :meth:`flush`, so a command prefix
    split over two writes is still seen at the start of its line."""

    def __init__(self, target: Any, keep_sgr: bool = False):
        self._target = target
        self._keep_sgr = keep_sgr
        self._pending = ""
        self._continued = False       # the held text continues a line already written in part

    def write(self, text: str) -> int:
        data = self._pending + text
        cut = data.rfind("\n") + 1
        self._pending = data[cut:]
        if cut:
            self._emit(data[:cut])
            self._continued = False
        return len(text)

    def _emit(self, text: str) -> None:
        out = clean_lines(text, self._keep_sgr)
        if self._continued and out.startswith("\\::") and not text.startswith("\\::"):
            out = out[1:]             # the middle of a line after text: not a line start
        self._target.write(out)

    def flush(self) -> None:
        if self._pending:
            self._emit(self._pending)
            # a line written so far as blanks only still has its start to come
            self._continued = bool(_SGR.sub("", self._pending).strip(" \t")) or self._continued
            self._pending = ""
        self._target.flush()

    def isatty(self) -> bool:
        return bool(getattr(self._target, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self._target.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._target, "encoding", "utf-8") or "utf-8"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)
