"""SGL0xx (engine routing), SLOT0xx (request slots) and CG0xx (CUDA-graph replay): rules over a BatchPlan."""
from __future__ import annotations

from ..inputs.batch import RequestColumns
from ..legality.failure import Failure
from ..flashmla.plan import plan as flashmla_plan
from ..flashmla.rules import SCHED_SMEM_SIGNATURES, empty_prefill_signatures
from ..facts.formula import Formula, formula_field
from .forward import forward_rows
from .versions import release_key
from ..facts.knowledge import load
from ..legality.registry import rule
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


def _holding(bp, where) -> list[tuple[str, int]]:
    """``(request id, slot)`` of the requests whose slot ``where(slots)`` selects (a numpy mask over
    the step's slots: one vectorized pass, request objects never built)."""
    reqs = bp.batch.requests
    if isinstance(reqs, RequestColumns):
        if reqs.slot is None or not len(reqs):
            return []
        a = np.asarray(reqs.slot, dtype=np.int64)
        ids = reqs.ids
        return [(str(ids[i]) if ids is not None else f"r{i}", int(a[i])) for i in np.flatnonzero(where(a))]
    held = [(r.id, r.req_pool_idx) for r in reqs if r.req_pool_idx is not None]
    if not held:
        return []
    mask = where(np.array([x for _, x in held], dtype=np.int64))
    return [h for h, m in zip(held, mask) if m]


def decode_rows_page() -> dict:
    """The numbers SGL001's page quotes: SGLang's routing threshold (``rules/engines.json``) and the
    decode kernel's real row limit (FlashMLA 9241ae3 on an H200)."""
    versions = load("engines")["profiles"]["sglang-dsv4"]["versions"]
    threshold = next(v["sparse_prefill_threshold"] for v in versions if v.get("sparse_prefill_threshold") is not None)
    rows = flashmla_plan({"kind": "sparse", "b": 1, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}, gpu="H200",
                         build="flashmla-9241ae3").max_sched_rows
    return {"threshold": threshold, "max_rows": rows, "gap_first": rows + 1}


@rule("SGL001", scope="batch", reads="rows", added=17, page=decode_rows_page,
      title="forward sends more query rows to the FlashMLA decode kernel than its scheduler can take",
      failure=Failure("process_exit", "the scheduler's 'invalid argument' exit(1) kills the SGLang scheduler process",
                      site="get_decoding_sched_meta.cu:111", message="invalid argument"),
      source="SGLang DeepSeek-V4 backend (q is [T, 1, h_q, 512]: one row per token); sparse-prefill routing in "
             "sgl-project/sglang PR #25418/#25502",
      signatures=SCHED_SMEM_SIGNATURES)
def decode_kernel_rows(bp):
    """The engine sends more query rows to FlashMLA's decode kernel than its scheduler can take.

    ## What it checks
    SGLang's DeepSeek-V4 backend passes ``q`` as ``[T, 1, h_q, 512]``: FlashMLA's ``b`` is the number
    of query rows ``T`` of the forward (extend: new tokens, plus merged decodes under mixed chunking;
    decode: batch size; target verify: batch size x draft tokens; draft extend: tokens). Versions
    with sparse-prefill routing send extend forwards above {{threshold}} rows to ``flash_mla_sparse_fwd``;
    the real limit is {{max_rows}}, so {{gap_first}}..{{threshold}}-row prefills still reach the decode
    kernel, and decode, verify and draft-extend forwards are never routed.

    ## Why it crashes
    The decode kernel's scheduler cannot get ``4*(5T+1)`` bytes of shared memory: ``CUDA error
    (.../get_decoding_sched_meta.cu:111): invalid argument`` and ``exit(1)`` kill the scheduler process.

    ## Example
    ``Prefill batch, #new-seq: 3, #new-token: 12288, #running-req: 1`` on a version without routing;
    a 11640-token prefill on a version with it.

    ## Fix
    Cap ``--chunked-prefill-size`` (and ``--max-prefill-tokens``) at the limit minus merged decodes;
    split the batch as proposed; for verify, keep ``max_running_requests x draft tokens`` below it.

    ## Source
    SGLang ``deepseek_v4_backend.py``; routing in sgl-project/sglang PR #25418 / #25502.
    """
    if bp.rows is None or bp.routing.get("routed") or bp.max_rows is None:
        return None
    T, L = bp.rows, bp.max_rows
    if T <= L:
        return None
    thr = bp.routing.get("threshold")
    mode = bp.batch.forward_mode
    if thr is None:
        why = f"SGLang {bp.routing['version']} sends every forward to flash_mla_with_kvcache"
    elif mode.is_routable():
        why = (f"the routing threshold {thr} is above the real limit {L}: extend forwards of {L + 1}..{thr} rows "
               f"still go to flash_mla_with_kvcache")
    else:
        why = f"{mode} forwards are never routed to flash_mla_sparse_fwd"
    parts = ", ".join(f"{k} {v}" for k, v in bp.row_breakdown.items() if v)
    return [decode_kernel_rows.rule.finding(
        f"{mode} forward sends {T} query rows to FlashMLA's decode kernel; expected <= {L} on {bp.batch.gpu.name}, got {T} "
        f"({parts}); {why}",
        subject=f"{mode} forward of {len(bp.batch.requests)} request(s)",
        numbers={"query_rows": T, "max_rows": L, "threshold": thr, **bp.row_breakdown},
        fix=_fix_rows(bp.batch, L),
    )]


