"""Kernel mode plumbing with a stand-in provider: real child processes, no torch, no GPU.

The stand-in backend (written to a temporary file) mimics FlashMLA's ways of failing: it prints a
CUDA error line and calls ``exit(1)``, kills itself with SIGSEGV, raises, hangs past the timeout, or
returns the metadata the real kernel recorded in the oracle. Its behaviour is chosen by the call's
``label`` or by limits the tests compute from first principles.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from validate_batch.api import check_calls
from validate_batch.kernel_mode.check import kernel_check_report
from validate_batch.kernel_mode.runner import ChildSpec, run_job

SMEM_OPTIN_H200 = 232448
MAX_ROWS_H200 = (SMEM_OPTIN_H200 - 4) // 20        # 4*(5b+1) bytes of scheduler shared memory -> 11622

STANDIN_SOURCE = r'''
"""Stand-in for FlashMLA in the kernel-mode child: same failure modes, no torch, no GPU."""
import ctypes
import json
import os
import signal
import sys
import time

from validate_batch.kernel_mode.protocol import Unavailable, Unsupported

SCHED = "/src/FlashMLA/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu"
COMBINE = "/src/FlashMLA/csrc/smxx/decode/combine/combine.cu"
KEY_FIELDS = ("kind", "b", "s_q", "h_q", "d_qk", "topk", "topk_length", "extra_topk", "extra_topk_length", "seqlens")


def key(rec):
    k = {f: rec.get(f) for f in KEY_FIELDS}
    if k["kind"] == "dense":
        k["d_qk"] = None
    return json.dumps(k, sort_keys=True)


def die(site, line, text):
    sys.stderr.write(f"CUDA error ({site}:{line}): {text}\n")
    sys.stderr.flush()
    os._exit(1)


def oracle_lookup(rec):
    path = os.environ.get("STANDIN_ORACLE")
    if not path:
        return None
    want = key(rec)
    with open(path) as fh:
        for line in fh:
            r = json.loads(line)
            if "kind" in r and key(r) == want:
                return r
    return None


def run(job, stage, partial):
    op = job.get("op")
    if op == "detect":
        mode = os.environ.get("STANDIN_DETECT", "ok")
        if mode == "no-torch":
            raise Unavailable("torch is not importable in the child: No module named 'torch'")
        prov = {"name": "flash_mla", "module": "flash_mla", "api": "sched_meta",
                "features": ["extra_indices", "extra_k_cache", "extra_topk_length", "indices", "is_fp8_kvcache",
                             "topk_length"], "reason": "stand-in"}
        if mode == "sglfm":   # the PyPI fork: every entry point takes use_legacy
            prov = dict(prov, features=prov["features"] + ["use_legacy"], distribution="sgl-flash-mla",
                        version="1.0.0")
        if mode == "no-provider":
            prov = dict(prov, api=None, reason="import failed: ModuleNotFoundError: No module named 'flash_mla'")
        out = {"torch": "0.0+standin", "cuda_available": mode != "no-cuda", "providers": [prov]}
        if mode == "no-cuda":
            out["cuda_reason"] = "torch 0.0+standin sees no CUDA GPU"
        else:
            out["device"] = {"name": "Stand-in H200", "cc": [9, 0], "num_sms": 132, "smem_optin": 232448,
                             "memory_bytes": 150000000000}
        return out
    if op == "slot":
        rows, slot = job["rows"], job["slot"]
        stage("index-write")
        if -rows <= slot < rows:
            return {"message": f"OK wrote slot {slot} of {rows} rows"}
        if job.get("device") == "cpu":
            raise IndexError(f"index {slot} is out of bounds for dimension 0 with size {rows}")
        sys.stderr.write("IndexKernel.cu:111: block: [0,0,0], thread: [0,0,0] Assertion `-sizes[i] <= index && "
                         "index < sizes[i] && \"index out of bounds\"` failed.\n")
        raise RuntimeError("CUDA error: device-side assert triggered")
    rec = job["record"]
    label = rec.get("label", "")
    use_legacy = job.get("use_legacy", rec.get("use_legacy"))
    if use_legacy is None and os.environ.get("STANDIN_DETECT") == "sglfm":
        use_legacy = True          # what the torch backend passes to a provider that takes it
    if use_legacy is not None:
        partial({"use_legacy": use_legacy})
    stage("call")
    if use_legacy is False or os.environ.get("STANDIN_RAISE") == "sm100f":
        raise RuntimeError("sparse_decode_fwd is only supported on SM100f architectures")
    if label == "standin:attr":
        raise AttributeError("module 'flash_mla' has no attribute 'flash_mla_sparse_fwd'")
    fb = int(os.environ.get("STANDIN_FALLBACK_ABOVE", "0") or 0)
    if fb and rec.get("b", 0) > fb:   # printed by C stdio, as the library does: lost unless flushed
        b = rec["b"]
        ctypes.CDLL(None).printf(b"[WARNING] batch_size=%d requires %dB shared memory (max=232448B), using "
                                 b"low-smem fallback kernel.\n", ctypes.c_int(b), ctypes.c_int(4 * (3 * b + 1)))
    limit = int(os.environ.get("STANDIN_B_LIMIT", "0") or 0)
    if limit and rec.get("b", 0) > limit:
        die(SCHED, 111, "invalid argument")
    fail_b = {int(x) for x in os.environ.get("STANDIN_FAIL_B", "").split(",") if x}
    if rec.get("b") in fail_b:
        die(COMBINE, 197, "an illegal memory access was encountered")
    if label == "standin:exit":
        die(SCHED, 111, "invalid argument")
    if label == "standin:ima":
        die(COMBINE, 197, "an illegal memory access was encountered")
    if label == "standin:segv":
        sys.stderr.write("Assertion `params.topk % TOPK_BLOCK_SIZE == 0` failed (csrc/sm90/decode/sparse_fp8/"
                         "instantiations/../splitkv_mla.cuh:689):\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if label == "standin:raise":
        raise RuntimeError("Only head_size_k == 576 or 512 is supported for sparse decoding")
    if label == "standin:raise-ima":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if label == "standin:hang":
        time.sleep(600)
    if label == "standin:unsupported":
        raise Unsupported("flash_mla.flash_mla_with_kvcache takes no topk_length")
    stage("readback")
    found = oracle_lookup(rec)
    if found is None or "tile_scheduler_metadata" not in found:
        return {"message": "OK"}
    md = found["tile_scheduler_metadata"]
    if label == "standin:corrupt":
        md = [list(r) for r in md]
        md[1][3] += 1
    ns = found["num_splits"]
    return {"num_sm_parts": len(md), "tile_scheduler_metadata": md, "num_splits": ns,
            "message": f"OK {len(md)} {ns[-1]}"}
'''


@pytest.fixture(scope="session")
def standin(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("standin") / "standin_backend.py"
    path.write_text(STANDIN_SOURCE, encoding="utf-8")
    return str(path)


def spec(standin: str, **env) -> ChildSpec:
    return ChildSpec(backend=standin, env=tuple((k, str(v)) for k, v in env.items()))


SPARSE = {"kind": "sparse", "b": 8, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}


def decode_job(**extra) -> dict:
    return {"op": "decode", "record": dict(SPARSE, **extra)}


# ----------------------------------------------------------------------------- one child per job

def test_child_exit_one_with_cuda_error(standin):
    r = run_job(decode_job(label="standin:exit"), 30, spec(standin))
    assert (r.outcome, r.exit_code, r.stage) == ("process_exit", 1, "call")
    assert r.cuda_error.site == "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:111"


def test_child_illegal_memory_access_exit(standin):
    r = run_job(decode_job(label="standin:ima"), 30, spec(standin))
    assert (r.outcome, r.oracle_outcome) == ("illegal_memory_access", "process_exit")


def test_child_sigsegv_is_process_crash(standin):
    r = run_job(decode_job(label="standin:segv"), 30, spec(standin))
    assert (r.outcome, r.signal, r.exit_code) == ("process_crash", "SIGSEGV", -signal.SIGSEGV)
    assert "TOPK_BLOCK_SIZE" in r.message


def test_child_python_exception(standin):
    r = run_job(decode_job(label="standin:raise"), 30, spec(standin))
    assert (r.outcome, r.error_type) == ("python_exception", "RuntimeError")
    assert r.message == "Only head_size_k == 576 or 512 is supported for sparse decoding"


def test_child_exception_after_illegal_access(standin):
    r = run_job(decode_job(label="standin:raise-ima"), 30, spec(standin))
    assert r.outcome == "illegal_memory_access" and r.exit_code == 0


def test_child_hang_is_killed_at_the_timeout(standin):
    r = run_job(decode_job(label="standin:hang"), 1.5, spec(standin))
    assert r.outcome == "timeout" and r.verdict == "inconclusive"
    assert 1.5 <= r.elapsed_s < 10


def test_bad_backend_is_unavailable_not_a_traceback(tmp_path):
    r = run_job({"op": "decode"}, 30, ChildSpec(backend=str(tmp_path / "missing.py")))
    assert r.outcome == "unavailable" and "missing.py" in r.message


# ----------------------------------------------------------------------------- kernel_check_report

def _oracle_records(oracle_dir: Path, n_each: int = 3) -> list[dict]:
    recs = [json.loads(l) for l in (oracle_dir / "flashmla_h200_cases.jsonl").read_text().splitlines()[1:]]
    recs = [r for r in recs if "tile_scheduler_metadata" in r]
    picked, seen = [], {}
    for r in recs:   # a few of each shape family, small b first for speed
        fam = (r["kind"], r.get("d_qk"), "topk_length" in r, "extra_topk" in r)
        if seen.get(fam, 0) < n_each and r["b"] <= 2048:
            seen[fam] = seen.get(fam, 0) + 1
            picked.append(r)
    return picked


def test_report_metadata_matches_oracle_through_the_child(oracle_dir, standin):
    recs = _oracle_records(oracle_dir)
    assert len(recs) >= 6
    report = check_calls(recs, "H200")
    res = kernel_check_report(report, None, child=spec(standin, STANDIN_ORACLE=oracle_dir / "flashmla_h200_cases.jsonl"),
                              timeout=60, max_parallel=2)
    assert res["available"] is True
    assert res["provider"]["api"] == "sched_meta" and res["model_generation"] == "flashmla-9241ae3"
    s = res["summary"]
    assert s["calls"] == len(recs) and s["outcomes"] == {"ok": len(recs)}
    assert s["metadata"] == {"compared": len(recs), "identical": len(recs), "differing": 0}
    assert s["all_agree"] and res["agreement"] is True
    assert json.loads(json.dumps(res)) == res      # JSON-able


def test_report_detects_a_corrupted_metadata_row(oracle_dir, standin):
    rec = dict(_oracle_records(oracle_dir, 1)[0], label="standin:corrupt")
    report = check_calls([rec], "H200")
    res = kernel_check_report(report, None, child=spec(standin, STANDIN_ORACLE=oracle_dir / "flashmla_h200_cases.jsonl"),
                              timeout=60)
    md = res["calls"][0]["metadata"]
    assert md["identical"] is False and md["rows_differing"] == 1 and md["first_row"] == 1
    assert md["kernel_row"][3] == md["model_row"][3] + 1
    assert res["agreement"] is False and res["summary"]["metadata"]["differing"] == 1


def test_report_verdicts_and_per_rule_agreement(standin):
    limit_plus_one = MAX_ROWS_H200 + 1
    calls = [
        {"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512},       # FMLA001
        {"kind": "sparse", "b": 4096, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512},        # legal
        {"kind": "sparse", "b": limit_plus_one, "s_q": 4, "h_q": 64, "d_qk": 512, "topk": 512},
        dict(SPARSE, topk=100, label="standin:segv"),                                          # FMLA004
        dict(SPARSE, label="standin:raise"),                                                   # legal, kernel raises
        dict(SPARSE, topk_length=[200] + [1] * 7),                                              # FMLA003 (UB), runs
    ]
    report = check_calls(calls, "H200")
    res = kernel_check_report(report, None, child=spec(standin, STANDIN_B_LIMIT=MAX_ROWS_H200), timeout=60,
                              max_parallel=3)
    by = {e["index"]: e for e in res["calls"]}
    assert [by[i]["agreement"] for i in range(6)] == ["agree", "agree", "agree", "agree", "disagree", "agree_ub"]
    assert by[0]["kernel"]["outcome"] == "process_exit" and by[0]["failure_class_match"] is True
    assert by[0]["kernel"]["cuda_error"]["line"] == 111
    assert by[3]["kernel"]["outcome"] == "process_crash" and by[3]["failure_class_match"] is True
    pr = res["summary"]["per_rule"]
    assert pr["FMLA001"]["calls"] == 2 and pr["FMLA001"]["agree"] == 2 and pr["FMLA001"]["kernel_failed"] == 2
    assert pr["FMLA004"]["agree"] == 1
    assert pr["FMLA003"]["agree_ub"] == 1 and pr["FMLA003"]["kernel_ok"] == 1
    assert pr["(no error)"] == {"calls": 2, "kernel_ok": 1, "kernel_failed": 1, "inconclusive": 0, "agree": 1,
                                "agree_ub": 0, "disagree": 1, "failure_class_match": 0}
    assert res["agreement"] is False
    from rich.console import Console

    from validate_batch.kernel_mode.check import render_kernel_result

    con = Console(record=True, width=200)
    render_kernel_result(res, con)
    text = con.export_text()
    assert "DISAGREE" in text and "get_decoding_sched_meta.cu:111" in text and "SIGSEGV" in text
    assert "undefined behaviour" in text


def test_unavailable_without_provider_is_a_clear_dict(monkeypatch):
    import validate_batch.kernel_mode.providers as prov

    monkeypatch.setattr(prov, "torch_installed", lambda: False)
    report = check_calls([SPARSE], "H200")
    res = kernel_check_report(report, None)
    assert res["available"] is False and "torch is not installed" in res["reason"]
    monkeypatch.setattr(prov, "torch_installed", lambda: True)
    monkeypatch.setattr(prov, "find_providers", lambda names=prov.PROVIDER_NAMES: [])
    res = kernel_check_report(report, None)
    assert res["available"] is False and "no FlashMLA provider is installed" in res["reason"]


@pytest.mark.parametrize("mode,needle", [("no-cuda", "sees no CUDA GPU"), ("no-provider", "no usable FlashMLA provider"),
                                         ("no-torch", "torch is not importable")])
def test_detection_failures_reported_by_child(standin, mode, needle):
    from validate_batch.kernel_mode.providers import detect

    det = detect("auto", spec(standin, STANDIN_DETECT=mode), 30)
    assert det.available is False and needle in det.reason


# ----------------------------------------------------------------------------- probe and slots

def test_probe_finds_scheduler_limit_with_one_child_per_probe(standin):
    from validate_batch.kernel_mode.probe import probe_boundary

    seen = []
    res = probe_boundary('{"kind":"sparse","s_q":1,"h_q":64,"d_qk":512,"topk":128}', "b", 11000, 12288,
                         child=spec(standin, STANDIN_B_LIMIT=MAX_ROWS_H200), timeout=30, max_parallel=4,
                         progress=seen.append)
    m, meas = res["model"], res["measured"]
    assert (m["last_legal"], m["first_illegal"], m["monotonic"]) == (MAX_ROWS_H200, MAX_ROWS_H200 + 1, True)
    assert (meas["status"], meas["last_legal"], meas["first_illegal"]) == ("found", MAX_ROWS_H200, MAX_ROWS_H200 + 1)
    assert meas["failure"] == "process_exit"
    assert res["agree"] is True and res["boundary_is_model_transition"] is True
    assert len(seen) == meas["num_probes"] == len(res["probes"])
    assert all(p["agrees"] for p in res["probes"])


def test_probe_reports_non_monotonic_measurements(standin):
    from validate_batch.kernel_mode.probe import probe_boundary

    # The stand-in fails only at b = 4675..4678 (an island), like the o_accum limit's first illegal run.
    res = probe_boundary('{"kind":"sparse","s_q":8,"h_q":128,"d_qk":512,"topk":2048}', "b", 4600, 4800,
                         child=spec(standin, STANDIN_FAIL_B="4675,4676,4677,4678,4800"), timeout=30, max_parallel=4)
    assert res["model"]["first_illegal"] == 4675 and res["model"]["monotonic"] is False
    vals = {p["value"]: p for p in res["probes"]}
    assert vals[4674]["verdict"] == "legal" and vals[4675]["verdict"] == "illegal"
    assert res["model"]["legal_again"][0] in vals            # the model's "legal again" value was probed
    assert any("not monotonic" in n for n in res["notes"])


def test_slot_probe_device_failure_next_to_cpu(standin):
    from validate_batch.kernel_mode.slot_probe import probe_slot_index

    res = probe_slot_index(33, 4, 96, "cuda", timeout=30, child=spec(standin))
    assert res["available"] and not res["in_bounds"]
    assert res["outcome"] == "device_assert" and "index out of bounds" in res["message"]
    assert res["cpu"]["outcome"] == "python_exception"
    assert res["cpu"]["message"] == "index 96 is out of bounds for dimension 0 with size 33"
    assert res["expected_cpu_message"] == res["cpu"]["message"]
    ok = probe_slot_index(33, 4, 32, "cuda", timeout=30, child=spec(standin), with_cpu=False)
    assert ok["in_bounds"] and ok["outcome"] == "ok" and "cpu" not in ok


def test_slot_probe_rejects_bad_input():
    from validate_batch.errors import InputError
    from validate_batch.kernel_mode.slot_probe import probe_slot_index

    for kwargs, field in (({"rows": 0}, "rows"), ({"width": "2"}, "width"), ({"slot": 1.5}, "slot"),
                          ({"device": "tpu"}, "device")):
        args = dict(rows=33, width=1, slot=3, device="cuda")
        args.update(kwargs)
        with pytest.raises(InputError) as e:
            probe_slot_index(**args)
        assert e.value.field == field


# ----------------------------------------------------------------------------- CLI

def test_cli_kernel_check_json_and_exit_codes(standin, tmp_path):
    from typer.testing import CliRunner

    from validate_batch.cli.main import app

    f = tmp_path / "calls.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"device": "NVIDIA H200", "num_sms": 132, "cc": [9, 0], "smem_optin": 232448},
        {"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512},
        {"kind": "sparse", "b": 4096, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512},
    ]) + "\n")
    runner = CliRunner()
    env = {"STANDIN_B_LIMIT": str(MAX_ROWS_H200)}
    r = runner.invoke(app, ["kernel-check", str(f), "--json", "--backend", standin, "--timeout", "30"], env=env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert [c["kernel"]["outcome"] for c in out["calls"]] == ["process_exit", "ok"]
    r = runner.invoke(app, ["kernel-check", str(f), "--backend", standin], env=env)
    assert r.exit_code == 0 and "AGREE" in r.stdout and "get_decoding_sched_meta.cu:111" in r.stdout
    r = runner.invoke(app, ["kernel-check", str(f), "--jobs", "0"])
    assert r.exit_code == 2


def test_cli_probe_json_and_bad_template(standin):
    from typer.testing import CliRunner

    from validate_batch.cli.main import app

    runner = CliRunner()
    args = ["probe", "-q", "b", "-t", '{"kind":"sparse","s_q":1,"h_q":64,"d_qk":512,"topk":128}', "--lo", "11600",
            "--hi", "11700", "-j", "4", "--json", "--backend", standin]
    r = runner.invoke(app, args, env={"STANDIN_B_LIMIT": str(MAX_ROWS_H200)})
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["measured"]["first_illegal"] == MAX_ROWS_H200 + 1
    r = runner.invoke(app, ["probe", "-t", '{"kind":"sparse","h_q":64}', "--backend", standin])
    assert r.exit_code == 2


def test_cli_check_kernel_without_gpu_never_tracebacks(monkeypatch):
    from typer.testing import CliRunner

    import validate_batch.kernel_mode.providers as prov
    from validate_batch.cli.main import app

    monkeypatch.setattr(prov, "find_providers", lambda names=prov.PROVIDER_NAMES: [])
    monkeypatch.setattr(prov, "torch_installed", lambda: True)
    r = CliRunner().invoke(app, ["check", "--kernel", "--json", "-"],
                           input='{"kind":"sparse","b":12288,"s_q":1,"h_q":64,"d_qk":512,"topk":512}')
    assert r.exit_code == 1 and r.exception is None or isinstance(r.exception, SystemExit)
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["legal"] is False and d["kernel"]["available"] is False


# ----------------------------------------------------------------------------- outcome classes

SGLFM_FAST_PATH_ROWS = (SMEM_OPTIN_H200 - 4) // 12     # 4*(3b+1) bytes on the legacy fast path -> 19370


def test_architecture_refusal_is_inconclusive_never_agreement(standin):
    # sgl-flash-mla with use_legacy=False on SM90: every call raises, for a reason that is not the batch.
    calls = [{"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512},    # FMLA001
             {"kind": "sparse", "b": 4096, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}]     # legal
    res = kernel_check_report(check_calls(calls, "H200"), None, child=spec(standin, STANDIN_RAISE="sm100f"),
                              timeout=30)
    assert [e["kernel"]["outcome"] for e in res["calls"]] == ["unsupported", "unsupported"]
    assert [e["agreement"] for e in res["calls"]] == ["inconclusive", "inconclusive"]
    assert all("architecture" in e["agreement_reason"] for e in res["calls"])
    assert res["summary"]["status"] == "inconclusive" and res["agreement"] is False
    from rich.console import Console

    from validate_batch.kernel_mode.check import render_kernel_result

    con = Console(record=True, width=200)
    render_kernel_result(res, con)
    text = con.export_text()
    assert "INCONCLUSIVE" in text and "AGREE " not in text.replace("INCONCLUSIVE", "")
    assert "only supported on SM100f architectures" in text


def test_missing_attribute_is_inconclusive(standin):
    res = kernel_check_report(check_calls([dict(SPARSE, label="standin:attr")], "H200"), None, child=spec(standin),
                              timeout=30)
    e = res["calls"][0]
    assert (e["kernel"]["outcome"], e["agreement"]) == ("unsupported", "inconclusive")
    assert e["kernel"]["error_type"] == "AttributeError"


def test_illegal_call_failing_in_another_class_is_a_disagreement(standin):
    # FMLA001 predicts exit(1) at the scheduler; a recoverable exception is not that failure.
    rec = {"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512, "label": "standin:raise"}
    res = kernel_check_report(check_calls([rec], "H200"), None, child=spec(standin), timeout=30)
    e = res["calls"][0]
    assert e["model"]["codes"][0] == "FMLA001" and e["kernel"]["outcome"] == "python_exception"
    assert e["failure_class_match"] is False
    assert e["agreement"] == "disagree" and "process_exit" in e["agreement_reason"]
    assert res["summary"]["status"] == "disagree"


def test_partly_inconclusive_run_agrees_on_what_ran(standin):
    calls = [{"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512},
             dict(SPARSE, label="standin:hang")]
    res = kernel_check_report(check_calls(calls, "H200"), None, child=spec(standin, STANDIN_B_LIMIT=MAX_ROWS_H200),
                              timeout=2)
    assert [e["agreement"] for e in res["calls"]] == ["agree", "inconclusive"]
    assert res["summary"]["status"] == "agree"
    assert res["summary"]["inconclusive_reasons"] == {"no result within the time limit": 1}


def test_cli_exit_codes_by_status(standin, tmp_path):
    from typer.testing import CliRunner

    from validate_batch.cli.main import app

    f = tmp_path / "calls.jsonl"
    f.write_text(json.dumps({"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}) + "\n")
    legal = tmp_path / "legal.jsonl"
    legal.write_text(json.dumps({"kind": "sparse", "b": 4096, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}) + "\n")
    runner = CliRunner()
    base = ["--backend", standin, "--timeout", "30"]
    r = runner.invoke(app, ["kernel-check", str(f), *base], env={"STANDIN_RAISE": "sm100f"})
    assert r.exit_code == 3, r.output
    assert "INCONCLUSIVE" in r.stdout
    r = runner.invoke(app, ["kernel-check", str(f), *base], env={"STANDIN_B_LIMIT": str(MAX_ROWS_H200)})
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["kernel-check", str(legal), *base], env={"STANDIN_B_LIMIT": "100"})
    assert r.exit_code == 1, r.output


def test_check_kernel_exit_code_table():
    from validate_batch.cli.kernel_cmd import check_kernel_exit_code

    agree = {"available": True, "status": "agree"}
    disagree = {"available": True, "status": "disagree"}
    inconclusive = {"available": True, "status": "inconclusive"}
    unavailable = {"available": False, "reason": "no GPU"}
    assert [check_kernel_exit_code(True, r) for r in (agree, disagree, inconclusive, unavailable)] == [0, 1, 3, 3]
    assert [check_kernel_exit_code(False, r) for r in (agree, disagree, inconclusive, unavailable)] == [1, 1, 1, 1]
    assert check_kernel_exit_code(False, agree, exit_zero=True) == 0
    assert check_kernel_exit_code(False, disagree, exit_zero=True) == 1


# ----------------------------------------------------------------------------- use_legacy

def test_sgl_flash_mla_build_and_default_use_legacy(standin):
    report = check_calls([SPARSE], "H200")
    res = kernel_check_report(report, None, child=spec(standin, STANDIN_DETECT="sglfm"), timeout=30)
    assert res["provider"]["build"] == "sgl-flash-mla-1.0.0" and res["provider"]["takes_use_legacy"] is True
    # the build's legacy half, the one SGLang's wrapper selects
    assert res["model_build"] == "sgl-flash-mla-1.0.0" and res["model_generation"] == "sgl-flash-mla-1.0.0-legacy"
    e = res["calls"][0]
    assert e["kernel"]["outcome"] == "ok" and e["kernel"]["use_legacy"] is True and e["agreement"] == "agree"


def test_probe_template_use_legacy_false_reaches_the_child(standin):
    from validate_batch.kernel_mode.probe import probe_boundary

    res = probe_boundary('{"kind":"sparse","s_q":1,"h_q":64,"d_qk":512,"topk":128,"use_legacy":false}', "b", 1, 64,
                         child=spec(standin, STANDIN_DETECT="sglfm"), timeout=30)
    assert res["use_legacy"] is False
    assert {p["outcome"] for p in res["probes"]} == {"unsupported"}
    assert res["status"] == "inconclusive"
    assert any("SM100f" in r for r in res["measured"]["inconclusive_reasons"])


# ----------------------------------------------------------------------------- the low-smem fallback

def test_fallback_warning_from_c_stdio_is_captured(standin):
    b = SGLFM_FAST_PATH_ROWS + 1
    r = run_job(decode_job(b=b), 30, spec(standin, STANDIN_FALLBACK_ABOVE=SGLFM_FAST_PATH_ROWS))
    assert r.outcome == "ok" and r.fallback_used
    assert r.fallback["batch_size"] == b and r.fallback["smem_bytes"] == 4 * (3 * b + 1)
    assert r.fallback["smem_max"] == SMEM_OPTIN_H200
    assert r.to_dict()["fallback_used"] is True
    r = run_job(decode_job(b=SGLFM_FAST_PATH_ROWS), 30, spec(standin, STANDIN_FALLBACK_ABOVE=SGLFM_FAST_PATH_ROWS))
    assert r.outcome == "ok" and not r.fallback_used


def test_kernel_check_reports_fallback(standin):
    b = SGLFM_FAST_PATH_ROWS + 10
    rec = {"kind": "sparse", "b": b, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
    res = kernel_check_report(check_calls([rec], "H200"), None,
                              child=spec(standin, STANDIN_FALLBACK_ABOVE=SGLFM_FAST_PATH_ROWS), timeout=30)
    e = res["calls"][0]
    assert e["fallback_used"] is True and e["kernel"]["fallback"]["batch_size"] == b
    assert res["summary"]["fallback_used"] == 1


def test_probe_no_row_limit_with_fallback_noted(standin):
    from typer.testing import CliRunner

    from validate_batch.cli.main import app

    hi = 3 * SGLFM_FAST_PATH_ROWS
    args = ["probe", "-q", "b", "-t", '{"kind":"sparse","s_q":1,"h_q":64,"d_qk":512,"topk":128}', "--lo", "1",
            "--hi", str(hi), "--gpu", "H200", "--backend", standin]
    env = {"STANDIN_FALLBACK_ABOVE": str(SGLFM_FAST_PATH_ROWS)}
    r = CliRunner().invoke(app, args + ["--json"], env=env)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    meas = res["measured"]
    assert meas["status"] == "hi_legal" and meas["fallback"]["probes"] >= 1
    assert meas["fallback"]["lowest"] > SGLFM_FAST_PATH_ROWS
    assert any(p["fallback_used"] for p in res["probes"]) and not all(p["fallback_used"] for p in res["probes"])
    r = CliRunner().invoke(app, args, env=env)
    assert f"no row limit up to the cap (b = {hi})" in r.stdout and "fallback used" in r.stdout
