"""Error signatures: what each error line is read as, which rules' signatures it matches, the catalog data
behind them, and the launch commands users paste.

Line formats are the libraries' own (cited where each is written): FlashMLA 9241ae3 csrc/utils.h:5-23
(CHECK_CUDA, FLASH_ASSERT) and csrc/kerutils/include/kerutils/host/host.h:57-67 (KU_ASSERT); FlashInfer
include/flashinfer/exception.h (``Error in function 'F' at FILE:LINE: MSG``) and
include/flashinfer/trtllm/common.h:44-48 (``CUDA Error: NAME FILE LINE``); CUTLASS's TMA descriptor dump;
the RuntimeError lines are verbatim from the measured probes (fixtures/oracle/sglfm_h200_probes.jsonl).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validate_batch.cli.main import app
from validate_batch.ingest.crash_lines import ErrorEvent, classify_error
from validate_batch.ingest.launch import parse_launch
from validate_batch.ingest.scan import scan_lines
from validate_batch.ingest.signatures import SignatureDataError, all_signatures, matching_codes, possible
from validate_batch.facts.knowledge import load
from validate_batch.legality.ruleset import get_rule, rule, unregister

ROOT = Path(__file__).resolve().parents[1]


def event(line: str) -> ErrorEvent:
    got = classify_error(line)
    assert got is not None, line
    return ErrorEvent(got[0], 1, line, numbers=got[1])


ORACLE_PHASE1 = ("RuntimeError: Assertion error (/flashmla/csrc_legacy/kernels/sm90/prefill/sparse/instantiations/../"
                 "phase1.cuh:621): Assertion `res == CUresult::CUDA_SUCCESS` failed (/flashmla/csrc_legacy/kernels/sm90/"
                 "prefill/sparse/instantiations/../phase1.cuh:621)")
ORACLE_TOPK = ("RuntimeError: Assertion error (/flashmla/csrc_legacy/kernels/sm90/decode/sparse/instantiations/../"
               "splitkv_mla.cuh:691): Assertion `params.topk % TOPK_BLOCK_SIZE == 0` failed (/flashmla/csrc_legacy/"
               "kernels/sm90/decode/sparse/instantiations/../splitkv_mla.cuh:691)")
ORACLE_DENSE_FP8 = ("Assertion failed (/flashmla/csrc_legacy/extension/sm90/dense_fp8/flash_fwd_mla_metadata.cu:74): "
                    "params.batch_size < MaxBatchSize")


# ------------------------------------------------------------------ what a line is read as
@pytest.mark.parametrize("line,kind,failure,fields", [
    ("CUDA error (/x/FlashMLA/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:111): invalid argument",
     "flashmla_sched", "process_exit", {"file": "get_decoding_sched_meta.cu", "source_line": 111}),
    ("CUDA error (/x/csrc/smxx/decode/combine/combine.cu:197): an illegal memory access was encountered",
     "flashmla_combine", "illegal_memory_access", {"source_line": 197}),
    ("CUDA error (/x/FlashMLA/csrc/smxx/mla_combine.cu:201): invalid configuration argument",
     "flashmla_combine", "process_exit", {"file": "mla_combine.cu", "message": "invalid configuration argument"}),
    ("Assertion failed (/x/FlashMLA/csrc/smxx/decode/combine/combine.cu:183): false",
     "flashmla_combine", "process_exit", {"source_line": 183, "condition": "false"}),
    (ORACLE_DENSE_FP8, "flashmla_sched", "process_exit", {"file": "flash_fwd_mla_metadata.cu", "source_line": 74}),
    (ORACLE_PHASE1, "flashmla_sparse_prefill", "python_exception", {"file": "phase1.cuh", "source_line": 621}),
    (ORACLE_TOPK, "flashmla_combine", "python_exception", {"file": "splitkv_mla.cuh", "source_line": 691}),
    ("Assertion `params.topk % TOPK_BLOCK_SIZE == 0` failed (/x/FlashMLA/csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:689): ",
     "flashmla_combine", "process_crash", {"source_line": 689}),
    ("RuntimeError: Error in function 'PrefillSplitQOKVIndptr' at /src/flashinfer/include/flashinfer/attention/"
     "scheduler.cuh:567: qo_indptr[2]100 - qo_indptr[1]120 should be non-negative",
     "flashinfer_plan", "python_exception", {"function": "PrefillSplitQOKVIndptr", "file": "scheduler.cuh", "source_line": 567}),
    ("CUDA Error: CUDA_ERROR_INVALID_VALUE /src/flashinfer/include/flashinfer/trtllm/fmha/fmhaKernels.cuh 451",
     "flashinfer_launch", "launch_error_silent", {"error_code": "CUDA_ERROR_INVALID_VALUE", "source_line": 451}),
    ("CUDA Error: invalid argument (1) /src/flashinfer/include/flashinfer/attention/prefill.cuh: line 2354 at function "
     "cudaLaunchKernel(...)", "flashinfer_launch", None, {"error_code": 1, "file": "prefill.cuh", "source_line": 2354}),
    ("TMA Desc Addr:   0x7ffd2c41e9c0", "tma_descriptor", "process_crash", {"library": "cutlass"}),
    ("Error: Failed to initialize the TMA descriptor 1", "tma_descriptor", "process_crash", {"tma_result": 1}),
    ("python3: /src/cutlass/include/cute/atom/copy_traits_sm90_tma.hpp:1023: auto make_tma_desc(): Assertion `false' failed.",
     "tma_descriptor", "process_crash", {"file": "copy_traits_sm90_tma.hpp"}),
    ("/src/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [5,0,0] Assertion "
     "`-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.", "device_assert", "device_assert",
     {"file": "IndexKernel.cu"}),
    ("CUDA error (/src/FlashMLA/csrc/smxx/decode/combine/comb", "cuda_error", None, {"cut_off": True}),
    ("CUDA error (/x/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:1", "cuda_error", None,
     {"file": "get_decoding_sched_meta.cu", "line_cut_off": True}),
])
def test_error_lines_are_read_with_their_failure(line, kind, failure, fields):
    e = event(line)
    assert (e.kind, e.failure) == (kind, failure)
    for k, v in fields.items():
        assert e.numbers[k] == v


@pytest.mark.parametrize("line", [ORACLE_PHASE1, ORACLE_TOPK,
                                  "python3: /x/cute/atom/copy_traits_sm90_tma.hpp:1023: f(): Assertion `false' failed.",
                                  "Assertion `params.h_kv == 1` failed (/x/FlashMLA/csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:688): "])
def test_host_assertions_are_not_slot_device_asserts(line):
    e = event(line)
    assert e.kind != "device_assert" and e.quantity != "slot"


def test_a_descriptor_dump_is_one_error_with_its_fields():
    ev = scan_lines(["[2026-05-03 17:31:15 TP0] Prefill batch, #new-seq: 1, #new-token: 0, #cached-token: 6144, "
                     "token usage: 0.01, #running-req: 1, #queue-req: 0, ",
                     "TMA Desc Addr:   0x7ffd2c41e9c0", "format         9", "dim            3",
                     "globalDim      (512,64,0,1,1)", "boxDim         (64,64,1,1,1)",
                     "Error: Failed to initialize the TMA descriptor 1", "Fatal Python error: Segmentation fault"])
    e = ev.root_error()
    assert e.kind == "tma_descriptor" and e.line_no == 2
    assert e.numbers["descriptor"] == {"format": "9", "dim": "3", "globalDim": "(512,64,0,1,1)", "boxDim": "(64,64,1,1,1)"}
    assert e.numbers["zero_extent"] and e.numbers["tma_result"] == 1
    assert ev.counts["other"] == 0


# ------------------------------------------------------------------ which rules' signatures match
@pytest.mark.parametrize("line,build,codes", [
    ("CUDA error (/x/get_decoding_sched_meta.cu:111): invalid argument", None, ["FMLA001", "SGL001"]),
    ("CUDA error (/x/get_decoding_sched_meta.cu:111): invalid argument", "flashmla-9241ae3", ["FMLA001", "SGL001"]),
    ("CUDA error (/x/get_decoding_sched_meta.cu:111): invalid argument", "flashmla-1408756", []),   # 1408756: line 93
    ("CUDA error (/x/FlashMLA/csrc/sm90/get_mla_metadata.cu:93): invalid argument", None, ["FMLA001", "SGL001"]),
    # another line of the file: no recorded version prints it there, yet library, file and message are the
    # scheduler's: the line corroborates, it does not gate ("another version's line")
    ("CUDA error (/x/get_decoding_sched_meta.cu:112): invalid argument", None, ["FMLA001", "SGL001"]),
    # a sticky illegal access surfaces at the combine kernel's check: the o_accum overflow, an unchecked decode
    # index (FMLA019) and graph metadata built for fewer rows (CG002) all report there
    ("CUDA error (/x/combine.cu:197): an illegal memory access was encountered", None,
     ["FMLA002", "FMLA003", "FMLA019", "CG002"]),
    ("CUDA error (/x/csrc_legacy/kernels/smxx/decode/combine/combine.cu:206): an illegal memory access was encountered",
     None, ["FMLA002", "FMLA019", "CG002"]),
    ("CUDA error (/x/FlashMLA/csrc/smxx/mla_combine.cu:201): invalid configuration argument", None, ["FMLA017"]),
    ("CUDA error (/x/FlashMLA/csrc/smxx/mla_combine.cu:201): invalid configuration argument", "flashmla-9241ae3", []),
    ("Assertion failed (/x/FlashMLA/csrc/smxx/decode/combine/combine.cu:183): false", None, ["FMLA008"]),
    (ORACLE_DENSE_FP8, None, ["FMLA016"]),
    (ORACLE_PHASE1, None, ["FMLA014", "SGL002"]),
    (ORACLE_PHASE1, "flashmla-9241ae3", []),           # 9241ae3 prints a descriptor dump instead
    (ORACLE_TOPK, None, ["FMLA004"]),
    # the dump's first line alone shows no extent: the empty-prefill rules need a 0 in globalDim
    ("TMA Desc Addr:   0x7ffd2c41e9c0", None, []),
    ("IndexError: index 96 is out of bounds for dimension 0 with size 33", None, ["SLOT001", "SLOT002", "SLOT004"]),
    # no file named: the slot rules, and dense fp8 padding rows on the builds that read block_table[-1]
    ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", None,
     ["SLOT002", "SLOT004", "FMLA020"]),
    ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", "flashmla-9241ae3",
     ["SLOT002", "SLOT004"]),
    ("RuntimeError: Error in function 'MLAPlan' at /x/scheduler.cuh:1599: qo_indptr[4]1 - qo_indptr[3]2 should be "
     "non-negative", None, ["FI002"]),
    ("CUDA Error: CUDA_ERROR_INVALID_VALUE /x/fmhaKernels.cuh 451", None, ["FI001"]),
    ("CUDA error (/src/FlashMLA/csrc/smxx/decode/combine/comb", None, []),
    ("CUDA error (/x/get_decoding_sched_meta/get_decoding_sched_meta.cu:1", None, []),   # line number cut off
])
def test_signature_matches(line, build, codes):
    assert matching_codes(event(line), build) == codes


def test_a_cut_off_line_is_only_consistent_with_rules():
    e = event("CUDA error (/src/FlashMLA/csrc/smxx/decode/combine/comb")
    # every rule with a signature in a file whose name starts "comb" (combine.cu) could be it
    assert matching_codes(e) == [] and set(possible(e)) == {"FMLA002", "FMLA003", "FMLA008", "FMLA017", "FMLA019", "CG002"}
    e = event("CUDA error (/x/get_decoding_sched_meta/get_decoding_sched_meta.cu:1")
    assert matching_codes(e) == [] and "FMLA001" in possible(e)


# ------------------------------------------------------------------ the data
def test_every_signature_names_known_builds_and_compiles():
    builds = (set(load("flashmla")["builds"]) - {"_doc"}) | set(load("deepgemm")["versions"]) | set(load("flashinfer")["versions"])
    sigs = all_signatures()
    assert sigs
    for s in sigs:
        assert set(s.builds) <= builds, (s.code, s.builds)
        if s.code.startswith(("FMLA", "SGL", "SLOT")):
            assert s.source, (s.code, s.index)        # where the error line was seen or read


def test_every_generation_error_site_with_a_line_is_a_signature():
    # the scheduler site of each generation is FMLA001's, the combine site FMLA002's (rules/flashmla.json)
    gens = load("flashmla")["generations"]
    for part, code in (("sched_smem", "FMLA001"), ("combine", "FMLA002")):
        for name, g in gens.items():
            site = (g.get(part) or {}).get("error_site")
            if not site or ":" not in site:
                continue
            path, _, line = site.rpartition(":")
            f = path.rsplit("/", 1)[-1]
            msg = "an illegal memory access was encountered" if part == "combine" else "invalid argument"
            line_text = (f"Assertion failed ({path}:{line}): params.batch_size < MaxBatchSize" if "dense_fp8" in path
                         else f"CUDA error ({path}:{line}): {msg}")
            got = matching_codes(event(line_text))
            assert code in got or (name == "dense-fp8" and "FMLA016" in got), (name, f, line, got)


@pytest.mark.parametrize("bad,field", [
    ({"file": "combine.cu"}, "failure"),
    ({"failure": "process_exit"}, "give the message"),
    ({"file": "combine.cu", "message": "x", "failure": "process_exit"}, "library: expected the library that prints the error"),
    ({"library": "flashmla", "file": "combine.cu", "message": "x", "failure": "process_exit", "lines": {"b": [3, 1]}},
     ".lines.b"),
    ({"file": "a/combine.cu", "failure": "process_exit"}, ".file"),
    ({"file": "combine.cu", "lines": [9, 3], "failure": "process_exit"}, ".lines"),
    ({"message": "(", "failure": "process_exit"}, ".message"),
    ({"message": "x", "failure": "process_exit", "colour": 1}, "unknown field"),
    ({"message": "x", "failure": "process_exit", "builds": "vllm-0.33"}, ".builds"),
])
def test_malformed_signatures_name_the_entry_and_field(bad, field):
    # a definition's signatures are read when the rule is defined: a malformed one is never registered
    with pytest.raises(SignatureDataError, match=r"rules\.FMLA001\.signatures\[0\]") as e:
        rule("FMLA001", title="t", failure="process_exit", signatures=[bad])
    assert field in str(e.value)
    assert get_rule("FMLA001").signatures[0].file == "get_decoding_sched_meta.cu"


def test_a_rule_added_with_a_signature_explains_its_line():
    # A stand-in rule (a function that finds nothing) only to show the matcher reads the field as agreed.
    rule("FI901", title="t", failure="python_exception", source="s",
         signatures=[{"library": "flashinfer", "file": "scheduler.cuh", "message": "should be non-negative", "failure": "python_exception"}])(
        lambda plan: None)
    try:
        line = "RuntimeError: Error in function 'MLAPlan' at /x/scheduler.cuh:1599: qo_indptr[4]1 - qo_indptr[3]2 should be non-negative"
        assert "FI901" in matching_codes(event(line))      # beside FI002, whose signature is the same error
    finally:
        unregister("FI901")
    assert "FI901" not in matching_codes(event(line))


# ------------------------------------------------------------------ launch commands as pasted
@pytest.mark.parametrize("cmd,want", [
    ("`python -m sglang.launch_server --model-path <path> -tp 8 -dp 8 --enable-dp-attention --chunked-prefill-size 16384`",
     {"tp_size": 8, "dp_size": 8, "enable_dp_attention": True, "chunked_prefill_size": 16384}),
    ("```bash\nvllm serve deepseek-ai/DeepSeek-V3.2 \\\n  --max-num-batched-tokens 8192 -tp 8\n```",
     {"model_path": "deepseek-ai/DeepSeek-V3.2", "max_num_batched_tokens": 8192, "tp_size": 8}),
    ("python3 -m sglang.bench_one_batch --model-path deepseek-ai/DeepSeek-V4-Flash --batch-size 1 2 --input-len 12288",
     {"model_path": "deepseek-ai/DeepSeek-V4-Flash", "batch_size": [1, 2], "input_len": 12288}),
    ("$ sglang serve --model-path $MODEL --chunked-prefill-size=<chunk> --port 30000 > log.txt 2>&1", {"port": 30000}),
])
def test_pasted_launch_commands(cmd, want):
    notes: list[str] = []
    got = parse_launch(cmd, "--launch", notes)
    assert got == want
    if "<" in cmd or "$M" in cmd:
        assert notes and all("placeholder" in n for n in notes)


def test_engine_comes_from_the_launch_command_or_the_log_format(tmp_path):
    p = tmp_path / "err.log"
    p.write_text("CUDA error (/x/FlashMLA/csrc/smxx/mla_combine.cu:201): invalid configuration argument\n")
    d = json.loads(CliRunner().invoke(app, ["bisect", str(p), "--json", "--launch", "`vllm serve <model> -tp 8`"]).stdout)
    assert d["engine"] == "vllm" and any("applies to this model" in n for n in d["notes"])
    p.write_text("(EngineCore_DP0 pid=176) ERROR 03-02 14:20:44 [core.py:710] RuntimeError: Error in function 'MLAPlan' "
                 "at /x/scheduler.cuh:1599: bad\n")
    d = json.loads(CliRunner().invoke(app, ["bisect", str(p), "--json"]).stdout)
    assert d["engine"] == "vllm" and d["explanation"]["recognised"]["function"] == "MLAPlan"


@pytest.mark.parametrize("line", [
    "Assertion `x' failed " + "9" * 200000 + ".cu",
    "9" * 200000 + ".cu:1: f: block: [0], thread: [0] Assertion `x` failed",
    "python3: " + "a/" * 50000 + "x.cu:1: f: Assertion `x' failed",
    "Error in function 'f' at " + "9" * 200000 + ".cuh:1: x",
    "CUDA Error: " + "A" * 200000 + " x.cu 12",
    "Assertion `c` failed (" + "9" * 200000,
    "CUDA error (" + "9" * 600000,
    "TMA Desc Addr: " + "f" * 200000,
])
def test_long_hostile_error_lines_are_read_in_bounded_time(line):
    t = time.perf_counter()
    classify_error(line)
    assert time.perf_counter() - t < 1.0


@pytest.mark.parametrize("line,library,fields", [
    # DeepGEMM 54e2261 csrc/utils/exception.hpp:12-35 (DGException, DG_HOST_ASSERT)
    ("RuntimeError: Assertion error (/src/deep_gemm/include/deep_gemm/scheduler/"
     "sm100_paged_mqa_logits.cuh:88): num_sms <= kMaxSMs", "deepgemm", {"source_line": 88, "condition": "num_sms <= kMaxSMs"}),
    ("RuntimeError: CUDA runtime error (/src/deep_gemm/csrc/jit_kernels/impls/sm100_mqa_logits.hpp:81): invalid argument",
     "deepgemm", {"file": "sm100_mqa_logits.hpp", "error_class": "CUDA runtime", "message": "invalid argument"}),
])
def test_other_deepgemm_errors_are_recognised_and_matched_by_no_rule(line, library, fields):
    e = event(line)
    assert e.numbers["library"] == library and e.failure == "python_exception"
    for k, v in fields.items():
        assert e.numbers[k] == v
    # DG001's signature is the metadata kernel's shared-memory assertion, not these
    assert matching_codes(e) == []


def test_the_measured_stride_refusal_is_fmla009s():
    # the message sgl-flash-mla 1.0.0 raised on the H200 for a query stride past int32 (the measured file)
    rec = json.loads((ROOT / "fixtures" / "measured" / "sglfm_h200_combine_grid_measured.json").read_text())
    msgs = [r["message"] for r in rec["calls"] if r.get("outcome") == "python_exception"]
    assert msgs
    for m in msgs:
        assert matching_codes(event(f"RuntimeError: {m}")) == ["FMLA009"]
        assert matching_codes(event(f"RuntimeError: {m}"), "flashmla-9241ae3") == []


def test_the_mqa_logits_shared_memory_assertion_is_dg001s():
    # DeepGEMM 88965b0 csrc/jit_kernels/impls/smxx_fp8_fp4_paged_mqa_logits.hpp:63-70: the metadata kernel's
    # shared memory checked against the architecture's capacity (DG_HOST_ASSERT)
    e = event("RuntimeError: Assertion error (/x/deep_gemm/csrc/jit_kernels/impls/smxx_fp8_fp4_paged_mqa_logits.hpp:70): "
              "smem_size <= SM90ArchSpec::smem_capacity")
    assert e.numbers["library"] == "deepgemm" and matching_codes(e) == ["DG001"]


@pytest.mark.parametrize("build,codes", [(None, ["FMLA001", "SGL001"]), ("flashmla-2026.09.30", ["FMLA001", "SGL001"]),
                                         ("flashmla-9241ae3", [])])
def test_the_build_decides_which_site_is_a_signature(build, codes):
    # upstream 2026.09.30 reports the scheduler failure at get_decoding_sched_meta.cu:143 (read from the binary:
    # its error_site in rules/flashmla.json); 9241ae3 at :111. A :143 line under --kernel-gen flashmla-9241ae3 is not FMLA001's.
    line = "CUDA error (/x/csrc/cuda_kernels/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:143): invalid argument"
    assert matching_codes(event(line), build) == codes
