"""Which rules an error line is the signature of: the ``signatures`` each rule's definition declares
(:mod:`validate_batch.legality.signature`), read through the registry (a rule registered at run time counts too).

A rule explains a crash only when one of its signatures matches the error line (see
:func:`matching`). A signature names its library, its entry (function and / or source file) and a
message pattern; these decide the match:

* ``library``: when the error's library is known (its path, its text, or the traceback around it:
  :attr:`ErrorEvent.owner`), it must be the signature's: a FlashInfer, FlashAttention-3 or DeepGEMM
  error never matches a FlashMLA signature, nor the other way round;
* ``file`` / ``function``: the source file name and the function the line prints must be the
  signature's; a signature naming neither matches only lines that name no file;
* ``message``, ``failure``, ``require``: the text, how the process ended, and fields of the read error;
* ``builds``: when the build is known (given by the user, or shown by a line that only some builds
  print), it must be one of them.

The printed source line corroborates and never gates: a line recorded for a version says which one
printed it ("at flashinfer-python-0.7.2's line 1634"); another line is "another version's line"; only
a build the user names, whose line is recorded and differs, rules the signature out. A cut-off line or
a report in prose matches nothing: a cut-off file name gives at most a *possible* rule (:func:`possible`).
"""
from __future__ import annotations

from functools import lru_cache

from ..facts.knowledge import load
from ..legality.ruleset import all_signatures
from ..legality.signature import Signature, SignatureDataError
from .crash_lines import ErrorEvent

__all__ = ["Signature", "SignatureDataError", "all_signatures", "build_library", "corroboration", "matching",
           "matching_codes", "possible", "signatures_of", "why_not"]


def signatures_of(code: str) -> list[Signature]:
    return [s for s in all_signatures() if s.code == code]


@lru_cache(maxsize=None)
def _build_libraries() -> dict[str, str]:
    out = {b: "flashmla" for b in load("flashmla")["builds"] if not b.startswith("_")}
    out.update((v, "flashinfer") for v in load("flashinfer")["versions"])
    out.update((v, "deepgemm") for v in load("deepgemm")["versions"])
    return out


def build_library(build: str | None) -> str | None:
    """The library a kernel build belongs to (``flashinfer-python-0.7.2`` -> ``flashinfer``), or None."""
    return _build_libraries().get(build) if build else None


def line_builds(err: ErrorEvent, library: str) -> set[str]:
    """The builds of ``library`` recorded to print the error's ``file:line`` (empty: no recorded version does)."""
    ln = err.source_line
    if ln is None or err.file is None:
        return set()
    return {b for s in all_signatures() if s.printed_by == library and s.file == err.file
            for b in s.fits(ln) if b is not None}


def _why_not(sig: Signature, err: ErrorEvent, build: str | None) -> str | None:
    """None when the signature matches the error, else the first field that does not."""
    if err.numbers.get("cut_off"):
        return "the error line is cut off: no signature can be confirmed"
    if err.numbers.get("prose"):
        return "the error is described in prose, not printed: low-confidence evidence matches no signature"
    owner = err.owner
    if owner is not None and owner != sig.printed_by:
        return f"library: the error comes from {owner}, signature {sig.printed_by}"
    if sig.file is not None:
        if err.file is None:
            return "file: the error line names no file"
        if err.file != sig.file:
            return f"file: {err.file}, signature {sig.file}"
    elif sig.function is None and err.file is not None:
        return f"file: the error names {err.file}; this signature is for lines without a file"
    if sig.function is not None and err.function != sig.function:
        return (f"function: {err.function}, signature {sig.function}" if err.function
                else "function: the error line names no function")
    if sig.message is not None and not sig.message.search(err.text):
        return f"message: /{sig.message.pattern}/ not in the error text"
    if err.failure != sig.failure:
        return f"failure: the error shows {err.failure or 'an unknown failure'}, signature {sig.failure}"
    for k, v in sig.require:
        if err.numbers.get(k) != v:
            return f"{k}: the error shows {err.numbers.get(k)!r}, signature needs {v!r}"
    ln = err.source_line
    if build is not None and build_library(build) in (None, sig.printed_by):
        if sig.builds and build not in sig.builds:
            return f"builds: {build} is not one of {', '.join(sig.builds)}"
        own = [r for r in sig.ranges if r[0] == build]
        if own and ln is not None and not any(lo <= ln <= hi for _, lo, hi in own):
            return (f"lines: {ln} is not {build}'s line ({', '.join(_span(lo, hi) for _, lo, hi in own)}): "
                    "the build given did not print it")
    elif build is None and sig.builds:
        shown = line_builds(err, sig.printed_by)
        if shown and not shown & set(sig.builds):
            return (f"builds: line {ln} of {err.file} is {', '.join(sorted(shown))}'s, not one of "
                    f"{', '.join(sig.builds)}")
    return None


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}..{hi}"


def corroboration(sig: Signature, err: ErrorEvent) -> str:
    """What the printed source line says about a matching signature: the recorded version it fits, or
    that another version printed it (the match rests on library, entry and message)."""
    if not sig.ranges:
        return "no line recorded: matched by library, entry and message"
    ln = err.source_line
    if ln is None:
        return "the error prints no line: matched by library, entry and message"
    fits = sig.fits(ln)
    if fits:
        named = [b for b in fits if b is not None]
        return (f"line {ln} is the recorded line of {', '.join(named)}" if named
                else f"line {ln} is the recorded line")
    rec = ", ".join(f"{b} {_span(lo, hi)}" if b else _span(lo, hi) for b, lo, hi in sig.ranges)
    return (f"matches {sig.code}'s message at another version's line: {err.file}:{ln} (recorded: {rec}); the "
            "version is not one the data records")


def matching(err: ErrorEvent | None, build: str | None = None) -> list[Signature]:
    """The signatures that match the error line (every deciding field), for the kernel build when known."""
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
    lib = err.owner
    out = []
    for s in all_signatures():
        if s.file is None or not tail or (lib is not None and s.printed_by != lib):
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
