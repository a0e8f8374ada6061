"""One streaming pass over an engine log: scheduler steps per DP rank, errors, configuration, vLLM dumps.

Memory stays bounded whatever the log size: per rank only the last ``window`` steps are kept (plus
counters and the largest prefill seen), errors and examples are capped, and a line longer than
``MAX_LINE`` characters is cut (and counted). Every line lands in exactly one counted category:
scheduler step, mirrored step (the same batch printed by another TP rank), batch-like line that did
not parse (examples kept), error, configuration, vLLM dump, or other. Error lines are read by the
recogniser table of :mod:`validate_batch.ingest.recognisers` (a new error-line format is a row there), and
a dump that spans lines (CUTLASS's TMA descriptor) by its row's block.
"""
from __future__ import annotations

import gzip
import io
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from ..facts import limits
from ..errors import InputError
from ..facts.limits import parse_int
from ..facts.names import normalize_setting
from .crash_lines import ErrorEvent
from .recognisers import KERNEL_LIBRARIES, OpenBlock, Recognised, classify, frame_library, open_block
from .launch import DP_CHUNK_WARNING, EngineConfig, entry_point, find_launch, parse_launch, server_args_from_line
from .sglang_log import Era, LineParseError, Step, looks_like_batch_line, parse_batch_line, parse_prefix
from .vllm_dump import MARKER as VLLM_MARKER
from .vllm_dump import VllmStep, parse_scheduler_output

MAX_LINE = 1 << 20              # characters kept of one line
DEFAULT_WINDOW = 64             # steps kept per rank
MAX_ERRORS_HEAD = 50            # first errors kept
MAX_ERRORS_TAIL = 150           # last errors kept (the crash is near the end)
MAX_EXAMPLES = 5
MAX_VLLM_DUMP_CHARS = 4 << 20
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_VLLM_PREFIX = re.compile(r"\((?P<proc>\w+?)(?:_DP(?P<dp>\d+))?\s+pid=\d+\)")
_VLLM_CONFIG = re.compile(r"\b(max_num_batched_tokens|max_num_seqs|max_model_len|tensor_parallel_size|"
                          r"num_speculative_tokens)'?\s*[=:]\s*'?(\d+)")
# vLLM's startup "non-default args: {...}" and crash-time "with config: model='...', ..." lines: the
# names a vLLM profile is recognised by and reads
_VLLM_VERSION = re.compile(r"(?:vLLM API server version |V1 LLM engine \(v)(\d+\.\d+(?:\.\d+)?)")
_VLLM_NAMES = re.compile(r"\b(model|kv_cache_dtype|attention_backend)'?\s*[=:]\s*'([^']{1,200})'")
# vLLM's log line "(PROC pid=N) LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE" (vllm 0.33.0 vllm/logger.py:28-33).
_VLLM_LINE = re.compile(r"^(?:\(\w+ pid=\d+\)\s+)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)? \[[\w./-]+:\d+\]")
_VLLM_MODEL = re.compile(r"'model': '([^']+)'")
# A Python traceback frame ('File "PATH", line N, in F') and faulthandler's ('File "PATH", line N in F')
_FRAME = re.compile(r'File "(?P<path>[^"]{1,1000})", line \d+')
MAX_FRAMES = 400                # traceback frames kept (with a library), for attributing errors
TRACEBACK_SPAN = 400            # lines a Python traceback may span before its exception line
FAULT_SPAN = 80                 # lines after a crash in which faulthandler's stack follows
NEIGHBOUR_SPAN = 40             # lines within which another error's library attributes this one
#: errors a tool prints inside a library's call (the compiler a JIT library runs): the library's own line nearby
#: (DeepGEMM's 'NVCC compilation failed' and its assertion) says whose they are; other errors are never
#: attributed by a neighbour
NEIGHBOUR_KINDS = ("ptxas_error", "compile_error")
#: failures caught at a later call than the one that caused them: the traceback does not name the culprit
#: (torch: "CUDA kernel errors might be asynchronously reported at some other API call")
STICKY = ("illegal_memory_access", "device_assert")


