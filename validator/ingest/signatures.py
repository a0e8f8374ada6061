"""Which rules an error line is the signature of: the ``signatures`` of each rule in ``rules/catalog.json``.

A rule explains a crash only when one of its signatures matches the error line (see
:func:`matching`). A signature is ``{"file", "lines", "message", "failure", "builds"}``:

* ``file``: the source file name as the error line prints it (``combine.cu``); matched against the
  line's file name. A signature without ``file`` describes an error that names no source file (a
  Python exception, a sticky CUDA error caught later, a descriptor dump) and matches only such lines;
* ``lines``: ``[lo, hi]``, the source line must be printed and lie in the range (a line number cut
  off in the paste matches no signature that names lines);
* ``message``: a Python regular expression searched in the error's text;
* ``failure``: how the process ended (``process_exit``, ``illegal_memory_access``,
  ``python_exception``, ``process_crash``, ``device_assert``, ``launch_error_silent``, ...): must be
  the failure the line shows;
* ``builds``: the kernel builds that print it; when the build is known, it must be one of them.

Every given field must match. What a signature cannot confirm is never a match: a cut-off file name
gives at most a *possible* rule (:func:`possible`), reported as such.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..knowledge import load
from .crash_lines import ErrorEvent

FIELDS = ("file", "lines", "message", "failure", "builds", "source", "note")


@dataclass(frozen=True)
class Signature:
    code: str
    index: int
    file: str | None
    lines: tuple[int, int] | None
    message: re.Pattern | None
    failure: str
    builds: tuple[str, ...]
    source: str = ""

    def to_dict(self) -> dict:
        d: dict = {"rule": self.code, "signature": self.index, "failure": self.failure}
        if self.file:
            d["file"] = self.file
        if self.lines:
            d["lines"] = list(self.lines)
        if self.message is not None:
            d["message"] = self.message.pattern
        if self.builds:
            d["builds"] = list(self.builds)
        return d


class SignatureDataError(ValueError):
    """A malformed ``signatures`` entry in rules/catalog.json (the message names the entry and field)."""


def _parse(code: str, i: int, raw: object) -> Signature:
    where = f"rules/catalog.json rules.{code}.signatures[{i}]"
    if not isinstance(raw, dict):
        raise SignatureDataError(f"{where}: expected an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise SignatureDataError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    failure = raw.get("failure")
    if not isinstance(failure, str) or not failure:
        raise SignatureDataError(f"{where}.failure: expected a failure class such as 'process_exit', got {failure!r}")
    file = raw.get("file")
    if file is not None and (not isinstance(file, str) or "/" in file or not file):
        raise SignatureDataError(f"{where}.file: expected a file name without directories, got {file!r}")
    lines = raw.get("lines")
    if lines is not None:
        if (not isinstance(lines, list) or len(lines) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                      for x in lines) or lines[0] > lines[1]):
            raise SignatureDataError(f"{where}.lines: expected [lo, hi] with lo <= hi, got {lines!r}")
        if file is None:
            raise SignatureDataError(f"{where}.lines: a line range needs the file it is in")
    msg = raw.get("message")
    pattern = None
    if msg is not None:
        try:
            pattern = re.compile(msg)
        except (re.error, TypeError) as e:
            raise SignatureDataError(f"{where}.message: not a regular expression ({e})") from None
    if file is None and pattern is None:
        raise SignatureDataError(f"{where}: give the file or the message the error line shows")
    builds = raw.get("builds") or []
    if not isinstance(builds, list) or not all(isinstance(b, str) for b in builds):
        raise SignatureDataError(f"{where}.builds: expected a list of build names, got {builds!r}")
    return Signature(code, i, file, tuple(lines) if lines else None, pattern, failure, tuple(builds),
                     str(raw.get("source", "")))


@lru_cache(maxsize=None)
def all_signatures() -> tuple[Signature, ...]:
    """Every rule's signatures, in catalog order (retired rules have none that count)."""
    out = []
    for code, entry in load("catalog")["rules"].items():
        if entry.get("retired"):
            continue
        for i, raw in enumerate(entry.get("signatures", []) or []):
            out.append(_parse(code, i, raw))
    return tuple(out)


def signatures_of(code: str) -> list[Signature]:
    return [s for s in all_signatures() if s.code == code]


def _why_not(sig: Signature, err: ErrorEvent, build: str | None) -> str | None:
    """None when the signature matches the error, else the first field that does not."""
    if sig.file is not None:
        if err.file is None:
            return "file: the error line names no file"
        if err.file != sig.file:
            return f"file: {err.file}, signature {sig.file}"
    elif err.file is not None:
        return f"file: the error names {err.file}; this signature is for lines without a file"
    if sig.lines is not None:
        ln = err.source_line
        if ln is None:
            return "lines: the error's line number is not there (cut off)"
        if not sig.lines[0] <= ln <= sig.lines[1]:
            return f"lines: {ln} outside {sig.lines[0]}..{sig.lines[1]}"
    if sig.message is not None and not sig.message.search(err.text):
        return f"message: /{sig.message.pattern}/ not in the error text"
    if err.failure != sig.failure:
        return f"failure: the error shows {err.failure or 'an unknown failure'}, signature {sig.failure}"
    if build is not None and sig.builds and build not in sig.builds:
        return f"builds: {build} is not one of {', '.join(sig.builds)}"
    return None


def matching(err: ErrorEvent | None, build: str | None = None) -> list[Signature]:
    """The signatures that match the error line (every given field), for the kernel build when known."""
    if err is None:
        return []
    return [s for s in all_signatures() if _why_not(s, err, build) is None]


def matching_codes(err: ErrorEvent | None, build: str | None = None) -> list[str]:
    """Rule codes with a signature matching the error, in catalog order."""
    return list(dict.fromkeys(s.code for s in matching(err, build)))


def possible(err: ErrorEvent | None) -> list[str]:
    """Rules the visible part of a cut-off error line is consistent with (never a match): their
    signature's file starts with the cut-off file name, or lies under the visible path."""
    if err is None or not err.numbers.get("cut_off"):
        return []
    frag = str(err.numbers.get("path_fragment", ""))
    tail = frag.rsplit("/", 1)[-1].split(":", 1)[0]
    out = []
    for s in all_signatures():
        if s.file is None or not tail:
            continue
        if s.file.startswith(tail) or s.file.split(".", 1)[0] in frag:
            out.append(s.code)
    return list(dict.fromkeys(out))


def why_not(code: str, err: ErrorEvent | None, build: str | None = None) -> str:
    """Why none of a rule's signatures matches the error (one line)."""
    sigs = signatures_of(code)
    if err is None:
        return "no error line to match"
    if not sigs:
        return f"{code} declares no error signature"
    if err.numbers.get("cut_off"):
        return "the error line is cut off: none of its signatures can be confirmed"
    reasons = [r for r in dict.fromkeys(_why_not(s, err, build) for s in sigs) if r is not None]
    return "; ".join(reasons) if reasons else "a signature matches"
