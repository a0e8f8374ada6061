"""Recognising the lines that say a process died, and what they say about why.

Each recognised line becomes an :class:`ErrorEvent` with a ``kind``, the numbers it carries, how the process
ended (``failure``) and the library that printed it.
Which rules explain an error is not decided here: each rule's ``signatures`` in ``rules/catalog.json``
say which error lines it produces (:mod:`validator.ingest.signatures`). Which source files name a FlashMLA
crash class is data: every kernel generation's ``error_site`` in ``rules/flashmla.json`` and the
other builds' sites in ``rules/crash_sites.json`` (see :func:`site_patterns`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from ..knowledge import load
from ..limits import parse_int

# kind -> (specificity, quantity that varies). Which rules explain an error is not decided here: each
# rule's "signatures" in rules/catalog.json say which error lines it produces (validator.ingest.signatures).
KINDS: dict[str, tuple[int, str | None]] = {
    "flashmla_sched": (10, "rows"),
    "flashmla_sparse_prefill": (10, "rows"),
    "tma_descriptor": (10, "rows"),
    "flashmla_combine": (9, "rows"),
    "flashinfer_plan": (9, None),
    "index_oob": (9, "slot"),
    "flashinfer_launch": (8, None),
    "device_assert": (8, None),
    "host_assert": (7, None),
    "oom": (7, "rows"),
    "segfault": (6, None),
    "cuda_error": (5, None),
    "illegal_memory_access": (4, None),
    "python_error": (3, None),
    "scheduler_exception": (2, None),
    "traceback": (1, None),
    "process_exit": (1, None),
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
    listed for other builds (and for classes no generation part names) in ``rules/crash_sites.json``."""
    gens = load("flashmla")["generations"]
    extra = load("crash_sites")
    out = {}
    kinds = list(SITE_PARTS) + [k for k in extra if not k.startswith("_") and k not in SITE_PARTS]
    for kind in kinds:
        part = SITE_PARTS.get(kind)
        sites = [g[part]["error_site"] for g in gens.values() if part and g.get(part, {}).get("error_site")]
        more = extra.get(kind, {})
        stems = [site_stem(x) for x in sites + list(more.get("sites", []))] + list(more.get("prefixes", []))
        out[kind] = (tuple(dict.fromkeys(stems)), tuple(more.get("contains", [])))
    return out


def site_kind(file: str) -> str | None:
    """The FlashMLA crash class a source file named in a CUDA error reports, or None."""
    for kind, (prefixes, fragments) in site_patterns().items():
        if (prefixes and file.startswith(prefixes)) or any(f in file for f in fragments):
            return kind
    return None


