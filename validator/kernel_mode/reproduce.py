"""Reproduce slot-buffer failures with real PyTorch tensors on the CPU (optional: needs torch).

For each slot finding, build the buffer with its real shape and dtype and do the index the engine
does (``buffer[req_pool_indices] = value``), capturing PyTorch's own error text. A torch that imports
but does not work (:func:`torch_broken`) skips the reproduction with the reason.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

BROKEN_PREFIX = "torch is broken: "


def torch_available() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, at most ``limit`` characters."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


def torch_broken(torch: Any) -> str | None:
    """Why ``torch`` (an imported module) does not work, in one line; None when a small CPU tensor
    can be built, index-written and read back as expected."""
    try:
        version = torch.__version__
        t = torch.zeros(4, dtype=torch.int64)
        t[torch.tensor([1], dtype=torch.int64)] = 5
        total = int(t.sum().item())
    except Exception as e:  # noqa: BLE001 - whatever a broken install raises is the reason
        return one_line(e)
    if total != 5:
        return f"torch {version}: writing 5 into a zero CPU tensor gives a sum of {total}"
    return None


def import_torch() -> tuple[Any, str | None]:
    """``(torch, None)``, or ``(None, reason)`` when torch is not installed, does not import, or is broken."""
    if not torch_available():
        return None, "torch is not installed (pip install torch==2.13.0 for a CPU build)"
    try:
        torch = importlib.import_module("torch")
    except ImportError as e:
        return None, f"torch is not importable: {one_line(e)}"
    except Exception as e:  # noqa: BLE001 - an import that raises anything else is a broken install
        return None, BROKEN_PREFIX + one_line(e)
    why = torch_broken(torch)
    return (None, BROKEN_PREFIX + why) if why else (torch, None)


def reproduce_slot_findings(report) -> list[dict]:
    """One entry per slot-indexed buffer involved in a SLOT001/002/004 error of ``report``."""
    bp = report.batch_plan
    if bp is None or bp.slots is None:
        return []
    torch, why = import_torch()
    if torch is None:
        return [{"available": False, "reason": why}]
    out = []
    slots = [r.req_pool_idx for r in bp.batch.requests if r.req_pool_idx is not None]
    for buf in bp.slots.buffers:
        if not any(s >= buf.rows for s in slots):
            continue
        width = buf.width if buf.width is not None else 1
        shape = (buf.rows, width, 128) if buf.width is not None else (buf.rows,)
        try:
            dtype = torch.bfloat16 if buf.width is not None else torch.int64
            t = torch.zeros(shape, dtype=dtype)
            idx = torch.tensor(slots, dtype=torch.int64)
            dtype_name = str(dtype).replace("torch.", "")
        except Exception as e:  # noqa: BLE001 - building the buffer is not the engine's index
            return [{"available": False, "reason": BROKEN_PREFIX + one_line(e)}]
        entry = {"available": True, "buffer": buf.name, "shape": list(shape), "dtype": dtype_name,
                 "index": slots, "operation": "buffer[req_pool_indices] = value"}
        try:
            t[idx] = 1
            entry["error"] = None
        except Exception as e:  # noqa: BLE001 - we report whatever PyTorch raises
            entry["error_type"] = type(e).__name__
            entry["error"] = (str(e).splitlines() or [""])[0]
        out.append(entry)
    return out
