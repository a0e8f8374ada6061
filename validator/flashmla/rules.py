"""FMLA0xx: limits of FlashMLA's decode and sparse-prefill kernels. Each rule reads one call's Plan
(FMLA018 / FMLA019: the tensors an engine passes, see :mod:`.tensors`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..legality.failure import Failure
from ..facts.knowledge import grid_limits, path_archs, sm_list, sm_name
from ..legality.registry import rule
from .calls import DecodeCall, SparsePrefillCall
from .plan import COMBINE_GRIDS, Plan
from .plan import plan as make_plan
from . import INDICES_KIND, REUSE_KIND
from .._numpy import numpy_on_first_use

if TYPE_CHECKING:
    from .tensors import IndicesCheck, ReuseCheck

np = numpy_on_first_use(globals())


def _facts(when, *paths):
    """A rule's facts (:mod:`validate_batch.facts.provenance`): ``paths`` on the plans ``when(plan)``
    holds for, none on the others (the rule cannot fire there)."""
    return lambda p: paths if when(p) else ()


def _decode(p) -> bool:
    return p.is_decode


def _sparse(p) -> bool:
    return p.is_decode and p.call.kind == "sparse"


def _dense(p) -> bool:
    return p.is_decode and p.call.kind in ("dense", "dense_fp8")


def _dense_fp8(p) -> bool:
    return p.is_decode and p.call.kind == "dense_fp8"


def _prefill(p) -> bool:
    return isinstance(p.call, SparsePrefillCall)


def _int_max(bits: int) -> int:
    """Largest value of a signed ``bits``-bit integer."""
    return (1 << (bits - 1)) - 1


def _or(values) -> str:
    return " or ".join(str(v) for v in values)


def _subject(p: Plan) -> str:
    return p.call.label or p.call.summary()


def _smem_formula(p: Plan) -> str:
    """The scheduler's shared-memory formula as the facts write it (``4*(5b+1)``)."""
    return str(p.sched_smem_formula)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _page_plan(build: str) -> Plan:
    """A one-row sparse decode call on an H200 planned on ``build``: the facts pages quote."""
    return make_plan({"kind": "sparse", "b": 1, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}, gpu="H200",
                     build=build)


