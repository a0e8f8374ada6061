"""Which rules an error line is the signature of: the ``signatures`` each rule's definition declares
(:mod:`validate_batch.legality.signature`), read through the registry (a rule registered at run time counts too).

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

from ..legality.ruleset import all_signatures
from ..legality.signature import Signature, SignatureDataError
from .crash_lines import ErrorEvent

__all__ = ["Signature", "SignatureDataError", "all_signatures", "matching", "matching_codes", "possible",
           "signatures_of", "why_not"]


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
    """Rule codes with a signature matching the error, in the order of :func:`all_signatures`."""
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