def _fix_rows(batch, L: int) -> str:
    """The fix of SGL001: split, and a chunk cap only where it lowers the configured one."""
    cap = L - (len(batch.running) if batch.mixed else 0)
    have = batch.arg("chunked_prefill_size")
    if not batch.forward_mode.is_routable() or (
            isinstance(have, int) and not isinstance(have, bool) and 0 < have <= cap):
        return "split the forward (see safe_split)"
    return f"split the forward (see safe_split) or cap --chunked-prefill-size at {L}" + (
        " minus merged decodes" if batch.mixed else "")


@rule("SGL002", scope="batch", reads="rows", added=18,
      title="prefill routed to the sparse prefill kernel with an empty chunk",
      failure=Failure("process_crash", "flash_mla_sparse_fwd with 0 rows segfaults",
                      message="TMA Desc Addr|Failed to initialize the TMA descriptor"),
      source="SGLang DeepSeek-V4 backend sparse-prefill route; FlashMLA measured s_q=0 crash",
      signatures=empty_prefill_signatures(("flashmla-9241ae3",)))
def empty_sparse_prefill(bp):
    """A forward routed to ``flash_mla_sparse_fwd`` must have at least one query row.

    ## What it checks
    Extend forwards routed to the sparse prefill kernel pass all their rows at once; a forward (or
    a chunk) with zero rows must not be launched.

    ## Why it crashes
    ``flash_mla_sparse_fwd`` with ``s_q = 0`` builds an invalid TMA descriptor and the process dies
    with SIGSEGV.

    ## Example
    An extend forward whose requests were all fully cached (0 new tokens) with padding disabled.

    ## Fix
    Skip the attention call for empty forwards.

    ## Source
    FlashMLA ``flash_mla_sparse_fwd`` (measured: 0 rows crash); SGLang DSv4 backend routing.
    """
    if bp.rows is None or bp.rows > 0:
        return None
    return [empty_sparse_prefill.rule.finding(
        f"{bp.batch.forward_mode} forward has 0 query rows; expected >= 1",
        subject="forward", numbers={"query_rows": 0}, fix="do not launch attention for an empty forward")]


def _global_slots(bp) -> tuple[list[tuple[str, int]], list[str]]:
    """``(request id, global slot)`` of the requests that hold one, and the ids of those whose global
    slot is unknown: a request's ``global_slot`` when given; its ``req_pool_idx`` when attention DP is
    1 (the rank's numbering is the global one); otherwise unknown (never guessed)."""
    reqs = bp.batch.requests
    single = bp.slots.attn_dp == 1
    if isinstance(reqs, RequestColumns):          # the guard's columns carry the rank's slots only
        return (_holding(bp, lambda a: a >= 0), []) if single else ([], [str(x) for x in (reqs.ids or [])][:64])
    held, unknown = [], []
    for r in reqs:
        if r.global_slot is not None:
            held.append((r.id, r.global_slot))
        elif r.req_pool_idx is not None:
            (held.append((r.id, r.req_pool_idx)) if single else unknown.append(r.id))
    return held, unknown


def precompute_formula(data: dict) -> Formula:
    """The schedule precompute's dynamic shared memory in bytes for ``b`` rows and ``P`` partitions
    (``sched_precompute.dynamic_bytes``, ``4*(5b+1+8P)``)."""
    return formula_field(data, "dynamic_bytes", "engines.sglang-dsv4.sched_precompute", ("b", "P"))


def _precompute_data() -> dict | None:
    return load("engines")["profiles"]["sglang-dsv4"].get("sched_precompute")


def precompute_releases() -> list[dict]:
    """The schedule precompute as each release ships it: the shared facts merged with the release's
    own guard, kernel check and shared-memory opt-in (``release``: its first release number)."""
    data = _precompute_data()
    if data is None:
        return []
    shared = {k: v for k, v in data.items() if k != "releases"}
    return [{**shared, **r, "release": r["min_release"]} for r in data["releases"]]


def release_tuple(v: str) -> tuple:
    """A release number as a key for ordering, PEP 440-like (``0.5.12 < 0.5.12.post1 < 0.5.13``;
    :func:`validate_batch.engines.versions.release_key`)."""
    key = release_key(v)
    if key is None:
        raise ValueError(f"not a release number: {v!r}")
    return key


