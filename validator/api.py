"""The Python API: ``plan``, ``check``, ``assert_legal`` - importable without torch."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from .inputs.batch import is_batch_like
from .deepgemm import KINDS as DEEPGEMM_KINDS
from .engines.shapes import call_plan
from .errors import BatchIllegalError, InputError
from .flashinfer import KINDS as FLASHINFER_KINDS
from .flashmla import SUBJECT_KINDS as TENSOR_KINDS
from .flashmla.calls import DecodeCall, KernelCall, SparsePrefillCall, call_from_record
from .flashmla.plan import Plan
from .facts.knowledge import GPU, resolve_gpu
from .legality.pipeline import check_batch
from .legality.report import Finding, Report
from .legality.ruleset import run_rules


def build_name(build: str | None, kernel: str | None) -> str | None:
    """``build=``, or ``kernel=``, its older name (an InputError when both name different builds)."""
    if kernel is not None and build is not None and kernel != build:
        raise InputError("kernel", f"given twice: build={build!r}, kernel={kernel!r} (kernel is the older name of build)")
    return build if build is not None else kernel


def _as_call(c: Any, where: str) -> KernelCall:
    if isinstance(c, (DecodeCall, SparsePrefillCall)):
        return c
    if isinstance(c, Mapping):
        return call_from_record(c, where)
    raise InputError(where, f"expected a call record (JSON object) or a DecodeCall, got {type(c).__name__}")


def plan(call: KernelCall | dict, gpu: Any = "H200", build: str | None = None) -> Plan:
    """Plan one FlashMLA call: a :class:`DecodeCall` or :class:`SparsePrefillCall`, or an
    oracle-format record (dict). A sparse decode call's plan comes from its shape's
    (:func:`~validate_batch.engines.shapes.call_plan`): the same plan as one made from scratch
    (:func:`validate_batch.flashmla.plan.plan`), with the shape's work done once."""
    if isinstance(call, dict):
        call = call_from_record(call)
    return call_plan(call, resolve_gpu(gpu), build)


def check_plan(p: Plan) -> list[Finding]:
    """All call-scope rules over one plan (of any kernel family: the rules of its kind)."""
    return run_rules("call", p)


def plan_any(c: Any, gpu: GPU, build: str | None = None, where: str = "call"):
    """The plan of one call of any kernel family: a FlashMLA call or record, a FlashInfer or
    DeepGEMM record (by ``kind``), or a FlashMLA tensor check (``sched_meta_reuse``,
    ``decode_indices``). ``build`` names the FlashMLA build (the other families take ``version``);
    ``gpu`` is resolved (:func:`resolve_gpu`). A sparse FlashMLA decode call's plan comes from its
    shape's (:func:`~validate_batch.engines.shapes.call_plan`)."""
    if isinstance(c, Mapping):
        kind = c.get("kind")
        # (each family's calls module loads with its first record)
        if kind in FLASHINFER_KINDS:
            from .flashinfer import calls as flashinfer_calls

            return flashinfer_calls.plan(c, gpu, prefix=where)
        if kind in DEEPGEMM_KINDS:
            from .deepgemm import calls as deepgemm_calls

            return deepgemm_calls.plan(c, gpu, prefix=where)
        if kind in TENSOR_KINDS:
            from .flashmla import tensors

            return tensors.subject_from_record(c, where, gpu, build)
    return call_plan(_as_call(c, where), gpu, build)


def check_calls(calls: Iterable[Any], gpu: Any = "H200", build: str | None = None, *,
                kernel: str | None = None) -> Report:
    """Check kernel calls (records of any family, or DecodeCall objects) and return one Report."""
    build = build_name(build, kernel)
    g = resolve_gpu(gpu)
    plans = []
    findings: list[Finding] = []
    for i, c in enumerate(calls):
        p = plan_any(c, g, build, f"calls[{i}]")
        plans.append(p)
        findings.extend(check_plan(p))
    return Report(findings, plans)


def check_sched_meta_reuse(planned: Any, reused: Any, gpu: Any = "H200", build: str | None = None) -> Report:
    """FMLA018: may a schedule planned for ``planned`` be reused for ``reused`` (call records or
    :class:`DecodeCall`)? A Report naming what changed."""
    from .flashmla import tensors

    s = tensors.reuse_check(planned, reused, gpu, build)
    return Report(run_rules("call", s), [s])


def check_decode_indices(indices: Any, num_kv_tokens: int, topk_length: Any = None, gpu: Any = "H200") -> Report:
    """FMLA019: sparse decode ``indices`` (numpy, lists or tensors, ``[rows, topk]``) against a KV cache
    of ``num_kv_tokens`` slots (``num_blocks * page_size``); ``topk_length``: valid entries per row."""
    from .flashmla import tensors

    s = tensors.indices_check(indices, num_kv_tokens, topk_length, gpu)
    return Report(run_rules("call", s), [s])


def check(obj: Any, gpu: Any = None, build: str | None = None, *, kernel: str | None = None, **kwargs) -> Report:
    """Check one call record, a list of call records, or an engine batch; never raises on illegal input.

    Raises :class:`InputError` (field named) when the input itself is malformed.
    """
    build = build_name(build, kernel)
    if is_batch_like(obj):
        return check_batch(obj, gpu=gpu, build=build, **kwargs)
    if isinstance(obj, (list, tuple)):
        return check_calls(obj, gpu or "H200", build)
    return check_calls([obj], gpu or "H200", build)


def assert_legal(obj: Any, gpu: Any = None, build: str | None = None, *, kernel: str | None = None,
                 **kwargs) -> Report:
    """Like :func:`check`, but raise :class:`BatchIllegalError` (with findings and safe split) if illegal,
    :class:`NotModelled` if the step runs a path the profiles do not model (and breaks no modelled limit)."""
    report = check(obj, gpu=gpu, build=build_name(build, kernel), **kwargs)
    if not report.legal:
        if report.verdict == "not_modelled":
            raise report.refusal()
        raise BatchIllegalError(report)
    return report


__all__ = ["plan", "plan_any", "check", "check_calls", "check_plan", "check_sched_meta_reuse", "check_decode_indices", "assert_legal", "Report", "Finding", "GPU",
           "InputError", "BatchIllegalError", "resolve_gpu"]