_EXC_MODULE = re.compile(r"(?:^|\s)(?P<mod>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)\.\w*(?:Error|Exception)\b")


def _module_owner(e: ErrorEvent) -> tuple[str, str] | None:
    """The kernel library an exception's module names (``flashinfer.jit.core.CompilationError: ...``), or None."""
    m = _EXC_MODULE.search(e.text[:200])
    if m is None:
        return None
    lib = frame_library(m.group("mod").replace(".", "/") + "/")
    return (lib, f"the exception's module {m.group('mod')}") if lib in KERNEL_LIBRARIES else None


@dataclass
class RankTimeline:
    """What one DP rank scheduled: the last ``window`` steps, counters, and the largest prefill."""

    rank: str
    window: int
    steps: deque = field(default=None)  # type: ignore[assignment]
    reporting_tp: int | None = None
    num_prefill: int = 0
    num_decode: int = 0
    num_mirrored: int = 0
    largest_prefill: Step | None = None
    largest_decode: Step | None = None
    last_line: int = 0

    def __post_init__(self):
        if self.steps is None:
            self.steps = deque(maxlen=self.window)

    def add(self, s: Step) -> None:
        self.steps.append(s)
        self.last_line = s.line_no
        if s.kind == "prefill":
            self.num_prefill += 1
            if self.largest_prefill is None or (s.new_token or 0) > (self.largest_prefill.new_token or 0):
                self.largest_prefill = s
        else:
            self.num_decode += 1
            if self.largest_decode is None or (s.running_req or 0) > (self.largest_decode.running_req or 0):
                self.largest_decode = s

    def before(self, line_no: int) -> list[Step]:
        return [s for s in self.steps if s.line_no < line_no]

    def last(self, kind: str | None = None, before_line: int | None = None) -> Step | None:
        for s in reversed(self.steps):
            if (kind is None or s.kind == kind) and (before_line is None or s.line_no < before_line):
                return s
        return None

    def to_dict(self, tail: int = 8) -> dict:
        return {"rank": self.rank, "num_prefill": self.num_prefill, "num_decode": self.num_decode,
                "num_mirrored": self.num_mirrored,
                "largest_prefill": self.largest_prefill.to_dict() if self.largest_prefill else None,
                "tail": [s.to_dict() for s in list(self.steps)[-tail:]]}


