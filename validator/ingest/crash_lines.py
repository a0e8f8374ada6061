"""Recognising the lines that say a process died, and what they say about why.

Each recognised line becomes an :class:`ErrorEvent` with a ``kind`` and the numbers it carries.
``SIGNATURES`` maps a kind to the rule codes whose failure looks like it, so that the diagnosis can
say "this error is what FMLA001 looks like" rather than guess. Which source files name a FlashMLA
crash class is data: every kernel generation's ``error_site`` in ``rules/flashmla.json`` and the
other builds' sites in ``rules/crash_sites.json`` (see :func:`site_patterns`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from ..knowledge import load
from ..limits import parse_int

# kind -> (specificity, rule codes whose documented failure produces this error, quantity that varies)
SIGNATURES: dict[str, tuple[int, tuple[str, ...], str | None]] = {
    "flashmla_sched": (10, ("FMLA001", "SGL001"), "rows"),
    "flashmla_combine": (9, ("FMLA002", "FMLA003"), "rows"),
    "index_oob": (9, ("SLOT001", "SLOT002", "SLOT004"), "slot"),
    "device_assert": (8, ("SLOT001", "SLOT002", "SLOT004"), "slot"),
    "host_assert": (7, ("FMLA004", "FMLA005", "FMLA006"), None),
    "oom": (7, ("FMLA010",), "rows"),
    "segfault": (6, ("FMLA004", "FMLA005", "FMLA006", "FMLA014", "SGL002"), None),
    "cuda_error": (5, (), None),
    "illegal_memory_access": (4, ("FMLA002", "FMLA003", "SLOT002"), None),
    "python_error": (3, (), None),
    "scheduler_exception": (2, (), None),
    "traceback": (1, (), None),
    "process_exit": (1, (), None),
}

# crash class -> (part of a generation in rules/flashmla.json whose "error_site" names its source file)
SITE_PARTS = {"flashmla_sched": "sched_smem", "flashmla_combine": "combine"}


def site_stem(site: str) -> str:
    """A source file's stem from an error site: ``csrc/.../combine.cu:197`` -> ``combine``."""
    return site.rsplit("/", 1)[-1].split(":", 1)[0].split(".", 1)[0]


