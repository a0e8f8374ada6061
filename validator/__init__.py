"""validate-batch: is this batch legal for the attention kernels, and if not, why and how to split it.

Importable without torch. Main entry points::

    import validate_batch
    report = validate_batch.check({"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512})
    report.legal, [f.code for f in report.findings]
    p = validate_batch.plan(record, gpu="H200"); p.num_sm_parts, p.schedule.metadata
    guard = validate_batch.Checker(engine="sglang-dsv4@0.5.10", gpu="H200")   # once per engine configuration
    guard.verdict(schedule_batch)            # every step: LEGAL, or a verdict with the report and split
"""
from .errors import BatchIllegalError, InputError, NotModelled

# The rest loads on first use (``validate_batch.check``, ``from validate_batch import Checker``): importing
# one submodule (the command line, the pytest plugin) then does not load every room of the package.
_LAZY = {"check": "api", "check_calls": "api", "plan": "api", "assert_legal": "api", "LEGAL": "guard",
         "Checker": "guard", "Headroom": "guard", "Verdict": "guard", "engine_settings": "guard", "GPU": "knowledge",
         "resolve_gpu": "knowledge", "explain": "explain", "Finding": "report", "Report": "report"}


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if where == "api":
        from . import api as mod
    elif where == "guard":
        from .guard import checker as mod
    elif where == "explain":
        from .output import explain as mod
    elif where == "report":
        from .legality import report as mod
    else:
        from .facts import knowledge as mod
    value = getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = ["check", "check_calls", "plan", "assert_legal", "Report", "Finding", "GPU", "resolve_gpu",
           "InputError", "NotModelled", "BatchIllegalError", "Checker", "Verdict", "Headroom", "LEGAL", "explain", "engine_settings",
           "__version__"]
