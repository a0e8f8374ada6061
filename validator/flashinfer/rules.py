"""FI0xx: limits of FlashInfer's trtllm-gen decode kernels and of its MLA ``plan()``."""
from __future__ import annotations

from ..legality.failure import Failure
from ..facts.knowledge import grid_limits
from ..legality.registry import rule
from .calls import PLAN_RULE_KIND, TRTLLM_RULE_KIND, FlashInferPlan, MlaPlanCall
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


def _subject(p: FlashInferPlan) -> str:
    return p.call.label or p.call.summary()


def grid_batch_page() -> dict:
    """The numbers FI001's page quotes: CUDA's grid limit on z (``rules/gpus.json``)."""
    return {"max_batch": grid_limits()["z"], "example_batch": grid_limits()["z"] + 1}


@rule("FI001", page=grid_batch_page, reads="rows", subject=TRTLLM_RULE_KIND, added=30, facts=("trtllm_gen",),
      title="FlashInfer trtllm-gen attention: batch size above gridDim.z's 65535",
      failure=Failure("launch_error_silent",
                      "cuLaunchKernelEx fails, the error check only prints 'CUDA Error: CUDA_ERROR_INVALID_VALUE "
                      ".../fmhaKernels.cuh 451' and returns; the output is never written (silently wrong attention)",
                      site="fmhaKernels.cuh:451", message="CUDA Error: CUDA_ERROR_\\w+"),
      source="flashinfer fb28d72 include/flashinfer/trtllm/fmha/fmhaKernels.cuh:579 (the grid's z dimension is the "
             "batch size), :476, :451 (launch); include/flashinfer/trtllm/common.h:44-54 (cuErrCheck prints and "
             "continues); csrc/trtllm_fmha_kernel_launcher.cu:164 (mBatchSize = batch size)",
      signatures=[
          {"file": "fmhaKernels.cuh", "lines": [451, 451], "message": "CUDA Error: CUDA_ERROR_\\w+",
           "failure": "launch_error_silent", "builds": ["flashinfer-fb28d72"]},
          {"file": "fmhaKernels.cuh", "lines": [475, 475], "message": "CUDA Error: CUDA_ERROR_\\w+",
           "failure": "launch_error_silent", "builds": ["flashinfer-python-0.7.2"],
           "source": "flashinfer-python 0.7.2 include/flashinfer/trtllm/fmha/fmhaKernels.cuh:475 (the launch)"},
          {"file": "fmhaKernels.cuh", "lines": [478, 478], "message": "CUDA Error: CUDA_ERROR_\\w+",
           "failure": "launch_error_silent", "builds": ["flashinfer-python-0.7.2.post1"],
           "source": "flashinfer-python 0.7.2.post1 include/flashinfer/trtllm/fmha/fmhaKernels.cuh:478 (the launch)"},
      ])