@dataclass
class LogEvidence:
    """Everything one pass over a log found."""

    name: str
    ranks: dict[str, RankTimeline] = field(default_factory=dict)
    errors_head: list[ErrorEvent] = field(default_factory=list)
    errors_tail: deque = field(default_factory=lambda: deque(maxlen=MAX_ERRORS_TAIL))
    error_counts: Counter = field(default_factory=Counter)
    first_error_by_rank: dict[str, ErrorEvent] = field(default_factory=dict)
    config: EngineConfig = field(default_factory=EngineConfig)
    eras: Counter = field(default_factory=Counter)
    era_examples: dict[str, Era] = field(default_factory=dict)
    vllm_steps: list[VllmStep] = field(default_factory=list)
    engine_version: str | None = None      # the vLLM release the log names (its startup or dump line)
    counts: Counter = field(default_factory=Counter)
    unparsed_examples: list[dict] = field(default_factory=list)
    unparsed_last: deque = field(default_factory=lambda: deque(maxlen=2))
    truncated_lines: int = 0
    total_lines: int = 0
    notes: list[str] = field(default_factory=list)
    engine: str | None = None
    frames: deque = field(default_factory=lambda: deque(maxlen=MAX_FRAMES))      # (line, library, path)
    stack_heads: deque = field(default_factory=lambda: deque(maxlen=MAX_FRAMES))  # (line, "last" | "first")

    # -------------------------------------------------------------- queries
    def era(self) -> Era | None:
        """The most specific era any line showed (prefill signals outrank decode ones)."""
        if not self.era_examples:
            return None
        return max(self.era_examples.values(), key=lambda e: e.rank)

    @property
    def errors(self) -> list[ErrorEvent]:
        """The first and the last errors of the log, in order (the middle of a long log is only counted)."""
        return self.errors_head + list(self.errors_tail)

    def last_step_line(self) -> int:
        return max((tl.last_line for tl in self.ranks.values()), default=0)

    def root_error(self) -> ErrorEvent | None:
        """The error that killed the server: among the errors after the last scheduler step (errors
        the server survived are followed by more steps), the first of the highest specificity - the
        cause rather than its echoes."""
        errs = self.errors
        if not errs:
            return None
        last = self.last_step_line()
        late = [e for e in errs if e.line_no > last]
        pool = late or errs
        best = max(e.specificity for e in pool)
        root = next(e for e in pool if e.specificity == best)
        self.attribute(root)
        return root

    def attribute(self, e: ErrorEvent) -> None:
        """Set ``owner`` (the library whose failure the error reports) and ``owner_from`` on an error whose
        own text names no kernel library: the innermost frame with a library of the Python traceback that
        ends at it, else the first of faulthandler's stack after it (a crash); a compiler's line takes the
        kernel library of an error within a few lines (the output DeepGEMM prints before its assertion). A sticky CUDA error
        is not attributed by its traceback (it surfaces at a later call)."""
        if "owner" in e.numbers or e.numbers.get("library") in KERNEL_LIBRARIES or e.numbers.get("prose"):
            return
        got = _module_owner(e)
        if got is None and (e.failure not in STICKY or e.numbers.get("library") == "cutlass"):
            got = self._frame_owner(e.line_no)
        if e.kind in NEIGHBOUR_KINDS and (got is None or got[0] not in KERNEL_LIBRARIES):
            for o in sorted(self.errors, key=lambda x: abs(x.line_no - e.line_no)):
                lib = o.numbers.get("library")
                if o is not e and lib in KERNEL_LIBRARIES and abs(o.line_no - e.line_no) <= NEIGHBOUR_SPAN:
                    got = (lib, f"the {lib} error on line {o.line_no}")
                    break
        if got is not None:
            e.numbers["owner"], e.numbers["owner_from"] = got

    def _frame_owner(self, line_no: int) -> tuple[str, str] | None:
        last_heads = [h for h, how in self.stack_heads if how == "last" and line_no - TRACEBACK_SPAN <= h < line_no]
        if last_heads:
            start = last_heads[-1]
            inner = [f for f in self.frames if start < f[0] < line_no and f[1] is not None]
            if inner:
                ln, lib, path = inner[-1]
                return lib, f"traceback frame on line {ln} ({path})"
        first_heads = [h for h, how in self.stack_heads if how == "first" and line_no < h <= line_no + FAULT_SPAN]
        if first_heads:
            start = first_heads[0]
            after = [f for f in self.frames if start < f[0] <= start + FAULT_SPAN and f[1] is not None]
            if after:
                ln, lib, path = after[0]
                return lib, f"crash stack frame on line {ln} ({path})"
        return None

    def to_dict(self) -> dict:
        era = self.era()
        return {
            "name": self.name, "total_lines": self.total_lines, "line_counts": dict(self.counts),
            "truncated_lines": self.truncated_lines,
            "unparsed": {"count": self.counts.get("unparsed_batch_line", 0),
                         "examples": self.unparsed_examples + [x for x in self.unparsed_last
                                                              if x not in self.unparsed_examples]},
            "era": era.to_dict() if era else None, "eras_seen": dict(self.eras),
            "ranks": {k: v.to_dict() for k, v in sorted(self.ranks.items())},
            "errors": [e.to_dict() for e in self.errors[-20:]], "error_counts": dict(self.error_counts),
            "config": self.config.to_dict(), "vllm_steps": [s.to_dict() for s in self.vllm_steps[-3:]],
            "notes": list(self.notes),
        }


