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
* ``unsupported`` - the installed provider lacks a feature the call needs (e.g. ``topk_length``).

A ``python_exception`` that is about the environment, not the batch (the kernel does not run on this
GPU architecture: "only supported on SM100f architectures"; the build lacks its legacy kernels; a
missing attribute, module or keyword argument) is reported as ``unsupported`` with the reason in
``inconclusive_reason``: it says nothing about the call's legality.

A run that printed FlashMLA's low-smem fallback warning (``[WARNING] batch_size=N requires XB shared
memory (max=YB), using low-smem fallback kernel.``, sgl-flash-mla's legacy scheduler above its fast
path) carries it in ``fallback``: the call ran, on a slower kernel.

``oracle_outcome`` maps these onto the four classes of the recorded probes (``ok``,
``python_exception``, ``process_exit``, ``process_crash``) so measured runs compare with them.
"""
from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, field
from typing import Any

MARKER = "@@validate-batch"
STAGE_PREFIX = f"{MARKER} stage "
PARTIAL_PREFIX = f"{MARKER} partial "
RESULT_PREFIX = f"{MARKER} result "

OUTCOMES = ("ok", "python_exception", "process_exit", "illegal_memory_access", "device_assert",
            "process_crash", "timeout", "unavailable", "unsupported")
# Outcomes after which the kernel did not run to completion: the call is illegal on this build.
FAILED_OUTCOMES = frozenset({"python_exception", "process_exit", "illegal_memory_access", "device_assert",
                             "process_crash"})
# Outcomes that say nothing about the call itself.
INCONCLUSIVE_OUTCOMES = frozenset({"timeout", "unavailable", "unsupported"})

CUDA_ERROR_RE = re.compile(r"CUDA error \(([^()]*?):(\d+)\): (.+)")
TORCH_CUDA_ERROR_RE = re.compile(r"CUDA error: ([^\n]+)")
ASSERTION_RE = re.compile(r"Assertion [`'].*failed.*")
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
ILLEGAL_ACCESS_TEXT = "illegal memory access"
DEVICE_ASSERT_TEXT = "device-side assert"


class Unavailable(Exception):
    """Raised in the child: the job cannot run here at all (torch, a CUDA GPU or FlashMLA is missing)."""


class Unsupported(Exception):
    """Raised in the child: the provider lacks a feature the call needs (the call says nothing about limits)."""


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


def find_cuda_error(text: str) -> CudaError | None:
    """The last ``CUDA error (file:line): text`` line in ``text``, if any."""
    found = None
    for m in CUDA_ERROR_RE.finditer(text):
        found = CudaError(m.group(1), int(m.group(2)), m.group(3).strip())
    return found


def find_fallback(text: str) -> dict | None:
    """The last low-smem fallback warning in ``text``: batch size, shared memory needed, the maximum."""
    found = None
    for m in FALLBACK_RE.finditer(text):
        found = {"batch_size": int(m.group(1)), "smem_bytes": int(m.group(2)), "smem_max": int(m.group(3)),
                 "text": m.group(0)}
    return found


def environment_reason(error_type: str | None, message: str) -> str | None:
    """Why an exception is about the environment (architecture, build, API) and not the batch; None if it
    may be about the batch."""
    for rx, why in ENVIRONMENT_MESSAGES:
        if rx.search(message or ""):
            return why
    return ENVIRONMENT_ERROR_TYPES.get(error_type or "")


def find_assertion(text: str) -> str | None:
    """The last host- or device-side assertion line (``Assertion `cond' failed ...``), if any."""
    found = None
    for m in ASSERTION_RE.finditer(text):
        found = m.group(0).strip()
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

    @property
    def last_stage(self) -> str | None:
        return self.stages[-1] if self.stages else None


def parse_child_stdout(stdout: str) -> ChildReport:
    """Read stage markers, partial results and the final result line from the child's stdout."""
    stages: list[str] = []
    partial: dict = {}
    result = None
    for ln in stdout.splitlines():
        if ln.startswith(STAGE_PREFIX):
            stages.append(ln[len(STAGE_PREFIX):].strip())
        elif ln.startswith(PARTIAL_PREFIX):
            try:
                obj = json.loads(ln[len(PARTIAL_PREFIX):])
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                partial.update(obj)
        elif ln.startswith(RESULT_PREFIX):
            try:
                obj = json.loads(ln[len(RESULT_PREFIX):])
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                result = obj
    return ChildReport(tuple(stages), partial, result)


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
        if with_payload and self.payload:
            d["payload"] = self.payload
        return d


def classify(returncode: int | None, stdout: str, stderr: str, *, timed_out: bool = False,
             elapsed_s: float = 0.0) -> RunResult:
    """Classify a finished (or killed) child run from its exit status and output.

    ``returncode`` follows :mod:`subprocess`: negative for a signal. Pure function: the unit tests
    drive it with synthetic outputs.
    """
    child = parse_child_stdout(stdout)
    both = f"{stderr}\n{stdout}"
    cuda_err = find_cuda_error(both)
    common = dict(stage=child.last_stage, partial=child.partial, elapsed_s=elapsed_s,
                  stderr_tail=tail(stderr), cuda_error=cuda_err, fallback=find_fallback(both))
    if timed_out:
        return RunResult("timeout", f"no result within {elapsed_s:.1f} s; the process group was killed",
                         exit_code=None, inconclusive_reason="no result within the time limit", **common)
    res = child.result
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
            assertion = find_assertion(stderr)
            if assertion:
                msg = f"{msg} [{assertion}]"
        else:
            outcome = "python_exception"
        return RunResult(outcome, msg, exit_code=returncode, error_type=err_type, **common)
    if returncode is not None and returncode < 0:
        name = signal_name(-returncode)
        msg = find_assertion(both) or last_line(stderr) or last_line(stdout)
        return RunResult("process_crash", msg, exit_code=returncode, signal=name, **common)
    if cuda_err is not None:
        outcome = "illegal_memory_access" if cuda_err.is_illegal_access else "process_exit"
        msg = f"CUDA error ({cuda_err.site}): {cuda_err.text}"
        return RunResult(outcome, msg, exit_code=returncode, **common)
    if returncode == 0:
        return RunResult("process_exit", "the process exited with status 0 before reporting a result",
                         exit_code=0, **common)
    return RunResult("process_exit", last_line(stderr) or last_line(stdout) or f"exit status {returncode}",
                     exit_code=returncode, **common)