def _rel(v: str | None):
    return None if v is None else release_tuple(v)


def precompute_for(version: dict) -> tuple[str, dict | None]:
    """``("one", data)``: the precompute of the release(s) a resolved version entry stands for (data
    None: those releases have none); ``("ambiguous", None)``: the entry spans releases whose
    precompute differs and names none of them (resolve it by release number).

    A version resolved by a release number stands for that release; one named by an alias for its
    ``min_release`` .. ``max_release`` (open ends open)."""
    rels = precompute_releases()
    m = version.get("matched_release")
    lo, hi = (_rel(m), _rel(m)) if m else (_rel(version.get("min_release")), _rel(version.get("max_release")))
    hits, before = [], False
    for r in rels:
        r_lo, r_hi = _rel(r["min_release"]), _rel(r.get("max_release"))
        if (hi is None or r_lo <= hi) and (lo is None or r_hi is None or lo <= r_hi):
            hits.append(r)
    if rels:
        first = _rel(rels[0]["min_release"])
        before = lo is None or lo < first
    kinds = len(hits) + (1 if before else 0)
    if kinds > 1:
        return "ambiguous", None
    return "one", (hits[0] if hits else None)


def precompute_launch_limit(data: dict) -> int:
    """The largest dynamic size the precompute's launch accepts: its opt-in when it sets one, else
    the default per-block limit less the kernel's static shared memory."""
    opt = data.get("opt_in_bytes")
    return int(opt) if opt else int(data["default_limit_bytes"]) - int(data["static_bytes"])


def precompute_window(data: dict, parts: int) -> tuple[int, int | None] | None:
    """``(first, last)`` rows whose precompute fails for ``parts`` partitions (last None: every
    larger ``b`` fails too); None when none fails."""
    f = precompute_formula(data)
    limit = precompute_launch_limit(data)
    guard = data.get("guard_budget_bytes")
    first = f.largest("b", limit, P=parts) + 1
    if guard is None:
        return first, None
    last = f.largest("b", guard, P=parts)
    return (first, last) if first <= last else None


