"""The one table of error-line recognisers, read by bisect's log scan and by kernel mode alike.

Each row of :data:`RECOGNISERS` is one error-line format a library prints: the library, the error
class (``kind``, a key of :data:`KINDS`), a compiled pattern, the literal markers a line needs before
the pattern is tried, and the fields it reads (``file``, ``source_line`` and ``path`` whenever the
pattern names a source site; ``failure``, how the process ended, when the line says it). Rows are tried
in order and the first that reads the line wins, so a row goes before the more general rows it must win
over. The prefilter that skips ordinary lines is derived from the rows' markers: adding a format is one
row here plus a fixture line in ``fixtures/error_lines.jsonl``.

:func:`classify` reads one line; :func:`classify_block` reads a run of lines, where an error may span
several (CUTLASS's TMA descriptor dump: the row's :class:`Block` says which lines continue it). Which
source files name a FlashMLA crash class is data: every kernel generation's ``error_site`` in
``rules/flashmla.json`` and the other builds' sites in ``rules/crash_sites.json`` (:func:`site_patterns`).
Which rules explain an error is not decided here: each rule's ``signatures`` say which error lines it
produces (:mod:`validate_batch.ingest.signatures`).

Every pattern stays linear in the length of the line: no part of a pattern can take another part's
characters (a hostile line of repeated characters must not backtrack), and the source-site formats read
only the first :data:`SITE_SCAN_CHARS` characters.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, NamedTuple

from ..facts.knowledge import load
from ..facts.limits import parse_int

# kind -> (specificity, quantity that varies). The most specific error of a run or a log is its cause.
KINDS: dict[str, tuple[int, str | None]] = {
    "flashmla_sched": (10, "rows"),
    "flashmla_sparse_prefill": (10, "rows"),
    "tma_descriptor": (10, "rows"),
    "flashmla_combine": (9, "rows"),
    "ptxas_error": (10, None),
    "compile_error": (9, None),
    "flashinfer_plan": (9, None),
    "index_oob": (9, "slot"),
    "flashinfer_launch": (8, None),
    "device_assert": (8, None),
    "tvm_check": (8, None),
    "host_assert": (7, None),
    "oom": (7, "rows"),
    "segfault": (6, None),
    "cuda_error": (5, None),
    "illegal_memory_access": (4, None),
    "python_error": (3, None),
    "scheduler_exception": (2, None),
    "traceback": (1, None),
    "process_exit": (1, None),
    "prose_report": (0, None),
}

SITE_SCAN_CHARS = 2000      # a line's first characters that the file-and-line formats read
ILLEGAL_ACCESS_TEXT = "illegal memory access"   # the CUDA runtime's text for a lost context
#: how the CUDA runtime and driver print it (cudaGetErrorString, the driver's error name); a line holding only
#: the words ("we get an illegal memory access when ...") is a report in prose
ILLEGAL_ACCESS_PRINTED = ("illegal memory access was encountered", "cudaErrorIllegalAddress",
                          "CUDA_ERROR_ILLEGAL_ADDRESS")
DEVICE_ASSERT_TEXT = "device-side assert"       # torch's text for a device-side assertion

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
    """The FlashMLA crash class a source file named in an error line reports, or None."""
    for kind, (prefixes, fragments) in site_patterns().items():
        if (prefixes and file.startswith(prefixes)) or any(f in file for f in fragments):
            return kind
    return None


#: the kernel libraries whose own failures rules describe; an error one of them prints (or raises) is theirs
KERNEL_LIBRARIES = ("flashmla", "flashinfer", "deepgemm", "fa3")
#: (part of a source path, the library it names), tried in order. FlashAttention-3 is the ``hopper/`` tree of
#: flash-attention, shipped by vLLM as ``vllm-flash-attn`` (``vllm/vllm_flash_attn`` once installed);
#: CUTLASS's CuTe headers sit in a directory ``cute``
_LIBRARIES = (("flashinfer", "flashinfer"), ("flashmla", "flashmla"), ("flash_mla", "flashmla"),
              ("deep_gemm", "deepgemm"), ("deepgemm", "deepgemm"), ("vllm-flash-attn", "fa3"),
              ("vllm_flash_attn", "fa3"), ("flash_attn_3", "fa3"), ("flash-attention/hopper", "fa3"),
              ("flash_attn/hopper", "fa3"), ("hopper/flash_", "fa3"),
              ("cutlass", "cutlass"))
_LIBRARY_DIRS = {"cute": "cutlass"}
#: path parts of the engines' own code (a traceback frame there: the engine raised, not a kernel library)
_ENGINES = (("/sglang/", "sglang"), ("sglang/srt/", "sglang"), ("/vllm/", "vllm"))


def library_of(path: str) -> str | None:
    """The library a source path belongs to (``.../flash_mla/...`` -> ``flashmla``), or None."""
    low = path.lower()
    found = next((lib for frag, lib in _LIBRARIES if frag in low), None)
    if found is None:
        found = next((_LIBRARY_DIRS[d] for d in low.split("/")[:-1] if d in _LIBRARY_DIRS), None)
    return found


def frame_library(path: str) -> str | None:
    """The library a Python traceback frame's file is in: a kernel library's package (checked first, so
    vLLM's bundled ``vllm_flash_attn`` is FlashAttention-3), else the engine (``sglang``, ``vllm``); None
    for other code (torch, the standard library)."""
    low = "/" + path.lower().lstrip("/")
    lib = library_of(low)
    if lib in KERNEL_LIBRARIES:
        return lib
    return next((name for frag, name in _ENGINES if frag in low), None)


# ---------------------------------------------------------------------------------- the rows
@dataclass(frozen=True, eq=False)
class Block:
    """Lines that continue the error a row opened (a dump spread over lines): field lines, then a
    closing line read by the row named ``closer``. Any other line, or a gap of more than ``max_gap``
    lines, ends the block; that line is read on its own."""

    field: re.Pattern                          # one field line: groups ``key`` and ``value``
    add: Callable[[dict, str, str], None]      # folds one field into the error's numbers
    closer: str                                # the row whose line closes the block
    closing_field: str                         # what the closing line adds (without it, the line is not the close)
    max_gap: int = 2


@dataclass(frozen=True, eq=False)
class Recogniser:
    """One error-line format: who prints it, what it reports, and how it is read.

    ``markers``: literals of which a line must hold one (compared as ``pattern`` compares: ignoring case
    when it does) before the pattern is tried; ``needs``: literals it must hold all of; ``unless``:
    literals that rule the row out. ``fields(match, line)`` gives the numbers the line carries (None:
    not this format after all); a pattern with a ``path`` group adds the source site. ``failure`` is how
    the process ended when ``fields`` does not say; ``default_library`` the library when the path names none.
    ``kind_of(match, line)`` decides the class when it depends on the line (the source file's crash class).
    ``window``: the row reads only the line's first characters.
    """

    name: str
    default_library: str | None
    kind: str
    pattern: re.Pattern | FirstStarts
    markers: tuple[str, ...]
    fields: Callable[[re.Match, str], dict | None] = lambda m, line: {}
    failure: str | None = None
    needs: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    window: int | None = None
    kind_of: Callable[[re.Match, str], str] | None = None
    path_names_library: bool = True
    block: Block | None = None
    source: str = ""

    @property
    def ignore_case(self) -> bool:
        return bool(self.pattern.flags & re.IGNORECASE)

    def holds_markers(self, text: str, low: str) -> bool:
        """Whether the text (and ``low``, the same text lower-cased) holds this row's literals."""
        if self.ignore_case:
            text = low
        fold = str.lower if self.ignore_case else str
        return (any(fold(m) in text for m in self.markers) and all(fold(m) in text for m in self.needs)
                and not any(fold(m) in text for m in self.unless))

    def read(self, line: str, low: str) -> Recognised | None:
        """The line read by this row, or None."""
        text, lowtext = (line, low) if self.window is None else (line[:self.window], low[:self.window])
        if not self.holds_markers(text, lowtext):
            return None
        m = self.pattern.search(text)
        if m is None:
            return None
        more = self.fields(m, line)
        if more is None:
            return None
        path = m.group("path") if "path" in self.pattern.groupindex else None
        nums: dict = {}
        if path is not None:
            nums.update(file=m.group("file"), source_line=parse_int(m.group("line"), "error line"), path=path)
        nums.update((k, v) for k, v in more.items() if v is not None)
        if self.failure is not None and "failure" not in nums:
            nums["failure"] = self.failure
        lib = (library_of(path) if path is not None and self.path_names_library else None) or self.default_library
        if lib is not None and "library" not in nums:
            nums["library"] = lib
        kind = self.kind_of(m, line) if self.kind_of is not None else self.kind
        return Recognised(kind, nums, self, line)


@dataclass(frozen=True, eq=False)
class FirstStarts:
    """A pattern tried only at the first place each of its alternatives can start (``starts``, one
    pattern per alternative). Right for alternatives that match at their first start or nowhere (a
    literal; a literal then anything up to a closing text), and linear where searching the alternation at
    every position is quadratic (a line of many starts and no closing text)."""

    pattern: re.Pattern
    starts: tuple[re.Pattern, ...]

    @property
    def flags(self) -> int:
        return self.pattern.flags

    @property
    def groupindex(self):
        return self.pattern.groupindex

    def search(self, text: str) -> re.Match | None:
        firsts = sorted({m.start() for rx in self.starts for m in [rx.search(text)] if m is not None})
        for pos in firsts:
            m = self.pattern.match(text, pos)
            if m is not None:
                return m
        return None


class Recognised(NamedTuple):
    """A line read by a row: its error class, the numbers it carries, the row, and the line."""

    kind: str
    numbers: dict
    recogniser: Recogniser
    text: str

    @property
    def failure(self) -> str | None:
        return self.numbers.get("failure")

    @property
    def specificity(self) -> int:
        return KINDS.get(self.kind, (0, None))[0]

    def to_dict(self, max_text: int = 300) -> dict:
        """What the line was read as: class, failure, library, the row, what else it carries, the line."""
        d = {"kind": self.kind, "failure": self.failure, "library": self.numbers.get("library"),
             "recogniser": self.recogniser.name}
        d.update((k, v) for k, v in self.numbers.items() if k not in d)
        d["text"] = self.text.strip()[:max_text]
        return d


# ---------------------------------------------------------------------------------- patterns
# A source path: directories (each ending in "/") then the file; no part can take another's characters, so
# matching stays linear in the line (a hostile line of digits must not backtrack).
_SRC = r"(?P<path>(?:[^()\s/:]*/)*(?P<file>[\w.+-]+\.(?:cu|cuh|cpp|h|hpp|cc|c)))"
_ILLEGAL = re.compile(re.escape(ILLEGAL_ACCESS_TEXT), re.I)
_RAISED = re.compile(r"(?:^|\s)(?:torch\.)?(?:RuntimeError|AcceleratorError|ValueError|AssertionError|IndexError)\b:")
_INNER_ASSERT = re.compile(r"Assertion `(?P<c>[^`]*)` failed")
_ALLOCATION = re.compile(r"Tried to allocate ([\d.]+ ?[KMGT]i?B)")
_CUT_FILE = re.compile(r"(?P<file>[\w.+-]+\.(?:cu|cuh|cpp|h|hpp|cc))(?::\d*)?$")
# The text of an assertion, from its keyword on: what kernel mode quotes for a crash (found without
# backtracking: the first keyword of a line that some "failed" follows, to the end of that line).
_ASSERTION_KEY = re.compile(r"Assertion [`']")
# One field line of CUTLASS's TMA descriptor dump (cute/atom/copy_traits_sm90_tma.hpp).
TMA_FIELD = re.compile(r"^\s*(?P<key>format|dim|gmem_address|globalDim|globalStrides|boxDim|elementStrides|interleave|"
                       r"swizzle|l2Promotion|oobFill|tensorDataType|tensorRank)\s+(?P<value>\S.*?)\s*$")


# ptxas's resource error: 'ptxas error   : Entry function 'K' uses too much shared data (0xN bytes, 0xM max)'
_PTXAS = re.compile(r"ptxas (?:error|fatal)\s*:\s*(?P<msg>(?:Entry function '(?P<kernel>[^'\s]{1,2000})' uses too much "
                    r"(?P<what>shared|local|param) data \((?P<bytes>0x[0-9a-fA-F]{1,16}|\d{1,20}) bytes, "
                    r"(?P<max>0x[0-9a-fA-F]{1,16}|\d{1,20}) max\))?.*)")
# TVM's (and TVM-FFI's, FlashInfer's binding layer) check text: 'InternalError: Check failed: (COND) is false: MSG'
_TVM_CHECK = re.compile(r"(?P<exc>(?:tvm\.error\.|tvm_ffi\.)?\w*Error)?:?\s*Check failed: (?P<cond>\(.{0,2000}?\) is false|"
                        r"[^:]{0,2000})(?::\s*(?P<msg>.*))?")


def _number(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else parse_int(text, "ptxas line")


def _ptxas(m: re.Match, line: str) -> dict:
    nums: dict = {"message": m.group("msg").strip()[:300]}
    if m.group("kernel"):
        nums.update(kernel=m.group("kernel")[:300], memory=m.group("what"), bytes=_number(m.group("bytes")),
                    max_bytes=_number(m.group("max")))
        if m.group("what") == "shared":
            nums["note"] = "static shared memory (__shared__ arrays): the 48 KiB static limit, not the dynamic opt-in"
    return nums


def _tvm_check(m: re.Match, line: str) -> dict:
    cond = m.group("cond").strip()
    if cond.endswith(" is false") and cond.startswith("("):
        cond = cond[1:-len(") is false")]
    return {"exception": m.group("exc"), "condition": cond[:300], "message": (m.group("msg") or "").strip()[:300]}


def _prose(m: re.Match, line: str) -> dict | None:
    return {"prose": True, "confidence": "low", "report": line.strip()[:300]}


def _raised(line: str) -> bool:
    """Whether the line is a Python exception's text (the library raised instead of exiting)."""
    return bool(_RAISED.search(line[:160]))


def _site_class(default: str) -> Callable[[re.Match, str], str]:
    """The FlashMLA crash class the line's source file reports (a FlashMLA file), else ``default``."""
    return lambda m, line: (site_kind(m.group("file")) if library_of(m.group("path")) in (None, "flashmla")
                            else None) or default


def _check_cuda_kind(m: re.Match, line: str) -> str:
    lib = library_of(m.group("path"))
    return (site_kind(m.group("file")) if lib in (None, "flashmla") else None) or (
        "illegal_memory_access" if _ILLEGAL.search(line[:SITE_SCAN_CHARS]) else "cuda_error")


def _site_library(m: re.Match) -> str | None:
    """``flashmla`` for a path that names no library but a FlashMLA source file (the format is shared:
    FlashAttention-3 prints the same 'CUDA error (FILE:LINE)' and DeepGEMM the same 'Assertion error (')."""
    return "flashmla" if library_of(m.group("path")) is None and site_kind(m.group("file")) else None


def _check_cuda(m: re.Match, line: str) -> dict:
    text = m.group("msg").strip()
    failure = ("python_exception" if _raised(line) else
               "illegal_memory_access" if _ILLEGAL.search(text) else "process_exit")
    return {"message": text, "failure": failure, "library": _site_library(m)}


def _flash_assert(m: re.Match, line: str) -> dict:
    text = m.group("msg").strip()
    cond = _INNER_ASSERT.search(text)
    return {"condition": cond.group("c") if cond else text, "library": _site_library(m),
            "failure": "python_exception" if (m.group("how") == "error" or _raised(line)) else "process_exit"}


def _cut_off(m: re.Match, line: str) -> dict:
    frag = m.group("frag")[-300:]       # the end of what is visible is what names the file
    nums: dict = {"cut_off": True, "path_fragment": frag, "library": library_of(frag)}
    fm = _CUT_FILE.search(frag)
    if fm:
        nums.update(file=fm.group("file"), line_cut_off=True)
    return nums


def _python_error(m: re.Match, line: str) -> dict | None:
    if not (line.lstrip().startswith(m.group("exc")) or ": " in line[m.start():m.start() + 40]):
        return None
    return {"exception": m.group("exc"), "message": m.group("msg").strip()[:300]}


def _tma_field(nums: dict, key: str, value: str) -> None:
    nums.setdefault("descriptor", {})[key] = value
    if key == "globalDim" and any(x.lstrip("-").strip("0") == "" for x in re.findall(r"-?\d+", value)):
        nums["zero_extent"] = True


def _first_group(rx: re.Pattern, line: str) -> str | None:
    m = rx.search(line)
    return m.group(1) if m else None


def _int(m: re.Match, group: str, what: str) -> int | None:
    return parse_int(m.group(group), what) if m.group(group) is not None else None


TMA_BLOCK = Block(TMA_FIELD, _tma_field, closer="cutlass_tma_init_failed", closing_field="tma_result")

RECOGNISERS: tuple[Recogniser, ...] = (
    Recogniser(
        "flashmla_check_cuda", None, "cuda_error",
        re.compile(r"CUDA error \((?P<path>(?:[^()/]*/)*(?P<file>[\w.+-]+\.(?:cu|cuh|cpp|h|hpp|cc)))\s*:\s*(?P<line>\d+)\)"
                   r"\s*:?\s*(?P<msg>.*)"),
        ("CUDA error (",), _check_cuda, kind_of=_check_cuda_kind,
        source="FlashMLA CHECK_CUDA: 'CUDA error (FILE:LINE): MESSAGE', then exit(1) (9241ae3 csrc/utils.h:5-11)"),
    Recogniser(
        "deepgemm_error", "deepgemm", "cuda_error",
        re.compile(r"(?P<name>NVRTC|CUDA driver|CUDA runtime|cuBLASLt) error \(" + _SRC + r":(?P<line>\d+)\):\s*(?P<msg>.*)"),
        (" error (",), lambda m, line: {"message": m.group("msg").strip(), "error_class": m.group("name")},
        failure="python_exception", window=SITE_SCAN_CHARS,
        source="DeepGEMM 'NAME error (FILE:LINE): MSG', raised as a RuntimeError (54e2261 csrc/utils/exception.hpp:12-73)"),
    Recogniser(
        "ptxas_error", None, "ptxas_error", _PTXAS, ("ptxas error", "ptxas fatal"), _ptxas,
        failure="python_exception", window=SITE_SCAN_CHARS,
        source="ptxas's error line, printed in the compiler output a JIT library shows before it raises (DeepGEMM "
               "06a6ae2 csrc/jit/compiler.hpp, NVCCCompiler::compile: printf then DG_HOST_ASSERT)"),
    Recogniser(
        "deepgemm_nvcc_failed", "deepgemm", "compile_error",
        re.compile(r"NVCC (?:PTX )?compilation failed:?\s*(?P<msg>.*)"), ("NVCC compilation failed", "NVCC PTX compilation"),
        lambda m, line: {"message": m.group("msg").strip()[:300]} if "Assertion" not in line[:m.start() + 1] else None,
        failure="python_exception", window=SITE_SCAN_CHARS,
        source="DeepGEMM's JIT compiler prints 'NVCC compilation failed: OUTPUT' then asserts (06a6ae2 "
               "csrc/jit/compiler.hpp, NVCCCompiler::compile)"),
    Recogniser(
        "tvm_check_failed", "tvm-ffi", "tvm_check", _TVM_CHECK, ("Check failed",), _tvm_check,
        failure="python_exception", window=SITE_SCAN_CHARS,
        source="TVM's check text 'InternalError: Check failed: (COND) is false: MSG' (tvm.error.InternalError), "
               "raised through TVM-FFI, FlashInfer's binding layer from 0.4 (its tvm-ffi requirement): the "
               "library that failed is the traceback's"),
    Recogniser(
        "flashinfer_error", "flashinfer", "flashinfer_plan",
        re.compile(r"Error in function '(?P<func>[^']*)' at " + _SRC + r":(?P<line>\d+):?\s*(?P<msg>.*)"),
        ("Error in function '",), lambda m, line: {"function": m.group("func"), "message": m.group("msg").strip()},
        failure="python_exception", window=SITE_SCAN_CHARS, path_names_library=False,
        source="FlashInfer's exception text (include/flashinfer/exception.h, class Error)"),
    Recogniser(
        "flashinfer_cuda_driver", "flashinfer", "flashinfer_launch",
        re.compile(r"CUDA Error: (?P<code>[A-Z][A-Z0-9_]+) " + _SRC + r" (?P<line>\d+)\b"),
        ("CUDA Error: ",), lambda m, line: {"error_code": m.group("code")},
        failure="launch_error_silent", window=SITE_SCAN_CHARS,
        source="FlashInfer's driver-call check around the trtllm-gen kernels (include/flashinfer/trtllm/common.h:44-48): "
               "prints and carries on, so the kernel did not run and its output stays unwritten"),
    Recogniser(
        "flashinfer_cuda_call", "flashinfer", "flashinfer_launch",
        re.compile(r"CUDA Error: (?P<msg>.*?) \((?P<code>\d+)\) " + _SRC + r": line (?P<line>\d+)(?: at function (?P<func>.*))?"),
        ("CUDA Error: ",),
        lambda m, line: {"error_code": parse_int(m.group("code"), "error code"), "message": m.group("msg").strip(),
                         "function": (m.group("func") or "").strip() or None,
                         "note": "the failed call's status is returned to its caller"},
        window=SITE_SCAN_CHARS,
        source="FlashInfer's runtime-call check (include/flashinfer/utils.cuh, FLASHINFER_CUDA_CALL in debug builds)"),
    Recogniser(
        "flashmla_assert", None, "host_assert",
        re.compile(r"Assertion (?P<how>failed|error) \(" + _SRC + r"\s*:\s*(?P<line>\d+)\)\s*:?\s*(?P<msg>.*)"),
        ("Assertion failed (", "Assertion error ("), _flash_assert, window=SITE_SCAN_CHARS,
        kind_of=_site_class("host_assert"),
        source="FlashMLA FLASH_ASSERT 'Assertion failed (FILE:LINE): COND', then exit(1) (9241ae3 csrc/utils.h:17-23); "
               "sgl-flash-mla's exception form 'Assertion error (FILE:LINE): Assertion `COND` failed (...)'"),
    Recogniser(
        "kerutils_assert", None, "host_assert",
        re.compile(r"Assertion `(?P<cond>[^`]*)` failed \(" + _SRC + r":(?P<line>\d+)\)"),
        ("` failed (",),
        lambda m, line: {"condition": m.group("cond"), "library": _site_library(m),
                         "failure": "python_exception" if _raised(line) else "process_crash"},
        window=SITE_SCAN_CHARS, kind_of=_site_class("host_assert"),
        source="FlashMLA KU_ASSERT 'Assertion `COND` failed (FILE:LINE): ...', then it throws; measured on an H200 "
               "the process then dies (SIGSEGV) (9241ae3 csrc/kerutils/include/kerutils/host/host.h:57-67)"),
    Recogniser(
        "cuda_device_assert", None, "device_assert",
        re.compile(_SRC + r":(?P<line>\d+): (?P<func>.*?):?\s*block: \[[^\]]*\],? thread: \[[^\]]*\],?\s*"
                   r"Assertion `(?P<cond>.*)` failed"),
        ("block: [",), lambda m, line: {"condition": m.group("cond")}, failure="device_assert",
        needs=("Assertion `",), window=SITE_SCAN_CHARS,
        source="CUDA's device assert: 'FILE:LINE: FUNC: block: [x,y,z], thread: [x,y,z] Assertion `COND` failed.'"),
    Recogniser(
        "glibc_assert", None, "host_assert",
        re.compile(_SRC + r":(?P<line>\d+): (?P<func>.*?):?\s*Assertion `(?P<cond>.*)' failed"),
        ("Assertion `",), lambda m, line: {"condition": m.group("cond")}, failure="process_crash",
        needs=("' failed",), window=SITE_SCAN_CHARS,
        kind_of=lambda m, line: ("tma_descriptor" if "tma" in m.group("file").lower()
                                 else site_kind(m.group("file")) or "host_assert"),
        source="glibc's assert: 'PROG: FILE:LINE: FUNC: Assertion `COND' failed.', then abort"),
    Recogniser(
        "flashmla_check_cuda_cut", None, "cuda_error",
        re.compile(r"CUDA error \((?P<frag>[^()]*)$"), ("CUDA error (",), _cut_off,
        source="FlashMLA's CHECK_CUDA line cut off before its closing parenthesis: the file (or its line) is not all there"),
    Recogniser(
        "cutlass_tma_descriptor", "cutlass", "tma_descriptor",
        re.compile(r"TMA Desc Addr:\s*(?P<addr>\S*)"), ("TMA Desc Addr:",),
        lambda m, line: {"descriptor_address": m.group("addr")}, failure="process_crash", block=TMA_BLOCK,
        source="CUTLASS's TMA descriptor dump (cute/atom/copy_traits_sm90_tma.hpp): its field lines follow"),
    Recogniser(
        "cutlass_tma_init_failed", "cutlass", "tma_descriptor",
        re.compile(r"Failed to initialize the TMA descriptor[,:]?\s*(?:error code:\s*)?(?P<code>-?\d+)?"),
        ("Failed to initialize the TMA descriptor",), lambda m, line: {"tma_result": _int(m, "code", "TMA result")},
        failure="process_crash",
        source="the closing line of CUTLASS's TMA descriptor dump (cute/atom/copy_traits_sm90_tma.hpp)"),
    Recogniser(
        "torch_index_out_of_bounds", None, "index_oob",
        re.compile(r"index (?P<index>-?\d+) is out of bounds for dimension (?P<dim>\d+) with size (?P<size>\d+)"),
        (" is out of bounds for dimension ",),
        lambda m, line: {"index": parse_int(m.group("index"), "error line"), "dim": parse_int(m.group("dim"), "error line"),
                         "size": parse_int(m.group("size"), "error line")},
        failure="python_exception", source="torch's IndexError for an index out of a tensor's bounds"),
    Recogniser(
        "torch_device_assert", None, "device_assert",
        re.compile(re.escape(DEVICE_ASSERT_TEXT) + r"(?:ion)? triggered"), (DEVICE_ASSERT_TEXT,),
        failure="device_assert", source="torch's 'CUDA error: device-side assert triggered'"),
    Recogniser(
        "cuda_illegal_memory_access", None, "illegal_memory_access",
        re.compile("|".join(re.escape(t) for t in ILLEGAL_ACCESS_PRINTED), re.I), ILLEGAL_ACCESS_PRINTED,
        failure="illegal_memory_access", source="the CUDA runtime's 'an illegal memory access was encountered'"),
    Recogniser(
        "torch_cuda_error", None, "cuda_error",
        re.compile(r"CUDA error:\s*(?P<msg>.*)"), ("CUDA error:",),
        lambda m, line: {"message": m.group("msg").strip(), "failure": "python_exception" if _raised(line) else None},
        source="torch's 'CUDA error: MESSAGE' (raised as RuntimeError or AcceleratorError)"),
    Recogniser(
        "torch_out_of_memory", None, "oom",
        re.compile(r"CUDA out of memory|OutOfMemoryError"), ("CUDA out of memory", "OutOfMemoryError"),
        lambda m, line: {"allocation": _first_group(_ALLOCATION, line)},
        failure="python_exception", source="torch's 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate N GiB'"),
    Recogniser(
        "process_signal", None, "segfault",
        re.compile(r"Segmentation fault|SIGSEGV|Fatal Python error|core dumped|SIGABRT|Aborted \(core"),
        ("Segmentation fault", "SIGSEGV", "Fatal Python error", "core dumped", "SIGABRT", "Aborted (core"),
        failure="process_crash", source="the shell's and Python's lines for a process killed by a signal"),
    Recogniser(
        "host_assert", None, "host_assert",
        FirstStarts(re.compile(r"Assertion [`'\"](?P<cond>.+?)[`'\"] failed|assert(?:ion)? failed|TORCH_CHECK|"
                               r"Expected .* to be true"),
                    (re.compile(r"Assertion [`'\"]"), re.compile(r"assert(?:ion)? failed"), re.compile("TORCH_CHECK"),
                     re.compile("Expected "))),
        # torch's "Expected ... to be true" check text is read on a line that names an error
        ("ssert", "TORCH_CHECK", "rror"), lambda m, line: {"condition": m.group("cond")},
        failure="process_crash", unless=("device-side",),
        source="assertion and TORCH_CHECK texts without a source site"),
    Recogniser(
        "library_exception", None, "python_error",
        re.compile(r"(?P<mod>(?:flashinfer|deep_gemm|flash_mla|vllm_flash_attn|flash_attn_interface|flash_attn)"
                   r"(?:\.\w+){0,8})\.(?P<exc>\w{0,80}(?:Error|Exception)):\s*(?P<msg>.*)"),
        ("flashinfer.", "deep_gemm.", "flash_mla.", "vllm_flash_attn.", "flash_attn"),
        lambda m, line: {"exception": f"{m.group('mod')}.{m.group('exc')}", "message": m.group("msg").strip()[:300],
                         "library": library_of(m.group("mod").replace(".", "/") + "/")},
        failure="python_exception", window=SITE_SCAN_CHARS,
        source="a kernel library's own Python exception, named with its module ('flashinfer.jit.core.CompilationError: "
               "MSG'): the module names the library"),
    Recogniser(
        "python_exception", None, "python_error",
        re.compile(r"\b(?P<exc>RuntimeError|IndexError|AssertionError|ValueError|KeyError|TypeError|torch\.AcceleratorError|"
                   r"AcceleratorError|EngineDeadError)\b:?\s*(?P<msg>.*)"),
        ("Error",), _python_error, failure="python_exception",
        source="a Python exception's last traceback line 'NAME: MESSAGE'"),
    Recogniser(
        "engine_scheduler_exception", None, "scheduler_exception",
        re.compile(r"(?:Scheduler|TpModelWorker|DataParallelController|EngineCore|Worker)\S{0,200} "
                   r"(?:hit an exception|encountered a fatal error|failed)", re.I),
        ("hit an exception", "encountered a fatal error", "failed"),
        source="SGLang's and vLLM's lines for a scheduler or worker that raised"),
    Recogniser(
        "prose_illegal_access", None, "prose_report", _ILLEGAL, (ILLEGAL_ACCESS_TEXT,), _prose,
        source="'illegal memory access' in a sentence, not in the runtime's printed form (a report written in words): "
               "low-confidence evidence, matched by no signature"),
    Recogniser(
        "python_traceback", None, "traceback",
        re.compile(r"Traceback \(most recent call last\)"), ("Traceback (most recent call last)",),
        source="the first line of a Python traceback"),
    Recogniser(
        "engine_process_exit", None, "process_exit",
        re.compile(r"Received sigquit from a child process|Child process unexpectedly failed|exit code[: ]+\d+|exited with|"
                   r"Killed|Dumping requests before crash|Dumped \d+ finished and \d+ unfinished requests", re.I),
        ("Received sigquit from a child process", "Child process unexpectedly failed", "exit code", "exited with",
         "Killed", "Dumping requests before crash", "Dumped "),
        source="SGLang's and the shell's lines for a process that ended (sigquit, exit code, killed, crash dump)"),
)


# ---------------------------------------------------------------------------------- reading
@lru_cache(maxsize=8)      # keyed by the table's identity (its rows compare by identity)
def prefilter(table: tuple[Recogniser, ...]) -> tuple[str, ...]:
    """The lower-cased literals one of which every line some row of ``table`` reads holds: every row's
    markers, less those that hold a shorter one."""
    marks = sorted({m.lower() for row in table for m in row.markers}, key=len)
    kept: list[str] = []
    for m in marks:
        if not any(k in m for k in kept):
            kept.append(m)
    return tuple(kept)


def classify(line: str) -> Recognised | None:
    """The error a log or output line reports, read by the first row of :data:`RECOGNISERS` that reads
    it; or None. Its ``numbers`` carry ``failure`` (how the process ended, when the line says it) and
    ``library``; a number too long to be real raises :class:`validate_batch.errors.InputError`."""
    table = RECOGNISERS
    low = line.lower()
    if not any(m in low for m in prefilter(table)):
        return None
    for row in table:
        got = row.read(line, low)
        if got is not None:
            return got
    return None


class OpenBlock:
    """An error whose block is still open: :meth:`take` folds the lines that continue it into its numbers."""

    def __init__(self, block: Block, numbers: dict, line_no: int):
        self.block, self.numbers, self.line_no = block, numbers, line_no
        self.is_open = True

    def take(self, line: str, line_no: int) -> bool:
        """Whether the line continues the block (then its field is in the numbers); False ends the block."""
        b, nums = self.block, self.numbers
        if not self.is_open or line_no - nums.get("last_line", self.line_no) > b.max_gap:
            self.is_open = False
            return False
        m = b.field.match(line)
        if m:
            b.add(nums, m.group("key"), m.group("value"))
        else:
            got = classify(line)
            self.is_open = False
            if got is None or got.recogniser.name != b.closer or b.closing_field not in got.numbers:
                return False
            nums[b.closing_field] = got.numbers[b.closing_field]
        nums["last_line"] = line_no
        return True


def open_block(got: Recognised, line_no: int) -> OpenBlock | None:
    """The block the recognised line opens (its row's :class:`Block`), or None."""
    block = got.recogniser.block
    return OpenBlock(block, got.numbers, line_no) if block is not None else None


def classify_block(lines: Iterable[str]) -> list[tuple[int, Recognised]]:
    """Every error in a run of lines, with its 1-based line number; the lines that continue an error
    (its row's :class:`Block`) are folded into it. Blank lines are skipped (they count in a gap)."""
    found: list[tuple[int, Recognised]] = []
    block: OpenBlock | None = None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if block is not None and block.take(line, no):
            continue
        got = classify(line)
        block = None
        if got is not None:
            found.append((no, got))
            block = open_block(got, no)
    return found


def most_specific(found: Iterable[Recognised]) -> Recognised | None:
    """The first of the most specific errors (the cause rather than its echoes), or None."""
    best: Recognised | None = None
    for r in found:
        if best is None or r.specificity > best.specificity:
            best = r
    return best


def assertion_text(got: Recognised) -> str | None:
    """The recognised line's assertion text, from its ``Assertion `...`` keyword on, or None."""
    for line in got.text.split("\n"):
        m = _ASSERTION_KEY.search(line)
        if m is not None and line.rfind("failed") >= m.end():
            return line[m.start():].strip()
    return None


def check_table(table: tuple[Recogniser, ...] | None = None) -> None:
    """Raise ValueError naming the row unless every row has a unique name, a known kind, a marker, and
    a block that names the row closing it."""
    rows = RECOGNISERS if table is None else table
    names = {row.name for row in rows}
    seen: set[str] = set()
    for row in rows:
        where = f"recogniser {row.name!r}"
        if row.name in seen:
            raise ValueError(f"{where}: the name is used twice")
        seen.add(row.name)
        if row.kind not in KINDS:
            raise ValueError(f"{where}.kind: {row.kind!r} is not one of {', '.join(KINDS)}")
        if not row.markers or not all(isinstance(m, str) and m for m in row.markers):
            raise ValueError(f"{where}.markers: expected at least one non-empty literal, got {row.markers!r}")
        if row.block is not None and row.block.closer not in names:
            raise ValueError(f"{where}.block.closer: {row.block.closer!r} is not a row of the table")


check_table()
