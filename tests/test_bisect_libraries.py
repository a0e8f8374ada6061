"""bisect on crash threads of other libraries and versions: every error is read as its library prints it and
attributed to that library, FlashInfer errors of unrecorded versions match their rules by message, an index
error's numbers are checked against the settings' capacities (a deduction, said as one), and benchmark commands
name their steps.

Ground truth, written here from the facts rather than read from the code under test:
* FlashInfer's MLAPlan check sits at scheduler.cuh:1599 in fb28d72 and :1634 in 0.7.2; a log printing :1671 is
  another version (the fixture is written so), with the same function and message;
* trtllm-gen puts the decode batch on gridDim.z, at most 2**16 - 1 = 65535 (CUDA's grid limit);
* FlashAttention-3 is flash-attention's hopper/ tree, shipped by vLLM as vllm-flash-attn; its CHECK_CUDA prints
  the same 'CUDA error (FILE:LINE): MSG' as FlashMLA's;
* ptxas's static shared-memory limit is 48 KiB = 0xc000 = 49152 bytes; the fixture's kernel asks 0x10000 = 65536;
* FlashMLA's scheduler takes b <= (232448 - 4) // 20 = 11622 rows on an H200;
* SGLang divides --max-running-requests by the attention-DP width: 64 / 2 = 32 requests per rank; the global
  slots of rank k are k x 32 .. k x 32 + 31.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validate_batch.cli.main import app
from validate_batch.facts.knowledge import load
from validate_batch.engines.versions import releases
from validate_batch.ingest.crash_lines import ErrorEvent, classify_error
from validate_batch.ingest.scan import scan_lines
from validate_batch.ingest.signatures import matching_codes

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "fixtures" / "logs"
runner = CliRunner()
MAX_B = (232448 - 4) // 20          # 11622
GRID_Z = 2**16 - 1                  # 65535



#: the 9241ae3 scheduler's error line, as a log of one line
SCHED_ERROR = "CUDA error (/x/get_decoding_sched_meta.cu:111): invalid argument"


def bisect_launch(tmp_path, error_line: str, launch: str, *extra: str):
    """``bisect --json --launch LAUNCH`` of a log holding only ``error_line``: the result and its JSON."""
    log = tmp_path / "x.log"
    log.write_text(error_line + "\n")
    r = runner.invoke(app, ["bisect", str(log), "--json", "--launch", launch, *extra])
    return r, json.loads(r.stdout)

def bisect_json(name: str, *args) -> tuple[int, dict]:
    r = runner.invoke(app, ["bisect", str(LOGS / name), "--json", *args])
    return r.exit_code, json.loads(r.stdout)


def event(line: str) -> ErrorEvent:
    got = classify_error(line)
    assert got is not None, line
    return ErrorEvent(got[0], 1, line, numbers=got[1])


# ------------------------------------------------------------------ signatures by library, entry and message
PLAN = ("RuntimeError: Error in function 'MLAPlan' at /x/flashinfer/data/include/flashinfer/attention/scheduler.cuh:{}: "
        "qo_indptr[3]5 - qo_indptr[2]9 should be non-negative")
LAUNCH = "CUDA Error: CUDA_ERROR_INVALID_VALUE /x/flashinfer/data/include/flashinfer/trtllm/fmha/fmhaKernels.cuh {}"


@pytest.mark.parametrize("line", [1598, 1599, 1600, 1634, 1671, 2000])
def test_a_flashinfer_plan_error_matches_fi002_at_any_line(line):
    assert matching_codes(event(PLAN.format(line))) == ["FI002"]


@pytest.mark.parametrize("line", [450, 451, 452, 475, 478, 502])
def test_a_trtllm_gen_launch_error_matches_fi001_at_any_line(line):
    assert matching_codes(event(LAUNCH.format(line))) == ["FI001"]


def test_a_build_the_user_names_keeps_its_recorded_line():
    # 0.7.2 prints the check at :1634; a :1599 line is not 0.7.2's, an unrecorded :1671 corroborates nothing
    assert matching_codes(event(PLAN.format(1599)), "flashinfer-python-0.7.2") == []
    assert matching_codes(event(PLAN.format(1634)), "flashinfer-python-0.7.2") == ["FI002"]
    # a FlashMLA build says nothing about FlashInfer's lines
    assert matching_codes(event(PLAN.format(1671)), "flashmla-9241ae3") == ["FI002"]


def test_another_function_of_the_same_file_is_not_fi002():
    e = event("RuntimeError: Error in function 'PrefillSplitQOKVIndptr' at /x/flashinfer/attention/scheduler.cuh:1599: "
              "qo_indptr[2]1 - qo_indptr[1]2 should be non-negative")
    assert matching_codes(e) == []


def test_other_version_fixtures_say_another_versions_line():
    rc, d = bisect_json("sglang-flashinfer-plan-other-version.log")
    xp = d["explanation"]
    assert xp["signature_matches"] == ["FI002"] and rc == 0 and xp["status"] == "not_explained"
    assert "another version's line: scheduler.cuh:1671" in xp["summary"]
    assert xp["signatures"][0]["library"] == "flashinfer" and xp["signatures"][0]["function"] == "MLAPlan"
    rc, d = bisect_json("sglang-flashinfer-trtllm-launch-other-version.log")
    assert rc == 1 and d["rule"] == ["FI001"] and "another version's line: fmhaKernels.cuh:502" in d["explanation"]["summary"]
    assert (d["boundary"]["largest_legal"], d["boundary"]["first_illegal"]) == (GRID_Z, GRID_Z + 1)
    assert d["crashing_step"]["likely"] == 70000


def test_a_recorded_line_is_named_with_its_version():
    rc, d = bisect_json("sglang-flashinfer-trtllm-launch-error.log")
    assert d["explanation"]["signatures"][0]["line"] == "line 451 is the recorded line of flashinfer-fb28d72"


# ------------------------------------------------------------------ the library decides
@pytest.mark.parametrize("line,library", [
    ("CUDA error (/workspace/vllm/.deps/vllm-flash-attn-src/hopper/flash_fwd_combine_launch_template.h:53): "
     "invalid configuration argument", "fa3"),
    ("CUDA error (/usr/local/lib/python3.12/dist-packages/vllm/vllm_flash_attn/hopper/flash_fwd_launch_template.h:190): "
     "an illegal memory access was encountered", "fa3"),
    ("RuntimeError: Assertion error (/usr/local/lib/python3.12/dist-packages/deep_gemm/include/deep_gemm/"
     "scheduler/paged_mqa_logits.cuh:28): batch <= 4096", "deepgemm"),
])
def test_errors_of_other_libraries_never_match_flashmla_rules(line, library):
    e = event(line)
    assert e.owner == library
    assert not [c for c in matching_codes(e) if c.startswith(("FMLA", "SGL", "CG"))]


def test_the_same_combine_line_from_flashmla_still_matches_its_rules():
    e = event("CUDA error (/x/FlashMLA/csrc/smxx/decode/combine/combine.cu:197): an illegal memory access was encountered")
    assert e.owner == "flashmla" and "FMLA002" in matching_codes(e)


def test_fa3_combine_error_is_attributed_to_fa3():
    rc, d = bisect_json("vllm-fa3-combine-launch-error.log")
    rec = d["explanation"]["recognised"]
    assert rec["library"] == "fa3" and rec["kind"] == "cuda_error"
    assert d["explanation"]["signature_matches"] == [] and "FlashAttention-3" in d["explanation"]["summary"]


DUMP = ["TMA Desc Addr:   0x7ffd2c41e9c0", "format         9", "dim            3", "globalDim      ({})",
        "Error: Failed to initialize the TMA descriptor 1", "Fatal Python error: Segmentation fault"]


@pytest.mark.parametrize("extent,frame,codes", [
    ("512,64,0,1,1", None, ["FMLA014", "SGL002"]),           # an empty chunk: the 0 extent, no other library
    ("512,64,1,1,1", None, []),                              # no zero extent: not the empty prefill
    ("512,64,0,1,1", "/usr/lib/python3/dist-packages/flashinfer/prefill.py", []),
    ("512,64,0,1,1", "/usr/lib/python3/dist-packages/vllm/vllm_flash_attn/flash_attn_interface.py", []),
    ("512,64,0,1,1", "/usr/lib/python3/dist-packages/flash_mla/flash_mla_interface.py", ["FMLA014", "SGL002"]),
])
def test_a_descriptor_dump_needs_a_zero_extent_and_flashmla(extent, frame, codes):
    lines = [x.format(extent) for x in DUMP]
    if frame:
        lines += ["", "Current thread 0x00007f5a0ddbf740 (most recent call first):", f'  File "{frame}", line 10 in run']
    e = scan_lines(lines).root_error()
    assert e.kind == "tma_descriptor" and matching_codes(e) == codes


@pytest.mark.parametrize("name,owner", [("vllm-fa3-tma-descriptor-dump.log", "fa3"),
                                        ("sglang-flashinfer-tma-descriptor-dump.log", "flashinfer")])
def test_descriptor_dumps_of_other_libraries_get_no_flashmla_rule(name, owner):
    rc, d = bisect_json(name)
    rec = d["explanation"]["recognised"]
    assert rec["kind"] == "tma_descriptor" and rec["owner"] == owner and not rec.get("zero_extent")
    assert d["explanation"]["signature_matches"] == [] and d["rule"] == [] and rc == 0


# ------------------------------------------------------------------ compile failures, TVM checks, prose
def test_ptxas_static_shared_memory_is_deepgemm_metadata():
    rc, d = bisect_json("sglang-deepgemm-ptxas-static-smem.log")
    rec = d["explanation"]["recognised"]
    assert rec["kind"] == "ptxas_error" and rec["owner"] == "deepgemm" and rec["memory"] == "shared"
    assert (rec["bytes"], rec["max_bytes"]) == (0x10000, 48 * 1024) and rec["bytes"] > rec["max_bytes"]
    assert "paged_mqa_logits_metadata" in rec["kernel"]
    assert d["explanation"]["signature_matches"] == ["DG001"] and d["rule"] == []


def test_a_ptxas_error_of_another_kernel_is_not_dg001():
    e = scan_lines(["NVCC compilation failed: ",
                    "ptxas error   : Entry function '_ZN9deep_gemm10fp8_gemm_kernelILj128EEEvPv' uses too much shared data "
                    "(0x10000 bytes, 0xc000 max)"]).root_error()
    assert e.kind == "ptxas_error" and e.owner == "deepgemm" and matching_codes(e) == []


def test_a_tvm_check_is_flashinfers_through_its_traceback():
    rc, d = bisect_json("sglang-flashinfer-tvm-check-failed.log")
    rec = d["explanation"]["recognised"]
    assert rec["kind"] == "tvm_check" and rec["owner"] == "flashinfer"
    assert rec["condition"] == "kv_indptr.size(0) == batch_size + 1"
    assert any("comes from FlashInfer" in n for n in d["notes"])


def test_prose_is_low_confidence_evidence_without_leads():
    rc, d = bisect_json("sglang-prose-illegal-access.log")
    xp = d["explanation"]
    assert xp["recognised"]["kind"] == "prose_report" and xp["recognised"]["confidence"] == "low"
    assert xp["signature_matches"] == [] and xp["possible"] == [] and d["rule"] == [] and rc == 0
    assert "prose" in xp["summary"]


@pytest.mark.parametrize("line,kind", [
    ("We get an illegal memory access after ten minutes.", "prose_report"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "illegal_memory_access"),
    ("CUDA_ERROR_ILLEGAL_ADDRESS", "illegal_memory_access"),
])
def test_printed_and_described_illegal_accesses(line, kind):
    assert classify_error(line)[0] == kind


# ------------------------------------------------------------------ deductions from the error's numbers
def test_dp_slot_error_is_explained_as_a_deduction():
    per_rank = 64 // 2
    rc, d = bisect_json("sglang-pd-decode-dp-slot-32.log")
    assert rc == 1 and d["rule"] == ["SLOT004"] and d["partial"]
    step = d["crashing_step"]
    assert step["rank"] == "DP1" and step["range"] == [32, 32] and not step["exact"]
    assert "deduction" in step and f"{per_rank} = max_running_requests 64 / dp_size 2" in step["deduction"]
    assert any(a.startswith("assumption: index 32 is a global slot") for a in step["assumptions"])
    assert (d["boundary"]["largest_legal"], d["boundary"]["first_illegal"]) == (per_rank - 1, per_rank)
    assert "deduction" in d["explanation"]["summary"]


# --dp-size 2 --max-running-requests 64 on a PD decode worker: R = 32 per rank, E = 2 x 32 = 64 pre-allocation slots
# (SGLang's default when R <= 32), so the capacities are R 32, R + E 96, table rows R + E + 1 97, global 64 and 192.
DP_PD = ("python -m sglang.launch_server --model-path m --tp 8 --dp-size 2 --enable-dp-attention "
         "--max-running-requests 64 --disaggregation-mode decode")
# One rank, --max-running-requests 32: the table has R + 1 = 33 rows, live slots 1..32.
ONE_RANK = "python -m sglang.launch_server --model-path m --tp 8 --max-running-requests 32"


@pytest.mark.parametrize("launch,index,size,rule", [
    (DP_PD, 31, 32, None),          # inside the buffer: nothing overflows, nothing is deduced
    (DP_PD, 32, 32, "SLOT004"),     # size = R: a per-rank buffer; 32 < 64 is a global slot
    (DP_PD, 63, 32, "SLOT004"),     # the last global slot
    (DP_PD, 32, 33, None),          # 33 is none of the capacities: no reading
    (ONE_RANK, 32, 32, "SLOT002"),  # one rank: a 32-row buffer indexed by slots up to 32 (the table's last row)
    (ONE_RANK, 31, 32, None),
])
def test_the_index_size_pair_against_the_capacities(tmp_path, launch, index, size, rule):
    r, d = bisect_launch(tmp_path, f"IndexError: index {index} is out of bounds for dimension 0 with size {size}", launch)
    assert r.exit_code == (1 if rule else 0)
    assert d["rule"] == ([rule] if rule else [])
    if rule:
        assert d["crashing_step"]["deduction"].startswith("deduction: ")
        assert d["boundary"]["largest_legal"] == size - 1


def test_a_size_no_capacity_gives_is_said_and_not_guessed(tmp_path):
    _, d = bisect_launch(tmp_path, "IndexError: index 50 is out of bounds for dimension 0 with size 50",
                         "python -m sglang.launch_server --model-path m --max-running-requests 64")
    assert d["rule"] == [] and any("none of the capacities the settings give" in n for n in d["notes"])


# ------------------------------------------------------------------ benchmark commands name their steps
def test_bench_one_batch_65536_is_the_step():
    rc, d = bisect_json("sglang-bench-one-batch-65536.log")
    step = d["crashing_step"]
    assert rc == 1 and step["range"] == [65536, 65536] and step["exact"]
    assert d["boundary"]["largest_legal"] == MAX_B


@pytest.mark.parametrize("flags", ["--batch-size 1 --input-len 65536", "--batch 1 --input 65536"])
def test_bench_one_batch_flags_as_argparse_takes_them(tmp_path, flags):
    _, d = bisect_launch(tmp_path, SCHED_ERROR,
                         f"python -m sglang.bench_one_batch --model-path deepseek-ai/DeepSeek-V4-Flash {flags}")
    assert d["crashing_step"]["range"] == [65536, 65536] and "FMLA001" in d["rule"]


@pytest.mark.parametrize("chunk,rows,illegal", [(MAX_B, MAX_B, False), (MAX_B + 1, MAX_B + 1, True), (32768, 32768, True)])
def test_bench_offline_throughput_prefill_from_its_lengths(tmp_path, chunk, rows, illegal):
    cmd = ("python -m sglang.bench_offline_throughput --model-path deepseek-ai/DeepSeek-V4-Flash --dataset-name random "
           f"--random-input 65536 --random-output 1 --random-range-ratio 1 --num-prompts 4 --chunked-prefill-size {chunk}")
    _, d = bisect_launch(tmp_path, SCHED_ERROR, cmd, "--sglang-version", "0.5.12")
    pre = next(c for c in d["candidates"] if c["kind"] == "prefill")
    assert pre["range"][1] == rows == min(4 * 65536, chunk)
    assert (pre["verdict"] != "legal") is illegal and ("FMLA001" in d["rule"]) is illegal


def test_bench_offline_throughput_with_a_dataset_reconstructs_nothing(tmp_path):
    _, d = bisect_launch(tmp_path, SCHED_ERROR, "python -m sglang.bench_offline_throughput --model-path m --num-prompts 10")
    assert d["candidates"] == [] and any("dataset sharegpt" in n for n in d["notes"])


# ------------------------------------------------------------------ every --engine spelling check accepts
def spellings() -> list[str]:
    data = load("engines")
    out = []
    for name, prof in data["profiles"].items():
        names = [name] + [a for a, target in data["aliases"].items() if target == name]
        versions = [None] + [x for v in prof["versions"] for x in [v["name"], *v.get("aliases", [])]]
        versions += [r["release"] for r in releases(name)]
        out += [n if v is None else f"{n}@{v}" for n in names for v in dict.fromkeys(versions)]
    return out


def test_every_engine_spelling_check_accepts_runs_on_bisect():
    seen = 0
    for spec in spellings():
        c = runner.invoke(app, ["check", "--engine", spec, "--extend", "100", "--server-arg", "max_running_requests=8", "-q"])
        if c.exit_code not in (0, 1):
            continue
        seen += 1
        for log in ("sglang-pd-decode-slot-96.log", "vllm-scheduler-dump.log"):
            r = runner.invoke(app, ["bisect", str(LOGS / log), "--engine", spec, "--json"])
            assert r.exit_code in (0, 1), (spec, log, r.output[-400:])
    assert seen >= len(load("engines")["profiles"]) * 2


def test_an_index_error_is_not_attributed_to_a_library_line_nearby():
    # FlashInfer's launch check prints and carries on; a later IndexError in SGLang's code stays SGLang's
    ev = scan_lines(["CUDA Error: CUDA_ERROR_INVALID_VALUE /x/flashinfer/trtllm/fmha/fmhaKernels.cuh 451",
                     "Traceback (most recent call last):",
                     '  File "/sgl-workspace/sglang/python/sglang/srt/mem_cache/memory_pool.py", line 10, in f',
                     "IndexError: index 96 is out of bounds for dimension 0 with size 33"])
    e = ev.root_error()
    assert e.kind == "index_oob" and e.owner == "sglang" and "SLOT002" in matching_codes(e)
    ev = scan_lines(["CUDA Error: CUDA_ERROR_INVALID_VALUE /x/flashinfer/trtllm/fmha/fmhaKernels.cuh 451",
                     "IndexError: index 96 is out of bounds for dimension 0 with size 33"])
    assert ev.root_error().owner is None


@pytest.mark.parametrize("line,owner", [
    ("flashinfer.jit.core.CompilationError: ninja build of batch_mla_sm90 failed", "flashinfer"),
    ("deep_gemm.jit.JITError: Assertion failed while compiling", "deepgemm"),
    ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", None),
])
def test_an_exceptions_module_names_its_library(line, owner):
    e = scan_lines([line]).root_error()
    assert e is not None and e.owner == owner


@pytest.mark.parametrize("line", [
    "a" * 200000 + " Check failed: (x) is false",
    "ptxas error   : Entry function '" + "x" * 200000,
    "flashinfer." + "a." * 100000 + "Error: x",
    "We saw an illegal memory access " + "again " * 40000,
])
def test_long_hostile_lines_of_the_new_formats_are_read_in_bounded_time(line):
    import time
    t = time.perf_counter()
    classify_error(line)
    assert time.perf_counter() - t < 1.0
