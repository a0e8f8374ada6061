"""How a child process that ran one kernel job ended, classified like the oracle's probe records.

Outcomes (the ``outcome`` field):

* ``ok`` - the job finished and reported its result;
* ``python_exception`` - the library raised (recoverable: an engine would see an exception);
* ``process_exit`` - the process exited with a non-zero status before reporting (the library
  printed ``CUDA error (file:line): text`` and called ``exit(1)``);
* ``illegal_memory_access`` - the CUDA error text is "an illegal memory access was encountered",
  whether the library exited or torch raised it; the CUDA context is unusable afterwards;
* ``device_assert`` - a device-side assertion fired (for example torch's index bounds check);
* ``process_crash`` - killed by a signal (SIGSEGV after a host assertion, SIGABRT, ...);
* ``timeout`` - still running when the time limit hit; the process group was killed;
* ``unavailable`` - the child could not run the job at all (no torch, no GPU, no FlashMLA);
* ``unsupported`` - the installed provider lacks a feature the call needs (e.g. ``topk_length``);
* ``malformed`` - what the child reported is not valid data (metadata that is not a table of int32
  rows, an integer of hundreds of digits, a CUDA error line number no source file has, ...): the run
  says nothing about the call, and ``inconclusive_reason`` says what was wrong.

A ``python_exception`` that is about the environment, not the batch (the kernel does not run on this
GPU architecture: "only supported on SM100f architectures"; the build lacks its legacy kernels; a
missing attribute, module or keyword argument) is reported as ``unsupported`` with the reason in
``inconclusive_reason``: it says nothing about the call's legality.

A run that printed FlashMLA's low-smem fallback warning (``[WARNING] batch_size=N requires XB shared
memory (max=YB), using low-smem fallback kernel.``, sgl-flash-mla's legacy scheduler above its fast
path) carries it in ``fallback``: the call ran, on a slower kernel.

``oracle_outcome`` maps these onto the four classes of the recorded probes (``ok``,
``python_exception``, ``process_exit``, ``process_crash``) so measured runs compare with them.

The child's error lines are read by the recogniser table bisect reads logs with
(:mod:`validate_batch.ingest.recognisers`; a new error-line format is a row there): FlashMLA's
``CUDA error (file:line)`` line gives ``cuda_error``, an assertion line the message of a crash, and the
most specific recognised line is reported as ``recognised``. The marker protocol the child prints is
:mod:`.protocol`.
"""
from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import InputError
from ..ingest.recognisers import (
    DEVICE_ASSERT_TEXT,
    ILLEGAL_ACCESS_TEXT,
    Recognised,
    assertion_text,
    classify_block,
    most_specific,
)
from .protocol import MARKER, PARTIAL_PREFIX, RESULT_PREFIX, STAGE_PREFIX

OUTCOMES = ("ok", "python_exception", "process_exit", "illegal_memory_access", "device_assert",
            "process_crash", "timeout", "unavailable", "unsupported", "malformed")
# Outcomes after which the kernel did not run to completion: the call is illegal on this build.
FAILED_OUTCOMES = frozenset({"python_exception", "process_exit", "illegal_memory_access", "device_assert",
                             "process_crash"})
# Outcomes that say nothing about the call itself.
INCONCLUSIVE_OUTCOMES = frozenset({"timeout", "unavailable", "unsupported", "malformed"})
MALFORMED_PREFIX = "malformed result from the child: "

# What a child's report may hold (anything else is malformed): every integer in a result line at most
# MAX_INT_DIGITS digits; metadata a [P, METADATA_WIDTH] table of int32 with P <= MAX_PARTS; num_splits
# at most MAX_SPLITS int32 values; line numbers at most MAX_LINE_DIGITS digits.
MAX_INT_DIGITS = 20
MAX_LINE_DIGITS = 9
METADATA_WIDTH = 8
MAX_PARTS = 1 << 16
MAX_SPLITS = 1 << 24
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