def sched_smem_page() -> dict:
    """The numbers FMLA001's page quotes: FlashMLA 9241ae3's scheduler on an H200 (``rules/gpus.json``,
    ``rules/flashmla.json``), for the page's example call."""
    p = make_plan({"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}, gpu="H200",
                  build="flashmla-9241ae3")
    return {"smem_optin": p.gpu.smem_optin, "max_rows": p.max_sched_rows, "example_smem": p.sched_smem_bytes}


#: the error lines of the decode scheduler's shared-memory failure, per build: FMLA001's, and the engine
#: rules' that send it too many rows (SGL001)
SCHED_SMEM_SIGNATURES = (
    {"library": "flashmla", "file": "get_decoding_sched_meta.cu", "lines": [111, 111], "message": "invalid argument",
     "failure": "process_exit", "builds": ["flashmla-9241ae3", "vllm-0.33", "vllm-0.34"],
     "source": "flashmla.json generations flashmla-9241ae3 / vllm-0.33-legacy sched_smem.error_site; measured "
               "on H200 (flashmla-facts.md section 4; vLLM 0.33 and 0.34: fixtures/measured/vllm03*_h200_probes.jsonl)"},
    {"library": "flashmla", "file": "get_mla_metadata.cu", "lines": [93, 93], "message": "invalid argument", "failure": "process_exit",
     "builds": ["flashmla-1408756"],
     "source": "flashmla.json generation flashmla-1408756 sched_smem.error_site; measured on H200 "
               "(flashmla-facts.md section 6)"},
    {"library": "flashmla", "file": "get_decoding_sched_meta.cu", "lines": [143, 143], "message": "invalid argument",
     "failure": "process_exit", "builds": ["flashmla-2026.09.30", "vllm-0.33", "vllm-0.34"],
     "source": "flashmla.json generation flashmla-2026.09.30 sched_smem.error_site and crash_sites.json (read "
               "from the binary); measured on H200 with vLLM 0.33 and 0.34 (the SM90 sparse scheduler's RuntimeError)"},
)


@rule("FMLA001", facts=_facts(_decode, 'sched_smem', 'failures'), reads="rows", added=1, page=sched_smem_page,
      title="scheduler shared memory: query rows above the GPU's opt-in limit",
      failure=Failure("process_exit",
                      "raising the scheduling kernel's shared-memory limit fails, the library prints 'CUDA error "
                      "(.../get_decoding_sched_meta.cu:111): invalid argument' and calls exit(1)",
                      site="get_decoding_sched_meta.cu:111", message="invalid argument"),
      source="FlashMLA 9241ae3 csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu (dynamic smem "
             "4*(5b+1) B); measured on H200: b=11622 ok, 11623 exits",
      signatures=SCHED_SMEM_SIGNATURES)
def sched_smem(p: Plan):
    """Scheduler shared memory: at most ``(smem_optin - 4) // 20`` query rows per call.

    ## What it checks
    The decode scheduling kernel keeps five int32 arrays of length ``b`` (plus one word) in dynamic
    shared memory: ``4*(5b+1)`` bytes. The GPU grants at most ``shared_memory_per_block_optin``
    ({{smem_optin}} bytes on SM90 and SM100), so ``b <= {{max_rows}}``. ``b`` is ``q.shape[0]``: for engines that
    flatten a prefill into one row per token it is the number of query tokens, not requests. The
    limit does not depend on s_q, h_q, topk, or dense versus sparse.

    ## Why it crashes
    Raising the scheduling kernel's dynamic shared-memory limit fails with ``invalid argument``; FlashMLA's
    error check prints ``CUDA error (.../get_decoding_sched_meta.cu:111): invalid argument`` and calls
    ``exit(1)``. No Python exception: the whole serving process dies.

    ## Example
    ``{"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}``: needs {{example_smem}} B
    of {{smem_optin}} B; a DeepSeek-V4 prefill of 3 x 4096 tokens on SGLang.

    ## Fix
    Keep every call at or below {{max_rows}} rows: split the batch (``validate-batch check`` proposes the
    minimal split), cap ``--chunked-prefill-size`` / ``--max-prefill-tokens`` at {{max_rows}}, or route large
    prefills to ``flash_mla_sparse_fwd`` (no scheduler, no row limit).

    ## Source
    FlashMLA 9241ae3 ``get_decoding_sched_meta.cu``; measured on an H200: 11622 ok, 11623 exits
    (dense and sparse, s_q 1 and 4).
    """
    if not p.is_decode or not p.split_kv or p.gen["sched_smem"].get("static") or p.falls_back:
        return None
    c: DecodeCall = p.call
    need, limit = p.sched_smem_bytes, p.gpu.smem_optin
    if need <= limit:
        return None
    max_b = p.max_sched_rows
    steps = -(-c.b // max_b)
    return [sched_smem.rule.finding(
        f"query rows {c.b} exceed the scheduler's limit {max_b} "
        f"(expected {_smem_formula(p)} <= {limit} B shared memory on {p.gpu.name}, got {need} B)",
        subject=_subject(p),
        numbers={"b": c.b, "max_b": max_b, "smem_bytes": need, "smem_limit": limit},
        fix=f"split into at least {steps} calls of <= {max_b} rows each",
    )]


def oaccum_safe_rows(p: Plan) -> int | None:
    """The largest ``b`` for which FMLA002 cannot fire, whatever the lengths: a split request's
    last partial-result row is at most ``(b - 1) + P``, so ``(b - 1 + P) * stride`` within the
    offset's integer range is safe
    (None: no scheduler, no bound needed)."""
    if not p.is_decode or p.num_sm_parts is None:
        return None
    return max(p.oaccum_max_row - p.num_sm_parts + 1, 0)


@rule("FMLA002", facts=_facts(lambda p: p.is_decode and p.runs_attention, 'oaccum', 'idle_begin_block', ''), reads="schedule", safe_rows=oaccum_safe_rows, added=2,
      title="32-bit o_accum row offset overflows for a split request",
      failure=Failure("illegal_memory_access",
                      "'CUDA error (.../combine.cu:197): an illegal memory access was encountered', exit(1); the "
                      "CUDA context is poisoned",
                      site="combine.cu:197", message="illegal memory access"),
      source="FlashMLA 9241ae3 split-KV kernel and csrc/smxx/decode/combine/combine.cu (row * s_q*h_q*512 computed "
             "in int32); measured on H200: split row 4095 ok, 4096 fails at s_q=8, h_q=128",
      signatures=[
          {"library": "flashmla", "file": "combine.cu", "lines": [197, 197], "message": "illegal memory access",
           "failure": "illegal_memory_access",
           "builds": ["flashmla-9241ae3", "vllm-0.33", "vllm-0.34", "sgl-kernel-flashmla"],
           "source": "flashmla.json combine.error_site of flashmla-9241ae3, vllm-0.33-legacy, "
                     "sgl-kernel-flashmla-legacy; measured on H200 with 9241ae3 (split row 4096 at s_q 8, h_q 128); "
                     "vLLM 0.34's combine host code is 0.33's (flashmla.json vllm-0.34 same_kernels_source)"},
          {"library": "flashmla", "file": "combine.cu", "lines": [206, 206], "message": "illegal memory access",
           "failure": "illegal_memory_access", "builds": ["sgl-flash-mla-1.0.0"],
           "source": "flashmla.json sgl-flash-mla-1.0.0-legacy combine.error_site; measured on H200 "
                     "(flashmla-builds.md section 2)"},
          {"library": "flashmla", "file": "mla_combine.cu", "message": "illegal memory access", "failure": "illegal_memory_access",
           "builds": ["flashmla-1408756"],
           "source": "flashmla.json flashmla-1408756 combine.error_site (no line recorded)"},
      ])
def oaccum_offset(p: Plan):
    """32-bit o_accum offset: the last partial-result row of a split request times ``s_q*h_q*512`` < 2^31.

    ## What it checks
    When the scheduler splits a request across partitions, each piece writes a partial result row of
    ``o_accum [b+P, s_q, h_q, 512]`` (fp32). The row index times ``s_q*h_q*512`` is computed in 32-bit
    int; later offsets are added to the pointer separately and do not overflow. Only split requests
    use o_accum, so the deciding number is the largest ``num_splits[r+1]-1`` over split requests -
    which needs the full schedule, not an estimate.

    ## Why it crashes
    The offset wraps negative, the split-KV kernel writes and the combine kernel reads outside the
    buffer: ``CUDA error (.../combine.cu:197): an illegal memory access was encountered`` and
    ``exit(1)``. The CUDA context is unusable afterwards.

    ## Example
    h_q=128, s_q=8: 2^31 / (8*128*512) = 4096, so a split request whose last row is 4096 crashes
    (measured: row 4095 ok, 4096 fails).

    ## Fix
    Fewer query rows per call (split the batch) so that split requests land below the boundary, or
    fewer heads / query tokens per row (smaller s_q or h_q per call).

    ## Source
    FlashMLA 9241ae3 split-KV and combine kernels; measured on an H200 at five (s_q, h_q) shapes and
    621 random calls.
    """
    if not (p.is_decode and p.runs_attention):
        return None
    safe = oaccum_safe_rows(p)
    if safe is not None and p.call.b <= safe:
        return None     # no split row of b rows reaches the overflow (oaccum_safe_rows): no schedule is needed
    sch = p.schedule
    if sch is None or sch.last_split_request < 0:
        return None
    c = p.call
    acc = p.gen["oaccum"]
    stride = c.s_q * c.h_q * acc["d_v"]
    row = sch.max_split_row
    max_row = p.oaccum_max_row
    if row <= max_row:
        return None
    req = sch.last_split_request
    return [oaccum_offset.rule.finding(
        f"request {req} is split and its last partial-result row is {row}; expected row * s_q*h_q*{acc['d_v']} "
        f"< 2^{acc['offset_bits'] - 1} (row <= {max_row} at s_q={c.s_q}, h_q={c.h_q}), got {row} * {stride} = {row * stride}",
        subject=_subject(p),
        numbers={"request": req, "row": row, "max_row": max_row, "row_stride": stride, "offset": row * stride},
        fix="run fewer query rows per call so split requests stay below that row (split the batch)",
    )]


@rule("FMLA003", facts=_facts(_sparse, 'failures'), reads="lengths", added=3,
      title="per-request topk_length / extra_topk_length outside [0, width]",
      failure=Failure("undefined_behaviour",
                      "reads past the row of indices; measured: illegal memory access at combine.cu:197 (exit(1)) "
                      "for 200 > 128, silent wrong results for 129",
                      site="combine.cu:197", message="illegal memory access"),
      source="FlashMLA 9241ae3 csrc/api/sparse_decode.h (lengths are trusted); measured on H200",
      signatures=[
          {"library": "flashmla", "file": "combine.cu", "lines": [197, 197], "message": "illegal memory access",
           "failure": "illegal_memory_access", "builds": ["flashmla-9241ae3"],
           "source": "measured on H200 with 9241ae3: topk_length 200 > topk 128 reported at combine.cu:197 "
                     "(flashmla-facts.md section 4)"},
      ])
def topk_length_range(p: Plan):
    """Per-request lengths within their cache width: ``0 <= topk_length[i] <= topk`` (and extra).

    ## What it checks
    ``topk_length[i]`` tells the kernel how many entries of row ``i`` of ``indices`` are valid; the
    same holds for ``extra_topk_length`` against ``extra_topk``. Values outside ``[0, width]`` make it
    read past the row.

    ## Why it crashes
    Undefined behaviour. Measured: 200 with topk 128 (and 100 with extra_topk 64) gave an illegal
    memory access reported at ``combine.cu:197`` and ``exit(1)``; 129 and 65 ran and silently read
    the neighbouring row; a negative value did not crash once. All are treated as illegal.

    ## Example
    ``"topk": 128, "topk_length": [200, ...]``.

    ## Fix
    Clamp lengths to the width when building the metadata (``min(causal_len, topk)``).

    ## Source
    FlashMLA 9241ae3 ``csrc/api/sparse_decode.h`` (lengths are not checked); measured on an H200.
    """
    c = p.call
    if not isinstance(c, DecodeCall) or c.kind != "sparse":
        return None
    out = []
    ranges = c.length_ranges
    for name, arr, width in (("topk_length", c.topk_length, c.topk),
                             ("extra_topk_length", c.extra_topk_length, c.extra_topk)):
        if arr is None or width is None or name not in ranges:
            continue
        lo, hi = ranges[name]
        if lo >= 0 and hi <= width:
            continue
        bad = (arr < 0) | (arr > width)
        if bad.any():
            i = int(bad.argmax())
            n_bad = int(bad.sum())
            out.append(topk_length_range.rule.finding(
                f"{name}[{i}] expected 0..{width}, got {int(arr[i])} ({n_bad} request(s) out of range)",
                subject=f"{_subject(p)} request {i}",
                numbers={"field": name, "request": i, "value": int(arr[i]), "width": width, "count": n_bad},
                fix=f"clamp {name} to [0, {width}]",
            ))
    return out


@rule("FMLA004", facts=_facts(_sparse, 'topk_block', 'failures'), shape_only=True, added=4,
      title="topk (or SM100 head64 extra_topk) not a multiple of 64",
      failure=Failure("process_crash",
                      "a host assertion that topk is a multiple of the top-k block fails, then SIGSEGV",
                      site="splitkv_mla.cuh:689", message="topk"),
      source="FlashMLA 9241ae3 csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:689; measured on H200 with topk=100",
      signatures=[
          {"library": "flashmla", "file": "splitkv_mla.cuh", "lines": [689, 689], "message": "topk", "failure": "process_crash",
           "builds": ["flashmla-9241ae3"],
           "source": "FlashMLA 9241ae3 csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:689 (host assertion); measured on "
                     "H200 with topk 100: SIGSEGV after it"},
          {"library": "flashmla", "file": "splitkv_mla.cuh", "lines": [691, 691], "message": "topk", "failure": "python_exception",
           "builds": ["sgl-flash-mla-1.0.0"],
           "source": "measured on H200 with sgl-flash-mla 1.0.0 (oracle sglfm_h200_probes.jsonl): RuntimeError for "
                     "the assertion at splitkv_mla.cuh:691"},
      ])
def topk_alignment(p: Plan):
    """``topk`` a multiple of 64 (SM100 head64: ``extra_topk`` too).

    ## What it checks
    The sparse kernels walk indices in blocks of 64. SM90 checks only ``topk`` (it accepted
    ``extra_topk = 100`` in a measurement); SM100's head64 kernel also requires ``extra_topk``.

    ## Why it crashes
    A host-side assertion that topk is a multiple of the top-k block fails and the process dies with
    SIGSEGV - no Python exception.

    ## Example
    ``"topk": 100`` on an H200.

    ## Fix
    Pad the index width up to a multiple of 64 (fill with -1) and pass per-request lengths.

    ## Source
    FlashMLA 9241ae3 ``splitkv_mla.cuh:689`` (SM90, measured), SM100 head64 ``get_meta`` (source).
    """
    c = p.call
    if not isinstance(c, DecodeCall) or c.kind != "sparse":
        return None
    out = []
    blk = p.gen["topk_block"]
    if c.topk % blk:
        out.append(topk_alignment.rule.finding(
            f"topk expected a multiple of {blk}, got {c.topk}", subject=_subject(p),
            numbers={"field": "topk", "value": c.topk, "multiple": blk},
            fix=f"pad indices to topk={-(-c.topk // blk) * blk} and pass topk_length"))
    impl = p.implementation
    if c.extra_topk is not None and c.extra_topk % blk and impl is not None and impl.extra_topk_block:
        out.append(topk_alignment.rule.finding(
            f"extra_topk expected a multiple of {blk} on {impl.name}, got {c.extra_topk}", subject=_subject(p),
            numbers={"field": "extra_topk", "value": c.extra_topk, "multiple": blk},
            fix=f"pad extra indices to {-(-c.extra_topk // blk) * blk}"))
    return out


@rule("FMLA005", facts=_facts(_sparse, 'sparse_shapes', 'kv_layouts', 'failures'), shape_only=True, added=5,
      title="unsupported head count or head dimension for sparse decode",
      failure=Failure("process_crash", also=("python_exception",), message="Segmentation fault|SIGSEGV",
                      text="process_crash for h_q outside {64, 128} (SIGSEGV, no message); python_exception for d_qk "
                           "outside {512, 576}"),
      source="FlashMLA 9241ae3 csrc/api/sparse_decode.h; measured on H200: h_q 32/96 crash, d_qk 448 RuntimeError",
      signatures=[
          {"library": "flashmla", "message": "Segmentation fault|SIGSEGV", "failure": "process_crash", "builds": ["flashmla-9241ae3"],
           "source": "measured on H200 with 9241ae3: h_q 32 or 96 crash with SIGSEGV and no message "
                     "(flashmla-facts.md section 4)"},
      ])
def sparse_heads(p: Plan):
    """Sparse decode shapes: ``h_q in {64, 128}``, ``h_kv == 1``, ``d_qk in {512, 576}``, ``d_v == 512``.

    ## What it checks
    The sparse decode kernels are instantiated for 64 or 128 query heads per KV head (one KV head),
    and for the two MLA layouts (576 = V3.2, 512 = MODEL1) with a 512-wide value.

    ## Why it crashes
    Other head counts make ``num_sm_parts`` divide by ``h_q/64 = 0`` or pick no kernel: the process
    dies with SIGSEGV and no message (measured with 32 and 96). A wrong ``d_qk`` is a Python
    ``RuntimeError`` (recoverable).

    ## Example
    ``"h_q": 96`` - e.g. 128 heads split over a tensor-parallel size that leaves 96 per rank.

    ## Fix
    Pad heads per rank to 64 or 128 (SGLang pads to 64), or change the tensor-parallel size.

    ## Source
    FlashMLA 9241ae3 ``csrc/api/sparse_decode.h``; measured on an H200.
    """
    c = p.call
    if not isinstance(c, DecodeCall) or c.kind != "sparse":
        return None
    shapes = p.gen["sparse_shapes"]
    layouts = p.gen["kv_layouts"]
    heads = shapes["h_q"]
    bad = [(name, value, list(allowed)) for name, value, allowed in (
        ("h_q", c.h_q, heads), ("h_k", c.h_k, shapes["h_k"]), ("d_qk", c.d_qk, layouts), ("d_v", c.d_v, shapes["d_v"]))
        if value not in allowed]
    if not bad:
        return None                     # (the common case: no fix text to build)
    fails = shapes.get("failures", {})
    pad = next((h for h in sorted(heads) if h > c.h_q), max(heads))
    names = " or ".join(f"{rec['name']} ({d})" for d, rec in layouts.items())
    fixes = {"h_q": f"pad heads to {pad}", "h_k": "MLA sparse decode uses one KV head",
             "d_qk": f"use the {names} KV layout", "d_v": f"head_dim_v must be {_or(shapes['d_v'])}"}
    return [sparse_heads.rule.finding(f"{name} expected {_or(allowed)}, got {value}", subject=_subject(p),
                                      numbers={"field": name, "value": value, "allowed": allowed},
                                      fix=fixes[name], failure=fails.get(name))
            for name, value, allowed in bad]


@rule("FMLA006", facts=_facts(lambda p: _sparse(p) and p.call.d_qk == 576, 'kv_layouts'), shape_only=True, added=6,
      title="V3.2 KV layout (d_qk 576) on SM90 with topk_length or an extra KV cache",
      failure=Failure("process_crash",
                      "host assertion ('V3.2 does not support dynamic topk length' / 'extra KV cache') then SIGSEGV",
                      site="splitkv_mla.cuh:700-701", message="V3\\.2 does not support"),
      source="FlashMLA 9241ae3 csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:700-701; measured on H200",
      signatures=[
          {"library": "flashmla", "file": "splitkv_mla.cuh", "lines": [700, 701], "message": "V3\\.2 does not support",
           "failure": "process_crash", "builds": ["flashmla-9241ae3"],
           "source": "FlashMLA 9241ae3 csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:700-701 (host assertions); "
                     "measured on H200: the process crashes"},
      ])
def v32_layout(p: Plan):
    """V3.2 layout (``d_qk == 576``) on SM90 takes no ``topk_length`` and no extra KV cache.

    ## What it checks
    The SM90 sparse kernel for the 656-byte V3.2 token layout has no per-request length and no extra
    cache; only the MODEL1 layout (``d_qk == 512``, 584 bytes per token) supports them.

    ## Why it crashes
    Host assertion (``V3.2 does not support dynamic topk length`` / ``... extra KV cache``), then
    SIGSEGV: the process dies.

    ## Example
    ``"d_qk": 576, "topk_length": [...]`` on an H200.

    ## Fix
    Use the MODEL1 layout (``d_qk = 512``) for per-request lengths and extra caches, or drop them.

    ## Source
    FlashMLA 9241ae3 ``splitkv_mla.cuh:700-701``; measured on an H200.
    """
    c = p.call
    if not isinstance(c, DecodeCall) or c.kind != "sparse":
        return None
    layouts = p.gen["kv_layouts"]
    lay, arch = layouts.get(c.d_qk), p.gpu.arch
    if lay is None:
        return None
    out = []
    for field, key, what, drop in (("topk_length", "no_topk_length_archs", "no topk_length", "topk_length"),
                                   ("extra_topk", "no_extra_cache_archs", "no extra KV cache", "the extra cache")):
        value = getattr(c, field)
        if value is None or arch not in lay.get(key, ()):
            continue
        got = "one" if field == "topk_length" else f"extra_topk={value}"
        alt = " or ".join(f"d_qk={d} ({rec['name']} layout)" for d, rec in layouts.items() if arch not in rec.get(key, ()))
        out.append(v32_layout.rule.finding(
            f"d_qk={c.d_qk} ({lay['name']} layout) expected {what} on {sm_name(arch)}, got {got}",
            subject=_subject(p), numbers={"field": field, "d_qk": c.d_qk},
            fix=f"use {alt} or drop {drop}" if alt else f"drop {drop}"))
    return out


@rule("FMLA007", facts=lambda p: (('kv_layouts', 'kv_checks') if p.gpu.arch >= 10 else ('kv_layouts',)) if _sparse(p) else (), shape_only=True, added=7,
      title="KV cache layout: row stride or alignment does not match the layout",
      failure=Failure("python_exception", also=("process_crash",), text="python_exception or host assertion"),
      source="FlashMLA 9241ae3 csrc/api/sparse_decode.h (token stride equal to bytes_per_token; SM100 block stride a "
             "multiple of 576/656, 16-byte base)")
def kv_layout(p: Plan):
    """KV cache ``[blocks, page, 1, bytes_per_token]`` whose token stride is ``bytes_per_token``.

    ## What it checks
    Checked only when the call gives ``bytes_per_token`` / ``kv_stride`` / ``kv_base_align``: the
    token stride must equal the layout's bytes per token (656 for V3.2, 584 for MODEL1); on SM100
    the block stride (``kv_stride``) must be a multiple of 576 (MODEL1) or 656 (V3.2) and the base
    16-byte aligned.

    ## Why it crashes
    A Python exception or a host assertion (the latter kills the process).

    ## Example
    ``"d_qk": 512, "bytes_per_token": 576``.

    ## Fix
    Allocate the cache in the layout the kernel expects; do not view a differently packed pool.

    ## Source
    FlashMLA 9241ae3 ``csrc/api/sparse_decode.h`` (read from source).
    """
    c = p.call
    if not isinstance(c, DecodeCall) or c.kind != "sparse":
        return None
    lay = p.gen["kv_layouts"].get(c.d_qk)
    want = lay["bytes_per_token"] if lay else None
    out = []
    if c.bytes_per_token is not None and want is not None and c.bytes_per_token != want:
        out.append(kv_layout.rule.finding(
            f"bytes_per_token expected {want} for d_qk={c.d_qk}, got {c.bytes_per_token}", subject=_subject(p),
            numbers={"field": "bytes_per_token", "expected": want, "got": c.bytes_per_token},
            fix="allocate the KV cache in the layout of this d_qk"))
    checks, arch = p.gen["kv_checks"], p.gpu.arch
    if arch in checks["block_stride_archs"] and c.kv_stride is not None:
        mult = lay["block_stride_multiple"] if lay else None
        if mult and c.kv_stride % mult:
            out.append(kv_layout.rule.finding(
                f"kv_stride expected a multiple of {mult} on {sm_name(arch)}, got {c.kv_stride}", subject=_subject(p),
                numbers={"field": "kv_stride", "multiple": mult, "got": c.kv_stride}, fix="pad each page"))
    align = checks["base_align"]
    if arch in checks["base_align_archs"] and c.kv_base_align is not None and c.kv_base_align % align:
        out.append(kv_layout.rule.finding(
            f"kv base alignment expected {align} bytes on {sm_name(arch)}, got {c.kv_base_align}", subject=_subject(p),
            numbers={"field": "kv_base_align", "expected": align, "got": c.kv_base_align}, fix="align the pool"))
    return out


def combine_parts_page() -> dict:
    """The numbers FMLA008's page quotes: FlashMLA 9241ae3's combine dispatch (``rules/flashmla.json``)."""
    p = _page_plan("flashmla-9241ae3")
    return {"max_parts": p.gen["combine"]["max_num_sm_parts"]}


@rule("FMLA008", facts=_facts(lambda p: p.is_decode and p.runs_attention, 'combine.max_num_sm_parts'), shape_only=True, added=8, page=combine_parts_page,
      title="more partitions than the combine kernel dispatches",
      failure=Failure("process_exit", "the combine dispatch has no case for num_sm_parts > 160 and calls exit(1)",
                      site="combine.cu:183"),
      source="FlashMLA 1408756 csrc/smxx/mla_combine.cu:154-174 and 9241ae3 "
             "csrc/smxx/decode/combine/combine.cu:165-185 (dispatch in steps of 32 up to 160 partitions, else an "
             "assertion that exits); the 2026.09.30 kernels up to 256 (read from the binary)",
      signatures=[
          {"library": "flashmla", "file": "combine.cu", "lines": [183, 183], "message": "Assertion (failed|error)",
           "failure": "process_exit",
           "builds": ["flashmla-9241ae3", "vllm-0.33", "vllm-0.34", "sgl-kernel-flashmla"],
           "source": "FlashMLA 9241ae3 csrc/smxx/decode/combine/combine.cu:183: the split-count dispatch has no case "
                     "above 160 and fails its assertion (exit(1), csrc/utils.h:17-23); vLLM 0.34's combine host code "
                     "is 0.33's"},
          {"library": "flashmla", "file": "mla_combine.cu", "lines": [172, 172], "message": "Assertion (failed|error)",
           "failure": "process_exit", "builds": ["flashmla-1408756"],
           "source": "FlashMLA 1408756 csrc/smxx/mla_combine.cu:172: the same dispatch assertion"},
      ])
def combine_parts(p: Plan):
    """``num_sm_parts <= {{max_parts}}``: the combine kernel is dispatched for at most {{max_parts}} partitions.

    ## What it checks
    ``num_sm_parts`` follows from the GPU's SM count and the call's shape; the combine kernel that
    merges split results has instantiations up to {{max_parts}} partitions. Only GPUs with more than {{max_parts}} SMs
    (or custom profiles) can reach it.

    ## Why it crashes
    No matching dispatch case: the library reports an error and calls ``exit(1)``.

    ## Example
    A custom profile with ``num_sms = 264`` and s_q = 1, h_q = 64.

    ## Fix
    None on the engine side short of a FlashMLA build with more combine instantiations.

    ## Source
    FlashMLA 9241ae3 ``combine.cu`` dispatch (read from source).
    """
    lim = p.gen["combine"]["max_num_sm_parts"]
    if p.num_sm_parts is None or p.num_sm_parts <= lim:
        return None
    return [combine_parts.rule.finding(
        f"num_sm_parts expected <= {lim}, got {p.num_sm_parts} ({p.implementation.parts_formula} with num_sms={p.gpu.num_sms})",
        subject=_subject(p), numbers={"num_sm_parts": p.num_sm_parts, "max": lim},
        fix="use a FlashMLA build whose combine kernel covers this many partitions")]


@rule("FMLA009", facts=('param_int_bits', 'oaccum'), shape_only=True, added=9,
      title="a tensor stride does not fit in int32",
      failure=Failure("python_exception", "stride check on the host", message="Stride exceeds int32 limit"),
      source="FlashMLA 9241ae3 csrc/api/ (int32 stride parameters), read from source",
      signatures=[
          {"library": "flashmla", "message": "Stride exceeds int32 limit", "failure": "python_exception", "builds": ["sgl-flash-mla-1.0.0"],
           "source": "measured on H200 with sgl-flash-mla 1.0.0 "
                     "(fixtures/measured/sglfm_h200_combine_grid_measured.json): a RuntimeError naming "
                     "csrc_legacy/api/common.h:115 inside its message, raised before any kernel runs"},
      ])
def int32_strides(p: Plan):
    """Every tensor stride of the call fits in int32.

    ## What it checks
    FlashMLA passes strides as 32-bit ints. The largest strides of a decode call are ``q``'s batch
    stride ``s_q*h_q*d_qk``, ``o_accum``'s row stride ``s_q*h_q*512``, ``indices``' batch stride
    ``s_q*topk`` and the KV block stride ``page*bytes_per_token``.

    ## Why it crashes
    A host-side check raises a Python exception (recoverable).

    ## Example
    ``s_q = 65536, h_q = 128``: ``o_accum`` row stride 2^32.

    ## Fix
    Fewer query tokens per request per call.

    ## Source
    FlashMLA 9241ae3 ``csrc/api/`` parameter structs (read from source).
    """
    c = p.call
    if not isinstance(c, DecodeCall):
        return None
    d_v = p.gen["oaccum"]["d_v"]
    strides = {
        "q.stride(0) = s_q*h_q*d_qk": c.s_q * c.h_q * c.d_qk,
        f"o_accum.stride(0) = s_q*h_q*{d_v}": c.s_q * c.h_q * d_v,
    }
    if c.kind == "sparse":
        strides["indices.stride(0) = s_q*topk"] = c.s_q * c.topk
        if c.extra_topk is not None:
            strides["extra_indices.stride(0) = s_q*extra_topk"] = c.s_q * c.extra_topk
        lay = p.gen["kv_layouts"].get(c.d_qk)
        bpt = c.bytes_per_token or (lay["bytes_per_token"] if lay else c.d_qk)
        strides["kv.stride(0) = page*bytes_per_token"] = c.page * bpt
    out = []
    limit = _int_max(p.gen["param_int_bits"])
    for name, v in strides.items():
        if v > limit:
            out.append(int32_strides.rule.finding(
                f"{name} expected <= {limit}, got {v}", subject=_subject(p),
                numbers={"stride": name, "value": v, "max": limit}, fix="fewer query tokens or heads per call"))
    return out


@rule("FMLA010", facts=_facts(lambda p: p.is_decode and p.runs_attention, ''), reads="rows", added=10,
      title="split-KV workspace larger than the GPU's memory",
      severity="warning",
      failure=Failure("python_exception", "CUDA out of memory while allocating lse_accum/o_accum",
                      message="CUDA out of memory|OutOfMemoryError"),
      source="FlashMLA 9241ae3 flash_mla_interface.py (fp32 lse_accum [b+P, s_q, h_q] and o_accum [b+P, s_q, h_q, "
             "512])",
      signatures=[
          {"library": "flashmla", "message": "CUDA out of memory|OutOfMemoryError", "failure": "python_exception",
           "source": "PyTorch's allocator raises torch.OutOfMemoryError when lse_accum/o_accum do not fit"},
      ])
def workspace(p: Plan):
    """The split-KV workspace must fit in GPU memory (a warning: the failure is recoverable).

    ## What it checks
    Each call allocates fp32 ``lse_accum [b+P, s_q, h_q]`` and ``o_accum [b+P, s_q, h_q, 512]``:
    ``(b+P)*s_q*h_q*2052`` bytes. It is compared with the GPU profile's memory when known
    (``memory_bytes``): a warning above it, an info line above a tenth of it.

    ## Why it crashes
    ``torch.OutOfMemoryError`` from the caching allocator - recoverable, but the step fails.

    ## Example
    b = 11622, s_q = 8, h_q = 128: 23 GiB of workspace.

    ## Fix
    Fewer query rows or query tokens per call.

    ## Source
    FlashMLA 9241ae3 ``flash_mla_interface.py`` (read from source).
    """
    nbytes = p.workspace_bytes
    if nbytes is None:
        return None
    mem = getattr(p.gpu, "memory_bytes", None)
    if mem and nbytes > mem:
        return [workspace.rule.finding(
            f"split-KV workspace expected <= {_fmt_bytes(mem)} (GPU memory), got {_fmt_bytes(nbytes)} ({nbytes} B)",
            subject=_subject(p), numbers={"workspace_bytes": nbytes, "gpu_memory_bytes": mem},
            fix="fewer query rows or query tokens per call")]
    if mem and nbytes > mem // 10:
        return [workspace.rule.finding(
            f"split-KV workspace is {_fmt_bytes(nbytes)} ({nbytes} B) for (b+P)={p.workspace_rows} rows, "
            f"over a tenth of the GPU's {_fmt_bytes(mem)}",
            subject=_subject(p), numbers={"workspace_bytes": nbytes}, severity="info",
            fix="make sure the allocator has this much free memory")]
    return None


@rule("FMLA011", facts=_facts(_dense, 'dense'), shape_only=True, added=11,
      title="dense decode outside its envelope (SM90 only, page block 64)",
      failure=Failure("python_exception"),
      source="FlashMLA 9241ae3 csrc/api/dense_decode.h, read from source")
def dense_envelope(p: Plan):
    """Dense decode runs only on SM90 with a page block size of 64.

    ## What it checks
    The dense (block-table) decode path exists for SM90 only, with 64-token KV pages.

    ## Why it crashes
    A Python exception from the host-side checks (recoverable).

    ## Example
    ``"kind": "dense", "page": 32``, or a dense call on a B200.

    ## Fix
    Use page size 64; on SM100 use the sparse path.

    ## Source
    FlashMLA 9241ae3 ``csrc/api/dense_decode.h`` (read from source).
    """
    c = p.call
    if not isinstance(c, DecodeCall) or c.kind != "dense":
        return None
    out = []
    archs = path_archs(p.gen, "dense")
    if p.gpu.arch not in archs:
        out.append(dense_envelope.rule.finding(
            f"dense decode expected an {sm_list(archs)} GPU, got {p.gpu.name} (sm{p.gpu.cc[0]}{p.gpu.cc[1]})", subject=_subject(p),
            numbers={"cc": list(p.gpu.cc)}, fix="use the sparse decode path on this GPU"))
    page = p.gen["dense"]["page_size"]
    if c.page != page:
        out.append(dense_envelope.rule.finding(
            f"dense page block size expected {page}, got {c.page}", subject=_subject(p),
            numbers={"field": "page", "expected": page, "got": c.page},
            fix=f"allocate the paged KV cache with {page}-token pages"))
    return out


@rule("FMLA012", facts=_facts(_sparse, 'sparse_requires'), shape_only=True, added=12,
      title="sparse decode needs an fp8 KV cache and causal=False",
      failure=Failure("python_exception"),
      source="FlashMLA 9241ae3 flash_mla_interface.py / csrc/api/sparse_decode.h, read from source")
def sparse_requirements(p: Plan):
    """Sparse decode needs ``is_fp8_kvcache=True`` and ``causal=False``.

    ## What it checks
    The sparse (indices) path reads an fp8 KV cache and ignores causality (indices define it).

    ## Why it crashes
    A Python exception from the interface's checks (recoverable).

    ## Example
    ``"kind": "sparse", "is_fp8": false``.

    ## Fix
    Quantize the KV cache to the fp8 layout; pass ``causal=False``.

    ## Source
    FlashMLA 9241ae3 ``flash_mla_interface.py`` (read from source).
    """
    c = p.call
    if not isinstance(c, DecodeCall) or c.kind != "sparse":
        return None
    out = []
    need = p.gen["sparse_requires"]
    fixes = {("is_fp8", True): "use the fp8 KV cache layout", ("is_fp8", False): "use a non-fp8 KV cache",
             ("causal", False): "pass causal=False; indices define what is attended", ("causal", True): "pass causal=True"}
    for field in ("is_fp8", "causal"):
        want, got = need[field], getattr(c, field)
        if got != want:
            out.append(sparse_requirements.rule.finding(
                f"{field} expected {str(want).lower()} for sparse decode, got {str(got).lower()}",
                subject=_subject(p), numbers={"field": field}, fix=fixes[field, want]))
    return out


@rule("FMLA013", facts=lambda p: ('', 'prefill_archs') if _prefill(p) else ('',), shape_only=True, added=13,
      title="no FlashMLA decode implementation for this GPU and shape",
      failure=Failure("python_exception", "unsupported architecture / shape", message="only supported on SM100f"),
      source="FlashMLA 9241ae3 csrc/api/sparse_decode.h and dense_decode.h (SM90 and SM100 only)",
      signatures=[
          {"library": "flashmla", "message": "only supported on SM100f", "failure": "python_exception",
           "builds": ["sgl-flash-mla-1.0.0", "flashmla-2026.09.30"],
           "source": "measured on H200 with sgl-flash-mla 1.0.0, use_legacy=False (oracle sglfm_h200_probes.jsonl): "
                     "RuntimeError naming the SM100f requirement"},
      ])
def implementation_exists(p: Plan):
    """There must be a decode implementation for the GPU's architecture and the call's shape.

    ## What it checks
    FlashMLA's decode kernels exist for SM90 (sparse and dense) and SM100 (sparse: head64, head64x2
    for h_q=128/d_qk=576, head128 for h_q=128/d_qk=512). A build's sparse prefill kernel runs on the
    architectures its ``prefill_archs`` lists (FlashMLA 9241ae3: SM90 and SM100,
    ``csrc/api/sparse_fwd.h:113-115``).

    ## Why it crashes
    A Python exception (unsupported architecture).

    ## Example
    A sparse decode on an A100 (sm80), or h_q = 96 on a B200.

    ## Fix
    Run on a supported GPU, or pad heads to a supported count.

    ## Source
    FlashMLA 9241ae3 ``csrc/api/sparse_decode.h``, ``dense_decode.h``.
    """
    c = p.call
    if isinstance(c, SparsePrefillCall):
        archs = p.gen.get("prefill_archs")
        if archs is None or p.gpu.arch in archs:
            return None
        return [implementation_exists.rule.finding(
            f"no sparse prefill implementation for {p.gpu.name} (sm{p.gpu.cc[0]}{p.gpu.cc[1]}) in {p.gen['build']}'s "
            f"{p.gen['name']} kernels; expected {sm_list(archs)}",
            subject=_subject(p), numbers={"cc": list(p.gpu.cc)},
            fix=p.gen.get("prefill_archs_fix", "use the build's kernels for this GPU (use_legacy=True on SM90)"),
            failure="python_exception: RuntimeError (kernel not built for this architecture), recoverable")]
    if not isinstance(c, DecodeCall) or p.implementation is not None:
        return None
    archs, arch = path_archs(p.gen, c.kind), p.gpu.arch
    if arch in archs:
        if any(row["path"] == c.kind and row["arch"] == arch and "h_q" not in row and "d_qk" not in row
               for row in p.gen["implementations"]):
            return None  # this arch dispatches every shape of the path; bad heads are FMLA005's crash
    elif c.kind == "dense":
        return None  # FMLA011 says it
    return [implementation_exists.rule.finding(
        f"no {c.kind} decode implementation for {p.gpu.name} (sm{p.gpu.cc[0]}{p.gpu.cc[1]}) with h_q={c.h_q}, d_qk={c.d_qk}",
        subject=_subject(p), numbers={"cc": list(p.gpu.cc), "h_q": c.h_q, "d_qk": c.d_qk},
        fix=f"use an {sm_list(archs)} GPU and a supported head count")]


def empty_prefill_signatures(tma_dump_builds: tuple) -> tuple:
    """The error lines of ``flash_mla_sparse_fwd`` with zero rows: FMLA014's, and SGL002's (the engine
    route that sends it an empty chunk). ``tma_dump_builds``: the builds the descriptor-dump line is
    recorded for."""
    return (
        {"library": "flashmla", "message": "TMA Desc Addr|Failed to initialize the TMA descriptor", "failure": "process_crash",
         "builds": list(tma_dump_builds), "require": {"zero_extent": True},
         "source": "measured on H200 with 9241ae3 (oracle flashmla_h200_sparse_prefill_probes.jsonl, s_q 0): a TMA "
                   "descriptor dump whose globalDim has a 0 extent (no rows), then SIGSEGV" + ("; 1408756 inferred from the same code"
                                                      if "flashmla-1408756" in tma_dump_builds else "")},
        {"library": "flashmla", "file": "phase1.cuh", "lines": [614, 614], "message": "CUDA_SUCCESS", "failure": "process_crash",
         "builds": ["flashmla-9241ae3"],
         "source": "FlashMLA 9241ae3 csrc/sm90/prefill/sparse/phase1.cuh:614: the host assertion on the encoded "
                   "TMA descriptor (read from source)"},
        {"library": "flashmla", "file": "phase1.cuh", "lines": [621, 621], "message": "CUDA_SUCCESS", "failure": "python_exception",
         "builds": ["sgl-flash-mla-1.0.0"],
         "source": "measured on H200 with sgl-flash-mla 1.0.0 (oracle sglfm_h200_probes.jsonl, 'legacy prefill "
                   "s_q=0'): RuntimeError for the assertion at phase1.cuh:621"},
    )


@rule("FMLA014", facts=_facts(_prefill, 'failures'), reads="rows", added=14,
      title="sparse prefill (flash_mla_sparse_fwd) with zero query rows",
      failure=Failure("process_crash", also=("python_exception",),
                      message="TMA Desc Addr|Failed to initialize the TMA descriptor",
                      text="process_crash on 9241ae3: SIGSEGV after printing a TMA descriptor dump; python_exception "
                           "on sgl-flash-mla 1.0.0 (RuntimeError at phase1.cuh:621)"),
      source="FlashMLA 9241ae3 flash_mla_sparse_fwd; measured on H200: s_q=0 crashes, 1..200000 run; sgl-flash-mla "
             "1.0.0 measured on H200 (sglfm_h200_probes)",
      signatures=empty_prefill_signatures(("flashmla-9241ae3", "flashmla-1408756")))
def sparse_prefill_rows(p: Plan):
    """``flash_mla_sparse_fwd`` needs at least one query row (and has no upper row limit).

    ## What it checks
    The sparse prefill kernel has no scheduler, so no shared-memory row limit (measured up to
    200000 rows), but an empty chunk (``s_q == 0``) must never reach it.

    ## Why it crashes
    With zero rows the TMA descriptor is invalid: the process prints a descriptor dump and dies
    with SIGSEGV.

    ## Example
    ``{"kind": "prefill", "s_q": 0, "h_q": 64, "d_qk": 512, "topk": 512}``.

    ## Fix
    Skip the call when a chunk has no rows.

    ## Source
    FlashMLA 9241ae3 ``flash_mla_sparse_fwd``; measured on an H200 (0 crashes; 1..200000 run).
    """
    c = p.call
    if not isinstance(c, SparsePrefillCall) or c.s_q > 0:
        return None
    return [sparse_prefill_rows.rule.finding("query rows expected >= 1, got 0", subject=_subject(p),
                                             numbers={"s_q": 0, "min": 1}, fix="do not launch the kernel for an empty chunk")]


@rule("FMLA023", facts=_facts(lambda p: _prefill(p) and "prefill_heads" in p.gen, 'prefill_heads'), shape_only=True,
      added=37, title="sparse prefill (flash_mla_sparse_fwd): query heads the build's prefill kernel takes",
      failure=Failure("python_exception", site="sparse_prefill.cpp:198", message="Unsupported h_q"),
      source="measured on an H200 with sgl-flash-mla 1.0.0: h_q 32 raises 'Unsupported h_q: 32', 64 and 128 run; "
             "vLLM 0.33's copy ran h_q 32 (fixtures/measured/h200_gap_probes.jsonl)",
      signatures=[{"library": "flashmla", "file": "sparse_prefill.cpp", "lines": [198, 198], "message": "Unsupported h_q",
                   "failure": "python_exception", "builds": ["sgl-flash-mla-1.0.0"],
                   "source": "measured on an H200 with sgl-flash-mla 1.0.0 (h200_gap_probes, prefill_h_q 32)"}])
def prefill_heads(p: Plan):
    """``flash_mla_sparse_fwd``: the query head counts a build's sparse prefill kernel is built for.

    ## What it checks
    Builds that list ``prefill_heads`` in their facts take only those ``h_q`` in the sparse prefill
    entry (FlashMLA 9241ae3 and sgl-flash-mla 1.0.0: 64 or 128). Builds without the fact are not
    judged here (vLLM 0.33's copy runs h_q 32).

    ## Why it crashes
    The entry refuses any other head count with a Python ``RuntimeError`` ('Unsupported h_q'); the
    step fails but the process lives.

    ## Example
    ``{"kind": "prefill", "s_q": 16, "h_q": 32, "d_qk": 512, "topk": 512}`` on sgl-flash-mla 1.0.0.

    ## Fix
    Pad the query heads to a supported count (64 or 128), or route the call to a build that takes it.

    ## Source
    Measured on an H200 with sgl-flash-mla 1.0.0 (``fixtures/measured/h200_gap_probes.jsonl``);
    FlashMLA 9241ae3 ``csrc/api/sparse_fwd.h:192-197`` (its entry picks a kernel for h_q 64 or 128).
    """
    c = p.call
    fact = p.gen.get("prefill_heads")
    if fact is None or not isinstance(c, SparsePrefillCall) or c.h_q in fact["h_q"]:
        return None
    return [prefill_heads.rule.finding(
        f"query heads expected {_or(fact['h_q'])} on {p.gen['build']}'s sparse prefill kernel, got {c.h_q}",
        subject=_subject(p), numbers={"h_q": c.h_q, "allowed": list(fact["h_q"])},
        fix=f"pad h_q to {_or(fact['h_q'])}", failure=fact["failure"])]


def sched_fallback_page() -> dict:
    """The numbers FMLA015's page quotes: sgl-flash-mla 1.0.0's fast scheduler on an H200."""
    p = _page_plan("sgl-flash-mla-1.0.0")
    return {"fast_rows": p.fast_sched_rows}


@rule("FMLA015", facts=_facts(lambda p: p.is_decode and p.falls_back, 'sched_smem.fallback', 'sched_smem'), reads="rows", added=15, page=sched_fallback_page,
      title="scheduler falls back to the low-shared-memory kernel (slow, legal)",
      severity="warning",
      source="sgl-flash-mla 1.0.0 legacy kernels and sgl-kernel's vendored copy; measured on H200 with sgl-flash-mla "
             "1.0.0")
def sched_fallback(p: Plan):
    """The scheduler does not fit in shared memory and this build falls back to a slow one (a warning).

    ## What it checks
    Builds with a low-shared-memory fallback (``sgl-flash-mla`` 1.0.0's legacy kernels, sgl-kernel's
    vendored copy) run the same schedule through a slower low-shared-memory scheduling kernel when the fast
    scheduler's shared memory (``4*(3b+1)`` bytes on sgl-flash-mla, b <= {{fast_rows}} on an H200) does not
    fit. The metadata is identical; the call is legal.

    ## Why it crashes
    It does not: it is a cliff in time. the fallback scheduler takes about 7-8x the fast path's
    device time per call (H200: 916 us at b = 19370, 7021 us at 19371, 21537 us at 60000), and a
    DeepSeek-V4 forward makes three calls. The build prints ``[WARNING] batch_size=N requires XB
    shared memory (max=232448B), using low-smem fallback kernel.``

    ## Example
    A 3 x 8192-token prefill (b = 24576) on sgl-flash-mla 1.0.0.

    ## Fix
    Keep forwards at or below the fast path's rows (``--chunked-prefill-size``) where step time
    matters; split as proposed.

    ## Source
    sgl-flash-mla 1.0.0 measured on an H200 (b up to 200000 ran; scheduler device time per b).
    """
    if not p.is_decode or not p.falls_back or not p.split_kv:
        return None
    need, limit = p.sched_smem_bytes, p.gpu.smem_optin
    if need <= limit:
        return None
    fb = p.gen["sched_smem"]["fallback"]
    fast = p.fast_sched_rows
    return [sched_fallback.rule.finding(
        f"query rows {p.call.b} exceed the fast scheduler's {fast} (expected {_smem_formula(p)} "
        f"<= {limit} B on {p.gpu.name}, got {need} B): {p.gen['build']} runs {fb['kernel']} instead; {fb['cost']}",
        subject=_subject(p), numbers={"b": p.call.b, "fast_b": fast, "smem_bytes": need, "smem_limit": limit},
        fix=f"keep calls at <= {fast} rows where step time matters (split the forward)")]


def static_batch_page() -> dict:
    """The numbers FMLA016's page quotes: the dense fp8 scheduler's array size (``rules/flashmla.json``)."""
    p = make_plan({"kind": "dense_fp8", "b": 1, "s_q": 1, "h_q": 128, "seqlens": [1]}, gpu="H200",
                  build="sgl-flash-mla-1.0.0")
    return {"max_b": p.gen["max_batch"]["max_b"]}


@rule("FMLA016", facts=_facts(lambda p: p.is_decode and bool(p.gen['sched_smem'].get('static')), 'max_batch'), reads="rows", added=16, page=static_batch_page,
      title="static scheduler arrays: more requests than the dense fp8 scheduler takes",
      failure=Failure("process_exit",
                      "the dense fp8 scheduler's assertion that the batch fits its static arrays fails "
                      "(dense_fp8/flash_fwd_mla_metadata.cu:74), exit code 1",
                      site="flash_fwd_mla_metadata.cu:74", message="batch_size < MaxBatchSize"),
      source="dense fp8 scheduler (fork's SM90 extension, vLLM's); measured on H200 with sgl-flash-mla 1.0.0: 4095 "
             "ok, 4096 exits",
      signatures=[
          {"library": "flashmla", "file": "flash_fwd_mla_metadata.cu", "lines": [74, 74], "message": "batch_size < MaxBatchSize",
           "failure": "process_exit",
           "source": "measured on H200 (oracle sglfm_h200_probes.jsonl): 'Assertion failed "
                     "(.../dense_fp8/flash_fwd_mla_metadata.cu:74): params.batch_size < MaxBatchSize', exit code 1"},
      ])
def static_batch(p: Plan):
    """A scheduler with static per-request arrays takes at most their size of requests.

    ## What it checks
    The dense fp8 path (``fwd_kvcache_mla_fp8``, scheduled by ``get_mla_decoding_metadata(...,
    is_fp8_kvcache=True)``) runs FlashMLA's first-generation scheduler, whose per-request arrays
    have a fixed size: b <= {{max_b}}.

    ## Why it crashes
    The scheduler's assertion that the batch fits its static arrays fails (reported at
    ``dense_fp8/flash_fwd_mla_metadata.cu:74``) and the process exits with code 1.

    ## Example
    ``{"kind": "dense_fp8", "b": 4096, "s_q": 1, "h_q": 128, "seqlens": [...]}``.

    ## Fix
    Keep dense fp8 decode batches at <= {{max_b}} requests (``--max-running-requests``), or split.

    ## Source
    Measured on an H200 with sgl-flash-mla 1.0.0: 4095 ok, 4096 exits.
    """
    lim = p.gen.get("max_batch")
    if lim is None or not p.is_decode or p.call.b <= lim["max_b"]:
        return None
    return [static_batch.rule.finding(
        f"{p.call.b} requests exceed the scheduler's static arrays; expected b <= {lim['max_b']}, got {p.call.b}",
        subject=_subject(p), numbers={"b": p.call.b, "max_b": lim["max_b"]},
        fix=f"split into calls of <= {lim['max_b']} requests", failure=lim["failure"])]


def combine_grid_page() -> dict:
    """The numbers FMLA017's page quotes: CUDA's grid limits (``rules/gpus.json``) and what they allow
    on 1408756's grid (``ceil(s_q*h_q/heads per block)`` on y)."""
    lim = grid_limits()
    per = _page_plan("flashmla-1408756").gen["combine_heads_per_block"]
    return {"grid_y": lim["y"], "grid_z": lim["z"], "y_heads": lim["y"] * per,
            "s_q_128": lim["y"] * per // 128, "s_q_64": lim["y"] * per // 64}


@rule("FMLA017", facts=_facts(lambda p: p.is_decode and p.runs_attention, 'combine.grid', 'combine_heads_per_block'), reads="rows", added=25, page=combine_grid_page,
      title="combine kernel launch grid exceeds CUDA's grid limits (s_q*h_q/8 on gridDim.y before upstream PR #182)",
      failure=Failure("process_exit",
                      "the combine launch is refused (a grid dimension over its limit: 'invalid configuration "
                      "argument' or 'invalid argument'); the error check prints 'CUDA error "
                      "(.../mla_combine.cu:201)' (1408756) or '(.../combine.cu:210)' (9241ae3) and calls exit(1)",
                      site="mla_combine.cu:201", message="invalid (configuration )?argument"),
      source="FlashMLA 1408756 csrc/smxx/mla_combine.cu:192 (grid (b, ceil(s_q*h_q/8), 1)), :201 (check); 9241ae3 "
             "(PR #182) csrc/smxx/decode/combine/combine.cu:203 (grid (b*s_q, 1, ceil(h_q/8))), :210; 2026.09.30 "
             "kernels grid (b, s_q, ceil(h_q/8)) read from the binary; sgl-kernel's fork (sgl-project/FlashMLA "
             "9804b12) csrc/smxx/decode/combine/combine.cu:202 (grid (b, s_q, ceil(h_q/8))), :209; sgl-flash-mla "
             "1.0.0 legacy kernels: grid (b*s_q, 1, ceil(h_q/8)) measured on H200 from the CUDA kernel trace, no "
             "launch refused up to s_q 65535 (fixtures/measured/sglfm_h200_combine_grid_measured.json): no grid "
             "limit below b*s_q = 2^31-1",
      signatures=[
          {"library": "flashmla", "file": "mla_combine.cu", "lines": [201, 201], "message": "invalid (configuration )?argument",
           "failure": "process_exit", "builds": ["flashmla-1408756"],
           "source": "FlashMLA 1408756 csrc/smxx/mla_combine.cu:192 (grid), :201 (the launch check that prints and "
                     "exits)"},
          {"library": "flashmla", "file": "combine.cu", "lines": [210, 210], "message": "invalid (configuration )?argument",
           "failure": "process_exit", "builds": ["flashmla-9241ae3"],
           "source": "FlashMLA 9241ae3 csrc/smxx/decode/combine/combine.cu:203 (grid), :210 (the launch check)"},
          {"library": "flashmla", "file": "combine.cu", "lines": [209, 209], "message": "invalid (configuration )?argument",
           "failure": "process_exit", "builds": ["sgl-kernel-flashmla"],
           "source": "sgl-kernel's FlashMLA fork 9804b12 csrc/smxx/decode/combine/combine.cu:202 (grid), :209 (the "
                     "launch check)"},
          {"library": "flashmla", "file": "combine.cu", "message": "invalid (configuration )?argument", "failure": "process_exit",
           "builds": ["flashmla-2026.09.30", "sgl-flash-mla-1.0.0", "vllm-0.33", "vllm-0.34"],
           "source": "the combine kernel's launch check of the 2026.09.30 kernels, sgl-flash-mla 1.0.0 and vLLM 0.33 "
                     "and 0.34 (file named, line not recorded)"},
      ])
def combine_grid(p: Plan):
    """The combine kernel's launch grid must fit CUDA's grid limits (x < 2^31, y <= {{grid_y}}, z <= {{grid_z}}).

    ## What it checks
    The kernel that merges split results is launched with one CTA per (request, query token, 8 heads),
    laid out differently per build. FlashMLA ``1408756`` (and every build before upstream PR #182)
    puts ``ceil(s_q*h_q/8)`` on the grid's y dimension, so ``s_q*h_q <= {{y_heads}}``: ``s_q <= {{s_q_128}}`` at
    ``h_q = 128``, ``s_q <= {{s_q_64}}`` at ``h_q = 64``. ``9241ae3`` (PR #182 itself) launches
    ``(b*s_q, 1, ceil(h_q/8))``: ``b*s_q <= 2^31-1``. The current kernels (2026.09.30) launch
    ``(b, s_q, ceil(h_q/8))``: ``s_q <= {{grid_y}}``, as does sgl-kernel's fork (9804b12, before PR #182).
    sgl-flash-mla 1.0.0's legacy kernels (``use_legacy=True``) launch ``(b*s_q, 1, ceil(h_q/8))``, as
    measured on an H200: no grid limit below ``b*s_q = 2^31-1``, which no GPU's memory reaches (its
    int32 strides, FMLA009, stop ``s_q`` at 65535 first). Only split-KV attention calls run the
    combine (on sgl-flash-mla 1.0.0 measured: also when no request is split); builds whose grid is
    not recorded (vLLM 0.33's bundled copy) are not judged.

    ## Why it crashes
    The launch is refused (``invalid configuration argument``); the library's error check prints
    ``CUDA error (.../mla_combine.cu:201)`` (1408756) or ``(.../combine.cu:210)`` (9241ae3) and
    calls ``exit(1)``: the serving process dies.

    ## Example
    ``{"kind": "sparse", "b": 1, "s_q": 4096, "h_q": 128, "d_qk": 576, "topk": 128}`` on
    ``flashmla-1408756``: 4096 x 128 / 8 = 65536 blocks on y.

    ## Fix
    Fewer query tokens per request per call (split ``s_q``), or a build whose combine grid puts the
    large dimension on x (9241ae3 and later, sgl-flash-mla 1.0.0's legacy kernels).

    ## Source
    FlashMLA 1408756 ``csrc/smxx/mla_combine.cu:192`` (grid) and ``:201`` (check); 9241ae3
    ``csrc/smxx/decode/combine/combine.cu:203`` and ``:210``; sgl-project/FlashMLA 9804b12
    ``csrc/smxx/decode/combine/combine.cu:202`` and ``:209``; current kernels from the binary;
    sgl-flash-mla 1.0.0 (legacy) measured on an H200, launch grids from the CUDA kernel trace
    (``fixtures/measured/sglfm_h200_combine_grid_measured.json``).
    """
    grid = p.combine_grid if p.is_decode else None
    if grid is None:
        return None
    lim = grid_limits()
    if grid[0] <= lim["x"] and grid[1] <= lim["y"] and grid[2] <= lim["z"]:
        return None
    name = p.gen["combine"]["grid"]
    labels = [x.format(m=p.gen["combine_heads_per_block"]) for x in COMBINE_GRIDS[name][1]]
    c = p.call
    out = []
    for axis, value, label in zip("xyz", grid, labels):
        top = lim[axis]
        if value <= top:
            continue
        out.append(combine_grid.rule.finding(
            f"combine grid dimension {axis} = {label} expected <= {top} on {p.gen['build']}, got {value} "
            f"(b={c.b}, s_q={c.s_q}, h_q={c.h_q})",
            subject=_subject(p),
            numbers={"axis": axis, "value": value, "max": top, "b": c.b, "s_q": c.s_q, "h_q": c.h_q},
            fix="fewer query tokens per request (s_q) or requests per call, so that "
                f"{label} <= {top}; or a build whose combine grid has room for it",
            failure=p.gen["combine"].get("grid_failure")))
    return out


@rule("FMLA018", facts=(), subject=REUSE_KIND, added=26,
      title="FlashMLASchedMeta reused after the shapes or per-request lengths it was planned for changed",
      failure=Failure("silent_wrong",
                      "a schedule planned for other per-row lengths (topk_length, extra_topk_length, cache_seqlens) "
                      "or another enable_batch_invariant is used unchecked on every build; a changed compared shape "
                      "field (b, s_q, h_q, h_k, page sizes, topk, extra_topk, causal, fp8) is a python_exception "
                      "(AssertionError) on the builds with FlashMLASchedMeta",
                      also=("python_exception",), site="flash_mla_interface.py",
                      message="sched_meta\\.config\\.\\w+ must be equal to"),
      source="FlashMLA 9241ae3 flash_mla/flash_mla_interface.py:115-149 (the first call fills FlashMLASchedMeta; "
             "later calls compare only the shape fields at :139-149); 1408756 returns plain metadata tensors "
             "(nothing compared); 2026.09.30 kernels: length values not compared (flashmla-builds.md section 3, read "
             "from the binary)",
      signatures=[
          {"library": "flashmla", "file": "flash_mla_interface.py", "message": "sched_meta\\.config\\.\\w+ must be equal to",
           "failure": "python_exception",
           "source": "FlashMLA flash_mla_interface.py:139-149: the schedule's recorded configuration compared with "
                     "the call's"},
      ])
def sched_meta_reuse(s: ReuseCheck):
    """A schedule may be reused only for a call that needs exactly that schedule.

    ## What it checks
    ``get_mla_metadata()`` returns an empty ``FlashMLASchedMeta``; the first
    ``flash_mla_with_kvcache`` call fills it and later calls reuse it. On reuse the library compares
    only shape fields (b, s_q, h_q, page sizes, h_k, causal, fp8, topk, extra_topk). The values of
    ``topk_length`` / ``extra_topk_length`` (dense: ``cache_seqlens``) and ``enable_batch_invariant``
    are not compared, yet the schedule depends on them. The check compares the scheduler's output
    for both calls; 1408756's plain metadata tensors are compared on nothing.

    ## Why it crashes
    A changed shape field: a Python ``AssertionError`` (recoverable). Changed lengths: the kernels run
    the stale partitions: blocks past the planned lengths are never attended and splits are merged
    by the old ``num_splits`` - silently wrong attention, or reads past the buffers when b grew.

    ## Example
    Planned with ``topk_length = [64] * 4``, reused with ``[512] * 4`` (topk 512): each request needs 8
    blocks, the schedule covers 1.

    ## Fix
    Make a new ``FlashMLASchedMeta`` (call ``get_mla_metadata()``) whenever the lengths, shapes or
    ``enable_batch_invariant`` change, e.g. once per forward and per layer group of equal lengths.

    ## Source
    FlashMLA 9241ae3 ``flash_mla/flash_mla_interface.py:139-149``; current kernels: lengths not compared
    (flashmla-builds.md section 3).
    """
    changed = s.changed_fields()
    checks = s.gen.get("sched_meta_checks", {})
    if changed:
        return [sched_meta_reuse.rule.finding(
            f"{name} expected {a} (the value the schedule was planned for), got {b}", subject=s.label or s.summary(),
            numbers={"field": name, "planned": a, "reused": b}, failure=checks.get("failure") or None,
            fix="make a new FlashMLASchedMeta for this call (get_mla_metadata())") for name, a, b in changed]
    inv = s.planned.call.enable_batch_invariant != s.reused.call.enable_batch_invariant
    if not inv and not s.schedules_differ():
        return None
    what = "enable_batch_invariant" if inv else "per-row lengths (topk_length / extra_topk_length / cache_seqlens)"
    a, b = s.planned.schedule, s.reused.schedule
    got = f"planned num_splits total {a.total_splits if a else 0}, needed {b.total_splits if b else 0}"
    return [sched_meta_reuse.rule.finding(
        f"the reused call needs another schedule: {what} changed on {s.gen['build']}; expected the schedule "
        f"it was planned with, got a different one ({got})",
        subject=s.label or s.summary(), numbers={"changed": what},
        fix="make a new FlashMLASchedMeta whenever the lengths change (the library does not compare them)")]


@rule("FMLA019", facts=(), subject=INDICES_KIND, added=27,
      title="sparse decode index outside the KV cache (only exactly -1 is skipped)",
      failure=Failure("illegal_memory_access",
                      "an index other than -1 outside [0, num_blocks*page_size) is turned into a block and row "
                      "offset unchecked and read (reported later, e.g. at combine.cu), or silently wrong attention "
                      "when the address happens to be mapped",
                      site="combine.cu", message="illegal memory access"),
      source="FlashMLA 9241ae3 csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:531-539 (positions past topk_length "
             "become -1 on MODEL1; -1 maps to block 0; every other value is divided by the page size as unsigned and "
             "dereferenced); 1408756 csrc/sm90/decode/sparse_fp8/splitkv_mla.cu:484-522; current kernels: only -1 "
             "skipped (flashmla-builds.md section 3)",
      signatures=[
          {"library": "flashmla", "file": "combine.cu", "message": "illegal memory access", "failure": "illegal_memory_access",
           "source": "an out-of-range decode index reads out of bounds in the split-KV kernel (9241ae3 "
                     "splitkv_mla.cuh:531-539); the sticky error surfaces at the combine kernel's check"},
          {"library": "flashmla", "file": "splitkv_mla.cuh", "message": "illegal memory access", "failure": "illegal_memory_access",
           "source": "the same read reported at the split-KV kernel's own check"},
      ])
def decode_indices(s: IndicesCheck):
    """Sparse decode indices must be ``-1`` or a token slot of the KV cache.

    ## What it checks
    Every index the kernel reads (all of a row, or its first ``topk_length`` on MODEL1) is either
    exactly ``-1`` (skipped) or in ``[0, num_blocks * page_size)``.

    ## Why it crashes
    The kernels do not bounds-check indices. ``-1`` is skipped; any other value outside the pool
    (``-2``, the largest int32, a slot of another pool) is turned into a block and a row and read:
    an illegal memory access (reported at a later CUDA check, e.g. ``combine.cu``), or
    silently wrong attention when the address is mapped.

    ## Example
    Padding rows filled with the largest int32 instead of ``-1``; indices built for a larger pool.

    ## Fix
    Fill unused index slots with ``-1`` and keep indices below the pool's ``num_blocks * page_size``.

    ## Source
    FlashMLA 9241ae3 ``csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:531-539``; 1408756
    ``csrc/sm90/decode/sparse_fp8/splitkv_mla.cu:484-522``; current kernels skip only -1
    (flashmla-builds.md section 3).
    """
    bad = s.bad()
    if not bad.any():
        return None
    flat = s.indices.reshape(bad.shape)
    row, pos = (int(x) for x in np.argwhere(bad)[0])
    v = int(flat[row, pos])
    return [decode_indices.rule.finding(
        f"indices[{row}][{pos}] expected -1 or 0..{s.num_kv_tokens - 1}, got {v} ({int(bad.sum())} value(s) outside the cache)",
        subject=s.label or f"decode indices row {row}",
        numbers={"row": row, "position": pos, "value": v, "num_kv_tokens": s.num_kv_tokens, "count": int(bad.sum())},
        fix="fill unused index slots with -1 and keep indices below num_blocks * page_size")]


@rule("FMLA020", facts=_facts(lambda p: _dense_fp8(p) and p.runs_attention, 'empty_row_read'), reads="lengths", added=34,
      title="dense fp8 attention (fwd_kvcache_mla_fp8): a request with cache_seqlens 0 (a CUDA-graph padding row) "
            "reads the block-table entry before its row and the page it names",
      failure=Failure("undefined_behaviour",
                      "a request with cache_seqlens 0 starts one block before its first: the kernel reads the "
                      "block-table entry just before its row (the previous row's last entry; before the table for "
                      "row 0) and loads K from the page it names: a page outside the pool is an out-of-bounds "
                      "read (-1: silent, memcheck reports it; far outside: an illegal memory access)",
                      also=("illegal_memory_access",), message="illegal memory access"),
      source="vllm-project/FlashMLA 46d64a8 csrc/extension/sm90/dense_fp8/flash_fwd_mla_kernel.h:292, :414-415, "
             ":455-458; measured on an H200 with vLLM 0.33 under compute-sanitizer (the previous row's last entry "
             "decides: -1 there is an invalid read, a valid page is not; a page 2^20 past the pool crashes)",
      signatures=[
          {"library": "flashmla", "message": "illegal memory access", "failure": "illegal_memory_access",
           "builds": ["sgl-flash-mla-1.0.0", "vllm-0.33", "vllm-0.34"],
           "source": "measured on an H200 with vLLM 0.33 and 0.34 (fixtures/measured/vllm033_h200_densefp8_padding_"
                     "memcheck_probes.jsonl, vllm034_h200_densefp8_padding_probes.jsonl): length-0 rows after a row "
                     "whose last block-table entry is 2^20"},
      ])
def empty_dense_row(p: Plan):
    """Dense fp8 decode: a request with ``cache_seqlens`` 0 reads the page its neighbour's last block names.

    ## What it checks
    The dense fp8 attention kernel (``fwd_kvcache_mla_fp8``, FlashMLA's first-generation kernel; a
    ``dense_fp8`` record with ``"entry": "fwd_kvcache_mla_fp8"``) is judged for requests of length 0,
    which engines create when they pad a batch up to a captured CUDA graph. The first-generation
    scheduler still places a 0-block request in a partition; the metadata op alone is fine with it.
    With the call's ``block_table`` (and ``num_blocks``, the pool's pages) the rule decides each
    empty request from the entry it reads; without them it flags every empty request.

    ## Why it crashes
    For an empty request the kernel's first block is one before the request's first block: it reads
    the block-table entry just before the request's row, which is the previous request's last entry
    (for request 0, the word before the table), and loads a 64-token tile of K from that page. A
    valid page there is harmless (the result is masked); -1 (what CUDA-graph padding writes) is the
    page before the KV pool: an out-of-bounds read that a plain run does not notice and memcheck
    reports; a page far outside the pool is an illegal memory access that kills the process. For
    request 0 the page is whatever memory precedes the table: on the same layout, measured an
    illegal memory access with sgl-flash-mla 1.0.0 and with vLLM 0.34's copy, and nothing with vLLM
    0.33's, whose dense fp8 extension is the same binary: the word differs from run to run.

    ## Example
    ``{"kind": "dense_fp8", "entry": "fwd_kvcache_mla_fp8", "b": 4, "s_q": 1, "h_q": 128,
    "seqlens": [900, 12, 0, 0]}`` with padding rows of -1: request 3 reads request 2's -1.

    ## Fix
    Give padding rows ``cache_seqlens = 1`` and a valid dummy page in every block-table entry (or
    trim them); with length-0 rows, keep the last entry of the row before each one a valid page.

    ## Source
    vllm-project/FlashMLA 46d64a8 ``csrc/extension/sm90/dense_fp8/flash_fwd_mla_kernel.h:292``,
    ``:414-415``, ``:455-458``; measured on an H200 with vLLM 0.33 (13 padding layouts, plain and
    under compute-sanitizer memcheck).
    """
    c = p.call
    fact = p.gen.get("empty_row_read")
    if fact is None or not isinstance(c, DecodeCall) or c.entry != fact["entry"] or c.seqlens is None \
            or not c.seqlens.shape[0]:
        return None
    empty = np.flatnonzero(c.seqlens == 0)
    if not empty.shape[0]:
        return None
    build = p.gen["build"]
    if c.block_table is None:
        i = int(empty[0])
        return [empty_dense_row.rule.finding(
            f"request {i} cache_seqlens expected >= 1 on {build}'s dense fp8 kernel, got 0 ({empty.shape[0]} empty "
            f"request(s)): it reads the block-table entry before its row and loads that page; give block_table "
            f"(and num_blocks) to decide whether that page is inside the pool",
            subject=f"{_subject(p)} request {i}", numbers={"request": i, "count": int(empty.shape[0])},
            fix="pad CUDA-graph rows with cache_seqlens 1 and a valid dummy page, or trim them",
            failure=fact["failure"])]
    out = []
    pool = c.num_blocks
    bad = []
    for i in (int(r) for r in empty):
        if i == 0:
            continue                       # the word before the table: not known from the call (see below)
        page = int(c.block_table[i - 1, -1])
        if page < 0 or (pool is not None and page >= pool):
            bad.append((i, page))
    if bad:
        i, page = bad[0]
        far = page >= (pool or 0) and page >= 0
        where = f"past the pool of {pool} pages" if far else "before the KV pool"
        out.append(empty_dense_row.rule.finding(
            f"request {i} has cache_seqlens 0 and reads page {page} (request {i - 1}'s last block-table entry): "
            f"expected a page in 0..{(pool - 1) if pool else 'num_blocks-1'}, got {page}, {where} "
            f"({len(bad)} such request(s))",
            subject=f"{_subject(p)} request {i}", numbers={"request": i, "page": page, "count": len(bad)},
            fix=f"make request {i - 1}'s last block-table entry a valid page, or pad with cache_seqlens 1 and "
                f"valid pages",
            failure=("illegal_memory_access: a page past the pool (measured: 2^20 past a 15-page pool crashes both builds)"
                     if far else "undefined_behaviour: an out-of-bounds read of the page before the KV pool, silent in "
                     "some runs (compute-sanitizer memcheck reports it) and an illegal_memory_access in others "
                     "(measured on vLLM 0.33, vLLM 0.34 and sgl-flash-mla 1.0.0)")))
    if empty[0] == 0:
        out.append(empty_dense_row.rule.finding(
            "request 0 has cache_seqlens 0: it reads the word before the block table as a page number, whatever "
            "memory holds there (expected a request of >= 1 token first, got 0; measured in the same layout: an "
            "illegal memory access with sgl-flash-mla 1.0.0 and with vLLM 0.34's copy, nothing reported with vLLM "
            "0.33's, the same binary as 0.34's)",
            subject=f"{_subject(p)} request 0", numbers={"request": 0},
            fix="put a non-empty request first, or pad with cache_seqlens 1 and valid pages",
            failure="undefined_behaviour: the page is whatever word precedes the block table (measured: an "
                    "illegal_memory_access on sgl-flash-mla 1.0.0 and vLLM 0.34, silent on vLLM 0.33)"))
    return out or None


@rule("FMLA022", facts=_facts(lambda p: _dense_fp8(p) and p.runs_attention, 'page_range'), reads="lengths", added=36,
      title="dense fp8 attention (fwd_kvcache_mla_fp8): a request's block-table entries within its length must be "
            "pages of the pool",
      failure=Failure("undefined_behaviour",
                      "the kernel loads K from every page a request's length covers: -1 reads the page before the "
                      "pool (silent, memcheck reports it), a page past the pool can be an illegal memory access",
                      also=("illegal_memory_access",)),
      source="measured on an H200 with vLLM 0.33 under compute-sanitizer: requests of length 1 whose block table "
             "is -1 (padding with length 1) are invalid reads")
def dense_fp8_pages(p: Plan):
    """Dense fp8 decode: every page a request's ``cache_seqlens`` covers is a page of the KV pool.

    ## What it checks
    With the call's ``block_table`` (and ``num_blocks``), the first ``ceil(cache_seqlens / page)``
    entries of each request's row are pages in ``0 .. num_blocks-1`` (``>= 0`` without
    ``num_blocks``).

    ## Why it crashes
    The kernel loads each page the request's length covers. A -1 entry (the padding engines write)
    is the page before the pool: an out-of-bounds read that a plain run does not notice and
    compute-sanitizer's memcheck reports; a page far past the pool is an illegal memory access.

    ## Example
    ``"seqlens": [900, 12, 1, 1]`` with rows 2 and 3 of the block table -1: padding with length 1 and
    no valid page.

    ## Fix
    Point padding rows at a valid dummy page.

    ## Source
    Measured on an H200 with vLLM 0.33 (``fixtures/measured/vllm033_h200_densefp8_padding_memcheck_probes.jsonl``).
    """
    c = p.call
    fact = p.gen.get("page_range")
    if fact is None or not isinstance(c, DecodeCall) or c.entry != fact["entry"] or c.block_table is None:
        return None
    width = c.block_table.shape[1]
    used = np.minimum(-(-c.seqlens // c.page), width)
    cols = np.arange(width)[None, :] < used[:, None]
    pool = c.num_blocks
    bad = cols & ((c.block_table < 0) | ((c.block_table >= pool) if pool is not None else False))
    rows = np.flatnonzero(bad.any(axis=1))
    if not rows.shape[0]:
        return None
    i = int(rows[0])
    j = int(np.flatnonzero(bad[i])[0])
    page = int(c.block_table[i, j])
    return [dense_fp8_pages.rule.finding(
        f"request {i} block_table[{j}] expected a page in 0..{(pool - 1) if pool else 'num_blocks-1'} "
        f"(its {int(c.seqlens[i])} tokens cover {int(used[i])} page(s)), got {page} ({rows.shape[0]} request(s))",
        subject=f"{_subject(p)} request {i}", numbers={"request": i, "entry": j, "page": page,
                                                       "count": int(rows.shape[0])},
        fix="point every entry a request's length covers at a page of the pool (a dummy page for padding)")]