class LogScanner:
    """Feed lines in order (:meth:`feed`), then read :attr:`evidence`."""

    def __init__(self, name: str = "<log>", window: int = DEFAULT_WINDOW):
        self.ev = LogEvidence(name)
        self.window = window
        self._ctx_rank: str | None = None       # rank of the last prefixed line (for unprefixed lines)
        self._launch_buf: list[str] | None = None
        self._launch_line = 0
        self._vllm_buf: list[str] | None = None
        self._vllm_line = 0
        self._vllm_waiting = 0
        self._block: OpenBlock | None = None    # an open multi-line error (a TMA descriptor dump): its lines follow

    @property
    def evidence(self) -> LogEvidence:
        return self.ev

    # ------------------------------------------------------------------ feeding
    def feed(self, line: str, no: int) -> None:
        try:
            self._feed(line, no)
        except InputError as e:
            raise InputError("LOG", f"{self.ev.name}:{no}: {e}") from None

    def _feed(self, line: str, no: int) -> None:
        ev = self.ev
        ev.total_lines = no
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        line = line.rstrip("\r\n")
        if self._vllm_buf is not None:
            if self._continue_vllm(line, no):
                ev.counts["vllm_dump"] += 1
                return
        if self._launch_buf is not None:
            self._launch_buf.append(line)
            if not line.rstrip().endswith("\\") or len(self._launch_buf) > 400:
                self._finish_launch()
            ev.counts["config"] += 1
            return
        if not line.strip():
            ev.counts["blank"] += 1
            return
        if ev.engine is None and _VLLM_LINE.match(line):
            ev.engine = "vllm"     # the log's own format says which engine wrote it
        prefix = parse_prefix(line)
        if prefix is not None:
            # Unprefixed lines that follow a prefixed exception line (a traceback) belong to its rank;
            # any other prefixed line ends that context.
            self._ctx_rank = None
        if " batch" in line and looks_like_batch_line(line):
            self._batch_line(line, no, prefix)
            return
        if VLLM_MARKER in line or "SchedulerOutput(" in line:
            ev.engine = ev.engine or "vllm"
            self._start_vllm(line, no)
            ev.counts["vllm_dump"] += 1
            return
        if "ServerArgs(" in line:
            got = server_args_from_line(line)
            if got is not None:
                vals, complete = got
                ev.config.update(vals, f"{ev.name}:{no} (ServerArgs)", per_rank_chunk=True)
                ev.config.engine = ev.config.engine or "sglang"
                if not complete:
                    ev.notes.append(f"line {no}: the ServerArgs(...) text is cut off; {len(vals)} fields read")
                ev.counts["config"] += 1
                return
        m = DP_CHUNK_WARNING.search(line) if "adjusted" in line else None
        if m:
            ev.config.update({"chunked_prefill_size": parse_int(m.group(2), "chunked prefill size")}, f"{ev.name}:{no} (DP-attention adjustment)",
                             per_rank_chunk=True)
            ev.counts["config"] += 1
            return
        hit = find_launch(line)
        if hit is not None and ("--" in line[hit[1]:] or line.rstrip().endswith("\\")):
            self._launch_buf = [line[hit[1]:]]
            self._launch_line = no
            ev.config.engine = ev.config.engine or hit[0]
            ev.config.entry_point = ev.config.entry_point or entry_point(line)
            if not line.rstrip().endswith("\\"):
                self._finish_launch()
            ev.counts["config"] += 1
            return
        if ev.engine_version is None and ("vLLM API server version" in line or "V1 LLM engine (v" in line):
            m = _VLLM_VERSION.search(line)
            if m:
                ev.engine_version = m.group(1)
        if "non-default args:" in line:
            m = _VLLM_MODEL.search(line)
            if m:
                ev.config.update({"model_path": m.group(1)}, f"{ev.name}:{no} (vLLM non-default args)")
                ev.config.engine = ev.config.engine or "vllm"
        if "max_num_batched_tokens" in line or "max_num_seqs" in line:
            vals = {normalize_setting(k): parse_int(v, k) for k, v in _VLLM_CONFIG.findall(line)}
            vals.update((normalize_setting(k), v) for k, v in _VLLM_NAMES.findall(line))
            if vals:
                ev.config.update(vals, f"{ev.name}:{no} (vLLM config)")
                ev.counts["config"] += 1
                return
        if self._block is not None:
            if self._block.take(line, no):     # a field or the closing line of the open dump: part of its error
                ev.counts["error"] += 1
                return
            self._block = None
        if 'File "' in line:
            fm = _FRAME.search(line)
            if fm:
                ev.frames.append((no, frame_library(fm.group("path")), fm.group("path")))
                ev.counts["other"] += 1
                return
        if "most recent call first" in line:
            ev.stack_heads.append((no, "first"))
        got = classify(line)
        if got is not None:
            if got.kind in ("traceback", "scheduler_exception") and "most recent call last" in line:
                ev.stack_heads.append((no, "last"))
            self._error(line, no, prefix, got)
            return
        ev.counts["other"] += 1

    def _batch_line(self, line: str, no: int, prefix) -> None:
        ev = self.ev
        try:
            step = parse_batch_line(line, no, prefix)
        except LineParseError as e:
            ev.counts["unparsed_batch_line"] += 1
            ex = {"line": no, "reason": str(e), "text": line.strip()[:300]}
            if len(ev.unparsed_examples) < MAX_EXAMPLES:
                ev.unparsed_examples.append(ex)
            else:
                ev.unparsed_last.append(ex)
            return
        ev.engine = ev.engine or "sglang"
        tl = ev.ranks.get(step.rank)
        if tl is None:
            tl = ev.ranks[step.rank] = RankTimeline(step.rank, self.window)
        tp = prefix.ranks.get("TP") if prefix is not None else None
        if tl.reporting_tp is None:
            tl.reporting_tp = tp
        elif tp is not None and tp != tl.reporting_tp:
            tl.num_mirrored += 1   # another TP rank of the same DP group printing the same batch
            ev.counts["mirrored_step"] += 1
            return
        tl.add(step)
        ev.counts[f"{step.kind}_step"] += 1
        ev.eras[step.era.label] += 1
        ev.era_examples.setdefault(step.era.label, step.era)

    def _error(self, line: str, no: int, prefix, got: Recognised) -> None:
        ev = self.ev
        kind, nums = got.kind, got.numbers
        ev.counts["error"] += 1
        ev.error_counts[kind] += 1
        rank = prefix.label() if prefix is not None and prefix.ranks else None
        inferred = False
        if rank is None:
            vm = _VLLM_PREFIX.search(line[:80])
            if vm and vm.group("dp") is not None:
                rank = f"DP{vm.group('dp')}"
        if rank is None and self._ctx_rank is not None:
            rank, inferred = self._ctx_rank, True
        if prefix is not None and prefix.ranks and kind in ("scheduler_exception", "traceback", "python_error"):
            self._ctx_rank = prefix.label()
        text = line.strip()
        if prefix is not None:
            text = line[prefix.end:].strip() or text
        e = ErrorEvent(kind, no, text[:500], rank, inferred, prefix.timestamp if prefix else None, nums)
        if len(ev.errors_head) < MAX_ERRORS_HEAD:
            ev.errors_head.append(e)
        else:
            ev.errors_tail.append(e)
        if rank is not None and not inferred:
            ev.first_error_by_rank.setdefault(rank, e)
        self._block = open_block(got, no)

    # ------------------------------------------------------------------ multi-line items
    def _finish_launch(self) -> None:
        buf, self._launch_buf = self._launch_buf or [], None
        text = " ".join(x.rstrip().rstrip("\\") for x in buf)
        try:
            vals = parse_launch(text, f"{self.ev.name}:{self._launch_line}", self.ev.config.notes)
        except InputError as e:
            self.ev.notes.append(f"line {self._launch_line}: launch command not read: {e}")
            return
        # ServerArgs (resolved) values outrank the command line: keep those already read.
        src = self.ev.config.sources
        keep = {k: v for k, v in vals.items()
                if "(ServerArgs)" not in src.get(k, "") and "(DP-attention adjustment)" not in src.get(k, "")}
        self.ev.config.update(keep, f"{self.ev.name}:{self._launch_line} (launch command)", per_rank_chunk=False)

    def _start_vllm(self, line: str, no: int) -> None:
        i = line.find("SchedulerOutput(")
        self._vllm_line = no
        self._vllm_buf = [line[i:]] if i >= 0 else []
        self._vllm_waiting = 3 if i < 0 else 0
        self._vllm_state = [0, None]          # bracket depth and open quote, carried from line to line
        self._vllm_chars = 0
        if i >= 0 and self._feed_dump(line[i:]):
            self._finish_vllm()

    def _continue_vllm(self, line: str, no: int) -> bool:
        buf = self._vllm_buf
        assert buf is not None
        if not buf:
            i = line.find("SchedulerOutput(")
            if i < 0:
                self._vllm_waiting -= 1
                if self._vllm_waiting <= 0:
                    self._vllm_buf = None
                    self.ev.notes.append(f"line {self._vllm_line}: 'Dumping scheduler output' without a SchedulerOutput")
                return False
            self._vllm_line = no
            buf.append(line[i:])
            line = line[i:]
        else:
            buf.append(line)
        if self._feed_dump(line) or self._vllm_chars > MAX_VLLM_DUMP_CHARS:
            self._finish_vllm()
        return True

    def _feed_dump(self, chunk: str) -> bool:
        """Scan one more line of a dump (each character once over the whole dump): True when the
        brackets opened by ``SchedulerOutput(`` close."""
        self._vllm_chars += len(chunk) + 1
        state = self._vllm_state
        depth, quote = state
        for c in chunk:
            if quote:
                if c == quote:
                    quote = None
                continue
            if c in "'\"":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
                if depth == 0:
                    state[0], state[1] = depth, quote
                    return True
        state[0], state[1] = depth, quote
        return False

    def _finish_vllm(self) -> None:
        buf, self._vllm_buf = self._vllm_buf or [], None
        text = "\n".join(buf)
        try:
            step = parse_scheduler_output(text, self._vllm_line)
        except InputError as e:
            self.ev.notes.append(f"line {self._vllm_line}: vLLM scheduler dump not read: {e}")
            self.ev.counts["unparsed_vllm_dump"] += 1
            return
        self.ev.vllm_steps.append(step)
        if len(self.ev.vllm_steps) > 8:
            self.ev.vllm_steps.pop(0)

    def finish(self) -> LogEvidence:
        if self._launch_buf is not None:
            self._finish_launch()
        if self._vllm_buf:
            self._finish_vllm()
        return self.ev