def precompute_safe_rows(p) -> int | None:
    """The largest ``b`` below SGL003's window on this call's GPU and heads in any release (None: no
    release precomputes this call's schedule, or none fails)."""
    if not p.is_decode:
        return None
    out = None
    for data in precompute_releases():
        if p.gpu.cc[0] not in data["cc_majors"] or p.call.h_q != data["h_q"]:
            continue
        w = precompute_window(data, max(p.gpu.num_sms // p.call.s_q, 1))
        if w is not None:
            out = w[0] - 1 if out is None else min(out, w[0] - 1)
    return out


@rule("SGL003", scope="batch", reads="schedule", safe_rows=precompute_safe_rows, added=19,
      title="SGLang's schedule precompute asks for more shared memory than its launch may have",
      failure=Failure("python_exception",
                      "the JIT scheduling kernel's launch is refused (CUDA: too much shared memory for the block, "
                      "raised by the launch check), or, in 0.5.21, its size check raises first: the forward fails "
                      "(read from the source; the launch limit's mechanism is measured on an H200: fixtures/measured/h200_smem_launch_probe.json)"),
      source="SGLang 0.5.21 / 0.5.22 / 0.5.23 srt/layers/attention/deepseek_v4_backend.py "
             "(_maybe_precompute_flashmla_sched_meta: no guard / guard 4*(5b+1+8P) <= 48 KiB / the same guard) and "
             "kernels/jit/csrc/deepseek_v4/flashmla_sched_meta.cuh (48 static bytes; 0.5.23 opts in to 48 KiB "
             "dynamic)")
def precompute_smem(bp):
    """SGLang's own schedule precompute asks for shared memory its launch may not have.

    ## What it checks
    On Blackwell with 64 heads per rank, SGLang's DeepSeek-V4 backend computes the decode kernel's
    tile schedule itself for DeepSeek-V4.1 (a JIT kernel, from 0.5.21), with ``num_sm_parts = SMs
    // s_q`` and ``4*(5b+1+8P)`` bytes of dynamic shared memory; the kernel also has 48 bytes of
    static shared memory. Each release ships it differently:

    - 0.5.21: no guard. The kernel's size check raises for more than 48 KiB dynamic, and the launch
      (no opt-in) needs dynamic + static <= 48 KiB: every ``b`` from the first that does not fit
      fails.
    - 0.5.22: a guard skips the precompute above 48 KiB dynamic, but forgets the static bytes: the
      ``b`` it admits that do not fit with them fail.
    - 0.5.23: the same guard, and the kernel opts in to 48 KiB of dynamic shared memory: every
      schedule the guard admits launches. Nothing fails.

    ## Why it crashes
    The launch asks for more shared memory than the block may have: CUDA refuses it and the JIT
    op's launch check raises, so the forward fails (0.5.21 above 48 KiB: its size check raises
    first).

    ## Example
    B200 (148 SMs): ``4*(5b+1+8*148) + 48 <= 49152`` holds up to b = 2218. SGLang 0.5.22 fails
    decode batches of 2219 and 2220 requests (its guard admits b <= 2220); 0.5.21 fails every batch
    from 2219; 0.5.23 none.

    ## Fix
    Keep the forward's rows outside the window (one request fewer, or, on 0.5.22, more), or use
    SGLang 0.5.23 (its kernel opts in to the shared memory the guard admits).

    ## Source
    SGLang 0.5.21 / 0.5.22 / 0.5.23 ``srt/layers/attention/deepseek_v4_backend.py``
    (``_maybe_precompute_flashmla_sched_meta``) and ``kernels/jit/csrc/deepseek_v4/flashmla_sched_meta.cuh``.
    """
    pre = bp.routing.get("sched_precompute")
    if not pre:
        return None
    data, parts = pre["data"], pre["num_sm_parts"]
    guard, check, static = data.get("guard_budget_bytes"), data.get("kernel_check_bytes"), data["static_bytes"]
    limit = precompute_launch_limit(data)
    dynamic = precompute_formula(data)
    window = precompute_window(data, parts)
    rel = pre.get("release") or data["release"]
    out = []
    for dc in bp.calls:
        c = dc.call
        if dc.route != "decode_kernel":
            continue
        if pre["use_legacy"] is False and c.topk + (c.extra_topk or 0) < data["split_kv_min_topk"]:
            continue            # the current kernels do not split this call: no schedule to compute
        need = dynamic(b=c.b, P=parts)
        if guard is not None and need > guard:
            continue            # the guard skips the precompute: FlashMLA schedules itself
        if check is not None and need > check:
            what = (f"SGLang {rel}'s schedule precompute for b = {c.b} rows needs {need} B of dynamic shared "
                    f"memory; expected <= {check} B (its kernel's size check, with no guard before it), got {need} B")
        elif need > limit:
            what = (f"SGLang {rel}'s schedule precompute for b = {c.b} rows needs {need} B dynamic + {static} B static "
                    f"shared memory; " + (f"its guard admits it ({need} <= {guard}) but " if guard is not None else "")
                    + f"expected <= {limit + static} B in all without an opt-in, got {need + static} B")
        else:
            continue
        if window is None:
            continue
        first, last = window
        keep = f"keep the forward's rows below {first}" + (f" or above {last} (split the batch)" if last is not None
                                                           else " (split the batch)")
        out.append(precompute_smem.rule.finding(
            f"{dc.name}: {what} on {bp.batch.gpu.name} (num_sm_parts {parts}, build {dc.plan.gen['build']})",
            subject=f"FlashMLA call {dc.name} of this {bp.batch.forward_mode} forward",
            numbers={"rows": c.b, "dynamic_bytes": need, "static_bytes": static, "launch_limit_bytes": limit,
                     "budget_bytes": guard, "num_sm_parts": parts, "release": rel},
            fix=f"{keep}, or use SGLang 0.5.23 (its kernel opts in to the shared memory its guard admits)"))
    return out


@rule("SGL004", scope="batch", reads="config", added=20,
      title="DeepSeek-V4 KV layout that the GPU cannot run",
      failure=Failure("python_exception",
                      "the engine refuses the layout at startup (an assertion in select_dsv4_kv_layout); the current "
                      "kernels raise RuntimeError on SM90"),
      source="SGLang 0.5.23 srt/mem_cache/deepseek_v4_memory_pool.py:198-234 (V4.1 layouts need an SM100 / SM103 "
             "GPU); sgl-flash-mla 1.0.0 use_legacy=False on SM90 (measured: RuntimeError)")
def kv_layout_gpu(bp):
    """The DeepSeek-V4 KV layout must be one the GPU runs.

    ## What it checks
    ``SGLANG_DSV4_KV_LAYOUT`` picks the paged KV layout: ``v4`` (default) runs everywhere on the
    legacy kernels; ``v41`` and ``v41_new`` (the V4.1 formats) need an SM100 / SM103 GPU, and
    ``v41_new`` (interleaved) sends decode-kernel calls to the build's current kernels
    (``use_legacy=False``), which exist for SM100 only.

    ## Why it crashes
    The engine refuses the layout when it builds the KV pool (an assertion); the current kernels
    raise ``RuntimeError`` (only supported on SM100f) on an H200.

    ## Example
    ``SGLANG_DSV4_KV_LAYOUT=v41_new`` on an H200.

    ## Fix
    Use ``v4`` (or ``auto``, which picks ``v4`` off SM100) on Hopper.

    ## Source
    SGLang 0.5.23 ``srt/mem_cache/deepseek_v4_memory_pool.py:198-234``,
    ``srt/layers/attention/deepseek_v4_backend.py:1264-1271``.
    """
    need = bp.routing.get("kv_layout_needs_cc_major")
    cc = bp.batch.gpu.cc
    if not need or cc[0] in need:
        return None
    half = "current (use_legacy=False)" if bp.routing.get("use_legacy") is False else "legacy"
    return [kv_layout_gpu.rule.finding(
        f"KV layout {bp.routing['kv_layout']} needs compute capability {' or '.join(f'{m}.x' for m in need)}; "
        f"expected an SM100-class GPU, got {bp.batch.gpu.name} (sm{cc[0]}{cc[1]}); its decode calls would run the "
        f"{half} kernels",
        subject=f"engine setting SGLANG_DSV4_KV_LAYOUT={bp.routing['kv_layout']}",
        numbers={"kv_layout": bp.routing["kv_layout"], "cc": list(cc), "use_legacy": bp.routing.get("use_legacy")},
        fix="set SGLANG_DSV4_KV_LAYOUT=v4 (or auto) on this GPU")]


@rule("SLOT001", scope="batch", reads="slots", added=21,
      title="req_pool_idx outside the request table",
      failure=Failure("python_exception", also=("illegal_memory_access", "device_assert"),
                      message="index \\d+ is out of bounds for dimension 0 with size \\d+",
                      text="python_exception on CPU ('index N is out of bounds for dimension 0 with size M'); "
                           "illegal memory access or device-side assert on GPU"),
      source="SGLang ReqToTokenPool / DecodeReqToTokenPool (rows = size + pre_alloc_size + 1)",
      signatures=[
          {"library": "sglang", "message": "index \\d+ is out of bounds for dimension 0 with size \\d+", "failure": "python_exception",
           "source": "PyTorch's CPU index check (sglang-facts.md B)"},
          {"library": "sglang", "file": "IndexKernel.cu", "message": "index out of bounds", "failure": "device_assert",
           "source": "PyTorch's CUDA index kernel assertion (aten/src/ATen/native/cuda/IndexKernel.cu)"},
          {"library": "sglang", "message": "device-side assert triggered", "failure": "device_assert",
           "source": "the CUDA error PyTorch raises after a device-side assertion"},
      ])
def slot_in_table(bp):
    """``req_pool_idx`` must address a row of the request table (``1 .. T_rows-1``).

    ## What it checks
    The request table (``req_to_token``) has ``T_rows = R + 1`` rows, or ``R + E + 1`` on a PD decode
    worker (``E`` pre-allocation slots); row 0 is the reserved padding row. A live request's slot
    outside 1 .. T_rows-1 (row 0 included) is a bookkeeping bug in the engine.

    ## Why it crashes
    On CPU: ``index N is out of bounds for dimension 0 with size T_rows``; on GPU an unchecked index
    is an illegal memory access (or a device-side assert).

    ## Example
    R = 32, PD decode with E = 64: slots up to 96 are valid; 97 is not.

    ## Fix
    Fix the slot allocator; check ``--max-running-requests`` and ``--disaggregation-decode-extra-slots``.

    ## Source
    SGLang ``ReqToTokenPool`` / ``DecodeReqToTokenPool(size=R, pre_alloc_size=E)``.
    """
    if bp.slots is None:
        return None
    t = bp.slots.table_rows
    out = []
    for rid, slot in _holding(bp, lambda a: (a >= t) | (a == 0)):
        if slot >= t:
            out.append(slot_in_table.rule.finding(
                f"request {rid} holds slot {slot}; expected a slot in 1..{t - 1} of the {t}-row request table, got {slot}",
                subject=f"request {rid}, slot {slot}",
                numbers={"request": rid, "slot": slot, "table_rows": t},
                fix="the engine handed out a slot beyond its table: check max_running_requests / extra slots"))
        elif slot == 0:
            out.append(slot_in_table.rule.finding(
                f"request {rid} holds slot 0, the reserved padding row; expected a slot in 1..{t - 1}, got 0",
                subject=f"request {rid}, slot 0", numbers={"request": rid, "slot": 0, "table_rows": t},
                fix="real requests never hold slot 0 (the allocator hands out 1..T_rows-1); CUDA-graph padding "
                    "rows write row 0, so this request's KV indices would be overwritten: fix the slot bookkeeping"))
    return out


@rule("SLOT002", scope="batch", reads="slots", added=22,
      title="slot-indexed buffer has fewer rows than a live slot needs",
      failure=Failure("python_exception", also=("illegal_memory_access",),
                      message="index \\d+ is out of bounds for dimension 0 with size \\d+",
                      text="python_exception on CPU ('index 96 is out of bounds for dimension 0 with size 33'); on "
                           "GPU the unchecked Triton write corrupts memory and a later kernel reports an illegal "
                           "memory access"),
      source="SGLang DSATokenToKVPool compression tails sized max_running_requests + 1 (plain DSA builder) vs table "
             "rows + 1 (hybrid builder and the fix)",
      signatures=[
          {"library": "sglang", "message": "index \\d+ is out of bounds for dimension 0 with size \\d+", "failure": "python_exception",
           "source": "PyTorch's CPU index check; sglang-facts.md B ('index 96 is out of bounds for dimension 0 with "
                     "size 33')"},
          {"library": "sglang", "message": "illegal memory access", "failure": "illegal_memory_access",
           "source": "the unchecked Triton write corrupts memory and a later kernel reports an illegal memory access "
                     "(sglang-facts.md B)"},
      ])
def slot_in_buffers(bp):
    """Every buffer indexed by ``req_pool_idx`` needs more rows than the largest live slot.

    ## What it checks
    Per-request buffers (DSA compression tails, mapping tables, ...) are indexed by the request's
    slot. Each must have at least ``T_rows`` rows. The DSA tails are ``[rows, index_kpool +
    draft_tokens, 128]`` bf16 with ``rows = max_running_requests_arg + 1``: the hybrid (target)
    builder passes the table's rows, but the plain builder used by the NextN draft - which shares
    the target's request table - passed the scheduler limit ``R``: ``R + 1`` rows while slots go up
    to ``R + E``. A live slot beyond a buffer is an error; a buffer smaller than the live slot
    domain is reported as a warning even when this batch's slots happen to fit.

    ## Why it crashes
    On CPU: ``index 96 is out of bounds for dimension 0 with size 33``. On GPU the Triton write has
    no bounds check: it corrupts memory and a later, unrelated kernel reports an illegal memory access.

    ## Example
    PD decode, R = 32, E = 64 (T_rows = 97), NextN draft tails sized 33 rows, draft-extend forward
    holding slot 96.

    ## Fix
    Size every slot-indexed buffer from the request table's rows (the upstream fix passes T_rows:
    98 rows); or, as a stopgap, ``--disaggregation-decode-extra-slots 0``. No batch split helps:
    the slot is the request's.

    ## Source
    SGLang ``DSATokenToKVPool`` compression tails; the hybrid builder versus the plain DSA builder.
    """
    if bp.slots is None:
        return None
    out = []
    live_max = bp.slots.table_rows - 1
    for buf in bp.slots.buffers[1:]:
        if buf.indexed_by != "req_pool_idx":
            continue
        t, rows = bp.slots.table_rows, buf.rows
        bad = _holding(bp, lambda a: (a < t) & (a >= rows))
        for rid, slot in bad:
            out.append(slot_in_buffers.rule.finding(
                f"request {rid} holds slot {slot} but {buf.name} has {buf.rows} rows; expected slot < {buf.rows}, "
                f"got {slot} (index {slot} is out of bounds for dimension 0 with size {buf.rows})",
                subject=f"request {rid}, slot {slot}, buffer {buf.name}",
                numbers={"request": rid, "slot": slot, "buffer": buf.name, "buffer_rows": buf.rows,
                         "table_rows": bp.slots.table_rows, "sizing": buf.sizing},
                fix=f"size {buf.name} from the request table: {bp.slots.table_rows + 1} rows (table rows + 1)"))
        if not bad and buf.rows <= live_max:
            out.append(slot_in_buffers.rule.finding(
                f"{buf.name} has {buf.rows} rows but live slots go up to {live_max}; this batch fits, a request holding slot "
                f">= {buf.rows} will crash",
                subject=f"buffer {buf.name}", severity="warning",
                numbers={"buffer": buf.name, "buffer_rows": buf.rows, "max_live_slot": live_max, "sizing": buf.sizing},
                fix=f"size {buf.name} from the request table: {bp.slots.table_rows + 1} rows"))
    return out


@rule("SLOT003", scope="batch", reads="config", added=23,
      title="compression tail narrower than index_kpool + draft tokens",
      failure=Failure("python_exception", "the backend asserts tail_k.shape[1] == index_kpool + tail_extra_slots",
                      message="tail_k\\.shape\\[1\\]"),
      source="SGLang DSA compression tails (tail_extra_slots = speculative draft tokens)",
      signatures=[
          {"library": "sglang", "message": "tail_k\\.shape\\[1\\]", "failure": "python_exception",
           "source": "the DSA backend's assertion on the compression tail width (sglang-facts.md B)"},
      ])
def tail_width(bp):
    """DSA compression tails must be ``index_kpool + draft tokens`` wide.

    ## What it checks
    The tails hold ``index_kpool`` compressed entries plus one slot per speculative draft token
    (``tail_extra_slots``). A tail built for fewer draft tokens than the engine runs is too narrow.

    ## Why it crashes
    The backend asserts ``tail_k.shape[1] == index_kpool + tail_extra_slots``: a Python
    AssertionError (recoverable, but the forward fails).

    ## Example
    ``--speculative-num-draft-tokens 4`` with tails built with ``tail_extra_slots = 0``.

    ## Fix
    Build the tails with ``tail_extra_slots = speculative_num_draft_tokens``.

    ## Source
    SGLang DSA compression tail allocation.
    """
    if bp.slots is None:
        return None
    out = []
    for buf in bp.slots.buffers:
        if buf.width is not None and buf.required_width is not None and buf.width != buf.required_width:
            out.append(tail_width.rule.finding(
                f"{buf.name} width expected index_kpool + draft tokens = {buf.required_width}, got {buf.width}",
                subject=f"buffer {buf.name}",
                numbers={"buffer": buf.name, "width": buf.width, "required_width": buf.required_width},
                fix="build the tails with tail_extra_slots = speculative_num_draft_tokens"))
    return out


@rule("SLOT004", scope="batch", reads="slots", added=24,
      title="per-DP-rank buffer indexed by a global slot",
      failure=Failure("python_exception", also=("illegal_memory_access",),
                      message="index \\d+ is out of bounds for dimension 0 with size \\d+",
                      text="python_exception on CPU ('index 32 is out of bounds for dimension 0 with size 32'); "
                           "illegal memory access on GPU"),
      source="SGLang mamba slot mapping sized per DP rank while slots are global (--max-running-requests 64 "
             "--dp-size 2)",
      signatures=[
          {"library": "sglang", "message": "index \\d+ is out of bounds for dimension 0 with size \\d+", "failure": "python_exception",
           "source": "PyTorch's CPU index check (sglang-facts.md B, mamba slot mapping)"},
          {"library": "sglang", "message": "illegal memory access", "failure": "illegal_memory_access",
           "source": "the same index on the GPU (sglang-facts.md B)"},
      ])
def per_dp_buffer_global_slot(bp):
    """A buffer sized per DP rank must not be indexed by a global slot.

    ## What it checks
    With attention data parallelism each DP worker has its own request table; a buffer sized for
    one worker (``R / dp_size`` rows) but indexed by a slot numbered across all workers overflows on
    every rank but the first.

    ## Why it crashes
    On CPU: ``index 32 is out of bounds for dimension 0 with size 32``; on GPU an illegal memory access.

    ## Example
    ``--max-running-requests 64 --dp-size 2``: a mamba slot mapping table with 32 rows indexed by
    global slots up to 63.

    ## Fix
    Size the buffer from the global slot count, or index it with the worker-local slot.

    ## Source
    SGLang mamba slot mapping (same bug class as the DSA tails).
    """
    if bp.slots is None:
        return None
    out = []
    for buf in bp.slots.buffers:
        if buf.indexed_by != "global_slot":
            continue
        rows = buf.rows
        held, unknown = _global_slots(bp)
        if unknown:
            out.append(per_dp_buffer_global_slot.rule.finding(
                f"{buf.name} is indexed by global slots, but request(s) {', '.join(unknown[:5])}"
                f"{' ...' if len(unknown) > 5 else ''} give only their rank's req_pool_idx under attention DP "
                f"{bp.slots.attn_dp}: expected global_slot, got none; not checked",
                subject=f"buffer {buf.name}", severity="warning",
                numbers={"buffer": buf.name, "requests_without_global_slot": len(unknown), "attn_dp": bp.slots.attn_dp},
                fix="give each request's global_slot (the slot numbered across all DP ranks)"))
        for rid, slot in held:
            if slot >= rows:
                out.append(per_dp_buffer_global_slot.rule.finding(
                    f"request {rid} has global slot {slot} but {buf.name} ({buf.scope}) has {buf.rows} rows; "
                    f"expected slot < {buf.rows}, got {slot}",
                    subject=f"request {rid}, slot {slot}, buffer {buf.name}",
                    numbers={"request": rid, "slot": slot, "buffer": buf.name, "buffer_rows": buf.rows},
                    fix="size the buffer for all DP ranks' slots, or index it with the local slot"))
    return out


def _real_rows(bp) -> int:
    """Query rows of the forward before CUDA-graph padding."""
    rows, bd = forward_rows(bp.batch)
    return rows - bd.get("padding_rows", 0)


@rule("CG001", scope="batch", reads="rows", added=28,
      title="CUDA-graph replay: the forward has more rows than the captured graph",
      failure=Failure("silent_wrong",
                      "a graph runs the shapes it was captured with; rows past the captured batch are never computed "
                      "(or the engine indexes its static buffers past their end: python_exception on CPU, illegal "
                      "memory access on GPU)",
                      also=("python_exception", "illegal_memory_access")),
      source="CUDA graphs replay fixed launch shapes (CUDA C++ Programming Guide, CUDA Graphs); SGLang "
             "CudaGraphRunner pads a batch up to a captured size and runs eager above the largest")
def graph_rows(bp):
    """A replayed CUDA graph runs the rows it was captured with: the forward must not have more.

    ## What it checks
    ``cuda_graph.captured_rows`` is the number of query rows the graph was captured with (batch size
    x query tokens per request); the forward's real rows (before padding) must not exceed it. Rows
    below it are padded up to it (``seq_len`` 0 / ``topk_length`` 0 rows, ``block_table`` -1, indices
    -1), and the kernel calls are judged with the padded rows.

    ## Why it crashes
    A graph replays fixed launch shapes: rows past the captured batch are never computed (silently
    wrong), and an engine that copies them into the graph's static buffers writes past their end.

    ## Example
    ``cuda_graph: {captured_rows: 256}`` with 300 decode requests.

    ## Fix
    Run the forward eagerly (SGLang does above its largest captured batch size) or capture a graph
    for this many rows (``--cuda-graph-max-bs``).

    ## Source
    CUDA graphs replay fixed launch shapes (CUDA C++ Programming Guide, CUDA Graphs); SGLang's
    CudaGraphRunner pads a batch up to a captured size.
    """
    g = bp.batch.cuda_graph
    if not g:
        return None
    real, cap = _real_rows(bp), g["captured_rows"]
    if real <= cap:
        return None
    return [graph_rows.rule.finding(
        f"the {bp.batch.forward_mode} forward has {real} query rows; expected <= {cap} (the captured graph's rows), got {real}",
        subject=f"{bp.batch.forward_mode} forward of {len(bp.batch.requests)} request(s)",
        numbers={"rows": real, "captured_rows": cap},
        fix=f"run this forward eagerly or capture a graph of >= {real} rows; or split it into steps of <= {cap} rows")]


@rule("CG002", scope="batch", reads="config", added=29,
      title="CUDA-graph replay: the decode metadata was built for fewer rows than the graph runs",
      failure=Failure("illegal_memory_access", also=("silent_wrong",), site="combine.cu",
                      message="illegal memory access",
                      text="illegal_memory_access or silent_wrong: the captured kernels read num_splits and "
                           "partition rows for every replayed row; entries past the rows the scheduler wrote are "
                           "stale (the combine reads o_accum at stale split offsets)"),
      source="FlashMLA 9241ae3 csrc/smxx/decode/combine/combine.cu:36-37 (num_splits read at the row and the row "
             "after, for every row of the grid); 1408756 csrc/smxx/mla_combine.cu:24-25; the split-KV kernels read "
             "tile_scheduler_metadata per partition (9241ae3 csrc/sm90/decode/dense/splitkv_mla.cuh:1020-1021)",
      signatures=[
          {"library": "flashmla", "file": "combine.cu", "message": "illegal memory access", "failure": "illegal_memory_access"},
          {"library": "flashmla", "file": "mla_combine.cu", "message": "illegal memory access", "failure": "illegal_memory_access"},
      ])
def graph_metadata_rows(bp):
    """The FlashMLA metadata of a replayed graph must be computed for every row the graph runs.

    ## What it checks
    ``cuda_graph.metadata_rows`` (the rows ``tile_scheduler_metadata`` / ``num_splits`` were computed
    for) must be at least ``captured_rows``: the captured kernels run all captured rows, padding rows
    included. A padding row (length 0) still counts one 64-token block in the schedule, so the
    metadata of the real rows alone is not the metadata of the padded call: ``num_splits`` has
    ``b + 1`` entries for the rows it was computed for, and its partitions end at those rows.

    ## Why it crashes
    The combine kernel reads ``num_splits[row]`` and ``num_splits[row + 1]`` for every row of its grid,
    and the split-KV kernel reads its partition rows; past the computed rows the entries are stale
    (from an earlier step) or unwritten: o_accum is read at wrong split offsets - an illegal memory
    access or silently wrong attention.

    ## Example
    ``cuda_graph: {captured_rows: 64, metadata_rows: 40}``: 40 real decode requests in a 64-row graph
    whose metadata was computed before padding.

    ## Fix
    Compute the metadata after padding, for the captured rows (padding rows with length 0), in the
    graph's static metadata buffers.

    ## Source
    FlashMLA 9241ae3 ``csrc/smxx/decode/combine/combine.cu:36-37``; 1408756 ``csrc/smxx/mla_combine.cu:24-25``;
    9241ae3 ``csrc/sm90/decode/dense/splitkv_mla.cuh:1020-1021``.
    """
    g = bp.batch.cuda_graph
    if not g or g["metadata_rows"] >= g["captured_rows"]:
        return None
    m, cap = g["metadata_rows"], g["captured_rows"]
    return [graph_metadata_rows.rule.finding(
        f"the graph runs {cap} rows but its FlashMLA metadata was computed for {m}; expected metadata_rows >= {cap}, "
        f"got {m} (num_splits entries {m + 1}..{cap} are stale)",
        subject="replayed CUDA graph", numbers={"metadata_rows": m, "captured_rows": cap},
        fix=f"compute the metadata after padding, for all {cap} rows (padding rows with length 0)")]
