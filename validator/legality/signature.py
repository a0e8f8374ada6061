"""An error signature: what an error line a rule's failure prints looks like, as a rule's definition
declares it (``signatures=[{...}]`` on ``@rule``).

A signature names the library that prints the error, where in it (its ``function`` and / or source
``file``) and the message; the source lines are facts per recorded version that corroborate a match:

* ``library``: the library whose failure the line reports (``flashmla``, ``flashinfer``, ``deepgemm``,
  ``fa3``, ``sglang``, ...). An error whose library is known (from its path, its text or its traceback)
  matches only the signatures of that library;
* ``file``: the source file name as the error line prints it (``combine.cu``), without directories.
  A signature with neither ``file`` nor ``function`` describes an error that names no source file (a
  Python exception, a sticky CUDA error caught later, a descriptor dump) and matches only such lines;
* ``function``: the function the error line names (FlashInfer's ``Error in function 'MLAPlan'``);
* ``message``: a Python regular expression searched in the error's text (required);
* ``failure``: how the process ended (``process_exit``, ``illegal_memory_access``,
  ``python_exception``, ``process_crash``, ``device_assert``, ``launch_error_silent``, ...);
* ``lines``: the printed source line per recorded version: ``{"build": [lo, hi], ...}``, or ``[lo, hi]``
  for every build in ``builds`` (any build when none is listed). Lines corroborate a match ("at
  flashinfer-python-0.7.2's line") and never gate it, except against the build the user named;
* ``builds``: the kernel builds that print it (none: any build);
* ``require``: fields the recognised error must carry with these values (``{"zero_extent": true}``);
* ``source`` / ``note``: where the line was seen or read.

:mod:`validate_batch.ingest.signatures` matches error lines against them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

FIELDS = ("library", "file", "function", "lines", "message", "failure", "builds", "require", "source", "note")


@dataclass(frozen=True)
class Signature:
    code: str
    index: int
    printed_by: str                                     # the library that prints the error
    file: str | None
    function: str | None
    ranges: tuple[tuple[str | None, int, int], ...]     # (build, lo, hi); build None: any build
    message: re.Pattern | None
    failure: str
    builds: tuple[str, ...]
    require: tuple[tuple[str, object], ...] = ()
    source: str = ""
    lines_form: str = "range"                           # how the definition wrote ``lines``: range | per_build

    def ranges_for(self, build: str) -> list[tuple[int, int]]:
        """The recorded line ranges of ``build`` (those recorded for any build included)."""
        return [(lo, hi) for b, lo, hi in self.ranges if b is None or b == build]

    def fits(self, line: int) -> list[str | None]:
        """The builds whose recorded range holds ``line`` (None: a range recorded for any build)."""
        return list(dict.fromkeys(b for b, lo, hi in self.ranges if lo <= line <= hi))

    def lines_value(self):
        """``lines`` as the definition wrote it."""
        if not self.ranges:
            return None
        if self.lines_form == "range":
            _, lo, hi = self.ranges[0]
            return [lo, hi]
        return {b: [lo, hi] for b, lo, hi in self.ranges}

    def to_dict(self) -> dict:
        d: dict = {"rule": self.code, "signature": self.index, "library": self.printed_by, "failure": self.failure}
        if self.file:
            d["file"] = self.file
        if self.function:
            d["function"] = self.function
        if self.ranges:
            d["lines"] = self.lines_value()
        if self.message is not None:
            d["message"] = self.message.pattern
        if self.builds:
            d["builds"] = list(self.builds)
        if self.require:
            d["require"] = dict(self.require)
        return d

    def to_definition(self) -> dict:
        """The signature as a definition writes it (``source`` included)."""
        d = {k: v for k, v in self.to_dict().items() if k not in ("rule", "signature")}
        if self.source:
            d["source"] = self.source
        return d


class SignatureDataError(ValueError):
    """A malformed signature in a rule's definition (the message names the rule, entry and field)."""


def _range(where: str, value: object) -> tuple[int, int]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in value) or value[0] > value[1]):
        raise SignatureDataError(f"{where}: expected [lo, hi] with lo <= hi, got {value!r}")
    return (value[0], value[1])


def _ranges(where: str, lines: object, file: object, builds: tuple[str, ...]) -> tuple[tuple, str]:
    if lines is None:
        return (), "range"
    if file is None:
        raise SignatureDataError(f"{where}.lines: a line range needs the file it is in")
    if isinstance(lines, dict):
        if not lines or not all(isinstance(b, str) and b for b in lines):
            raise SignatureDataError(f"{where}.lines: expected {{build: [lo, hi]}} with build names, got {lines!r}")
        return tuple((b, *_range(f"{where}.lines.{b}", v)) for b, v in lines.items()), "per_build"
    lo, hi = _range(f"{where}.lines", lines)
    return (tuple((b, lo, hi) for b in builds) if builds else ((None, lo, hi),)), "range"


def _pattern(where: str, msg: object) -> re.Pattern:
    if msg is None:
        raise SignatureDataError(f"{where}.message: give the message the error line shows (a regular expression)")
    try:
        return re.compile(msg)
    except (re.error, TypeError) as e:
        raise SignatureDataError(f"{where}.message: not a regular expression ({e})") from None


def _name(raw: dict, where: str, key: str, expected: str, optional: bool = False, slash: bool = True) -> str | None:
    """The non-empty string field ``key`` of a signature (None when ``optional`` and absent;
    ``slash``: whether it may hold a "/")."""
    v = raw.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, str) or not v or (not slash and "/" in v):
        raise SignatureDataError(f"{where}.{key}: expected {expected}, got {v!r}")
    return v


def parse_signature(code: str, i: int, raw: object) -> Signature:
    """Signature ``i`` of rule ``code`` from its definition; :class:`SignatureDataError` names the
    field that is wrong."""
    where = f"rules.{code}.signatures[{i}]"
    if not isinstance(raw, dict):
        raise SignatureDataError(f"{where}: expected an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise SignatureDataError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    failure = _name(raw, where, "failure", "a failure class such as 'process_exit'")
    file = _name(raw, where, "file", "a file name without directories", optional=True, slash=False)
    function = _name(raw, where, "function", "a function name", optional=True)
    builds = raw.get("builds") or []
    if not isinstance(builds, (list, tuple)) or not all(isinstance(b, str) for b in builds):
        raise SignatureDataError(f"{where}.builds: expected a list of build names, got {builds!r}")
    ranges, form = _ranges(where, raw.get("lines"), file, tuple(builds))
    pattern = _pattern(where, raw.get("message"))
    require = raw.get("require") or {}
    if not isinstance(require, dict) or not all(isinstance(k, str) for k in require):
        raise SignatureDataError(f"{where}.require: expected {{field: value}}, got {require!r}")
    library = _name(raw, where, "library", "the library that prints the error (flashmla, flashinfer, deepgemm, "
                                           "fa3, sglang, ...)")
    return Signature(code, i, library, file, function, ranges, pattern, failure, tuple(builds),
                     tuple(sorted(require.items())), str(raw.get("source", "")), form)
