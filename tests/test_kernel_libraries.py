"""Kernel mode for FlashInfer's MLA plan and DeepGEMM's paged MQA-logits metadata.

Ground truth: ``fixtures/measured/flashinfer072_h200_kernel_check.json.gz`` and
``flashinfer072post1_h200_kernel_check.json.gz`` - ``validate-batch kernel-check --flashinfer DIR --json
--keep-output`` of the 248 calls in ``flashinfer_h200_kernel_check_inputs.jsonl.gz`` (the 220 random plans
of ``flashinfer072_h200_plan_cases.jsonl``, the FI002 / FI003 probes, and 16383 / 16384 / 16385 work items
on both entries) on an H200 with flashinfer-python 0.7.2 and 0.7.2.post1, each plan's 18 plan_info numbers
and every planned array read back from the GPU, then the attention run with outputs pre-filled; and
``deepgemm_h200_vllm033_kernel_check.json.gz``: vLLM 0.33's bundled deep_gemm 2.8.1 on the 19 calls of
``deepgemm_h200_kernel_check_inputs.jsonl``.

The first tests hold the current model to those recorded kernel results. The plumbing tests run the
real child processes with a stand-in backend (no GPU here) that answers each job with what the H200
recorded for it, so that the parent's job building, comparison and verdicts are exercised on real data;
a perturbed answer must be caught.
"""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from validate_batch.api import check_calls
from validate_batch.flashinfer.mla_schedule import MERGE, PER_WORK, mla_schedule
from validate_batch.kernel_mode import libraries
from validate_batch.kernel_mode.check import kernel_check_report
from library_standin import standin_spec, write_standin

MEASURED = Path(__file__).resolve().parents[1] / "fixtures" / "measured"
INPUTS = [json.loads(x) for x in gzip.decompress((MEASURED / "flashinfer_h200_kernel_check_inputs.jsonl.gz")
                                                 .read_bytes()).decode().splitlines() if x.strip()]
RECORDS = {v: json.loads(gzip.decompress((MEASURED / f).read_bytes()))
           for v, f in (("flashinfer-python-0.7.2", "flashinfer072_h200_kernel_check.json.gz"),
                        ("flashinfer-python-0.7.2.post1", "flashinfer072post1_h200_kernel_check.json.gz"))}
DG_INPUTS = [json.loads(x) for x in (MEASURED / "deepgemm_h200_kernel_check_inputs.jsonl").read_text().splitlines()
             if x.strip()]
DG = json.loads(gzip.decompress((MEASURED / "deepgemm_h200_vllm033_kernel_check.json.gz").read_bytes()))
CAPACITY = 16384          # entries of each per-work array of the plan (MLAPlan's work list)


def _kernel(version: str, i: int) -> dict:
    c = RECORDS[version]["calls"][i]
    assert c["call"] == INPUTS[i]["label"]
    return c["kernel"]


def test_the_recordings_are_what_they_say():
    assert len(INPUTS) == 248
    for version, rec in RECORDS.items():
        assert rec["device"]["name"] == "NVIDIA H200" and rec["device"]["num_sms"] == 132
        assert rec["provider"]["build"] == version and rec["provider"]["version"] == version.rsplit("-", 1)[1]
        assert [c["call"] for c in rec["calls"]] == [r["label"] for r in INPUTS]
        assert all(c["kernel"]["outcome"] in ("ok", "python_exception") for c in rec["calls"])
    assert "/tmp/" not in json.dumps(RECORDS) and "/tmp/" not in json.dumps(DG)


@pytest.mark.parametrize("version", sorted(RECORDS))
def test_every_recorded_plan_the_model_calls_legal_is_the_models_bit_for_bit(version):
    compared = 0
    for i, rec in enumerate(INPUTS):
        k = _kernel(version, i)
        r = check_calls([{**rec, "version": version}], "H200")
        if not r.legal or k["outcome"] != "ok":
            continue
        got = k["payload"]
        m = mla_schedule(rec["qo_indptr"], rec["kv_indptr"], rec["kv_len"], rec["h_q"], 132, rec.get("causal", False))
        assert got["plan_info"] == m["plan_info"], rec["label"]
        n = m["total_works"]
        assert got["arrays"]["work_indptr"] == m["arrays"]["work_indptr"], rec["label"]
        for key in PER_WORK:
            assert got["arrays"][key][:n] == m["arrays"][key][:n], (rec["label"], key)
        for key in MERGE:
            assert got["arrays"][key] == m["arrays"][key], (rec["label"], key)
        assert got["unwritten_requests"] == [], rec["label"]
        compared += 1
    assert compared >= 230


