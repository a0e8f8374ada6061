"""Build names from package metadata, the provider's build and model generation, and `validate-batch env`.

The metadata lookup is replaced by a table (no package is installed for these tests); expected build
names are the ones rules/flashmla.json and the field use (written out here, not read from the code).
"""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import validate_batch.kernel_mode.builds as builds
import validate_batch.kernel_mode.env as envmod
import validate_batch.kernel_mode.providers as prov
from validate_batch.cli.main import app
from validate_batch.kernel_mode.builds import Dist, build_name
from validate_batch.kernel_mode.providers import Provider

SGLFM_FEATURES = frozenset({"indices", "topk_length", "extra_k_cache", "extra_indices", "extra_topk_length",
                            "is_fp8_kvcache", "use_legacy", "enable_batch_invariant"})
UPSTREAM_FEATURES = frozenset({"indices", "topk_length", "extra_k_cache", "extra_indices", "extra_topk_length",
                               "is_fp8_kvcache"})


@pytest.mark.parametrize("provider,dist,api,params,use_legacy,expected", [
    ("flash_mla", Dist("sgl-flash-mla", "1.0.0"), "sched_meta", {"use_legacy"}, None, "sgl-flash-mla-1.0.0"),
    ("flash_mla", Dist("sgl-flash-mla", "1.0.0"), "sched_meta", {"use_legacy"}, True, "sgl-flash-mla-1.0.0"),
    ("flash_mla", Dist("sgl-flash-mla", "1.0.0"), "sched_meta", {"use_legacy"}, False, "flashmla-2026.09.30"),
    ("flash_mla", Dist("flash_mla", "1.0.0"), "sched_meta", set(), None, "flashmla-9241ae3"),
    ("flash_mla", Dist("flash_mla", "1.0.0+1408756"), "sched_meta", set(), None, "flashmla-1408756"),
    ("flash_mla", None, "tensors", set(), None, "flashmla-1408756"),
    ("flash_mla", None, "sched_meta", {"enable_batch_invariant"}, None, "flashmla-2026.09.30"),
    ("sgl_kernel", Dist("sgl-kernel", "0.3.21"), "tensors", set(), None, "sgl-kernel-flashmla"),
    # an sglang-kernel release whose binary was read is its own build (its combine kernel's grid and splits)
    ("sgl_kernel", Dist("sglang-kernel", "0.4.7"), "sched_meta", set(), None, "sglang-kernel-0.4.7"),
    ("sgl_kernel", Dist("sglang-kernel", "0.4.6"), "sched_meta", set(), None, "sglang-kernel-0.4.6"),
    ("sgl_kernel", Dist("sglang-kernel", "0.4.10"), "sched_meta", set(), None, "sgl-kernel-flashmla"),
    ("vllm", Dist("vllm", "0.33.0"), None, set(), None, "vllm-0.33"),
])
def test_build_names(provider, dist, api, params, use_legacy, expected):
    assert build_name(provider, dist, api, frozenset(params), use_legacy) == expected


def test_provider_build_and_generation():
    p = Provider("flash_mla", "flash_mla", "sched_meta", features=SGLFM_FEATURES, distribution="sgl-flash-mla",
                 version="1.0.0")
    assert p.takes_use_legacy and p.build == "sgl-flash-mla-1.0.0"
    assert p.generation == "sgl-flash-mla-1.0.0" and p.generation_note == ""
    assert p.default_use_legacy() is True
    up = Provider("flash_mla", "flash_mla", "sched_meta", features=UPSTREAM_FEATURES)
    assert (up.build, up.generation, up.takes_use_legacy) == ("flashmla-9241ae3", "flashmla-9241ae3", False)
    old = Provider("flash_mla", "flash_mla", "tensors", features=UPSTREAM_FEATURES)
    assert old.generation == "flashmla-1408756"
    assert p.to_dict()["build"] == "sgl-flash-mla-1.0.0" and up.to_job()["build"] == "flashmla-9241ae3"


def test_unmodelled_build_falls_back_to_its_api_with_a_note(monkeypatch):
    monkeypatch.setattr(prov, "known_generation", lambda name: name in ("flashmla-9241ae3", "flashmla-1408756"))
    p = Provider("sgl_kernel", "sgl_kernel.flash_mla", "tensors", features=UPSTREAM_FEATURES,
                 distribution="sgl-kernel", version="0.3.21")
    assert p.build == "sgl-kernel-flashmla" and p.generation == "flashmla-1408756"
    assert "no model of sgl-kernel-flashmla" in p.generation_note


def fake_metadata(monkeypatch, table: dict):
    monkeypatch.setattr(builds, "lookup_distribution", lambda name: table.get(name))


