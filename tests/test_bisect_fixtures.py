"""bisect on one fixture log per crash class: the right rule, or "not explained" with what was recognised,
and never a confident wrong answer. Golden ``bisect --json`` views live in fixtures/bisect/golden/.

Ground truth, written here rather than read from the code under test:
* which rule truly explains each fixture comes from how the fixture was written (its error line and
  the step before it) and from the facts: FlashMLA's scheduler needs 4*(5b+1) bytes of shared memory,
  an H200 opts in to 232448 bytes, so b <= (232448/4 - 1) // 5 (flashmla-facts.md section 4);
  flash_mla_sparse_fwd with 0 rows fails its TMA descriptor (measured: oracle
  flashmla_h200_sparse_prefill_probes.jsonl and sglfm_h200_probes.jsonl);
* a cut-off error line must say "not explained" (its visible part fits several rules); a FlashInfer
  plan() error and a pre-#182 combine grid error have the signature of a rule (FI002, FMLA017) but their
  logs hold no step that breaks it (the negative query length is not in the log; a vLLM log without its
  scheduler dump holds no step): they say "not explained" with the rule whose signature matched;
* the trtllm-gen launch error comes from a 65536-request decode under --attention-backend trtllm_mla:
  that backend passes the decode batch as the kernel's batch (sglang 0.5.23
  srt/layers/attention/trtllm_mla_backend.py:821, :1323-1324, :1350-1362), which the kernel puts on
  gridDim.z, at most 2**16 - 1 = 65535 (CUDA's grid limit): 65536 breaks FI001 by one.

Regenerate a golden view after a reviewed change with ``python tests/test_bisect_fixtures.py NAME.log``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import validate_batch
from validate_batch.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "fixtures" / "logs"
GOLDEN = ROOT / "fixtures" / "bisect" / "golden"
BATCHES = ROOT / "fixtures" / "bisect" / "batches"
MAX_B = (232448 // 4 - 1) // 5          # 11622: the scheduler's row limit on an H200

# fixture -> (the rules that truly explain it, status). An empty set: nothing in the catalog explains it.
TRUTH = {
    "sglang-dsv4-prefill-12288.log": ({"FMLA001", "SGL001"}, "explained"),
    "sglang-0512-dsv4-dp-pending.log": ({"FMLA001", "SGL001"}, "explained"),
    "sglang-pd-decode-slot-96.log": ({"SLOT002"}, "explained"),
    "sglang-pd-decode-dp-illegal-access.log": ({"SLOT002"}, "explained"),
    "vllm-scheduler-dump.log": ({"FMLA001"}, "explained"),
    "sglang-bench-one-batch-traceback.log": ({"FMLA001", "SGL001"}, "explained"),
    "sglang-tma-descriptor-dump.log": ({"SGL002", "FMLA014"}, "explained"),
    # The empty chunk that crashed is not in a 0.5.23 log (it prints a batch after its forward): the error
    # has FMLA014's signature, but no reconstructed step has 0 rows.
    "sglang-0523-sparse-prefill-tma-assert.log": (set(), "not_explained"),
    "sglang-cut-off-cuda-error.log": (set(), "not_explained"),
    # FI002's signature (the plan() input contract) matches; the step with the negative query length is
    # not in the log, so the status stays not_explained.
    "sglang-flashinfer-plan-after-completed-prefill.log": (set(), "not_explained"),
    # FI001's signature (trtllm-gen grid, batch <= 65535) matches and the sglang-trtllm-mla profile (picked
    # from --attention-backend trtllm_mla) runs the 65536-request decode as one trtllm-gen call of batch
    # 65536 > 2**16 - 1: explained by FI001.
    "sglang-flashinfer-trtllm-launch-error.log": ({"FI001"}, "explained"),
    # FMLA017's signature (1408756's combine grid) matches mla_combine.cu:201; no step is in a vLLM log
    # without its scheduler dump, so the status stays not_explained.
    "vllm-mla-combine-grid.log": (set(), "not_explained"),
    # The same FlashInfer errors printed by a version whose lines the data does not record: they match FI002 and
    # FI001 by library, function / file and message ("another version's line"); 70000 running requests on one
    # trtllm-gen decode call exceed gridDim.z's 2**16 - 1 = 65535.
    "sglang-flashinfer-plan-other-version.log": (set(), "not_explained"),
    "sglang-flashinfer-trtllm-launch-other-version.log": ({"FI001"}, "explained"),
    # Errors of other libraries than FlashMLA: FlashAttention-3's combine launch and TMA descriptor dumps (no 0
    # extent), FlashInfer's TMA descriptor dump and its TVM-FFI check, DeepGEMM's JIT compile (ptxas over the
    # 48 KiB = 0xc000 static shared-memory limit). No step in these logs breaks a rule of that library.
    "vllm-fa3-combine-launch-error.log": (set(), "not_explained"),
    "vllm-fa3-tma-descriptor-dump.log": (set(), "not_explained"),
    "sglang-flashinfer-tma-descriptor-dump.log": (set(), "not_explained"),
    "sglang-flashinfer-tvm-check-failed.log": (set(), "not_explained"),
    "sglang-deepgemm-ptxas-static-smem.log": (set(), "not_explained"),
    # An issue's prose ("dies ... with an illegal memory access") is no error line: nothing explains it.
    "sglang-prose-illegal-access.log": (set(), "not_explained"),
    # bench_one_batch --batch-size 1 --input-len 65536: one unchunked extend of 65536 rows > 11622.
    "sglang-bench-one-batch-65536.log": ({"FMLA001", "SGL001"}, "explained"),
    # index 32 in a buffer of 32 rows under --dp-size 2 --max-running-requests 64: 32 = 64 / 2 rows per rank,
    # indexed by DP1's first global slot 1 x 32 = 32 (a deduction: the error does not say the slot is global).
    "sglang-pd-decode-dp-slot-32.log": ({"SLOT004"}, "explained"),
}


def bisect(*args):
    return CliRunner().invoke(app, ["bisect", *[str(a) for a in args]])


def bisect_json(name: str, *args) -> tuple[int, dict]:
    r = bisect(f"fixtures/logs/{name}", "--json", *args)
    return r.exit_code, json.loads(r.stdout)


def golden_view(d: dict) -> dict:
    """The part of a diagnosis a reviewer checks: what was read, what explains it, what else is illegal."""
    ex = d["crashing_step"]
    xp = d["explanation"]

    def cand(c: dict) -> dict:
        return {k: c.get(k) for k in ("rank", "kind", "label", "range", "likely", "exact", "verdict", "codes",
                                      "explains", "completed", "assumptions", "from_line")}
    return {
        "engine": d["engine"], "profile": d["profile"],
        "error": None if d["error"] is None else {k: d["error"].get(k) for k in ("kind", "line", "rank")},
        "recognised": xp["recognised"] if xp else None,
        "status": xp["status"] if xp else None, "summary": xp["summary"] if xp else None,
        "signature_matches": xp["signature_matches"] if xp else None, "possible": xp["possible"] if xp else None,
        "rule": d["rule"],
        "crashing_step": cand(ex) if ex else None,
        "boundary": None if d["boundary"] is None else {k: d["boundary"][k] for k in ("quantity", "largest_legal", "first_illegal", "observed")},
        "also_illegal": xp["also_illegal"] if xp else None,
        "candidates": [cand(c) for c in d["candidates"]],
        "notes": d["notes"],
    }


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)      # paths in the output are relative to the checkout, as in the golden files


def test_every_fixture_log_has_a_truth_and_a_golden_view():
    assert set(TRUTH) == {p.name for p in LOGS.glob("*.log")}
    assert {p.stem for p in GOLDEN.glob("*.json")} == {Path(n).stem for n in TRUTH}


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_no_fixture_gets_a_confident_wrong_answer(name):
    rc, d = bisect_json(name)
    truth, status = TRUTH[name]
    assert d["explanation"]["status"] == status, d["explanation"]["summary"]
    assert set(d["rule"]) <= truth, f"{name}: explained by {d['rule']}, true causes {truth or 'none in the catalog'}"
    if status == "explained":
        assert d["rule"] and rc == 1
        assert d["crashing_step"] is not None and not d["crashing_step"].get("completed")
    else:
        assert d["rule"] == [] and d["crashing_step"] is None and rc == 0


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_golden_views(name):
    _, d = bisect_json(name)
    want = json.loads((GOLDEN / f"{Path(name).stem}.json").read_text())
    assert golden_view(json.loads(json.dumps(d, default=str))) == want


# ------------------------------------------------------------------ each class, what it must say
def test_seed_crash_still_names_fmla001_at_the_h200_boundary():
    rc, d = bisect_json("sglang-dsv4-prefill-12288.log")
    assert rc == 1 and "FMLA001" in d["rule"] and d["boundary"]["largest_legal"] == MAX_B
    assert d["explanation"]["signature_matches"][:2] == ["FMLA001", "SGL001"]
    step = d["crashing_step"]
    # #new-seq 3 and #running-req 1 are counts: the ids are invented and the even split is an assumption
    assert step["invented_request_ids"] == ["p1", "p2", "p3", "d1"]
    assert any("split evenly over the 3 requests" in a for a in step["assumptions"])
    assert any(a.startswith("invented:") for a in step["assumptions"])


def test_cut_off_cuda_error_matches_no_rule_and_fmla001_is_only_also_illegal():
    rc, d = bisect_json("sglang-cut-off-cuda-error.log")
    rec = d["explanation"]["recognised"]
    assert rec["kind"] == "cuda_error" and rec["cut_off"] and rec["path_fragment"].endswith("/combine/comb")
    assert d["explanation"]["signature_matches"] == []
    # The visible "combine/comb" fits the combine rules, never the scheduler's: a hint, not a match.
    assert "FMLA002" in d["explanation"]["possible"] and "FMLA001" not in d["explanation"]["possible"]
    also = d["explanation"]["also_illegal"]
    assert also and also[0]["codes"] == ["FMLA001", "SGL001"] and "does not explain this error" in also[0]["reason"]
    assert also[0]["at"] == 12288


def test_tma_assertion_of_sparse_prefill_is_not_a_slot_device_assert():
    rc, d = bisect_json("sglang-0523-sparse-prefill-tma-assert.log")
    rec = d["explanation"]["recognised"]
    assert rec["kind"] == "flashmla_sparse_prefill" and rec["failure"] == "python_exception"
    assert (rec["file"], rec["source_line"]) == ("phase1.cuh", 621)
    assert d["profile"] == ["sglang-dsv4"]
    assert not any(c["kind"] == "slot" for c in d["candidates"])
    assert not any("max_running_requests" in n for n in d["notes"])
    assert set(d["explanation"]["signature_matches"]) == {"FMLA014", "SGL002"}


def test_tma_descriptor_dump_is_read_whole_and_explained_by_the_empty_chunk():
    rc, d = bisect_json("sglang-tma-descriptor-dump.log")
    rec = d["explanation"]["recognised"]
    assert rec["kind"] == "tma_descriptor" and rec["failure"] == "process_crash"
    assert rec["descriptor"]["globalDim"] == "(512,64,0,1,1)" and rec["zero_extent"] and rec["tma_result"] == 1
    assert d["profile"] == ["sglang-dsv4"] and rc == 1
    step = d["crashing_step"]
    assert step["from_line"] == 7 and step["range"] == [0, 0] and d["rule"] == ["SGL002"]
    # the limit is a lower one: 0 rows illegal, 1 legal (flashmla-facts.md 4b: s_q = 1 ran)
    assert d["boundary"]["first_illegal"] == 0 and "1 is legal" in d["boundary"]["note"]


def test_completed_prefill_is_never_the_crash_and_the_flashinfer_plan_error_is_not_explained():
    rc, d = bisect_json("sglang-flashinfer-plan-after-completed-prefill.log")
    rec = d["explanation"]["recognised"]
    assert rec["kind"] == "flashinfer_plan" and rec["library"] == "flashinfer"
    assert (rec["function"], rec["file"], rec["source_line"]) == ("MLAPlan", "scheduler.cuh", 1599)
    assert "should be non-negative" in rec["message"]
    pre = next(c for c in d["candidates"] if c.get("from_line") == 4)
    assert pre["codes"] == ["FMLA001", "SGL001"] and "completed" in pre["completed"]
    assert d["crashing_step"] is None and rc == 0
    also = d["explanation"]["also_illegal"]
    assert any(a["step"] == pre["label"] and "not the crashing step" in a["reason"] for a in also)
    # the plan() input-contract rule's signature matches (file, line and message of the plan error)
    assert d["explanation"]["signature_matches"] == ["FI002"]


def test_flashinfer_trtllm_launch_error_is_explained_by_the_grid_rule():
    rc, d = bisect_json("sglang-flashinfer-trtllm-launch-error.log")
    rec = d["explanation"]["recognised"]
    assert rec["kind"] == "flashinfer_launch" and rec["failure"] == "launch_error_silent"
    assert (rec["file"], rec["source_line"], rec["error_code"]) == ("fmhaKernels.cuh", 451, "CUDA_ERROR_INVALID_VALUE")
    # the launch command's --attention-backend trtllm_mla picks the profile that routes decode to FlashInfer
    assert d["profile"] == ["sglang-trtllm-mla"]
    assert d["explanation"]["signature_matches"] == ["FI001"] and rc == 1 and d["rule"] == ["FI001"]
    step = d["crashing_step"]
    # the Decode line at line 4 shows 65536 running requests; --max-running-requests 98304 allows more
    assert step["from_line"] == 4 and step["range"] == [65536, 98304] and step["likely"] == 65536
    top = 2**16 - 1                      # CUDA's gridDim.z limit: the batch axis of the trtllm-gen launch
    assert (d["boundary"]["largest_legal"], d["boundary"]["first_illegal"]) == (top, top + 1)
    # the FlashMLA caveat about other backends no longer applies: the profile models this backend
    assert not any("verdicts of FlashMLA rules" in n for n in d["notes"])
    assert any("no version for SGLang 0.5.12" in n for n in d["notes"])


def test_vllm_combine_grid_error_is_judged_as_vllm_and_matches_no_combine_rule():
    rc, d = bisect_json("vllm-mla-combine-grid.log")
    assert d["engine"] == "vllm"
    rec = d["explanation"]["recognised"]
    assert (rec["file"], rec["source_line"], rec["message"]) == ("mla_combine.cu", 201, "invalid configuration argument")
    # FMLA002 is an illegal memory access at combine.cu, FMLA008 the dispatch assertion at mla_combine.cu:172:
    # neither is this launch error; the combine grid rule (1408756: ceil(s_q*h_q/8) on gridDim.y) is.
    assert d["explanation"]["signature_matches"] == ["FMLA017"] and rc == 0
    assert any("vllm-flashmla-sparse" in n and "applies to this model" in n for n in d["notes"])


def test_bench_one_batch_is_one_unchunked_extend():
    rc, d = bisect_json("sglang-bench-one-batch-traceback.log")
    step = d["crashing_step"]
    assert rc == 1 and step["range"] == [3 * 4096, 3 * 4096] and step["exact"]
    assert d["boundary"]["largest_legal"] == MAX_B and step["engine_version"] == "0.5.12"


# ------------------------------------------------------------------ the batches behind the fixtures
@pytest.mark.parametrize("name,args,codes", [
    ("empty-sparse-prefill-chunk.yaml", [], ["SGL002"]),
    ("empty-sparse-prefill-call.json", [], ["FMLA014"]),
    ("bench-one-batch-3x4096.yaml", [], ["FMLA001", "SGL001"]),
    ("cut-off-last-prefill-12288.yaml", [], ["FMLA001", "SGL001"]),
    ("completed-prefill-12288-flashinfer.yaml", [], ["FMLA001", "SGL001"]),
    # ceil(4096 * 128 / 8) = 65536 > 65535 blocks on 1408756's gridDim.y; 9241ae3 puts b * s_q on x
    ("mla-combine-grid-s_q-4096.json", ["--kernel-gen", "flashmla-1408756"], ["FMLA017"]),
    ("mla-combine-grid-s_q-4096.json", ["--kernel-gen", "flashmla-9241ae3"], []),
    # 65536 rows > 11622, the 9241ae3 scheduler's limit ((232448 - 4) // 20)
    ("bench-one-batch-65536.yaml", [], ["FMLA001", "SGL001"]),
    # 64 running / 2 DP ranks = 32 rows; DP1's first request holds global slot 32
    ("pd-decode-dp-slot-32.yaml", [], ["SLOT004"]),
    # qo_indptr 4 -> 3: a query length of -1, through the module's plan
    ("flashinfer-plan-negative-qo-len.json", [], ["FI002"]),
    # 16385 requests of one token and one key: one work item each, one past 16384
    ("flashinfer-plan-16385-works.json", [], ["FI004"]),
])
def test_fixture_batches_reproduce_their_step(name, args, codes):
    r = CliRunner().invoke(app, ["check", str(BATCHES / name), "--json", *args])
    d = json.loads(r.stdout)
    assert sorted({f["code"] for f in d["findings"] if f["severity"] == "error"}) == sorted(codes)


@pytest.mark.parametrize("rows,legal", [(0, False), (1, True), (2, True)])
def test_empty_chunk_at_its_limit(rows, legal):
    doc = {"engine": "sglang-dsv4@0.5.8", "gpu": "H200", "forward_mode": "extend",
           "requests": [{"id": "p1", "extend_tokens": rows, "prefix_len": 6144}]}
    rep = validate_batch.check(doc)
    assert rep.legal is legal and (("SGL002" in rep.codes) is not legal)


# ------------------------------------------------------------------ rule selection and statistics
def test_select_ignore_and_statistics():
    rc, d = bisect_json("sglang-dsv4-prefill-12288.log", "--ignore", "SGL")
    assert rc == 1 and d["rule"] == ["FMLA001"]
    rc, d = bisect_json("sglang-dsv4-prefill-12288.log", "--select", "SLOT")
    assert rc == 0 and d["rule"] == [] and d["explanation"]["status"] == "not_explained"
    rc, d = bisect_json("sglang-dsv4-prefill-12288.log", "--statistics")
    assert d["statistics"]["FMLA001"] >= 1 and d["statistics"]["SGL001"] >= 1
    r = bisect("fixtures/logs/sglang-dsv4-prefill-12288.log", "--statistics")
    assert "statistics:" in r.stdout and "FMLA001" in r.stdout.split("statistics:")[1]
    r = bisect("fixtures/logs/sglang-dsv4-prefill-12288.log", "--select", "NOPE9")
    assert r.exit_code == 2 and "--select" in r.output



def test_the_story_says_not_explained_and_also_illegal():
    out = bisect("fixtures/logs/sglang-cut-off-cuda-error.log").stdout
    assert "verdict: not explained: the error line is cut off" in out
    assert "also illegal, does not explain this error:" in out and "FMLA001, SGL001 at 12288 query rows" in out
    assert "crashing step" not in out
    out = bisect("fixtures/logs/sglang-0523-sparse-prefill-tma-assert.log").stdout
    assert "signature of: FMLA014, SGL002" in out and "max_running_requests unknown" not in out
    assert "--server-arg max_running_requests" not in out
    out = bisect("fixtures/logs/sglang-dsv4-prefill-12288.log").stdout
    assert "invented: request ids p1, p2, p3, d1" in out and "split evenly over the 3 requests" in out


if __name__ == "__main__":      # write the golden view of the named fixtures (review the diff before committing)
    os.chdir(ROOT)
    for n in sys.argv[1:] or sorted(TRUTH):
        res = CliRunner().invoke(app, ["bisect", f"fixtures/logs/{n}", "--json"])
        view = golden_view(json.loads(res.stdout))
        (GOLDEN / f"{Path(n).stem}.json").write_text(json.dumps(view, indent=1, ensure_ascii=False) + "\n")
        print("wrote", GOLDEN / f"{Path(n).stem}.json")