@pytest.mark.parametrize("version", sorted(RECORDS))
def test_the_model_s_verdict_is_the_kernel_s_on_every_recorded_call(version):
    for i, rec in enumerate(INPUTS):
        k = _kernel(version, i)
        r = check_calls([{**rec, "version": version}], "H200")
        unwritten = (k.get("payload") or {}).get("unwritten_requests") or []
        failed = k["outcome"] != "ok" or bool(unwritten)
        kinds = {f.failure.kind for f in r.errors}
        if kinds == {"undefined_behaviour"}:
            continue                       # the kernel may run or not: either agrees
        assert r.legal == (not failed), (rec["label"], r.codes, k["outcome"], k["message"], unwritten)
        if failed:
            want = "silent_wrong" if k["outcome"] == "ok" else k["outcome"]
            assert want in kinds, (rec["label"], kinds, k["outcome"])


@pytest.mark.parametrize("version", sorted(RECORDS))
@pytest.mark.parametrize("entry", ["wrapper", "module"])
@pytest.mark.parametrize("n", [CAPACITY - 1, CAPACITY, CAPACITY + 1])
def test_fi004_the_work_list_capacity_at_its_edge(version, entry, n):
    # n decode requests of 1 token and 1 key, 128 heads: 128 packed rows each (mean above 64: two-CTA clusters
    # of 128 rows, 66 on 132 SMs), so one tile per request; 1 key per tile is never split: n work items
    i = next(j for j, r in enumerate(INPUTS) if r["label"] == f"probe works {entry} total works {n}")
    rec, k = INPUTS[i], _kernel(version, i)
    assert len(rec["kv_len"]) == n and set(rec["kv_len"]) == {1} and rec["h_q"] == 128
    r = check_calls([{**rec, "version": version}], "H200")
    if n <= CAPACITY:
        assert k["outcome"] == "ok" and k["payload"]["unwritten_requests"] == [] and r.legal
        assert k["payload"]["arrays"]["work_indptr"][-1] == n
        return
    assert r.codes == ["FI004"] and r.errors[0].numbers["works"] == n
    if entry == "wrapper":
        assert k["outcome"] == "python_exception" and f"needs at least {n} work items" in k["message"]
        assert r.errors[0].failure.kind == "python_exception"
    else:
        assert k["outcome"] == "ok" and k["payload"]["unwritten_requests"]
        assert r.errors[0].failure.kind == "silent_wrong"


def test_deepgemm_bundled_by_vllm_agrees_at_its_host_check():
    assert DG["provider"]["build"] == "deepgemm-vllm-0.33" and DG["provider"]["vendored_by"] == "vllm 0.33.0"
    assert [c["call"] for c in DG["calls"]] == [r["label"] for r in DG_INPUTS]
    # the host check: 4 * align(b, 32) dynamic bytes <= 232448 -> b <= 58112 (align 32: 58112 = 1816 * 32)
    assert 4 * 58112 <= 232448 < 4 * (58112 + 32)
    for rec, c in zip(DG_INPUTS, DG["calls"]):
        k = c["kernel"]
        r = check_calls([{**{x: y for x, y in rec.items() if x != "label"}, "version": "deepgemm-vllm-0.33"}], "H200")
        assert r.legal == (k["outcome"] == "ok"), (rec, r.codes, k["outcome"])
        assert (rec["batch"] <= 58112) == (k["outcome"] == "ok"), rec
        if k["outcome"] == "ok":
            assert k["payload"]["metadata_shape"] == [133, 2]     # one row per SM and one more
        else:
            assert "smem_size <= SM90ArchSpec::smem_capacity" in k["message"] and r.codes == ["DG001"]


# ----------------------------------------------------------------------------- plumbing (stand-in)

@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return write_standin(tmp_path_factory.mktemp("standin"))


def _report(records):
    from validate_batch.api import check_calls as cc

    return cc(records, "H200")


def _spec(standin, version, record, inputs, **extra):
    return standin_spec(standin, version, [(MEASURED / inputs, MEASURED / record)], **extra)


PICK = [0, 1, 7, 50, 119, 200, 219, 220, 225, 234, 237, 242, 243, 244, 245, 246, 247]


def test_kernel_check_of_recorded_flashinfer_plans_agrees(standin):
    recs = [{k: v for k, v in INPUTS[i].items()} for i in PICK]
    res = kernel_check_report(_report(recs), None, timeout=120,
                              child=_spec(standin, "0.7.2", "flashinfer072_h200_kernel_check.json.gz",
                                          "flashinfer_h200_kernel_check_inputs.jsonl.gz"))
    assert res["available"] and res["library"] == "flashinfer" and res["provider"]["build"] == "flashinfer-python-0.7.2"
    s = res["summary"]
    assert s["agreement"]["disagree"] == 0 and s["metadata"]["differing"] == 0, [
        (e["call"], e["agreement_reason"], (e["metadata"] or {}).get("summary")) for e in res["calls"]
        if e["agreement"] == "disagree" or (e["metadata"] and not e["metadata"]["identical"])]
    legal = sum(1 for e in res["calls"] if e["model"]["verdict"] == "legal")
    assert s["metadata"]["identical"] == legal >= 10
    by = {e["call"]: e for e in res["calls"]}
    assert by["probe works module total works 16385"]["model"]["codes"] == ["FI004"]
    assert by["probe works module total works 16385"]["agreement"] == "agree"     # rows left unwritten, as predicted
    assert by["probe works wrapper total works 16385"]["kernel"]["outcome"] == "python_exception"


