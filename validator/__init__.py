"""validate-batch: is this batch legal for the attention kernels, and if not, why and how to split it.

Importable without torch. Main entry points::

    import validator
    report = validator.check({"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512})
    report.legal, [f.code for f in report.findings]
    p = validator.plan(record, gpu="H200"); p.num_sm_parts, p.schedule.metadata
    guard = validator.Checker(engine="sglang-dsv4@0.5.10", gpu="H200")   # once per engine configuration
    guard.verdict(schedule_batch)            # every step: LEGAL, or a verdict with the report and split
"""
from .api import assert_legal, check, check_calls, plan
from .errors import BatchIllegalError, InputError
from .explain import explain
from .guard import LEGAL, Checker, Headroom, Verdict, engine_settings
from .knowledge import GPU, resolve_gpu
from .report import Finding, Report

__version__ = "0.1.0"

__all__ = ["check", "check_calls", "plan", "assert_legal", "Report", "Finding", "GPU", "resolve_gpu",
           "InputError", "BatchIllegalError", "Checker", "Verdict", "Headroom", "LEGAL", "explain", "engine_settings",
           "__version__"]
