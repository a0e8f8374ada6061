"""FI0xx: limits of FlashInfer's trtllm-gen decode kernels and of its MLA ``plan()``."""
from __future__ import annotations

import numpy as np

from ..legality.failure import Failure
from ..facts.knowledge import grid_limits
from ..legality.registry import rule
from .calls import PLAN_RULE_KIND, TRTLLM_RULE_KIND, FlashInferPlan, MlaPlanCall


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
            failure=p.plan_facts.get("kv_indptr_failure", p.plan_facts["kv_failure"])))
    if c.kv_len is not None and c.kv_len.shape[0] and int(c.kv_len.min()) < 0:
        j = int(np.argmax(c.kv_len < 0))
        out.append(mla_plan_kv_lengths.rule.finding(
            f"request {j} kv_len expected >= 0, got {int(c.kv_len[j])}",
            subject=f"{_subject(p)} request {j}", numbers={"request": j, "field": "kv_len", "value": int(c.kv_len[j])},
            fix="pass each request's KV length (>= 0)", failure=p.plan_facts["kv_failure"]))
    return out


def _work_capacity(p: FlashInferPlan) -> dict | None:
    """The version's work-item capacity facts for the call's entry (None: none recorded)."""
    facts = p.plan_facts.get("work_capacity") or p.facts["mla_plan"].get("work_capacity")
    return facts


def _total_works(c: MlaPlanCall, num_sm: int, cap: int) -> int | None:
    """The plan's work items (the model of MLAPlan, bit-exact on an H200), or a lower bound above ``cap``
    when the batch alone exceeds it (every request with query rows is at least one work item); None when
    the plan cannot be made (an earlier rule's input, or no KV lengths)."""
    from .mla_schedule import mla_schedule

    q_lens = np.diff(c.qo_indptr)
    if c.kv_len is None or (q_lens < 0).any() or (c.kv_len < 0).any():
        return None
    if int((q_lens > 0).sum()) > cap:
        return int((q_lens > 0).sum())
    try:
        return mla_schedule(c.qo_indptr, c.kv_indptr, c.kv_len, c.h_q, num_sm, c.causal)["total_works"]
    except (ValueError, ZeroDivisionError, AssertionError):
        return None


@rule("FI004", subject=PLAN_RULE_KIND, added=38, facts=("mla_plan",),
      title="FlashInfer MLA plan(): more work items than the plan's fixed 16384-entry work list",
      failure=Failure("python_exception",
                      "flashinfer-python 0.7.2's wrapper: \"FA MLA needs at least N work items; native capacity is "
                      "16384.\" (recoverable, the step fails); the JIT module's plan (CUDA-graph replays) and older "
                      "trees: no check, the work list overruns and rows are left unwritten (silent_wrong)",
                      message="needs at least \\d+ work items; native capacity is \\d+"),
      source="flashinfer-python 0.7.2 flashinfer/mla/_batch_mla/_backends/_fa_common.py:253-322 (the wrapper counts "
             "the work items first), flashinfer/data/include/flashinfer/attention/scheduler.cuh:1775-1840 "
             "(MLAPlan's 16384-entry per-work regions, no check)",
      signatures=[
          {"message": "needs at least \\d+ work items; native capacity is \\d+", "failure": "python_exception",
           "builds": ["flashinfer-python-0.7.2", "flashinfer-python-0.7.2.post1"],
           "source": "flashinfer-python 0.7.2 flashinfer/mla/_batch_mla/_backends/_fa_common.py:253-322"},
      ])
def mla_plan_work_capacity(p: FlashInferPlan):
    """MLA ``plan()``: the plan's work items must fit the 16384 entries of each per-work array.

    ## What it checks
    The number of work items the plan makes (each request's query rows in tiles of 64 or 128 packed
    rows, each tile's keys in KV chunks: the model of ``MLAPlan``, equal to the kernel's plan on an
    H200 for every recorded call) is at most 16384.

    ## Why it crashes
    ``MLAPlan`` lays out each per-work array (query and KV offsets, lengths, partial-output offsets)
    as a region of 16384 entries of the integer workspace and writes the work items into them without
    a check. flashinfer-python 0.7.2's wrapper counts the work items first and refuses a plan above
    the capacity (``FA MLA needs at least 16385 work items; native capacity is 16384.``). The JIT
    module's ``plan``, which SGLang calls directly on CUDA-graph replays (``"entry": "module"``), does
    not: the items past the region overwrite the next one, and on an H200 the rows of a request the
    overrun reaches were left unwritten (silently wrong).

    ## Example
    16385 decode requests of 1 query token and 1 key each, 128 heads, on 132 SMs: two-CTA clusters, one
    work item per request, 16385 items.

    ## Fix
    Split the batch so each plan has at most 16384 work items (fewer requests, or fewer query tokens
    per request in one plan).

    ## Source
    flashinfer-python 0.7.2 ``flashinfer/mla/_batch_mla/_backends/_fa_common.py:253-322``,
    ``flashinfer/data/include/flashinfer/attention/scheduler.cuh:1775-1840``; measured on an H200
    (``fixtures/measured/flashinfer072_h200_kernel_check.json.gz``: 16383 / 16384 / 16385 work items on
    both entries).
    """
    c = p.call
    if not isinstance(c, MlaPlanCall):
        return None
    facts = _work_capacity(p)
    if facts is None:
        return None
    cap = int(facts["max_works"])
    n = _total_works(c, p.gpu.num_sms, cap)
    if n is None or n <= cap:
        return None
    parts = -(-n // cap)
    return [mla_plan_work_capacity.rule.finding(
        f"the plan has {n} work items on {p.gpu.num_sms} SMs; expected <= {cap}, got {n}",
        subject=_subject(p), numbers={"work_items": n, "max_work_items": cap, "num_sm": p.gpu.num_sms},
        fix=f"split the batch into at least {parts} plans of <= {cap} work items (about {-(-c.batch // parts)} "
            f"requests each)",
        failure=facts["failure"])]
