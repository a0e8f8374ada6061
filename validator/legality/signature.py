"""An error signature: what an error line a rule's failure prints looks like, as a rule's definition
declares it (``signatures=[{...}]`` on ``@rule``).

A signature is ``{"file", "lines", "message", "failure", "builds", "source", "note"}``:

* ``file``: the source file name as the error line prints it (``combine.cu``), without directories.
  A signature without ``file`` describes an error that names no source file (a Python exception, a
  sticky CUDA error caught later, a descriptor dump) and matches only such lines;
* ``lines``: ``[lo, hi]``, the range the printed source line must lie in (needs ``file``);
* ``message``: a Python regular expression searched in the error's text;
* ``failure``: how the process ended (``process_exit``, ``illegal_memory_access``,
  ``python_exception``, ``process_crash``, ``device_assert``, ``launch_error_silent``, ...);
* ``builds``: the kernel builds that print it (none: any build);
* ``source`` / ``note``: where the line was seen or read.

:mod:`validate_batch.ingest.signatures` matches error lines against them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

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

    def to_definition(self) -> dict:
        """The signature as a definition writes it (``source`` included)."""
        d = {k: v for k, v in self.to_dict().items() if k not in ("rule", "signature")}
        if self.source:
            d["source"] = self.source
        return d


class SignatureDataError(ValueError):
    """A malformed signature in a rule's definition (the message names the rule, entry and field)."""


def _lines(where: str, lines: object, file: object) -> tuple[int, int] | None:
    if lines is None:
        return None
    if (not isinstance(lines, (list, tuple)) or len(lines) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in lines) or lines[0] > lines[1]):
        raise SignatureDataError(f"{where}.lines: expected [lo, hi] with lo <= hi, got {lines!r}")
    if file is None:
        raise SignatureDataError(f"{where}.lines: a line range needs the file it is in")
    return (lines[0], lines[1])


def _pattern(where: str, msg: object) -> re.Pattern | None:
    if msg is None:
        return None
    try:
        return re.compile(msg)
    except (re.error, TypeError) as e:
        raise SignatureDataError(f"{where}.message: not a regular expression ({e})") from None


def parse_signature(code: str, i: int, raw: object) -> Signature:
    """Signature ``i`` of rule ``code`` from its definition; :class:`SignatureDataError` names the
    field that is wrong."""
    where = f"rules.{code}.signatures[{i}]"
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
    lines = _lines(where, raw.get("lines"), file)
    pattern = _pattern(where, raw.get("message"))
    if file is None and pattern is None:
        raise SignatureDataError(f"{where}: give the file or the message the error line shows")
    builds = raw.get("builds") or []
    if not isinstance(builds, (list, tuple)) or not all(isinstance(b, str) for b in builds):
        raise SignatureDataError(f"{where}.builds: expected a list of build names, got {builds!r}")
    return Signature(code, i, file, lines, pattern, failure, tuple(builds), str(raw.get("source", "")))
