"""Reproduce slot-buffer failures with real PyTorch tensors on the CPU (optional: needs torch).

For each slot finding, build the buffer with its real shape and dtype and do the index the engine
does (``buffer[req_pool_indices] = value``), capturing PyTorch's own error text.
"""
from __future__ import annotations

import importlib.util


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def reproduce_slot_findings(report) -> list[dict]:
    """One entry per slot-indexed buffer involved in a SLOT001/002/004 error of ``report``."""
    bp = report.batch_plan
    if bp is None or bp.slots is None:
        return []
    if not torch_available():
        return [{"available": False, "reason": "torch is not installed (pip install torch==2.13.0 for a CPU build)"}]
    import torch

    out = []
    slots = [r.req_pool_idx for r in bp.batch.requests if r.req_pool_idx is not None]
    for buf in bp.slots.buffers:
        if not any(s >= buf.rows for s in slots):
            continue
        width = buf.width if buf.width is not None else 1
        shape = (buf.rows, width, 128) if buf.width is not None else (buf.rows,)
        dtype = torch.bfloat16 if buf.width is not None else torch.int64
        t = torch.zeros(shape, dtype=dtype)
        idx = torch.tensor(slots, dtype=torch.int64)
        entry = {"available": True, "buffer": buf.name, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
                 "index": slots, "operation": "buffer[req_pool_indices] = value"}
        try:
            t[idx] = 1
            entry["error"] = None
        except Exception as e:  # noqa: BLE001 - we report whatever PyTorch raises
            entry["error_type"] = type(e).__name__
            entry["error"] = str(e).splitlines()[0]
        out.append(entry)
    return out
