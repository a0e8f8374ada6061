"""torch in a kernel-mode child: imported and checked, the CUDA device required and described (shared by the
FlashMLA backend, :mod:`.torch_backend`, and the other libraries', :mod:`.libraries_backend`)."""
from __future__ import annotations

from .protocol import Unavailable
from .reproduce import BROKEN_PREFIX, one_line, torch_broken


def torch_module():
    """torch, checked on a small CPU tensor: a torch that is missing or broken is ``Unavailable``."""
    try:
        import torch
    except ImportError as e:
        raise Unavailable(f"torch is not importable in the child: {e}") from None
    except Exception as e:  # an import that raises anything else is a broken install
        raise Unavailable(BROKEN_PREFIX + one_line(e)) from None
    why = torch_broken(torch)
    if why:
        raise Unavailable(BROKEN_PREFIX + why)
    return torch


def require_cuda(torch):
    if not torch.cuda.is_available():
        raise Unavailable(f"torch {torch.__version__} sees no CUDA GPU")


def device_facts(torch) -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "cc": [props.major, props.minor],
        "num_sms": props.multi_processor_count,
        "smem_optin": getattr(props, "shared_memory_per_block_optin", None),
        "memory_bytes": getattr(props, "total_memory", None),
    }