@lru_cache(maxsize=None)
def site_patterns() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Crash class -> (file-name prefixes, file-name fragments) of the source files that report it:
    the stems of every FlashMLA generation's ``error_site`` and of the sites, prefixes and fragments
    listed for other builds in ``rules/crash_sites.json``."""
    gens = load("flashmla")["generations"]
    extra = load("crash_sites")
    out = {}
    for kind, part in SITE_PARTS.items():
        sites = [g[part]["error_site"] for g in gens.values() if g.get(part, {}).get("error_site")]
        more = extra.get(kind, {})
        stems = [site_stem(x) for x in sites + list(more.get("sites", []))] + list(more.get("prefixes", []))
        out[kind] = (tuple(dict.fromkeys(stems)), tuple(more.get("contains", [])))
    return out


def site_kind(file: str) -> str | None:
    """The FlashMLA crash class a source file named in a CUDA error reports, or None."""
    for kind, (prefixes, fragments) in site_patterns().items():
        if file.startswith(prefixes) or any(f in file for f in fragments):
            return kind
    return None


_CUDA_FILE = re.compile(r"CUDA error \((?P<path>[^()]*?(?P<file>[\w.+-]+\.(?:cu|cuh|cpp|h|hpp|cc)))\s*:\s*(?P<line>\d+)\)\s*:?\s*(?P<msg>.*)")
_CUDA_PLAIN = re.compile(r"CUDA error:\s*(?P<msg>.*)")
_INDEX = re.compile(r"index (?P<index>-?\d+) is out of bounds for dimension (?P<dim>\d+) with size (?P<size>\d+)")
_DEVICE_ASSERT = re.compile(r"device-side assert(?:ion)? triggered|Assertion `(?P<cond>[^`]*)` failed")
_HOST_ASSERT = re.compile(r"Assertion [`'\"](?P<cond>.+?)[`'\"] failed|assert(?:ion)? failed|TORCH_CHECK|Expected .* to be true")
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")
_SEGV = re.compile(r"Segmentation fault|SIGSEGV|Fatal Python error|core dumped|SIGABRT|Aborted \(core")
_PYERR = re.compile(r"\b(?P<exc>RuntimeError|IndexError|AssertionError|ValueError|KeyError|TypeError|torch\.AcceleratorError|AcceleratorError|EngineDeadError)\b:?\s*(?P<msg>.*)")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_SCHED_EXC = re.compile(r"(?:Scheduler|TpModelWorker|DataParallelController|EngineCore|Worker)\S* (?:hit an exception|encountered a fatal error|failed)", re.I)
_EXIT = re.compile(r"Received sigquit from a child process|Child process unexpectedly failed|exit code[: ]+\d+|exited with|Killed|Dumping requests before crash|Dumped \d+ finished and \d+ unfinished requests", re.I)
_ILLEGAL = re.compile(r"illegal memory access", re.I)


@dataclass
class ErrorEvent:
    kind: str
    line_no: int
    text: str
    rank: str | None = None
    rank_inferred: bool = False   # no prefix on the line: the rank of the preceding prefixed line
    timestamp: str | None = None
    numbers: dict = field(default_factory=dict)

    @property
    def specificity(self) -> int:
        return SIGNATURES.get(self.kind, (0, (), None))[0]

    @property
    def suspect_codes(self) -> tuple[str, ...]:
        return SIGNATURES.get(self.kind, (0, (), None))[1]

    @property
    def quantity(self) -> str | None:
        return SIGNATURES.get(self.kind, (0, (), None))[2]

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "line": self.line_no, "text": self.text}
        if self.rank is not None:
            d["rank"] = self.rank
            if self.rank_inferred:
                d["rank_inferred"] = True
        if self.timestamp:
            d["timestamp"] = self.timestamp
        if self.numbers:
            d["numbers"] = dict(self.numbers)
        if self.suspect_codes:
            d["looks_like"] = list(self.suspect_codes)
        return d


_ANY = re.compile(r"rror|out of bounds|ssert|Traceback|illegal|Segmentation|SIG[A-Z]|Killed|xception|failed|"
                  r"Fatal|exit|Dumping requests|Dumped \d|core dumped|Aborted|out of memory|TORCH_CHECK", re.I)


def classify_error(msg: str) -> tuple[str, dict] | None:
    """The kind of error a log message reports (most specific first), with its numbers; or None."""
    if not _ANY.search(msg):
        return None
    m = _CUDA_FILE.search(msg)
    if m:
        f = m.group("file")
        nums = {"file": f, "source_line": parse_int(m.group("line"), "error line"), "message": m.group("msg").strip()}
        kind = site_kind(f)
        if kind is not None:
            return kind, nums
        if _ILLEGAL.search(msg):
            return "illegal_memory_access", nums
        return "cuda_error", nums
    m = _INDEX.search(msg)
    if m:
        return "index_oob", {"index": parse_int(m.group("index"), "error line"), "dim": parse_int(m.group("dim"), "error line"),
                           "size": parse_int(m.group("size"), "error line")}
    m = _DEVICE_ASSERT.search(msg)
    if m:
        cond = m.group("cond") if m.lastgroup == "cond" else None
        return "device_assert", ({"condition": cond} if cond else {})
    if _ILLEGAL.search(msg):
        return "illegal_memory_access", {}
    m = _CUDA_PLAIN.search(msg)
    if m:
        return "cuda_error", {"message": m.group("msg").strip()}
    if _OOM.search(msg):
        m2 = re.search(r"Tried to allocate ([\d.]+ ?[KMGT]i?B)", msg)
        return "oom", ({"allocation": m2.group(1)} if m2 else {})
    if _SEGV.search(msg):
        return "segfault", {}
    m = _HOST_ASSERT.search(msg)
    if m and "device-side" not in msg:
        return "host_assert", ({"condition": m.group("cond")} if m.group("cond") else {})
    m = _PYERR.search(msg)
    if m and (msg.lstrip().startswith(m.group("exc")) or ": " in msg[m.start():m.start() + 40]):
        return "python_error", {"exception": m.group("exc"), "message": m.group("msg").strip()[:300]}
    if _SCHED_EXC.search(msg):
        return "scheduler_exception", {}
    if _TRACEBACK.search(msg):
        return "traceback", {}
    if _EXIT.search(msg):
        return "process_exit", {}
    return None
