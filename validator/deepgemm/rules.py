"""DG0xx: limits of DeepGEMM's paged MQA-logits metadata (the DSA indexer's scheduler)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..legality.failure import Failure
from ..facts.knowledge import load, sm_name
from ..legality.registry import rule
from . import RULE_KIND

if TYPE_CHECKING:
    from .calls import DeepGemmPlan


def mqa_metadata_page() -> dict:
    """The numbers DG001's page quotes: each version's batch limit (``rules/deepgemm.json``) on an H200
    (SM90) and a B200 (SM100), the static-array limit, and SGLang 0.5.23's replacement threshold."""
    from .calls import plan, version     # (the calls module loads with the first DeepGEMM call)

    rec = {"kind": "paged_mqa_logits_metadata", "batch": 1}
    sm100 = plan(rec, "B200", "deepgemm-54e2261").max_batch
    data = load("deepgemm")
    return {"sm90_rows": plan(rec, "H200", "deepgemm-54e2261").max_batch,
            "varlen_rows": plan({**rec, "varlen": True}, "H200", "deepgemm-88965b0").max_batch,
            "static_sm90_rows": plan(rec, "H200", "deepgemm-7f2a703").max_batch,
            "static_sm100_rows": plan(rec, "B200", "deepgemm-7f2a703").max_batch,
            "static_sm100_limit": version("deepgemm-7f2a703")["metadata"]["10"]["static_smem_limit"],
            "sm100_rows": sm100, "sm100_example": sm100 + 1,
            "static_example": plan(rec, "H200", "deepgemm-7f2a703").max_batch + 1,
            "capacity": version("deepgemm-54e2261")["smem_capacity"],
            "threshold": data["callers"]["sglang-0.5.23"]["replacement_threshold"]}


#: what each limit is, as a finding says it
_LIMIT_WORDS = {
    "host": ("shared memory", "DeepGEMM's capacity"),
    "static": ("static shared memory (a __shared__ array sized by the batch at JIT time)", "ptxas's static limit"),
    "launch": ("static plus dynamic shared memory", "the GPU's opt-in maximum"),
}
_LIMIT_FAILURE = {"host": "failure", "static": "static_failure", "launch": "launch_failure"}


@rule("DG001", page=mqa_metadata_page, reads="rows", subject=RULE_KIND, added=33,
      facts=("metadata.{layout}", "metadata.{layout}.static_smem_limit", "smem_capacity"),
      title="DeepGEMM paged MQA-logits metadata: batch above the scheduler's shared-memory budget",
      failure=Failure("python_exception",
                      "DeepGEMM's host assertion 'Assertion error (.../<impl>.hpp:N): smem_size <= "
                      "SM90ArchSpec::smem_capacity' (or SM100ArchSpec) raises, or (7f2a703's static array) the JIT "
                      "compile ('Assertion error (.../compiler.hpp:228): false and \"NVCC compilation failed\"') or "
                      "the launch's shared-memory attribute ('CUDA driver error (.../handle.hpp:178)') fails; the DSA "
                      "indexer step fails",
                      also=("process_crash",), site="sm90_fp8_mqa_logits.hpp",
                      message="smem_size <= SM90ArchSpec::smem_capacity"),
      source="DeepGEMM 54e2261 csrc/jit_kernels/impls/sm90_fp8_mqa_logits.hpp:210-212 (4*align(b,32) bytes), "
             "csrc/jit_kernels/impls/sm100_mqa_logits.hpp:64-65 (8*b bytes), csrc/jit_kernels/heuristics/sm90.hpp:14 "
             "/ sm100.hpp:15 (232448); 88965b0 and 7f2a703 csrc/jit_kernels/impls/smxx_fp8_fp4_paged_mqa_logits.hpp; "
             "7f2a703 deep_gemm/include/deep_gemm/scheduler/paged_mqa_logits.cuh:28 (static __shared__ array), "
             "csrc/jit/compiler.hpp:225-229 (the JIT compile's failure), csrc/jit/handle.hpp:175-187 (the launch); "
             "SGLang 0.5.23 srt/layers/attention/dsv4/metadata.py:66, :212-218 (replacement planner)",
      signatures=[
          {"library": "deepgemm", "file": "sm90_fp8_mqa_logits.hpp", "message": "smem_size <= SM90ArchSpec::smem_capacity",
           "failure": "python_exception", "builds": ["deepgemm-54e2261"]},
          {"library": "deepgemm", "file": "sm100_mqa_logits.hpp", "message": "smem_size <= SM100ArchSpec::smem_capacity",
           "failure": "python_exception", "builds": ["deepgemm-54e2261"]},
          {"library": "deepgemm", "file": "smxx_fp8_fp4_paged_mqa_logits.hpp", "message": "smem_size <= SM(90|100)ArchSpec::smem_capacity",
           "failure": "python_exception", "builds": ["deepgemm-88965b0", "deepgemm-7f2a703"]},
          {"library": "deepgemm", "message": "paged_mqa_logits_metadata\\w*' uses too much shared data",
           "failure": "python_exception", "builds": ["deepgemm-7f2a703"], "require": {"memory": "shared"},
           "source": "7f2a703 deep_gemm/include/deep_gemm/scheduler/paged_mqa_logits.cuh:28 (the metadata kernel's "
                     "static __shared__ array): ptxas's 'Entry function ... uses too much shared data' in the output "
                     "DeepGEMM prints before 'NVCC compilation failed' (csrc/jit/compiler.hpp:225-229)"},
      ])