# ---------------------------------------------------------------------------------- reading
class _Counted(io.RawIOBase):
    """A binary stream that counts what it gives and refuses more than ``limit()`` bytes."""

    def __init__(self, fh: Any, name: str, limit: Callable[[], int], what: str, head: bytes = b""):
        self.fh, self.name, self.limit, self.what = fh, name, limit, what
        self.head = head
        self.n = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.head:
            k = min(len(b), len(self.head))
            b[:k] = self.head[:k]
            self.head = self.head[k:]
        else:
            data = self.fh.read(len(b))
            k = len(data)
            b[:k] = data
        self.n += k
        if self.n > self.limit():
            raise InputError("LOG", f"{self.name}: more than {self.limit()} bytes {self.what}")
        return k


def _wait_for_writer(fd: int, path: str) -> None:
    """A named pipe opened without blocking: wait up to ``FIFO_WAIT_S`` for data, then read blocking."""
    import os
    import select

    ready, _, _ = select.select([fd], [], [], limits.FIFO_WAIT_S)
    if not ready:
        os.close(fd)
        raise InputError("LOG", f"{path}: a named pipe with no writer (nothing within {limits.FIFO_WAIT_S:g} s)")
    os.set_blocking(fd, True)


def _open_stream(path: str) -> tuple[Any, int]:
    """A binary stream of ``path``: a regular file, a pipe or a named pipe (never sought), with its size
    (0 when unknown)."""
    import os
    import stat

    p = Path(path)
    if not p.exists():
        raise InputError("LOG", f"{path}: no such file")
    if p.is_dir():
        raise InputError("LOG", f"{path}: is a directory")
    st = p.stat()
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        raise InputError("LOG", f"{path}: a device, not a log file")
    if stat.S_ISFIFO(st.st_mode) and not path.startswith("/dev/fd/") and not path.startswith("/proc/"):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        _wait_for_writer(fd, path)
        return os.fdopen(fd, "rb", buffering=0), 0
    return p.open("rb", buffering=0), st.st_size if stat.S_ISREG(st.st_mode) else 0