# A source path: directories (each ending in "/") then the file; no part can take another's characters, so
# matching stays linear in the line (a hostile line of digits must not backtrack).
_SRC = r"(?P<path>(?:[^()\s/:]*/)*(?P<file>[\w.+-]+\.(?:cu|cuh|cpp|h|hpp|cc|c)))"
SITE_SCAN_CHARS = 2000      # a line's first characters that the file-and-line patterns read
# FlashMLA's CHECK_CUDA: "CUDA error (FILE:LINE): MESSAGE", then exit(1) (9241ae3 csrc/utils.h:5-11).
_CUDA_FILE = re.compile(r"CUDA error \((?P<path>(?:[^()/]*/)*(?P<file>[\w.+-]+\.(?:cu|cuh|cpp|h|hpp|cc)))\s*:\s*(?P<line>\d+)\)\s*:?\s*(?P<msg>.*)")
# The same line cut off before its closing parenthesis: the file (or its line) is not all there.
_CUDA_CUT = re.compile(r"CUDA error \((?P<frag>[^()]*)$")
# FlashMLA's FLASH_ASSERT "Assertion failed (FILE:LINE): COND", then exit(1) (9241ae3 csrc/utils.h:17-23), and
# sgl-flash-mla's exception form "Assertion error (FILE:LINE): Assertion `COND` failed (...)".
_FLASH_ASSERT = re.compile(r"Assertion (?P<how>failed|error) \(" + _SRC + r"\s*:\s*(?P<line>\d+)\)\s*:?\s*(?P<msg>.*)")
# DeepGEMM's exception text (54e2261 csrc/utils/exception.hpp:12-73): "NAME error (FILE:LINE): MSG" for
# assertions, NVRTC, CUDA driver and CUDA runtime failures; raised to Python as a RuntimeError.
_DG_ERROR = re.compile(r"(?P<name>NVRTC|CUDA driver|CUDA runtime|cuBLASLt) error \(" + _SRC + r":(?P<line>\d+)\):\s*(?P<msg>.*)")
# FlashInfer's exception text (include/flashinfer/exception.h, class Error): "Error in function 'F' at FILE:LINE: MSG".
_FI_PLAN = re.compile(r"Error in function '(?P<func>[^']*)' at " + _SRC + r":(?P<line>\d+):?\s*(?P<msg>.*)")
# FlashInfer's driver-call check around the trtllm-gen kernels (include/flashinfer/trtllm/common.h:44-48):
# prints "CUDA Error: NAME FILE LINE" and carries on, so the kernel did not run and its output stays unwritten.
_FI_CUDA_DRIVER = re.compile(r"CUDA Error: (?P<code>[A-Z][A-Z0-9_]+) " + _SRC + r" (?P<line>\d+)\b")
# FlashInfer's runtime-call check (include/flashinfer/utils.cuh, FLASHINFER_CUDA_CALL in debug builds):
# "CUDA Error: STRING (CODE) FILE: line N at function CALL"; the status is returned to the caller.
_FI_CUDA_CALL = re.compile(r"CUDA Error: (?P<msg>.*?) \((?P<code>\d+)\) " + _SRC + r": line (?P<line>\d+)(?: at function (?P<func>.*))?")
# CUTLASS's TMA descriptor dump (cute/atom/copy_traits_sm90_tma.hpp) and its closing line.
_TMA_DUMP = re.compile(r"TMA Desc Addr:\s*(?P<addr>\S*)")
_TMA_FAIL = re.compile(r"Failed to initialize the TMA descriptor[,:]?\s*(?:error code:\s*)?(?P<code>-?\d+)?")
TMA_FIELD = re.compile(r"^\s*(?P<key>format|dim|gmem_address|globalDim|globalStrides|boxDim|elementStrides|interleave|"
                       r"swizzle|l2Promotion|oobFill|tensorDataType|tensorRank)\s+(?P<value>\S.*?)\s*$")
# FlashMLA's KU_ASSERT (9241ae3 csrc/kerutils/include/kerutils/host/host.h:57-67): "Assertion `COND` failed
# (FILE:LINE): ..." on stderr, then it throws; measured on an H200 the process then dies (SIGSEGV).
_KU_ASSERT = re.compile(r"Assertion `(?P<cond>[^`]*)` failed \(" + _SRC + r":(?P<line>\d+)\)")
# A host assert (glibc): "PROG: FILE:LINE: FUNC: Assertion `COND' failed." -> abort.
_HOST_ASSERT_SITE = re.compile(_SRC + r":(?P<line>\d+): (?P<func>.*?):?\s*Assertion `(?P<cond>.*)' failed")
# A device assert (CUDA): "FILE:LINE: FUNC: block: [x,y,z], thread: [x,y,z] Assertion `COND` failed."
_DEVICE_ASSERT_SITE = re.compile(_SRC + r":(?P<line>\d+): (?P<func>.*?):?\s*block: \[[^\]]*\],? thread: \[[^\]]*\],?\s*"
                                 r"Assertion `(?P<cond>.*)` failed")
_CUDA_PLAIN = re.compile(r"CUDA error:\s*(?P<msg>.*)")
_INDEX = re.compile(r"index (?P<index>-?\d+) is out of bounds for dimension (?P<dim>\d+) with size (?P<size>\d+)")
_DEVICE_ASSERT = re.compile(r"device-side assert(?:ion)? triggered")
_HOST_ASSERT = re.compile(r"Assertion [`'\"](?P<cond>.+?)[`'\"] failed|assert(?:ion)? failed|TORCH_CHECK|Expected .* to be true")
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")
_SEGV = re.compile(r"Segmentation fault|SIGSEGV|Fatal Python error|core dumped|SIGABRT|Aborted \(core")
_PYERR = re.compile(r"\b(?P<exc>RuntimeError|IndexError|AssertionError|ValueError|KeyError|TypeError|torch\.AcceleratorError|AcceleratorError|EngineDeadError)\b:?\s*(?P<msg>.*)")
_RAISED = re.compile(r"(?:^|\s)(?:torch\.)?(?:RuntimeError|AcceleratorError|ValueError|AssertionError|IndexError)\b:")
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
        return KINDS.get(self.kind, (0, None))[0]

    @property
    def quantity(self) -> str | None:
        """What varies for this error: ``rows``, ``slot`` (an index out of a buffer) or None."""
        if self.kind == "device_assert" and "index" in str(self.numbers.get("condition", "")):
            return "slot"
        return KINDS.get(self.kind, (0, None))[1]

    @property
    def failure(self) -> str | None:
        """How the process ended, as the rule catalog names it (``process_exit``, ``illegal_memory_access``,
        ``python_exception``, ``process_crash``, ``device_assert``, ``launch_error_silent``), or None."""
        return self.numbers.get("failure")

    @property
    def file(self) -> str | None:
        return self.numbers.get("file")

    @property
    def source_line(self) -> int | None:
        return self.numbers.get("source_line")

    def recognised(self) -> dict:
        """What the line was read as: its class, failure, library, source file and line, and what else it carries."""
        d = {"kind": self.kind, "failure": self.failure, "library": self.numbers.get("library")}
        for k, v in self.numbers.items():
            if k not in d:
                d[k] = v
        return d

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
        return d