def test_a_planned_array_one_value_off_is_a_metadata_difference(standin):
    recs = [INPUTS[i] for i in (0, 1)]
    res = kernel_check_report(_report(recs), None, timeout=120,
                              child=_spec(standin, "0.7.2", "flashinfer072_h200_kernel_check.json.gz",
                                          "flashinfer_h200_kernel_check_inputs.jsonl.gz",
                                          STANDIN_BUMP_WORK=len(INPUTS[1]["qo_indptr"])))
    assert res["status"] == "disagree"
    bad = [e for e in res["calls"] if e["metadata"] and not e["metadata"]["identical"]]
    assert [e["call"] for e in bad] == [INPUTS[1]["label"]] and "kv_end[0]" in bad[0]["metadata"]["summary"]


def test_kernel_check_of_recorded_deepgemm_calls_agrees(standin):
    recs = [{k: v for k, v in r.items() if k != "label"} | {"label": r["label"]} for r in DG_INPUTS]
    res = kernel_check_report(_report(recs), None, timeout=120,
                              child=_spec(standin, "2.8.1", "deepgemm_h200_vllm033_kernel_check.json.gz",
                                          "deepgemm_h200_kernel_check_inputs.jsonl"))
    assert res["library"] == "deep_gemm" and res["status"] == "agree"
    # a stand-in names no folder: the version alone picks the facts (2.8.1 is only vLLM 0.33's copy)
    assert res["provider"]["build"] == "deepgemm-vllm-0.33"
    assert res["summary"]["agreement"]["agree"] == len(DG_INPUTS)


def test_a_report_with_both_libraries_runs_both_and_fails_on_either(standin):
    # one stand-in answers only FlashInfer jobs here: the DeepGEMM part's lookups fail -> not an agreement
    recs = [INPUTS[0], {"kind": "paged_mqa_logits_metadata", "batch": 7}]
    res = kernel_check_report(_report(recs), None, timeout=60,
                              child=_spec(standin, "0.7.2", "flashinfer072_h200_kernel_check.json.gz",
                                          "flashinfer_h200_kernel_check_inputs.jsonl.gz"))
    from validate_batch.cli.kernel_cmd import kernel_status

    assert res["library"] == "flashinfer" and [p["library"] for p in res["libraries"]] == ["deep_gemm"]
    assert kernel_status(res) != "agree"


# ----------------------------------------------------------------------------- finding the libraries

def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_flashinfer_from_an_unzipped_wheel_is_judged_by_its_version(tmp_path):
    _write(tmp_path / "flashinfer" / "__init__.py", "__version__ = '0.7.2.post1'\n")
    _write(tmp_path / "flashinfer_python-0.7.2.post1.dist-info" / "METADATA", "Name: flashinfer-python\nVersion: 0.7.2.post1\n")
    lib, why = libraries.locate_flashinfer(str(tmp_path))
    assert why == "" and lib.build == "flashinfer-python-0.7.2.post1" and lib.note == ""
    _write(tmp_path / "flashinfer_python-0.7.2.post1.dist-info" / "METADATA", "Name: flashinfer-python\nVersion: 0.9.0\n")
    lib, _ = libraries.locate_flashinfer(str(tmp_path))
    assert lib.build == "flashinfer-fb28d72" and "no facts for FlashInfer 0.9.0" in lib.note


def test_deep_gemm_inside_an_extracted_vllm_wheel(tmp_path):
    _write(tmp_path / "vllm" / "third_party" / "deep_gemm" / "__init__.py", "__version__ = '2.8.1'\n")
    _write(tmp_path / "vllm-0.33.0.dist-info" / "METADATA", "Name: vllm\nVersion: 0.33.0\n")
    lib, why = libraries.locate_deep_gemm(str(tmp_path))
    assert why == "" and lib.build == "deepgemm-vllm-0.33" and lib.vendored_by == "vllm 0.33.0"
    assert lib.root == str(tmp_path / "vllm" / "third_party")
    _write(tmp_path / "other" / "deep_gemm" / "__init__.py", "__version__ = '2.4.2'\n")
    assert libraries.locate_deep_gemm(str(tmp_path / "other"))[0].build == "deepgemm-7f2a703"
    lib, why = libraries.locate_deep_gemm(str(tmp_path / "nowhere"))
    assert lib is None and "is not a folder" in why


def test_kernel_check_names_a_bad_library_folder(tmp_path):
    rec = tmp_path / "c.jsonl"
    rec.write_text(json.dumps({"kind": "paged_mqa_logits_metadata", "batch": 8}) + "\n")
    p = subprocess.run([sys.executable, "-m", "validate_batch", "kernel-check", "--deep-gemm", str(tmp_path / "x"),
                        str(rec)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--deep-gemm" in p.stderr and "not a folder" in p.stderr
    assert "Traceback" not in p.stderr