CUDA_ERROR_FORMAT = "flashmla_check_cuda"   # the recogniser of the library's exit(1) line, with its site
FALLBACK_RE = re.compile(r"\[WARNING\] batch_size=(\d+) requires (\d+)\s*B shared memory \(max=(\d+)\s*B\), "
                         r"using low-smem fallback kernel\.?")
# Exceptions that are about the environment (GPU architecture, build, API), never about the batch.
ENVIRONMENT_MESSAGES = (
    (re.compile(r"only supported on SM\s*\d+\w* architectures?", re.I),
     "the kernel does not run on this GPU architecture"),
    (re.compile(r"no kernel image is available for execution on the device", re.I),
     "the build has no kernels for this GPU"),
    (re.compile(r"legacy FlashMLA kernels .* are not available", re.I | re.S),
     "the build lacks its legacy kernels"),
    (re.compile(r"unexpected keyword argument", re.I), "the provider's API does not take an argument the call passed"),
    (re.compile(r"(?:undefined symbol|cannot open shared object file)", re.I), "the provider's library does not load"),
)
ENVIRONMENT_ERROR_TYPES = {
    "ImportError": "an import failed",
    "ModuleNotFoundError": "an import failed",
    "AttributeError": "the provider lacks an attribute the call needs",
    "NotImplementedError": "the provider does not implement the call",
}


class MalformedResult(ValueError):
    """Raised in the parent: what the child reported is not valid data (the message says what)."""


def _digits(text: str, what: str, limit: int) -> int:
    """``int(text)`` for a run of digits no longer than ``limit``; else :class:`MalformedResult`."""
    n = len(text.lstrip("+-"))
    if n > limit:
        raise MalformedResult(f"{what} has {n} digits (at most {limit} expected)")
    return int(text)


def _json_int(text: str) -> int:
    return _digits(text, "an integer", MAX_INT_DIGITS)


def _json_constant(text: str):
    raise MalformedResult(f"{text} is not a number")


def loads_report(text: str) -> Any:
    """A JSON value from the child, integers bounded in length and NaN/Infinity refused (then
    :class:`MalformedResult`); text that is not JSON at all raises :class:`json.JSONDecodeError`."""
    try:
        return json.loads(text, parse_int=_json_int, parse_constant=_json_constant)
    except RecursionError:
        raise MalformedResult("JSON nested too deeply") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(v: Any, what: str, lo: int = INT32_MIN, hi: int = INT32_MAX) -> None:
    if not _is_int(v):
        raise MalformedResult(f"{what} is {type(v).__name__} {_short(v)}, not an integer")
    if not lo <= v <= hi:
        raise MalformedResult(f"{what} is {v}, outside {lo}..{hi}")