def mqa_metadata_smem(p: DeepGemmPlan):
    """DeepGEMM's paged MQA-logits metadata kernel keeps per-request arrays in shared memory.

    ## What it checks
    ``get_paged_mqa_logits_metadata`` asks for ``4*align(b, 32)`` bytes (DeepGEMM up to 7f2a703, and
    SM90 in 54e2261: b <= {{sm90_rows}}), ``4*(3*align(b, 32)+1)`` with varlen indices (88965b0: b <= {{varlen_rows}}),
    or ``8*b`` on SM100 in 54e2261 (b <= {{sm100_rows}}), against DeepGEMM's own capacity of {{capacity}} bytes.
    Up to 7f2a703 the kernel keeps its prefix sums in a static ``__shared__`` array sized by the batch
    as a template constant and asks for the same bytes again as dynamic shared memory: the launch
    needs both within the GPU's opt-in maximum (``8*align(b, 32)``: b <= {{static_sm90_rows}} on SM90), and on
    SM100, where the JIT compiles for the family target ``sm_100f`` (NVCC 12.9 and newer), ptxas
    refuses a static array above {{static_sm100_limit}} bytes (b <= {{static_sm100_rows}}).
    ``b`` is ``context_lens.size(0)``: requests. SGLang 0.5.23's DeepSeek-V4 indexer replaces the call by its own JIT planner (no shared-memory bound) when each request has one query row and the
    forward has more than {{threshold}} rows (or ``SGLANG_OPT_USE_JIT_INDEXER_METADATA`` is set); with
    several rows per request (speculative verify) DeepGEMM's planner always runs.

    ## Why it crashes
    DeepGEMM's host assertion ``smem_size <= SM90ArchSpec::smem_capacity`` (or ``SM100ArchSpec``)
    throws: ``Assertion error (.../sm100_mqa_logits.hpp:65): ...`` - a Python ``RuntimeError``; the
    indexer step fails. With 7f2a703's static array the host check passes and either the JIT compile
    fails (SM100: ptxas prints ``uses too much shared data (0x... bytes, 0xc000 max)`` and DeepGEMM raises
    ``Assertion error (.../compiler.hpp:228): false and "NVCC compilation failed"``) or the launch refuses
    the shared-memory attribute (SM90: ``CUDA driver error (.../handle.hpp:178): 1 (CUDA_ERROR_INVALID_VALUE, ...)``).

    ## Example
    ``{"kind": "paged_mqa_logits_metadata", "batch": {{sm100_example}}}`` on a B200 with DeepGEMM 54e2261;
    ``{"kind": "paged_mqa_logits_metadata", "batch": {{static_example}}, "version": "deepgemm-7f2a703"}`` on an H200.

    ## Fix
    Chunk the indexer's rows (one metadata call per chunk of <= the limit), or let the engine's
    replacement planner take the call (SGLang: ``SGLANG_OPT_USE_JIT_INDEXER_METADATA=1``).

    ## Source
    DeepGEMM 54e2261 ``csrc/jit_kernels/impls/sm90_fp8_mqa_logits.hpp:210-212``,
    ``sm100_mqa_logits.hpp:64-65``; 88965b0 / 7f2a703 ``smxx_fp8_fp4_paged_mqa_logits.hpp``;
    7f2a703 ``deep_gemm/include/deep_gemm/scheduler/paged_mqa_logits.cuh:28``, ``csrc/jit/compiler.hpp:225-229``,
    ``csrc/jit/handle.hpp:175-187``, ``csrc/jit/device_runtime.hpp:88-97``;
    SGLang 0.5.23 ``srt/layers/attention/dsv4/metadata.py:66`` and ``:212-218``.
    """
    if p.replaced:
        return None
    lim = p.broken
    if lim is None:
        return None
    c = p.call
    top = p.max_batch
    why = ""
    cf = p.caller_facts
    if cf is not None:
        why = (f"; {c.caller} keeps DeepGEMM's planner here (its replacement runs only for one row per request "
               f"and more than {cf['replacement_threshold']} rows)")
    what, against = _LIMIT_WORDS[lim.kind]
    steps = -(-c.batch // top)
    return [mqa_metadata_smem.rule.finding(
        f"batch {c.batch} needs {lim.need} B of {what} in DeepGEMM {p.facts['name']}'s MQA-logits metadata on "
        f"{sm_name(p.gpu.arch)}; expected <= {lim.limit} B ({against}; batch <= {top}), got {lim.need} B{why}",
        subject=c.label or c.summary(),
        numbers={"batch": c.batch, "max_batch": top, "smem_bytes": lim.need, "smem_limit": lim.limit},
        fix=f"chunk the indexer metadata into at least {steps} calls of <= {top} requests"
            + (", or set SGLANG_OPT_USE_JIT_INDEXER_METADATA=1" if cf is not None and c.next_n == 1 else ""),
        failure=load("deepgemm")[_LIMIT_FAILURE[lim.kind]])]


def _empty_batch_facts(p: DeepGemmPlan) -> tuple:
    return ("metadata.{layout}.empty_batch",) if p.empty_batch is not None else ()


def empty_batch_page() -> dict:
    """The numbers DG002's page quotes, from 54e2261's SM90 layout."""
    from .calls import version

    fact = version("deepgemm-54e2261")["metadata"]["9"]["empty_batch"]
    m = fact["batch_multiple_of"]
    return {"multiple": m, "example": 2 * m, "next": 2 * m + 1}


@rule("DG002", page=empty_batch_page, reads="lengths", subject=RULE_KIND, added=39, facts=_empty_batch_facts,
      title="DeepGEMM paged MQA-logits metadata: every context length 0 at a batch that is a multiple of 32",
      failure=Failure("illegal_memory_access",
                      "the SM90 metadata kernel reads one int past its shared prefix array; the launch's sync "
                      "raises 'CUDA error: an illegal memory access was encountered' and the CUDA context is lost"),
      source="DeepGEMM 54e2261 deep_gemm/include/deep_gemm/scheduler/sm90_paged_mqa_logits.cuh:104-113 (the search "
             "ends at q_idx = batch_size and reads prefix_sum[batch_size]), csrc/jit_kernels/impls/"
             "sm90_fp8_mqa_logits.hpp:207-209 (align(batch, 32) ints of shared memory); measured on an H200 "
             "(fixtures/measured/deepgemm_h200_54e2261_empty_probes.jsonl)")
def mqa_metadata_empty_batch(p: DeepGemmPlan):
    """DeepGEMM's SM90 metadata kernel overruns its shared array when no request has any KV to index.

    ## What it checks
    A ``get_paged_mqa_logits_metadata`` call on SM90 whose every context length is 0 (the last of each
    request's ``next_n`` lengths: what the kernel reads), on a DeepGEMM version whose kernel reads past
    its shared prefix array then: DeepGEMM 54e2261, and SGLang 0.5.23's sgl-deep-gemm 0.2.5, whose SM90
    metadata kernel is the same file. It fails when the batch is a multiple of {{multiple}} (the array is
    ``align(batch, 32)`` ints, so the one-past read falls inside the padding otherwise). vLLM 0.33's
    bundled deep_gemm 2.8.1 runs the same calls. SGLang 0.5.23's DeepSeek-V4 indexer passes the
    ratio-4 compressed lengths unclamped (``seq_len // 4``: 0 for a request of fewer than 4 tokens;
    read, not run here), so a step of such requests alone reaches it when DeepGEMM's planner runs.

    ## Why it crashes
    With nothing to split, every SM's binary search over the prefix sums ends at ``batch`` and the kernel
    reads ``prefix_sum[batch]``, the int after the ``align(batch, 32)`` it asked for: compute-sanitizer
    reports ``Invalid __shared__ read of size 4 bytes`` in ``sm90_paged_mqa_logits_metadata``, and the
    step fails with ``CUDA error: an illegal memory access was encountered`` (the CUDA context is lost:
    the process must restart).

    ## Example
    ``{"kind": "paged_mqa_logits_metadata", "batch": {{example}}, "context_lens": [0, 0, ...]}`` (every one of
    the {{example}} lengths 0) fails; the same call with {{next}} requests runs, and so does one with any
    length above 0.

    ## Fix
    Skip the indexer's metadata call for a step with no KV to index, or give the padding requests a
    length of at least 1 (or pad to a batch that is not a multiple of {{multiple}}).

    ## Source
    DeepGEMM 54e2261 ``deep_gemm/include/deep_gemm/scheduler/sm90_paged_mqa_logits.cuh:104-113``,
    ``csrc/jit_kernels/impls/sm90_fp8_mqa_logits.hpp:207-209``; SGLang 0.5.23
    ``srt/layers/attention/deepseek_v4_backend.py:1509`` (``c4_topk_lengths_raw``),
    ``kernels/ops/attention/dsv4/metadata_kernel.py:103`` (``seq_len // 4``),
    ``srt/layers/attention/dsv4/metadata.py:210-226``.
    """
    fact = p.empty_batch
    if fact is None or p.replaced or p.lengths_all_zero is not True:
        return None
    c = p.call
    m = fact["batch_multiple_of"]
    if c.batch % m:
        return None
    return [mqa_metadata_empty_batch.rule.finding(
        f"batch {c.batch} with every context length 0 on DeepGEMM {p.facts['name']}'s SM90 MQA-logits metadata: "
        f"the kernel reads prefix_sum[{c.batch}], past its {c.batch} shared ints; expected a batch that is not a "
        f"multiple of {m} or a non-zero length, got batch {c.batch} (= {c.batch // m} x {m}) with every length 0",
        subject=c.label or c.summary(),
        numbers={"batch": c.batch, "batch_multiple_of": m, "max_context_len": 0},
        fix="skip the indexer metadata call when no request has KV to index, or give padding requests a "
            f"length of at least 1 (or a batch of {c.batch + 1} / {c.batch - 1})",
        failure=load("deepgemm")["empty_batch_failure"])]