_ANY = re.compile(r"rror|out of bounds|ssert|Traceback|illegal|Segmentation|SIG[A-Z]|Killed|xception|failed|"
                  r"Fatal|exit|Dumping requests|Dumped \d|core dumped|Aborted|out of memory|TORCH_CHECK|TMA Desc", re.I)


def _raised(msg: str) -> bool:
    """Whether the line is a Python exception's text (the library raised instead of exiting)."""
    return bool(_RAISED.search(msg[:160]))


def _site(m: re.Match, **more) -> dict:
    d = {"file": m.group("file"), "source_line": parse_int(m.group("line"), "error line"), "path": m.group("path")}
    d.update({k: v for k, v in more.items() if v is not None})
    return d


_LIBRARIES = (("flashinfer", "flashinfer"), ("flashmla", "flashmla"), ("flash_mla", "flashmla"),
              ("deep_gemm", "deepgemm"), ("deepgemm", "deepgemm"), ("cutlass", "cutlass"), ("/cute/", "cutlass"))


def _library(path: str) -> str | None:
    low = path.lower()
    return next((lib for frag, lib in _LIBRARIES if frag in low), None)


def _classify_site(line: str) -> tuple[str, dict] | None:
    """Lines that name the source file and line they come from (each pattern runs only on lines with its
    literal marker; all but FlashMLA's ``CUDA error (FILE:LINE)`` on the first ``SITE_SCAN_CHARS`` characters)."""
    m = _CUDA_FILE.search(line) if "CUDA error (" in line else None
    msg = line[:SITE_SCAN_CHARS]
    if m:
        text = m.group("msg").strip()
        failure = ("python_exception" if _raised(msg) else
                   "illegal_memory_access" if _ILLEGAL.search(text) else "process_exit")
        nums = _site(m, message=text, failure=failure, library=_library(m.group("path")) or "flashmla")
        kind = site_kind(m.group("file"))
        if kind is not None:
            return kind, nums
        return ("illegal_memory_access" if _ILLEGAL.search(msg) else "cuda_error"), nums
    m = _DG_ERROR.search(msg) if " error (" in msg else None
    if m:
        return "cuda_error", _site(m, message=m.group("msg").strip(), error_class=m.group("name"),
                                   failure="python_exception", library=_library(m.group("path")) or "deepgemm")
    m = _FI_PLAN.search(msg) if "Error in function '" in msg else None
    if m:
        return "flashinfer_plan", _site(m, function=m.group("func"), message=m.group("msg").strip(),
                                        failure="python_exception", library="flashinfer")
    fi = "CUDA Error: " in msg
    m = _FI_CUDA_DRIVER.search(msg) if fi else None
    if m:
        return "flashinfer_launch", _site(m, error_code=m.group("code"), failure="launch_error_silent",
                                          library=_library(m.group("path")) or "flashinfer")
    m = _FI_CUDA_CALL.search(msg) if fi else None
    if m:
        return "flashinfer_launch", _site(m, error_code=parse_int(m.group("code"), "error code"),
                                          message=m.group("msg").strip(), function=(m.group("func") or "").strip() or None,
                                          library=_library(m.group("path")) or "flashinfer",
                                          note="the failed call's status is returned to its caller")
    m = _FLASH_ASSERT.search(msg) if ("Assertion failed (" in msg or "Assertion error (" in msg) else None
    if m:
        text = m.group("msg").strip()
        cond = re.search(r"Assertion `(?P<c>[^`]*)` failed", text)
        nums = _site(m, condition=cond.group("c") if cond else text,
                     failure="python_exception" if (m.group("how") == "error" or _raised(msg)) else "process_exit",
                     library=_library(m.group("path")) or "flashmla")
        return (site_kind(m.group("file")) or "host_assert"), nums
    m = _KU_ASSERT.search(msg) if "` failed (" in msg else None
    if m:
        return (site_kind(m.group("file")) or "host_assert"), _site(
            m, condition=m.group("cond"), failure="python_exception" if _raised(msg) else "process_crash",
            library=_library(m.group("path")) or "flashmla")
    m = _DEVICE_ASSERT_SITE.search(msg) if ("block: [" in msg and "Assertion `" in msg) else None
    if m:
        return "device_assert", _site(m, condition=m.group("cond"), failure="device_assert",
                                      library=_library(m.group("path")))
    m = _HOST_ASSERT_SITE.search(msg) if ("Assertion `" in msg and "' failed" in msg) else None
    if m:
        kind = "tma_descriptor" if "tma" in m.group("file").lower() else (site_kind(m.group("file")) or "host_assert")
        return kind, _site(m, condition=m.group("cond"), failure="process_crash", library=_library(m.group("path")))
    return None


