"""How a broken limit makes the process fail, as data: a kind, the site that reports it, the message
pattern it prints, and the prose a finding prints.

A rule's definition gives its :class:`Failure`; findings carry it (a :class:`Failure` is the text it
renders, so every output that prints or serialises the failure prints that text). Programs read the
structure: ``kind`` (``process_exit``, ``illegal_memory_access``, ...) and ``kinds`` (the kind and the
others the failure takes on some builds or inputs, ``also``).

The knowledge files write a build's own failure as text that starts with its kind
(``"python_exception: RuntimeError ..."``); :func:`failure_of` reads such a text into a
:class:`Failure` (the one place that convention is read).
"""
from __future__ import annotations

import re

#: the kinds of failure: the process ends in a Python exception (recoverable), ``exit()``, an illegal
#: memory access (the CUDA context is lost), a device-side assertion, a crash (signal); the input is
#: undefined behaviour (may or may not crash); the output is silently wrong; a kernel launch fails
#: and only prints; a CUDA error of another kind
KINDS = ("python_exception", "process_exit", "illegal_memory_access", "device_assert", "process_crash",
         "undefined_behaviour", "silent_wrong", "launch_error_silent", "cuda_error")
#: a host assertion ends the process with a signal: prose naming one names a ``process_crash``
HOST_ASSERTION = "host assertion"
_NAMED = {k: re.compile(rf"\b{k}\b") for k in KINDS}


class Failure(str):
    """How the process fails: ``kind``, ``also`` (further kinds), ``site`` (``file:line`` or function
    that reports it), ``message`` (a regular expression of what it prints); the string itself is the
    prose findings print: ``"kind: detail"``, or ``text`` when given whole."""

    kind: str
    also: tuple
    site: str
    message: str

    def __new__(cls, kind: str = "", detail: str = "", *, also: tuple = (), site: str = "", message: str = "",
                text: str | None = None):
        if text is None:
            text = f"{kind}: {detail}" if detail else kind
        self = super().__new__(cls, text)
        self.kind, self.also, self.site, self.message = kind, tuple(also), site, message
        return self

    def __reduce__(self):
        return (_rebuild, (self.kind, self.also, self.site, self.message, str(self)))

    def unknown_kinds(self) -> list:
        """The kinds it names that are not in :data:`KINDS` (a definition must name none)."""
        return [k for k in self.kinds if k not in KINDS]

    @property
    def kinds(self) -> tuple:
        """The kind, then the other kinds it takes (no repeats)."""
        return tuple(dict.fromkeys(k for k in (self.kind, *self.also) if k))

    def to_dict(self) -> dict:
        """The structure (the prose is the string itself)."""
        d: dict = {"kind": self.kind}
        if self.also:
            d["also"] = list(self.also)
        if self.site:
            d["site"] = self.site
        if self.message:
            d["message"] = self.message
        return d


def _rebuild(kind: str, also: tuple, site: str, message: str, text: str) -> Failure:
    return Failure(kind, also=also, site=site, message=message, text=text)


def failure_of(value: str | None) -> Failure:
    """``value`` as a :class:`Failure`: itself when it is one; a knowledge file's text read by its
    convention: the word before the first ``:`` (or space) is the kind, every other kind the text
    names (a host assertion: ``process_crash``) is in ``also``."""
    if isinstance(value, Failure):
        return value
    text = value or ""
    head = text.split(":", 1)[0].strip()
    lead = head.split()[0] if head else ""
    named = [k for k in KINDS if k != lead and _NAMED[k].search(text)]
    if HOST_ASSERTION in text and "process_crash" not in named and lead != "process_crash":
        named.append("process_crash")
    return Failure(lead, also=tuple(named), text=text)