def test_installed_distributions_from_metadata(monkeypatch):
    fake_metadata(monkeypatch, {"sgl-flash-mla": Dist("sgl-flash-mla", "1.0.0", "/site"),
                                "vllm": Dist("vllm", "0.33.0", "/site")})
    names = [(d.name, d.version) for d in builds.installed_distributions()]
    assert names == [("sgl-flash-mla", "1.0.0"), ("vllm", "0.33.0")]
    assert builds.distribution_of("flash_mla").name == "sgl-flash-mla"
    assert builds.distribution_of("sgl_kernel") is None


# ----------------------------------------------------------------------------- env


def test_env_without_anything_installed(monkeypatch):
    fake_metadata(monkeypatch, {})
    monkeypatch.setattr(prov, "find_providers", lambda names=prov.PROVIDER_NAMES: [])
    monkeypatch.setattr(envmod, "find_providers", lambda names=prov.PROVIDER_NAMES: [])
    monkeypatch.setattr(envmod, "torch_installed", lambda: False)
    r = CliRunner().invoke(app, ["env", "--json"])
    assert r.exit_code == 3, r.output
    d = json.loads(r.stdout)
    assert d["builds"] == [] and d["torch"]["installed"] is False
    assert d["kernel_mode"]["available"] is False and "torch is not installed" in d["kernel_mode"]["reason"]
    assert d["kernel_gen_auto"]["generation"] == "flashmla-9241ae3"      # rules/flashmla.json's default
    assert any("pip install '.[kernel]'" in h for h in d["install"])
    r = CliRunner().invoke(app, ["doctor"])
    assert r.exit_code == 3 and "none installed" in r.stdout and "pip install '.[kernel]'" in r.stdout


def test_env_with_sgl_flash_mla_and_vllm(monkeypatch, tmp_path):
    fake_metadata(monkeypatch, {"sgl-flash-mla": Dist("sgl-flash-mla", "1.0.0", str(tmp_path)),
                                "vllm": Dist("vllm", "0.33.0", str(tmp_path))})
    sglfm = Provider("flash_mla", "flash_mla", "sched_meta", str(tmp_path / "flash_mla/flash_mla_interface.py"),
                     SGLFM_FEATURES, "", "sgl-flash-mla", "1.0.0")
    monkeypatch.setattr(envmod, "find_providers", lambda names=prov.PROVIDER_NAMES: [sglfm])
    monkeypatch.setattr(envmod, "torch_installed", lambda: True)
    monkeypatch.setattr(envmod, "vllm_flashmla_files", lambda dist=None: [str(tmp_path / "vllm/_flashmla_C.abi3.so")])
    r = CliRunner().invoke(app, ["env", "--json", "--no-gpu"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    by = {b["build"]: b for b in d["builds"]}
    assert set(by) == {"sgl-flash-mla-1.0.0", "vllm-0.33"}
    assert by["sgl-flash-mla-1.0.0"]["builds_by_use_legacy"] == {"true": "sgl-flash-mla-1.0.0",
                                                                  "false": "flashmla-2026.09.30"}
    assert by["vllm-0.33"]["runnable"] is False
    assert d["kernel_gen_auto"]["generation"] == "sgl-flash-mla-1.0.0"
    assert d["gpu"] == {"checked": False} and d["install"] == []
    r = CliRunner().invoke(app, ["env", "--no-gpu"])
    assert "sgl-flash-mla-1.0.0" in r.stdout and "use_legacy=False: flashmla-2026.09.30" in r.stdout


def test_env_reads_the_gpu_in_a_child(monkeypatch, tmp_path):
    backend = tmp_path / "gpu_backend.py"
    backend.write_text("def run(job, stage, partial):\n"
                       "    return {'torch': '0+x', 'cuda_available': True, 'providers': [],\n"
                       "            'device': {'name': 'Stand-in H200', 'cc': [9, 0], 'num_sms': 132,"
                       " 'smem_optin': 232448}}\n")
    fake_metadata(monkeypatch, {})
    monkeypatch.setattr(envmod, "find_providers", lambda names=prov.PROVIDER_NAMES: [])
    monkeypatch.setattr(envmod, "torch_installed", lambda: True)
    r = CliRunner().invoke(app, ["env", "--json", "--backend", str(backend)])
    d = json.loads(r.stdout)
    assert d["gpu"]["name"] == "Stand-in H200" and d["gpu"]["num_sms"] == 132
    assert r.exit_code == 3 and d["kernel_mode"]["available"] is False     # a GPU, but no FlashMLA build


def test_env_imports_no_torch_in_this_process():
    import subprocess
    import sys

    code = ("import sys, json\nfrom validate_batch.kernel_mode.env import environment\n"
            "environment(check_gpu=False)\nprint(json.dumps('torch' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "false"
