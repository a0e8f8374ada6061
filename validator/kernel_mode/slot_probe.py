"""Request-slot buffers on the GPU: what an out-of-range slot index does on the device.

Engines keep per-request buffers indexed by a request slot (SGLang's ``req_pool_idx``). When a buffer
has fewer rows than the slot table, the engine's index-write ``buf[slots] = values`` goes past its
end. On the CPU torch raises ``IndexError: index 96 is out of bounds for dimension 0 with size 33``;
on the GPU the same write trips a device-side assertion that poisons the CUDA context (and an
unchecked custom kernel corrupts memory silently). :func:`probe_slot_index` runs that write in a
child process on the device and, beside it, on the CPU.
"""
from __future__ import annotations

from typing import Any

from ..errors import InputError
from .providers import torch_installed
from .runner import ChildSpec, run_job, run_jobs

DEFAULT_SLOT_TIMEOUT_S = 60.0
MAX_ROWS = 1 << 24
MAX_WIDTH = 1 << 16


def cpu_index_error(rows: int, slot: int) -> str | None:
    """The message torch's CPU bounds check gives for ``slot`` into ``rows`` rows (None if in bounds)."""
    if -rows <= slot < rows:
        return None
    return f"index {slot} is out of bounds for dimension 0 with size {rows}"


def _validate(rows: Any, width: Any, slot: Any, device: str) -> tuple[int, int, int]:
    for name, v, lo, hi in (("rows", rows, 1, MAX_ROWS), ("width", width, 1, MAX_WIDTH)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(name, f"expected an integer, got {v!r}")
        if not lo <= v <= hi:
            raise InputError(name, f"expected {lo}..{hi}, got {v}")
    if isinstance(slot, bool) or not isinstance(slot, int):
        raise InputError("slot", f"expected an integer, got {slot!r}")
    if abs(slot) > (1 << 62):
        raise InputError("slot", f"{slot} does not fit in int64")
    if device not in ("cuda", "cpu"):
        raise InputError("device", f"expected \"cuda\" or \"cpu\", got {device!r}")
    return rows, width, slot


def _entry(run, device: str) -> dict:
    d = run.to_dict()
    d["device"] = device
    return d


def probe_slot_index(rows: int, width: int, slot: int, device: str = "cuda",
                     timeout: float = DEFAULT_SLOT_TIMEOUT_S, child: ChildSpec | None = None,
                     with_cpu: bool = True) -> dict:
    """Allocate bf16 ``[rows, width, 128]`` on ``device`` and write row ``slot`` as an engine does.

    Runs in a child process with a timeout. Returns a JSON-able dict: ``available``, ``in_bounds``,
    the device run (``outcome``, ``message``, ``exit_code``, ``signal``, ``stage``), and under
    ``cpu`` the same write on the CPU (when ``device == "cuda"`` and ``with_cpu``), plus
    ``expected_cpu_message`` (torch's CPU bounds-check text, computed, no torch needed).
    """
    rows, width, slot = _validate(rows, width, slot, device)
    base = {"rows": rows, "width": width, "slot": slot, "device": device,
            "in_bounds": -rows <= slot < rows, "bytes": rows * width * 128 * 2,
            "expected_cpu_message": cpu_index_error(rows, slot)}
    child = child or ChildSpec()
    if child.backend is None and child.python == ChildSpec().python and not torch_installed():
        return dict(base, available=False, reason="torch is not installed in this Python: the slot probe "
                                                   "allocates the buffer with torch")
    job = {"op": "slot", "rows": rows, "width": width, "slot": slot, "device": device}
    if device == "cuda" and with_cpu:
        dev_run, cpu_run = run_jobs([job, dict(job, device="cpu")], timeout, child, max_parallel=2)
    else:
        dev_run, cpu_run = run_job(job, timeout, child), None
    if dev_run.outcome == "unavailable":
        return dict(base, available=False, reason=dev_run.message,
                    cpu=_entry(cpu_run, "cpu") if cpu_run is not None else None)
    out = dict(base, available=True, **_entry(dev_run, device))
    if cpu_run is not None:
        out["cpu"] = _entry(cpu_run, "cpu")
    return out
