"""FI0xx: limits of FlashInfer's trtllm-gen decode kernels and of its MLA ``plan()``."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..legality.failure import Failure
from ..facts.knowledge import grid_limits
from ..legality.registry import rule
from ..facts.knowledge import resolve_gpu
from . import PLAN_RULE_KIND, TRTLLM_RULE_KIND
from .._numpy import numpy_on_first_use

if TYPE_CHECKING:
    from .calls import FlashInferPlan

np = numpy_on_first_use(globals())


def _mla_plan_call(c) -> bool:
    """Whether ``c`` is an MLA ``plan()`` call (the calls module is loaded by then: a FlashInfer
    plan was made)."""
    from .calls import MlaPlanCall

    return isinstance(c, MlaPlanCall)


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
          {"library": "flashinfer", "file": "fmhaKernels.cuh", "message": "CUDA Error: CUDA_ERROR_\\w+",
           "failure": "launch_error_silent",
           "lines": {"flashinfer-fb28d72": [451, 451], "flashinfer-python-0.7.2": [475, 475],
                     "flashinfer-python-0.7.2.post1": [478, 478], "flashinfer-python-0.7.4": [526, 526]},
           "source": "the launch's check in include/flashinfer/trtllm/fmha/fmhaKernels.cuh: fb28d72 :451, "
                     "flashinfer-python 0.7.2 :475, 0.7.2.post1 :478, 0.7.4 :526"},
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
          {"library": "flashinfer", "function": "MLAPlan", "file": "scheduler.cuh",
           "message": "qo_indptr\\[\\d+\\].*should be non-negative", "failure": "python_exception",
           "lines": {"flashinfer-fb28d72": [1599, 1599], "flashinfer-python-0.7.2": [1634, 1634],
                     "flashinfer-python-0.7.2.post1": [1634, 1634], "flashinfer-python-0.7.4": [1642, 1642]},
           "source": "MLAPlan's check of each query length in include/flashinfer/attention/scheduler.cuh: fb28d72 "
                     ":1599, flashinfer-python 0.7.2 and 0.7.2.post1 :1634, 0.7.4 :1642 (the module plan's check)"},
          {"library": "flashinfer", "message": "qo_indptr metadata must be nondecreasing", "failure": "python_exception",
           "builds": ["flashinfer-python-0.7.2", "flashinfer-python-0.7.2.post1",
                      "flashinfer-python-0.7.4"],
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
    if not _mla_plan_call(c):
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
          {"library": "flashinfer", "message": "kv_len_arr metadata must be nonnegative", "failure": "python_exception",
           "builds": ["flashinfer-python-0.7.2", "flashinfer-python-0.7.2.post1",
                      "flashinfer-python-0.7.4"],
           "source": "flashinfer-python 0.7.2 flashinfer/mla/_batch_mla/_planning.py:130"},
          {"library": "flashinfer", "message": "kv_indptr metadata must be nondecreasing", "failure": "python_exception",
           "builds": ["flashinfer-python-0.7.2", "flashinfer-python-0.7.2.post1",
                      "flashinfer-python-0.7.4"],
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
    if not _mla_plan_call(c):
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


def _work_capacity(p: FlashInferPlan) -> dict:
    """The version's work-list facts for the call's entry (the module's plan has its own failure)."""
    return p.plan_facts.get("work_capacity") or p.facts["mla_plan"]["work_capacity"]


def _work_facts(p: FlashInferPlan) -> tuple:
    """The records FI004 rests on for this call: its entry's work-list facts."""
    if _mla_plan_call(p.call) and p.call.entry == "module" and "work_capacity" in p.plan_facts:
        return ("mla_plan.module_plan.work_capacity",)
    return ("mla_plan.work_capacity",)


def mla_works_page() -> dict:
    """The numbers FI004's page quotes: the work list's capacity (``rules/flashinfer.json``) and an H200 example."""
    from .calls import version

    cap = version(None)["mla_plan"]["work_capacity"]["max_works"]
    return {"max_works": cap, "example_batch": cap + 1, "sms": resolve_gpu("H200").num_sms}


@rule("FI004", subject=PLAN_RULE_KIND, added=38, facts=_work_facts, page=mla_works_page,
      title="FlashInfer MLA plan(): more work items than its fixed work list holds",
      failure=Failure("silent_wrong", also=("python_exception", "illegal_memory_access"),
                      message="FA MLA needs (at least )?\\d+ work items",
                      text="silent_wrong (or an illegal memory access) where MLAPlan copies the work items past its "
                           "16384-entry arrays; python_exception on flashinfer-python 0.7.2's wrapper, which refuses "
                           "the plan first ('FA MLA needs at least N work items; native capacity is 16384.')"),
      source="flashinfer-ai/flashinfer 00b1eec include/flashinfer/attention/scheduler.cuh (MLAPlan: "
             "max_total_num_works = 16384, per-work arrays of that size, copies without a check); flashinfer-python "
             "0.7.2 flashinfer/mla/_batch_mla/_planning.py:84-148 (the wrapper's checks, rules/flashinfer.json "
             "other_checks); the work count follows validator/flashinfer/mla_schedule.py (scheduler.cuh:1614-1872 "
             "in 0.7.2)",
      signatures=[
          {"library": "flashinfer", "message": "FA MLA needs (at least )?\\d+ work items", "failure": "python_exception",
           "builds": ["flashinfer-python-0.7.2", "flashinfer-python-0.7.2.post1",
                      "flashinfer-python-0.7.4"],
           "source": "flashinfer-python 0.7.2 flashinfer/mla/_batch_mla/_planning.py (the wrapper's work-item check; "
                     "rules/flashinfer.json other_checks)"},
      ])
def mla_plan_work_items(p: FlashInferPlan):
    """MLA ``plan()``: at most {{max_works}} work items in one plan.

    ## What it checks
    ``MLAPlan`` cuts each request's packed query rows (``qo_len * h_q``) into tiles of 64 or 128
    rows and each tile's keys into chunks; every chunk is one work item, kept in arrays of a fixed
    {{max_works}} entries in the integer workspace. The count follows the plan's own algorithm
    (``validate_batch.flashinfer.mla_schedule``) on the GPU's SM count ({{sms}} on an H200).

    ## Why it crashes
    ``MLAPlan`` copies the work items into its {{max_works}}-entry arrays without checking their
    count: past it, each array runs into the next and the kernels read corrupted work lists (wrong
    attention or an illegal memory access). flashinfer-python 0.7.2's wrapper refuses such a plan
    first (``No supported planned MLA backend: fa3: FA MLA needs at least 16385 work items; native capacity is
    16384.``, measured on an H200); the JIT
    module's ``plan`` (SGLang's CUDA-graph decode replays) does not.

    ## Example
    A decode plan of {{example_batch}} requests with one query token and a short KV each: one work
    item per request, {{example_batch}} in all.

    ## Fix
    Plan fewer requests per call (split the batch), or cap the decode batch
    (``--max-running-requests``) so that one plan stays within {{max_works}} work items.

    ## Source
    flashinfer-ai/flashinfer 00b1eec ``include/flashinfer/attention/scheduler.cuh`` (MLAPlan,
    ``max_total_num_works``); flashinfer-python 0.7.2 ``flashinfer/mla/_batch_mla/_planning.py:84-148``,
    ``_backends/_fa_common.py:253-322`` (the wrapper's count). Measured on an H200 with 0.7.2 and
    0.7.2.post1 at 16383 / 16384 / 16385 work items on both entries
    (``fixtures/measured/flashinfer072*_h200_kernel_check.json.gz``): the wrapper refuses 16385, the
    module's plan takes it and leaves one request's output rows unwritten.
    """
    c = p.call
    if not _mla_plan_call(c) or c.kv_len is None or c.batch == 0:
        return None
    if _first_drop(c.qo_indptr) is not None or int(c.kv_len.min()) < 0:
        return None           # FI002 / FI003 say it; MLAPlan stops (or drops the request) before counting
    facts = _work_capacity(p)
    cap = facts["max_works"]
    # A bound first (cheap, exact as a bound): a tile's keys go in chunks of at most L keys, L >= total keys /
    # clusters, so the work items are at most tiles + clusters; tiles are at most sum(ceil(qo_len * h_q / 64)).
    tiles = int(((np.diff(c.qo_indptr) * c.h_q + 63) // 64).sum())
    if tiles + p.gpu.num_sms <= cap:
        return None
    from .mla_schedule import mla_schedule

    works = mla_schedule(c.qo_indptr.tolist(), c.kv_indptr.tolist(), c.kv_len.tolist(), num_heads=c.h_q,
                         num_sm=p.gpu.num_sms)["total_works"]
    if works <= cap:
        return None
    return [mla_plan_work_items.rule.finding(
        f"plan of {c.batch} request(s) has {works} work items on {p.gpu.name} ({p.gpu.num_sms} SMs); expected <= {cap} "
        f"(MLAPlan's fixed work list), got {works}",
        subject=_subject(p), numbers={"works": works, "max_works": cap, "batch": c.batch},
        fix=f"split the plan: at most {cap} work items per call (fewer requests, or shorter KV per request)",
        failure=facts["failure"])]