def _short(v: Any, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[:n] + "..."


def _check_type(obj: dict, key: str, types: tuple, what: str) -> None:
    if key in obj and obj[key] is not None and not isinstance(obj[key], types):
        raise MalformedResult(f"{what}{key} is {type(obj[key]).__name__} {_short(obj[key])}")


def _check_ints(values: list, what: str) -> None:
    for j, v in enumerate(values):
        _check_int(v, f"{what}[{j}]")


def check_report_data(obj: dict, where: str = "result") -> None:
    """Raise :class:`MalformedResult` unless the fields the parent reads from a child's ``result`` or
    ``partial`` object have their shape, types and ranges: ``tile_scheduler_metadata`` a list of at most
    ``MAX_PARTS`` rows of ``METADATA_WIDTH`` int32 values, ``num_splits`` a list of at most ``MAX_SPLITS``
    int32 values, ``num_sm_parts`` a count, ``device`` and ``providers`` as the detection writes them."""
    md = obj.get("tile_scheduler_metadata")
    if md is not None:
        if not isinstance(md, list):
            raise MalformedResult(f"{where} tile_scheduler_metadata is {type(md).__name__}, not a list of rows")
        if len(md) > MAX_PARTS:
            raise MalformedResult(f"{where} tile_scheduler_metadata has {len(md)} rows (at most {MAX_PARTS})")
        for i, row in enumerate(md):
            if not isinstance(row, list):
                raise MalformedResult(f"{where} tile_scheduler_metadata row {i} is {type(row).__name__} "
                                      f"{_short(row)}, not a list")
            if len(row) != METADATA_WIDTH:
                raise MalformedResult(f"{where} tile_scheduler_metadata row {i} has {len(row)} values "
                                      f"({METADATA_WIDTH} expected)")
            _check_ints(row, f"{where} tile_scheduler_metadata[{i}]")
    ns = obj.get("num_splits")
    if ns is not None:
        if not isinstance(ns, list):
            raise MalformedResult(f"{where} num_splits is {type(ns).__name__}, not a list")
        if len(ns) > MAX_SPLITS:
            raise MalformedResult(f"{where} num_splits has {len(ns)} values (at most {MAX_SPLITS})")
        _check_ints(ns, f"{where} num_splits")
    if obj.get("num_sm_parts") is not None:
        _check_int(obj["num_sm_parts"], f"{where} num_sm_parts", 0, MAX_PARTS)
    _check_type(obj, "use_legacy", (bool,), f"{where} ")
    for key in ("message", "error_type", "cuda_reason", "torch"):
        _check_type(obj, key, (str,), f"{where} ")
    dev = obj.get("device")
    if dev is not None:
        if not isinstance(dev, dict):
            raise MalformedResult(f"{where} device is {type(dev).__name__}, not an object")
        _check_type(dev, "name", (str,), f"{where} device ")
        for key, lo, hi in (("num_sms", 0, 1 << 20), ("smem_optin", 0, 1 << 40), ("memory_bytes", 0, 1 << 60)):
            if dev.get(key) is not None:
                _check_int(dev[key], f"{where} device {key}", lo, hi)
        cc = dev.get("cc")
        if cc is not None:
            if not (isinstance(cc, list) and len(cc) == 2):
                raise MalformedResult(f"{where} device cc is {_short(cc)}, not [major, minor]")
            for v in cc:
                _check_int(v, f"{where} device cc", 0, 1000)
    provs = obj.get("providers")
    if provs is not None:
        if not isinstance(provs, list) or not all(isinstance(p, dict) for p in provs):
            raise MalformedResult(f"{where} providers is {_short(provs)}, not a list of objects")
        for p in provs:
            for key in ("name", "module", "api", "origin", "reason", "distribution", "version"):
                _check_type(p, key, (str,), f"{where} provider ")
            feats = p.get("features", [])
            if not isinstance(feats, list) or not all(isinstance(f, str) for f in feats):
                raise MalformedResult(f"{where} provider features is {_short(feats)}, not a list of names")


@dataclass(frozen=True)
class CudaError:
    """One ``CUDA error (file:line): text`` line. ``site`` is the file path from ``csrc/`` on."""

    file: str
    line: int
    text: str

    @property
    def site(self) -> str:
        path = self.file
        i = path.find("csrc/")
        return f"{path[i:] if i >= 0 else path}:{self.line}"

    @property
    def is_illegal_access(self) -> bool:
        return ILLEGAL_ACCESS_TEXT in self.text

    def to_dict(self) -> dict:
        return {"site": self.site, "file": self.file, "line": self.line, "text": self.text}


def read_errors(text: str) -> list[Recognised]:
    """The error lines of a child's output (the marker protocol's lines aside), in order, read by the
    shared recognisers; a number in them too long to be real is :class:`MalformedResult`."""
    lines = (ln for ln in text.splitlines() if not ln.startswith(MARKER))
    try:
        return [got for _, got in classify_block(lines)]
    except InputError as e:
        raise MalformedResult(str(e)) from None


def cuda_error_of(errors: Iterable[Recognised]) -> CudaError | None:
    """The last ``CUDA error (file:line): text`` line among the recognised errors, if any."""
    found = None
    for got in errors:
        if got.recogniser.name == CUDA_ERROR_FORMAT:
            found = got
    if found is None:
        return None
    nums = found.numbers
    line = _digits(str(nums["source_line"]), "a CUDA error line number", MAX_LINE_DIGITS)
    return CudaError(nums["path"], line, str(nums.get("message", "")))


def find_cuda_error(text: str) -> CudaError | None:
    """The last ``CUDA error (file:line): text`` line in ``text``, if any."""
    return cuda_error_of(read_errors(text))


def find_fallback(text: str) -> dict | None:
    """The last low-smem fallback warning in ``text``: batch size, shared memory needed, the maximum."""
    found = None
    for m in FALLBACK_RE.finditer(text):
        what = "a number in the low-smem fallback warning"
        found = {"batch_size": _digits(m.group(1), what, MAX_INT_DIGITS),
                 "smem_bytes": _digits(m.group(2), what, MAX_INT_DIGITS),
                 "smem_max": _digits(m.group(3), what, MAX_INT_DIGITS), "text": m.group(0)}
    return found


def environment_reason(error_type: str | None, message: str) -> str | None:
    """Why an exception is about the environment (architecture, build, API) and not the batch; None if it
    may be about the batch."""
    for rx, why in ENVIRONMENT_MESSAGES:
        if rx.search(message or ""):
            return why
    return ENVIRONMENT_ERROR_TYPES.get(error_type or "")


def assertion_of(errors: Iterable[Recognised]) -> str | None:
    """The last recognised host- or device-side assertion's text (``Assertion `cond' failed ...``), if any."""
    found = None
    for got in errors:
        found = assertion_text(got) or found
    return found


def _plain_lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln.startswith(MARKER)]