def open_log(fh: Any, name: str) -> Any:
    """A buffered stream of a log's text bytes from a binary stream: gzip is decompressed (at most
    ``GZIP_FLOOR_BYTES``, or ``GZIP_MAX_RATIO`` per compressed byte when that is more), a pickle is refused, at most
    ``MAX_LOG_BYTES`` bytes are read. Reads forward only: pipes and stdin work."""
    head = b""
    while len(head) < 2:
        more = fh.read(2 - len(head))
        if not more:
            break
        head += more
    if head[:1] == b"\x80":
        raise InputError("LOG", f"{name}: looks like a pickle, not a log; pass it with --dump")
    raw = _Counted(fh, name, lambda: limits.MAX_LOG_BYTES, "(the log byte budget)", head)
    if head == b"\x1f\x8b":
        unzipped = gzip.GzipFile(fileobj=io.BufferedReader(raw), mode="rb")
        return io.BufferedReader(_Counted(unzipped, name, lambda: max(limits.GZIP_FLOOR_BYTES, limits.GZIP_MAX_RATIO * raw.n),
                                          "decompressed from its gzip data (refused as a decompression bomb)"))
    return io.BufferedReader(raw)


def iter_lines(fh: IO[bytes], counter: Callable[[], None] | None = None) -> Iterator[tuple[str, bool]]:
    """Decoded lines, each cut to ``MAX_LINE`` characters; yields (text, was_cut). Lines end at
    ``\\n`` only, so line numbers are the file's. A line over ``MAX_LOG_LINE_BYTES`` is refused."""
    while True:
        chunk = fh.readline(MAX_LINE)
        if not chunk:
            return
        cut = False
        if len(chunk) >= MAX_LINE and not chunk.endswith(b"\n"):
            cut = True
            seen = len(chunk)
            while True:  # drain the rest of the over-long line without keeping it
                more = fh.readline(MAX_LINE)
                seen += len(more)
                if not more or more.endswith(b"\n"):
                    break
                if seen > limits.MAX_LOG_LINE_BYTES:
                    raise InputError("LOG", f"a line longer than {limits.MAX_LOG_LINE_BYTES} bytes: not a text log")
        yield chunk.decode("utf-8", errors="replace"), cut