def _classify_cut(msg: str) -> tuple[str, dict] | None:
    """A ``CUDA error (`` line cut off before its closing parenthesis: what is visible, marked as cut."""
    m = _CUDA_CUT.search(msg) if "CUDA error (" in msg else None
    if not m:
        return None
    frag = m.group("frag")[-300:]       # the end of what is visible is what names the file
    nums: dict = {"cut_off": True, "path_fragment": frag}
    lib = _library(frag)
    if lib:
        nums["library"] = lib
    fm = re.search(r"(?P<file>[\w.+-]+\.(?:cu|cuh|cpp|h|hpp|cc))(?::\d*)?$", frag)
    if fm:
        nums["file"] = fm.group("file")
        nums["line_cut_off"] = True
    return "cuda_error", nums


def classify_error(msg: str) -> tuple[str, dict] | None:
    """The kind of error a log message reports (most specific first), with its numbers; or None.
    The numbers carry ``failure`` (how the process ended, when the line says it) and ``library``."""
    if not _ANY.search(msg):
        return None
    got = _classify_site(msg) or _classify_cut(msg)
    if got is not None:
        return got
    m = _TMA_DUMP.search(msg)
    if m:
        return "tma_descriptor", {"descriptor_address": m.group("addr"), "failure": "process_crash", "library": "cutlass"}
    m = _TMA_FAIL.search(msg)
    if m:
        return "tma_descriptor", {"failure": "process_crash", "library": "cutlass",
                                  **({"tma_result": parse_int(m.group("code"), "TMA result")} if m.group("code") else {})}
    m = _INDEX.search(msg)
    if m:
        return "index_oob", {"index": parse_int(m.group("index"), "error line"), "dim": parse_int(m.group("dim"), "error line"),
                             "size": parse_int(m.group("size"), "error line"), "failure": "python_exception"}
    if _DEVICE_ASSERT.search(msg):
        return "device_assert", {"failure": "device_assert"}
    if _ILLEGAL.search(msg):
        return "illegal_memory_access", {"failure": "illegal_memory_access"}
    m = _CUDA_PLAIN.search(msg)
    if m:
        return "cuda_error", {"message": m.group("msg").strip(), **({"failure": "python_exception"} if _raised(msg) else {})}
    if _OOM.search(msg):
        m2 = re.search(r"Tried to allocate ([\d.]+ ?[KMGT]i?B)", msg)
        return "oom", {"failure": "python_exception", **({"allocation": m2.group(1)} if m2 else {})}
    if _SEGV.search(msg):
        return "segfault", {"failure": "process_crash"}
    m = _HOST_ASSERT.search(msg)
    if m and "device-side" not in msg:
        return "host_assert", {"failure": "process_crash", **({"condition": m.group("cond")} if m.group("cond") else {})}
    m = _PYERR.search(msg)
    if m and (msg.lstrip().startswith(m.group("exc")) or ": " in msg[m.start():m.start() + 40]):
        return "python_error", {"exception": m.group("exc"), "message": m.group("msg").strip()[:300],
                                "failure": "python_exception"}
    if _SCHED_EXC.search(msg):
        return "scheduler_exception", {}
    if _TRACEBACK.search(msg):
        return "traceback", {}
    if _EXIT.search(msg):
        return "process_exit", {}
    return None