def last_line(text: str) -> str:
    lines = _plain_lines(text)
    return lines[-1] if lines else ""


def tail(text: str, max_lines: int = 12, max_chars: int = 2000) -> str:
    out = "\n".join(_plain_lines(text)[-max_lines:])
    return out[-max_chars:]


@dataclass(frozen=True)
class ChildReport:
    """What the child printed on stdout through the marker protocol."""

    stages: tuple = ()
    partial: dict = field(default_factory=dict)
    result: dict | None = None
    unreadable: str = ""          # the last result line that was not JSON (cut short, garbled), if any

    @property
    def last_stage(self) -> str | None:
        return self.stages[-1] if self.stages else None


def parse_child_stdout(stdout: str) -> ChildReport:
    """Read stage markers, partial results and the final result line from the child's stdout.

    Raises :class:`MalformedResult` for a partial or result line that is not valid data
    (:func:`loads_report`, :func:`check_report_data`)."""
    stages: list[str] = []
    partial: dict = {}
    result = None
    unreadable = ""
    for ln in stdout.splitlines():
        if ln.startswith(STAGE_PREFIX):
            stages.append(ln[len(STAGE_PREFIX):].strip())
        elif ln.startswith(PARTIAL_PREFIX):
            try:
                obj = loads_report(ln[len(PARTIAL_PREFIX):])
            except json.JSONDecodeError:
                continue
            if not isinstance(obj, dict):
                raise MalformedResult(f"a partial result is {type(obj).__name__}, not an object")
            check_report_data(obj, "partial result")
            partial.update(obj)
        elif ln.startswith(RESULT_PREFIX):
            try:
                obj = loads_report(ln[len(RESULT_PREFIX):])
            except json.JSONDecodeError as e:
                unreadable = f"the result line is not JSON ({e.msg} at character {e.pos})"
                continue
            if not isinstance(obj, dict):
                raise MalformedResult(f"the result is {type(obj).__name__}, not an object")
            check_report_data(obj)
            result = obj
    return ChildReport(tuple(stages), partial, result, unreadable if result is None else "")


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