def trtllm_gen_batch_grid(p: FlashInferPlan):
    """trtllm-gen decode kernels put the batch on ``gridDim.z``: at most {{max_batch}} requests per call.

    ## What it checks
    ``trtllm_batch_decode_with_kv_cache_mla`` (and the FMHA decode entry) launch one CTA column per
    request along the grid's z axis, whose CUDA limit is {{max_batch}}.

    ## Why it crashes
    It does not crash, which is worse: ``cuLaunchKernelEx`` fails, FlashInfer's error check only
    prints ``CUDA Error: CUDA_ERROR_INVALID_VALUE .../fmhaKernels.cuh 451`` and returns. The output
    tensor is never written; the step goes on with whatever it held - silently wrong attention.

    ## Example
    ``{"kind": "trtllm_gen_mla", "batch": {{example_batch}}, "q_len_per_request": 1, "h_q": 128}``.

    ## Fix
    Split decode batches above {{max_batch}} requests (``--max-running-requests``, or per-DP-rank batches).

    ## Source
    flashinfer fb28d72 ``include/flashinfer/trtllm/fmha/fmhaKernels.cuh:579`` (the batch on z),
    ``:451`` (launch), ``include/flashinfer/trtllm/common.h:44-54`` (prints and continues).
    """
    g = p.grid
    if g is None:
        return None
    top = grid_limits()[g["axis"]]
    if g["value"] <= top:
        return None
    steps = -(-g["value"] // top)
    return [trtllm_gen_batch_grid.rule.finding(
        f"batch {g['value']} is launched on gridDim.{g['axis']}; expected <= {top}, got {g['value']} "
        f"(FlashInfer {p.facts['name']}: the launch error is only printed and the output is left unwritten)",
        subject=_subject(p), numbers={"batch": g["value"], "max_batch": top, "axis": g["axis"]},
        fix=f"split into at least {steps} calls of <= {top} requests")]


def _first_drop(a: np.ndarray) -> int | None:
    """Index i of the first ``a[i+1] < a[i]`` (None: non-decreasing)."""
    if a.shape[0] < 2:
        return None
    d = np.diff(a) < 0
    return int(d.argmax()) if d.any() else None


@rule("FI002", subject=PLAN_RULE_KIND, added=31, facts=("mla_plan",),
      title="FlashInfer MLA plan(): a request with a negative query length (qo_indptr decreases)",
      failure=Failure("python_exception",
                      "\"Error in function 'MLAPlan' at .../scheduler.cuh:1599: qo_indptr[i+1]... - qo_indptr[i]... "
                      "should be non-negative\" (recoverable, the step fails)",
                      site="scheduler.cuh:1599", message="qo_indptr\\[\\d+\\].*should be non-negative"),
      source="flashinfer fb28d72 include/flashinfer/attention/scheduler.cuh:1594-1600 (MLAPlan checks each qo "
             "length), include/flashinfer/exception.h:23 (FLASHINFER_ERROR throws), csrc/batch_mla_plan.cu:48-56",
      signatures=[
          {"file": "scheduler.cuh", "lines": [1599, 1599], "message": "qo_indptr\\[\\d+\\].*should be non-negative",
           "failure": "python_exception", "builds": ["flashinfer-fb28d72"]},
          {"file": "scheduler.cuh", "lines": [1634, 1634], "message": "qo_indptr\\[\\d+\\].*should be non-negative",
           "failure": "python_exception", "builds": ["flashinfer-python-0.7.2", "flashinfer-python-0.7.2.post1"],
           "source": "flashinfer-python 0.7.2 include/flashinfer/attention/scheduler.cuh:1634 (the module plan's check)"},
          {"message": "Error in function 'MLAPlan'", "failure": "python_exception"},
          {"message": "qo_indptr metadata must be nondecreasing", "failure": "python_exception",
           "builds": ["flashinfer-python-0.7.2", "flashinfer-python-0.7.2.post1"],
           "source": "flashinfer-python 0.7.2 flashinfer/mla/_batch_mla/_planning.py:73 (the wrapper's check)"},
      ])
def mla_plan_qo_lengths(p: FlashInferPlan):
    """MLA ``plan()``: every request's query length ``qo_indptr[i+1] - qo_indptr[i]`` must be >= 0.

    ## What it checks
    ``qo_indptr`` is non-decreasing: each request has a non-negative number of query tokens.

    ## Why it crashes
    ``MLAPlan`` checks each length and throws: ``Error in function 'MLAPlan' at
    .../scheduler.cuh:1599: qo_indptr[i+1]X - qo_indptr[i]Y should be non-negative`` - a Python
    ``RuntimeError``; recoverable, but the step fails. flashinfer-python 0.7.2's wrapper refuses it
    first in Python (``ValueError: qo_indptr metadata must be nondecreasing.``); its JIT module's
    ``plan``, which SGLang calls directly on CUDA-graph replays (``"entry": "module"``), still
    fails in ``MLAPlan`` (scheduler.cuh:1634).

    ## Example
    ``{"kind": "mla_plan", "qo_indptr": [0, 4, 3], "kv_indptr": [0, 1, 2]}``: request 1 has -1 tokens.

    ## Fix
    Build ``qo_indptr`` as the cumulative sum of non-negative query lengths (a request scheduled with
    no new tokens has length 0).

    ## Source
    flashinfer fb28d72 ``include/flashinfer/attention/scheduler.cuh:1594-1600``; flashinfer-python
    0.7.2 ``flashinfer/mla/_batch_mla/_planning.py:66-73``, ``scheduler.cuh:1629-1635``.
    """
    c = p.call
    if not isinstance(c, MlaPlanCall):
        return None
    i = _first_drop(c.qo_indptr)
    if i is None:
        return None
    n = int((np.diff(c.qo_indptr) < 0).sum())
    a, b = int(c.qo_indptr[i]), int(c.qo_indptr[i + 1])
    return [mla_plan_qo_lengths.rule.finding(
        f"request {i} query length qo_indptr[{i + 1}] - qo_indptr[{i}] expected >= 0, got {b} - {a} = {b - a} "
        f"({n} request(s) negative)",
        subject=f"{_subject(p)} request {i}", numbers={"request": i, "qo_len": b - a, "count": n},
        fix="build qo_indptr as the cumulative sum of non-negative query lengths",
        failure=p.plan_facts["qo_failure"])]


@rule("FI003", subject=PLAN_RULE_KIND, added=32, facts=("mla_plan",),
      title="FlashInfer MLA plan(): a negative KV length or a decreasing kv_indptr (not checked: the request is "
            "dropped)",
      failure=Failure("silent_wrong",
                      "MLAPlan does not check KV lengths; a negative one never enters the work loop, so the request "
                      "is not scheduled and its output rows are left unwritten"),
      source="flashinfer fb28d72 include/flashinfer/attention/scheduler.cuh:1606 (kv_len taken as given), :1710-1711 "
             "(work is emitted only while the remaining length is > 0 or exactly 0); flashinfer-python 0.7.2 "
             "flashinfer/mla/_batch_mla/_planning.py:73, :130 (the wrapper refuses both in Python)",
      signatures=[
          {"message": "kv_len_arr metadata must be nonnegative", "failure": "python_exception",
           "builds": ["flashinfer-python-0.7.2", "flashinfer-python-0.7.2.post1"],
           "source": "flashinfer-python 0.7.2 flashinfer/mla/_batch_mla/_planning.py:130"},
          {"message": "kv_indptr metadata must be nondecreasing", "failure": "python_exception",
           "builds": ["flashinfer-python-0.7.2", "flashinfer-python-0.7.2.post1"],
           "source": "flashinfer-python 0.7.2 flashinfer/mla/_batch_mla/_planning.py:73"},
      ])
def mla_plan_kv_lengths(p: FlashInferPlan):
    """MLA ``plan()``: KV lengths must be >= 0 and ``kv_indptr`` non-decreasing (not checked by FlashInfer).

    ## What it checks
    Each ``kv_len[i] >= 0`` and ``kv_indptr[i+1] >= kv_indptr[i]`` (pages per request).

    ## Why it crashes
    ``MLAPlan`` takes the KV lengths as given. A negative one never enters its work loop, so the
    request gets no work item and its output rows are never written (silently wrong); a decreasing
    ``kv_indptr`` points the request's pages at another request's. flashinfer-python 0.7.2's
    wrapper refuses both in Python (``ValueError: kv_len_arr metadata must be nonnegative.``,
    ``kv_indptr metadata must be nondecreasing.``); its JIT module's ``plan``, which SGLang calls
    directly on CUDA-graph replays (``"entry": "module"``), does not check them.

    ## Example
    ``{"kind": "mla_plan", "qo_indptr": [0, 1, 2], "kv_indptr": [0, 3, 2], "kv_len": [130, -2]}``.

    ## Fix
    Derive ``kv_len`` and ``kv_indptr`` from the same non-negative sequence lengths.

    ## Source
    flashinfer fb28d72 ``include/flashinfer/attention/scheduler.cuh:1606`` and ``:1710-1711``;
    flashinfer-python 0.7.2 ``flashinfer/mla/_batch_mla/_planning.py:73``, ``:130``,
    ``scheduler.cuh:1641``, ``:1745-1746``.
    """
    c = p.call
    if not isinstance(c, MlaPlanCall):
        return None
    out = []
    i = _first_drop(c.kv_indptr)
    if i is not None:
        a, b = int(c.kv_indptr[i]), int(c.kv_indptr[i + 1])
        out.append(mla_plan_kv_lengths.rule.finding(
            f"request {i} pages kv_indptr[{i + 1}] - kv_indptr[{i}] expected >= 0, got {b} - {a} = {b - a}",
            subject=f"{_subject(p)} request {i}", numbers={"request": i, "field": "kv_indptr", "value": b - a},
            fix="build kv_indptr as the cumulative sum of each request's page count",
            failure=p.plan_facts["kv_failure"]))
    if c.kv_len is not None and c.kv_len.shape[0] and int(c.kv_len.min()) < 0:
        j = int(np.argmax(c.kv_len < 0))
        out.append(mla_plan_kv_lengths.rule.finding(
            f"request {j} kv_len expected >= 0, got {int(c.kv_len[j])}",
            subject=f"{_subject(p)} request {j}", numbers={"request": j, "field": "kv_len", "value": int(c.kv_len[j])},
            fix="pass each request's KV length (>= 0)", failure=p.plan_facts["kv_failure"]))
    return out