def scan_stream(fh: Any, name: str, window: int = DEFAULT_WINDOW, progress: Any = None, size: int = 0,
                tell: Callable[[], int] | None = None) -> LogEvidence:
    """Stream a binary log (plain or gzip) through a :class:`LogScanner`."""
    text = open_log(fh, name)
    sc = LogScanner(name, window)
    no = 0
    for no, (line, cut) in enumerate(iter_lines(text), 1):
        if cut:
            sc.ev.truncated_lines += 1
            if sc.ev.truncated_lines <= 3:
                sc.ev.notes.append(f"line {no}: longer than {MAX_LINE} characters; only the start was read")
        sc.feed(line, no)
        if progress is not None and no % 8192 == 0 and tell is not None:
            progress(tell(), size)
    ev = sc.finish()
    if no == 0:
        raise InputError("LOG", f"{name}: empty " + ("file" if name != "<stdin>" else "input"))
    return ev


def scan_lines(lines: Iterable[str], name: str = "<log>", window: int = DEFAULT_WINDOW) -> LogEvidence:
    sc = LogScanner(name, window)
    no = 0
    for no, line in enumerate(lines, 1):
        sc.feed(line, no)
    return sc.finish()


def scan_file(path: str, window: int = DEFAULT_WINDOW, progress: Any = None) -> LogEvidence:
    """Stream ``path`` (plain or gzip; a file, a pipe or a named pipe) through a :class:`LogScanner`.
    ``progress(bytes_done, total)`` is called every few thousand lines."""
    raw, size = _open_stream(path)
    try:
        with raw:
            ev = scan_stream(raw, path, window, progress, size, raw.tell if size else None)
    except OSError as e:
        raise InputError("LOG", f"{path}: {e}") from None
    if progress is not None:
        progress(size, size)
    return ev