@dataclass(frozen=True)
class RunResult:
    """How one child run ended. ``payload`` is the job's result when ``outcome == "ok"``."""

    outcome: str
    message: str = ""
    exit_code: int | None = None
    signal: str | None = None
    cuda_error: CudaError | None = None
    stage: str | None = None
    payload: dict = field(default_factory=dict)
    partial: dict = field(default_factory=dict)
    error_type: str | None = None
    elapsed_s: float = 0.0
    stderr_tail: str = ""
    fallback: dict | None = None
    inconclusive_reason: str = ""
    output_dropped: dict = field(default_factory=dict)   # bytes of child output not kept, by stream
    recognised: dict | None = None   # the most specific error line of the run, as the shared recognisers read it

    @property
    def fallback_used(self) -> bool:
        return self.fallback is not None

    @property
    def use_legacy(self) -> bool | None:
        """The ``use_legacy`` the child passed (None: the provider takes none, or nothing was reported)."""
        for src in (self.payload, self.partial):
            if src.get("use_legacy") is not None:
                return bool(src["use_legacy"])
        return None

    @property
    def is_ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def failed(self) -> bool:
        """The kernel call did not complete: on this build the call is illegal."""
        return self.outcome in FAILED_OUTCOMES

    @property
    def is_conclusive(self) -> bool:
        return self.outcome not in INCONCLUSIVE_OUTCOMES

    @property
    def kills_process(self) -> bool:
        """An engine making this call would lose its process (exit, crash) or its CUDA context."""
        return self.outcome in ("process_exit", "process_crash", "illegal_memory_access", "device_assert")

    @property
    def verdict(self) -> str:
        """``legal`` (ran), ``illegal`` (failed) or ``inconclusive`` (timeout, unavailable, unsupported)."""
        if self.is_ok:
            return "legal"
        return "illegal" if self.failed else "inconclusive"

    @property
    def oracle_outcome(self) -> str:
        """The outcome in the oracle's four classes (plus ``timeout``/``unavailable``/``unsupported``)."""
        if self.outcome == "illegal_memory_access":
            return "process_exit" if self.exit_code not in (None, 0) else "python_exception"
        if self.outcome == "device_assert":
            return "python_exception" if self.exit_code in (None, 0) else "process_exit"
        return self.outcome

    def to_dict(self, with_payload: bool = False) -> dict:
        d: dict[str, Any] = {"outcome": self.outcome, "oracle_outcome": self.oracle_outcome,
                             "message": self.message, "exit_code": self.exit_code,
                             "elapsed_s": round(self.elapsed_s, 3)}
        if self.signal:
            d["signal"] = self.signal
        if self.cuda_error is not None:
            d["cuda_error"] = self.cuda_error.to_dict()
        if self.stage:
            d["stage"] = self.stage
        if self.error_type:
            d["error_type"] = self.error_type
        if self.outcome != "ok" and self.stderr_tail:
            d["stderr_tail"] = self.stderr_tail
        if self.inconclusive_reason:
            d["inconclusive_reason"] = self.inconclusive_reason
        if self.use_legacy is not None:
            d["use_legacy"] = self.use_legacy
        d["fallback_used"] = self.fallback_used
        if self.fallback is not None:
            d["fallback"] = self.fallback
        if self.output_dropped:
            d["output_dropped"] = dict(self.output_dropped)
        if self.outcome != "ok" and self.recognised is not None:
            d["recognised"] = dict(self.recognised)
        if with_payload and self.payload:
            d["payload"] = self.payload
        return d


def classify(returncode: int | None, stdout: str, stderr: str, *, timed_out: bool = False,
             elapsed_s: float = 0.0, dropped: dict | None = None) -> RunResult:
    """Classify a finished (or killed) child run from its exit status and output.

    ``returncode`` follows :mod:`subprocess`: negative for a signal. ``dropped``: bytes of each stream
    the parent did not keep. Pure function: the unit tests drive it with synthetic outputs. Output that
    is not valid data is a ``malformed`` run (after a timeout, still a ``timeout``), never an exception.
    """
    dropped = {k: v for k, v in (dropped or {}).items() if v}
    try:
        return _classify(returncode, stdout, stderr, timed_out, elapsed_s, dropped)
    except MalformedResult as e:
        if timed_out:
            return RunResult("timeout", f"no result within {elapsed_s:.1f} s; the process group was killed",
                             elapsed_s=elapsed_s, stderr_tail=tail(stderr), output_dropped=dropped,
                             inconclusive_reason="no result within the time limit")
        why = MALFORMED_PREFIX + str(e)
        return RunResult("malformed", why, exit_code=returncode, elapsed_s=elapsed_s, stderr_tail=tail(stderr),
                         inconclusive_reason=why, output_dropped=dropped)


