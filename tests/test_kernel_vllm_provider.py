"""Kernel mode's provider for vLLM 0.33's bundled FlashMLA, chosen by ``--kernel-gen vllm-0.33``.

Everything here runs on the CPU with a stand-in of the bundle: a folder laid out like the wheel's
three files, whose ``.so`` files are empty and whose interface module is a few lines written here
with the same function signatures (the real files need a CUDA GPU to load, and are not part of the
project). The child-side import is checked in a real child process with CPU torch; the kernel run
itself with a stand-in backend that answers with what the real kernel wrote on an H200
(``fixtures/measured/vllm033_h200_sparse_cases.jsonl``).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validate_batch.cli.main import app
from validate_batch.kernel_mode.check import kernel_check_report
from validate_batch.kernel_mode.providers import detect, find_providers, provider_for_build
from validate_batch.kernel_mode.runner import ChildSpec, run_job
from validate_batch.kernel_mode.vllm_bundle import ENV_VAR, locate
from validate_batch.cli.session import check_documents

MEASURED = Path(__file__).resolve().parents[1] / "fixtures" / "measured"

# The interface's shape: get_mla_metadata(*args, **kwargs) and a FlashMLASchedMeta class (the current
# API), flash_mla_with_kvcache taking the sparse and batch-invariant parameters. No torch import: the
# child imports it on a CPU-only machine.
STANDIN_INTERFACE = '''
class FlashMLASchedMeta:
    tile_scheduler_metadata = None
    num_splits = None


def get_mla_metadata(*args, **kwargs):
    return FlashMLASchedMeta(), None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False,
                           indices=None, attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None,
                           topk_length=None, extra_topk_length=None, out=None, enable_batch_invariant=False):
    raise RuntimeError("stand-in: no kernels here")
'''

STANDIN_BACKEND = r'''
"""Stand-in child: detect answers like the H200 run; decode returns the metadata recorded there."""
import json
import os

KEYS = ("kind", "b", "s_q", "h_q", "d_qk", "topk", "topk_length", "extra_topk", "extra_topk_length", "page",
        "extra_page")


def run(job, stage, partial):
    if job["op"] == "detect":
        prov = {"name": "vllm", "module": "vllm.third_party.flashmla.flash_mla_interface", "api": "sched_meta",
                "features": ["enable_batch_invariant", "extra_indices", "extra_k_cache", "extra_topk_length",
                             "indices", "is_fp8_kvcache", "topk_length"], "reason": "stand-in",
                "distribution": "vllm", "version": "0.33.0"}
        wanted = job.get("providers") or []
        return {"torch": "0.0+standin", "cuda_available": True, "providers": [prov] if "vllm" in wanted else [],
                "device": {"name": "NVIDIA H200", "cc": [9, 0], "num_sms": 132, "smem_optin": 232448}}
    assert job["provider"]["name"] == "vllm", job["provider"]
    want = {k: job["record"].get(k) for k in KEYS}
    with open(os.environ["STANDIN_RECORDS"]) as fh:
        for line in list(fh)[1:]:
            r = json.loads(line)
            if {k: r.get(k) for k in KEYS} == want:
                md = r["tile_scheduler_metadata"]
                return {"tile_scheduler_metadata": md, "num_splits": r["num_splits"], "num_sm_parts": len(md),
                        "message": r["message"]}
    raise RuntimeError("not recorded")
'''


def make_bundle(root: Path, *, extension: bool = True, version: str | None = "0.33.0") -> Path:
    pkg = root / "vllm"
    (pkg / "third_party" / "flashmla").mkdir(parents=True)
    (pkg / "_flashmla_C.abi3.so").write_bytes(b"")
    if extension:
        (pkg / "_flashmla_extension_C.abi3.so").write_bytes(b"")
    (pkg / "third_party" / "flashmla" / "__init__.py").write_text("")
    (pkg / "third_party" / "flashmla" / "flash_mla_interface.py").write_text(STANDIN_INTERFACE)
    if version:
        meta = root / f"vllm-{version}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return root


def test_locate_reads_the_extracted_wheel_folder(tmp_path):
    root = make_bundle(tmp_path)
    for given in (root, root / "vllm"):           # the folder unzip wrote, or its vllm/ folder
        bundle, why = locate(str(given))
        assert why == "" and bundle.version == "0.33.0" and bundle.root == str(root)
        assert bundle.kernels.endswith("_flashmla_C.abi3.so") and bundle.extension.endswith("_extension_C.abi3.so")


def test_locate_names_what_is_missing(tmp_path):
    bundle, why = locate(str(make_bundle(tmp_path, extension=False)))
    assert bundle is None and "_flashmla_extension_C*.so" in why and "--vllm-flashmla" in why
    bundle, why = locate(str(tmp_path / "nowhere"))
    assert bundle is None and "is not a folder" in why


def test_the_build_picks_the_provider():
    assert provider_for_build("vllm-0.33") == "vllm"
    assert provider_for_build("flashmla-9241ae3") == "auto"
    assert provider_for_build("vllm-0.33", "flash_mla") == "flash_mla"      # an explicit provider wins
    assert provider_for_build(None) == "auto"


def test_static_provider_from_the_interface_file(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(make_bundle(tmp_path)))
    (p,) = find_providers(("vllm",))
    assert (p.name, p.api, p.version, p.build, p.generation) == ("vllm", "sched_meta", "0.33.0", "vllm-0.33",
                                                                  "vllm-0.33")
    assert {"indices", "topk_length", "extra_k_cache"} <= p.features


def test_absent_bundle_is_a_clear_reason(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    det = detect("vllm")
    assert not det.available and "no " in det.reason and "--vllm-flashmla" in det.reason


def test_cli_without_the_bundle_exits_3_without_a_traceback(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    rec = tmp_path / "call.jsonl"
    rec.write_text(json.dumps({"kind": "sparse", "b": 4, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}) + "\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(app, ["kernel-check", str(rec), "--kernel-gen", "vllm-0.33", "--vllm-flashmla",
                                   str(empty), "--json"])
    assert res.exit_code == 3, res.output
    d = json.loads(res.stdout)
    assert d["available"] is False and "bundled FlashMLA is incomplete" in d["reason"]
    assert "Traceback" not in res.output
    bad = CliRunner().invoke(app, ["kernel-check", str(rec), "--kernel-gen", "vllm-9.99"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_the_child_imports_the_bundle_from_its_folder(tmp_path):
    pytest.importorskip("torch")
    root = make_bundle(tmp_path)
    r = run_job({"op": "detect", "providers": ["vllm"]}, 120, ChildSpec(env=((ENV_VAR, str(root)),)))
    assert r.is_ok, r.message
    (prov,) = r.payload["providers"]
    assert (prov["api"], prov["distribution"], prov["version"]) == ("sched_meta", "vllm", "0.33.0")
    assert prov["origin"].startswith(str(root))


def test_kernel_check_by_build_runs_the_vllm_provider(tmp_path):
    backend = tmp_path / "standin_vllm.py"
    backend.write_text(STANDIN_BACKEND)
    recorded = MEASURED / "vllm033_h200_sparse_cases.jsonl"
    lines = recorded.read_text().splitlines()
    keys = ("kind", "b", "s_q", "h_q", "d_qk", "topk", "topk_length", "extra_topk", "extra_topk_length", "page",
            "extra_page")
    calls = [{k: v for k, v in json.loads(line).items() if k in keys} for line in lines[1:9]]
    src = tmp_path / "calls.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in calls))
    report, _ = check_documents(str(src), "H200", None)
    child = ChildSpec(backend=str(backend), env=(("STANDIN_RECORDS", str(recorded)),))
    res = kernel_check_report(report, provider=provider_for_build("vllm-0.33"), child=child)
    assert res["provider"]["build"] == "vllm-0.33" and res["model_generation"] == "vllm-0.33-sparse-sm90"
    assert res["summary"]["metadata"] == {"compared": 8, "identical": 8, "differing": 0}
    assert res["status"] == "agree"
