"""The same batches under every SGLang release 0.5.12 .. 0.5.23, through the CLI's JSON output.

Each row says what the release's wheel implies, written here from the wheels and release notes
(not from the code under test): the FlashMLA build it runs (its METADATA pin, or the upstream
package 0.5.12 imports, judged as 9241ae3), how an extend forward is routed, whether the engine's
schedule precompute runs and how it fails, and which steps run a kernel this project does not
model. Every output must name the release judged as and the build.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from validate_batch.cli.main import app

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[1] / "rules" / "examples" / "dsv4-prefill-3x4096.yaml"

#: release -> the FlashMLA build its DeepSeek-V4 backend runs (the wheel's METADATA pin; 0.5.12 and
#: 0.5.12.post1 import the upstream flash_mla package, which the seed crash ran at 9241ae3)
BUILD = {
    "0.5.12": "flashmla-9241ae3", "0.5.12.post1": "flashmla-9241ae3",
    "0.5.13": "sglang-kernel-0.4.3", "0.5.13.post1": "sglang-kernel-0.4.3", "0.5.14": "sglang-kernel-0.4.4",
    "0.5.15": "sglang-kernel-0.4.4", "0.5.15.post1": "sglang-kernel-0.4.4",
    "0.5.16": "sglang-kernel-0.4.5", "0.5.17": "sglang-kernel-0.4.5",
    "0.5.18": "sglang-kernel-0.4.6.post1", "0.5.19": "sglang-kernel-0.4.6.post1",
    "0.5.20": "sglang-kernel-0.4.7", "0.5.21": "sglang-kernel-0.4.7", "0.5.22": "sglang-kernel-0.4.9",
    "0.5.23": "sgl-flash-mla-1.0.0",
}
RELEASES = list(BUILD)
ORDER = {r: i for i, r in enumerate(RELEASES)}

# the decode kernel's scheduler gets its shared memory for at most 11622 rows on 9241ae3 (and
# crashes past it); the sgl-kernel / sglang-kernel copies fall back to a low-shared-memory kernel
# and sgl-flash-mla 1.0.0's legacy kernels have no row limit: legal
ROW_LIMIT_9241AE3 = 11622
THRESHOLD = 11673        # 0.5.13 on: non-speculative extends above it go to flash_mla_sparse_fwd


def at_least(release: str, first: str) -> bool:
    return ORDER[release] >= ORDER[first]


def seed_routing(release: str) -> str:
    """Where the seed's 12288-row extend goes: the decode kernel before any routing (0.5.12*),
    sparse prefill above the threshold (0.5.13, 0.5.14), sparse prefill for every extend with the
    switch on by default (0.5.15 on)."""
    if not at_least(release, "0.5.13"):
        return "decode_kernel"
    return "sparse_prefill"


def seed_verdict(release: str) -> str:
    if seed_routing(release) == "decode_kernel":
        return "illegal" if 12288 > ROW_LIMIT_9241AE3 else "legal"
    return "legal"


def decode_verdict(release: str, rows: int) -> str:
    """An H200 (SM90) DeepSeek-V4 decode: never routed; only 9241ae3 has a row limit."""
    if BUILD[release] == "flashmla-9241ae3" and rows > ROW_LIMIT_9241AE3:
        return "illegal"
    return "legal"


# SGLang's schedule precompute (DeepSeek-V4.1 on Blackwell, 64 kernel heads, 0.5.21 on): dynamic
# shared memory 4*(5b+1+8P) bytes with P = 148 partitions on a B200, 48 static bytes, launched
# without an opt-in (0.5.21, 0.5.22: dynamic + static <= 48 KiB) or with 48 KiB opted in (0.5.23);
# 0.5.21 has no size check before it, 0.5.22 and 0.5.23 skip it when the dynamic part > 48 KiB
B200_SMS, KIB48, STATIC = 148, 49152, 48


def dynamic(b: int) -> int:
    return 4 * (5 * b + 1 + 8 * B200_SMS)


def precompute_fails(release: str, b: int) -> bool:
    if not at_least(release, "0.5.21"):
        return False
    if release == "0.5.21":
        return dynamic(b) + STATIC > KIB48
    guarded = dynamic(b) <= KIB48                  # 0.5.22 and 0.5.23: the guard's check
    if release == "0.5.22":
        return guarded and dynamic(b) + STATIC > KIB48
    return False                                   # 0.5.23: the dynamic part may reach 48 KiB


# the engine's SM100 small-batch decode kernel (swapab_attention): most rows and heads per rank
SMALL = {"0.5.21": (8, {16}), "0.5.22": (8, {16}), "0.5.23": (40, {16, 32})}


def small_decode_verdict(release: str, rows: int, per_rank: int) -> str:
    top, heads = SMALL.get(release, (0, set()))
    return "not_modelled" if rows <= top and per_rank in heads else "legal"


#: the setting that turns prefill context parallelism on (each wheel's server-argument fields)
CP_SETTING = {r: ("enable_nsa_prefill_context_parallel" if not at_least(r, "0.5.13") else
                  "enable_dsa_prefill_context_parallel" if not at_least(r, "0.5.14") else "enable_prefill_cp")
              for r in RELEASES}


# ------------------------------------------------------------------------------------------ helpers
def run(tmp_path: Path, d: dict, name: str = "b.json") -> tuple[dict, int, str]:
    f = tmp_path / name
    f.write_text(json.dumps(d), encoding="utf-8")
    res = runner.invoke(app, ["check", str(f), "--json"])
    assert res.exit_code in (0, 1, 2), res.output
    return json.loads(res.stdout), res.exit_code, res.stderr


def verdict(out: dict) -> str:
    return out.get("verdict") or ("legal" if out["legal"] else "illegal")


def named(out: dict, release: str) -> None:
    """The output names the release judged as and the build."""
    j = out["judged_as"][0]
    assert j["profile"] == "sglang-dsv4" and j["release"] == release, j
    assert j["kernel_build"] == BUILD[release] == out["kernel_build"], (release, j)


def seed(release: str) -> dict:
    d = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    d["engine"] = f"sglang-dsv4@{release}"
    return d


def decode(release: str, n: int, **kw) -> dict:
    d = {"engine": f"sglang-dsv4@{release}", "gpu": kw.get("gpu", "H200"), "forward_mode": "decode",
         "server_args": {"tp_size": 8}, "requests": [{"id": f"r{i}", "seq_len": 300} for i in range(n)]}
    if "model" in kw:
        d["model"] = kw["model"]
    return d


V41 = {"model_type": "deepseek_v41", "num_attention_heads": 128}       # 16 heads per rank at TP 8


# --------------------------------------------------------------------------------------- the table
def test_the_table_covers_every_known_release():
    from validate_batch.facts.knowledge import load
    known = [r["release"] for r in load("engines")["profiles"]["sglang-dsv4"]["releases"]]
    assert sorted(known) == sorted(RELEASES)


@pytest.mark.parametrize("release", RELEASES)
def test_the_seed_prefill(release, tmp_path):
    out, code, _ = run(tmp_path, seed(release))
    named(out, release)
    want = seed_verdict(release)
    assert verdict(out) == want and code == (0 if want == "legal" else 1), (release, out["findings"])
    assert out["query_rows"] == 12288
    assert {c["route"] for c in out["kernel_calls"]} == {seed_routing(release)}
    assert out["routing"]["routed"] is (seed_routing(release) == "sparse_prefill")
    if want == "illegal":
        assert out["safe_split"]["possible"]


@pytest.mark.parametrize("release", ["0.5.12", "0.5.14", "0.5.20", "0.5.23"])
def test_the_seed_prefill_in_text_names_release_and_build(release, tmp_path):
    f = tmp_path / "b.json"
    f.write_text(json.dumps(seed(release)), encoding="utf-8")
    res = runner.invoke(app, ["check", str(f)])
    assert f"judged as: sglang-dsv4 {release}" in res.stdout and f"kernel build {BUILD[release]}" in res.stdout


@pytest.mark.parametrize("release", RELEASES)
def test_a_decode_at_the_row_limit(release, tmp_path):
    for n in (ROW_LIMIT_9241AE3, ROW_LIMIT_9241AE3 + 1):
        out, code, _ = run(tmp_path, decode(release, n))
        named(out, release)
        assert verdict(out) == decode_verdict(release, n), (release, n, out["findings"])
        assert out["routing"]["routed"] is False            # a decode is never routed
        assert {c["route"] for c in out["kernel_calls"]} == {"decode_kernel"}


@pytest.mark.parametrize("release", RELEASES)
def test_the_precompute_window_edges(release, tmp_path):
    first = next(b for b in range(1, 10 ** 5) if dynamic(b) + STATIC > KIB48)      # 2219
    last = max(b for b in range(1, 10 ** 5) if dynamic(b) <= KIB48)                 # 2220
    for b in (first - 1, first, last, last + 1):
        out, _, _ = run(tmp_path, decode(release, b, gpu="B200", model=V41))
        named(out, release)
        want = precompute_fails(release, b)
        assert verdict(out) == ("illegal" if want else "legal"), (release, b)
        assert ("SGL003" in {f["code"] for f in out["findings"] if f["severity"] == "error"}) is want


@pytest.mark.parametrize("release", RELEASES)
def test_a_small_decode_on_sm100(release, tmp_path):
    for n in (8, 9, 40, 41):
        for model, per_rank in ((V41, 16), ({**V41, "num_attention_heads": 256}, 32), ({**V41, "num_attention_heads": 512}, 64)):
            out, code, err = run(tmp_path, decode(release, n, gpu="B200", model=model))
            named(out, release)
            want = small_decode_verdict(release, n, per_rank)
            assert verdict(out) == want, (release, n, per_rank)
            if want == "not_modelled":
                assert code == 2 and "not modelled" in err and out["kernel_calls"] == []
                assert "swapab_attention" in out["not_modelled"][0]["path"]
                assert f"sglang {release} " in out["not_modelled"][0]["source"]
            else:
                assert code == 0 and "not_modelled" not in out


@pytest.mark.parametrize("release", RELEASES)
def test_a_context_parallel_prefill(release, tmp_path):
    d = seed(release)
    d["server_args"] = {**d["server_args"], CP_SETTING[release]: True, "attn_cp_size": 2}
    out, code, err = run(tmp_path, d)
    named(out, release)
    assert verdict(out) == "not_modelled" and code == 2, release
    assert out["not_modelled"][0]["field"] == f"server_args.{CP_SETTING[release]}"
    assert "apply_cp_reindex" in out["not_modelled"][0]["source"] and "not modelled" in err