def _exception_text(res: dict) -> str:
    """The exception a child reported, as its traceback's last line prints it (``TYPE: message``)."""
    msg = str(res.get("message", ""))
    return f"{res['error_type']}: {msg}" if res.get("error_type") else msg


def _classify(returncode: int | None, stdout: str, stderr: str, timed_out: bool, elapsed_s: float,
              dropped: dict) -> RunResult:
    child = parse_child_stdout(stdout)
    both = f"{stderr}\n{stdout}"
    err_lines = read_errors(stderr)
    errors = err_lines + read_errors(stdout)
    res = child.result
    if res is not None and res.get("status") not in ("ok", "unavailable", "unsupported"):
        errors += read_errors(_exception_text(res))
    cuda_err = cuda_error_of(errors)
    best = most_specific(errors)
    common = dict(stage=child.last_stage, partial=child.partial, elapsed_s=elapsed_s,
                  stderr_tail=tail(stderr), cuda_error=cuda_err, fallback=find_fallback(both),
                  output_dropped=dropped, recognised=best.to_dict() if best is not None else None)
    if timed_out:
        return RunResult("timeout", f"no result within {elapsed_s:.1f} s; the process group was killed",
                         exit_code=None, inconclusive_reason="no result within the time limit", **common)
    if res is not None:
        status = res.get("status")
        if status == "ok":
            payload = {k: v for k, v in res.items() if k != "status"}
            return RunResult("ok", str(res.get("message", "")), exit_code=returncode, payload=payload, **common)
        full = str(res.get("message", ""))
        if status in ("unavailable", "unsupported"):
            why = "nothing ran" if status == "unavailable" else "the provider lacks a feature the call needs"
            return RunResult(status, full, exit_code=returncode, inconclusive_reason=why, **common)
        err_type = res.get("error_type")
        text = f"{full}\n{stderr}"
        msg = next((ln.strip() for ln in full.splitlines() if ln.strip()), "")   # torch appends hints
        env_why = environment_reason(err_type, full)
        if env_why and ILLEGAL_ACCESS_TEXT not in text and DEVICE_ASSERT_TEXT not in text:
            return RunResult("unsupported", msg, exit_code=returncode, error_type=err_type,
                             inconclusive_reason=f"not about the batch: {env_why}", **common)
        if ILLEGAL_ACCESS_TEXT in text:
            outcome = "illegal_memory_access"
        elif DEVICE_ASSERT_TEXT in text:
            outcome = "device_assert"
            assertion = assertion_of(err_lines)
            if assertion:
                msg = f"{msg} [{assertion}]"
        else:
            outcome = "python_exception"
        return RunResult(outcome, msg, exit_code=returncode, error_type=err_type, **common)
    if returncode is not None and returncode < 0:
        name = signal_name(-returncode)
        msg = assertion_of(errors) or last_line(stderr) or last_line(stdout)
        return RunResult("process_crash", msg, exit_code=returncode, signal=name, **common)
    if child.unreadable and returncode == 0:
        raise MalformedResult(child.unreadable)
    if cuda_err is not None:
        outcome = "illegal_memory_access" if cuda_err.is_illegal_access else "process_exit"
        msg = f"CUDA error ({cuda_err.site}): {cuda_err.text}"
        return RunResult(outcome, msg, exit_code=returncode, **common)
    if returncode == 0:
        lost = (f" ({dropped['stdout']} bytes of its stdout were over the capture cap and dropped)"
                if dropped.get("stdout") else "")
        return RunResult("process_exit", f"the process exited with status 0 before reporting a result{lost}",
                         exit_code=0, **common)
    return RunResult("process_exit", last_line(stderr) or last_line(stdout) or f"exit status {returncode}",
                     exit_code=returncode, **common)
