"""vLLM 0.33's and 0.34's bundled FlashMLA and sgl-flash-mla 1.0.0, measured on an H200.

Ground truth: ``fixtures/measured/vllm033_h200_*.jsonl``, ``vllm034_h200_*.jsonl`` (the same seeded
calls and probes, run again on vLLM 0.34.0's files) and ``sglfm_h200_*.jsonl``,
recorded with ``bench/record_kernels.py`` (one H200, torch 2.11, the wheel's own ``.so`` files). Each
record holds the inputs and what the kernel wrote (``tile_scheduler_metadata``, ``num_splits``) or
how it failed. Every record is compared with the model: metadata bit for bit (the generation's
columns), and the verdict (the kernel ran = legal; failed = illegal, in the class the model
predicts). The limits are derived here from first principles (the scheduler's shared-memory
formula against the H200's 232448 B, the static arrays, the partition formula) and checked at
limit-1 / limit / limit+1 against the probes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from validate_batch.api import check_calls
from validate_batch.flashmla.plan import plan
from validate_batch.kernel_mode.check import diff_metadata, judge, model_view
from validate_batch.kernel_mode.outcome import RunResult
from validate_batch.facts.knowledge import load

MEASURED = Path(__file__).resolve().parents[1] / "fixtures" / "measured"
VLLM, VLLM34, SGLFM = "vllm-0.33", "vllm-0.34", "sgl-flash-mla-1.0.0"
#: each vLLM build's recording: its file prefix, the date and the wheel's version
RUNS = {VLLM: ("vllm033", "2026-12-01", "0.33.0"), VLLM34: ("vllm034", "2026-12-04", "0.34.0")}
SMEM, NUM_SMS = 232448, 132
INPUT_FIELDS = ("kind", "b", "s_q", "h_q", "d_qk", "topk", "topk_length", "extra_topk", "extra_topk_length",
                "page", "extra_page", "seqlens", "entry", "causal", "bytes_per_token")
CASE_FILES = {   # file: (build, entry it exercises, least calls)
    "vllm033_h200_sparse_cases.jsonl": (VLLM, "flash_mla_with_kvcache", 200),
    "vllm033_h200_dense_cases.jsonl": (VLLM, "flash_mla_with_kvcache", 200),
    "vllm033_h200_densefp8_cases.jsonl": (VLLM, "fwd_kvcache_mla_fp8", 200),
    "vllm033_h200_densefp8_sched_cases.jsonl": (VLLM, "get_mla_decoding_metadata", 60),
    "sglfm_h200_densefp8_sched_cases.jsonl": (SGLFM, "get_mla_decoding_metadata", 60),
    "sglfm_h200_sparse_cases.jsonl": (SGLFM, "flash_mla_with_kvcache", 200),
    "sglfm_h200_dense_cases.jsonl": (SGLFM, "flash_mla_with_kvcache", 200),
    "sglfm_h200_hoisted_cases.jsonl": (SGLFM, "get_mla_decoding_metadata", 200),
    "sglfm_h200_densefp8_attn_cases.jsonl": (SGLFM, "fwd_kvcache_mla_fp8", 200),
}
# vLLM 0.34.0's recording: the same seeded calls of each vLLM 0.33.0 file, on 0.34.0's files
CASE_FILES.update({f.replace("vllm033", "vllm034"): (VLLM34, entry, least)
                   for f, (build, entry, least) in list(CASE_FILES.items()) if build == VLLM})
# FMLA020 (a length-0 row of the dense fp8 kernel reads the page named by the block-table entry before
# its own): with valid pages there, as the recording builds them, the read stays in bounds and the call
# runs; with the -1 entries of CUDA-graph padding memcheck reports the out-of-bounds read
# (vllm033_h200_densefp8_padding_memcheck.json). The model flags both: it cannot see the block table.
READS_NEIGHBOUR_PAGE = "FMLA020"


def read(name: str) -> tuple[dict, list[dict]]:
    lines = [json.loads(line) for line in (MEASURED / name).read_text().splitlines() if line.strip()]
    return lines[0], lines[1:]


def inputs(rec: dict) -> dict:
    """The call record of a measured line (``"<N values>"`` lists expanded from ``<field>_value``)."""
    out = {k: rec[k] for k in INPUT_FIELDS if k in rec}
    for k, v in list(out.items()):
        if isinstance(v, str) and v.startswith("<"):
            out[k] = [rec[f"{k}_value"]] * rec["b"]
    return out


def kernel_run(rec: dict) -> RunResult:
    return RunResult(rec["outcome"], rec.get("message") or "", exit_code=rec.get("exit_code"))


# ----------------------------------------------------------------------------- the recordings

@pytest.mark.parametrize("name", sorted(CASE_FILES))
def test_recording_names_device_package_and_date(name):
    head, rows = read(name)
    build, entry, least = CASE_FILES[name]
    assert (head["device"], head["num_sms"], head["cc"], head["smem_optin"]) == ("NVIDIA H200", NUM_SMS, [9, 0], SMEM)
    _, date, version = RUNS.get(build, RUNS[VLLM])
    assert head["date"] == date and head["torch"].startswith("2.11") and head["build"] == build
    versions = {p["name"]: p["version"] for p in head["providers"]}
    assert versions["vllm"] == version
    if build == SGLFM:
        assert versions["flash_mla"] == "1.0.0"
    assert len(rows) >= least
    assert {r.get("entry", "flash_mla_with_kvcache") for r in rows} == {entry}


def test_recordings_cover_the_shapes_asked_for():
    _, sparse = read("vllm033_h200_sparse_cases.jsonl")
    assert {r["page"] for r in sparse} == {64, 256} and {r["d_qk"] for r in sparse} == {512, 576}
    assert any("topk_length" in r for r in sparse) and any("extra_topk_length" in r for r in sparse)
    assert max(r["b"] for r in sparse) > 1000 and min(r["b"] for r in sparse) <= 4      # wide and narrow
    for name in ("vllm033_h200_dense_cases.jsonl", "vllm033_h200_densefp8_cases.jsonl"):
        _, rows = read(name)
        assert any(0 in r["seqlens"] for r in rows) and any(set(r["seqlens"]) == {0} for r in rows)
        assert {r["h_q"] for r in rows} == {16, 32, 64, 128} and max(r["b"] for r in rows) > 1000


@pytest.mark.parametrize("name", sorted(CASE_FILES))
def test_every_recorded_call_matches_the_model(name):
    build = CASE_FILES[name][0]
    _, rows = read(name)
    compared = 0
    for rec in rows:
        p = plan(inputs(rec), "H200", build)
        mv = model_view(p)
        verdict, why = judge(mv, kernel_run(rec))
        if verdict != "agree":
            assert mv.codes == (READS_NEIGHBOUR_PAGE,) and rec["outcome"] == "ok", (rec.get("i"), mv.codes, why)
            assert 0 in rec["seqlens"]
        if rec.get("tile_scheduler_metadata") is None:
            continue
        cols = len(p.gen.get("row_layout") or range(7))
        md = p.metadata_in_layout()
        assert md is not None, rec.get("i")
        d = diff_metadata(md, p.schedule.num_splits, rec["tile_scheduler_metadata"], rec["num_splits"], cols)
        assert d.identical, (rec.get("i"), d.describe())
        compared += 1
    assert compared >= min(CASE_FILES[name][2], 26)


def test_the_same_calls_gave_the_same_answers_on_both_vllm_releases():
    # vLLM 0.34.0's SM90 kernels are 0.33.0's (rules/flashmla.json vllm-0.34 same_kernels_source): the seeded
    # calls and probes, run on each release's files, ran or failed alike and wrote the same metadata in the
    # generation's columns; the two calls that differ are all-empty dense fp8 batches (request 0 empty, FMLA020)
    for kind in ("sparse_cases", "dense_cases", "densefp8_cases", "densefp8_sched_cases", "probes"):
        old = [r for r in read(f"vllm033_h200_{kind}.jsonl")[1] if r.get("provider", "vllm") == "vllm"]
        _, new = read(f"vllm034_h200_{kind}.jsonl")
        assert [inputs(r) for r in old] == [inputs(r) for r in new], kind
        differ = []
        for o, n in zip(old, new):
            cols = len(plan(inputs(o), "H200", VLLM34).gen.get("row_layout") or range(7))
            if _answer(o, cols) != _answer(n, cols):
                differ.append(n)
        for n in differ:
            assert kind == "densefp8_cases" and set(n["seqlens"]) == {0} and n["outcome"] == "illegal_memory_access"
            assert model_view(plan(inputs(n), "H200", VLLM34)).codes == (READS_NEIGHBOUR_PAGE,)
        assert len(differ) <= 2, kind


def _answer(rec: dict, cols: int) -> tuple:
    """What a recorded call answered: its outcome and message, and the metadata in the generation's columns
    (the columns after them are not written by the scheduler: their values are whatever memory held)."""
    md = rec.get("tile_scheduler_metadata")
    return rec["outcome"], rec.get("message"), md and [row[:cols] for row in md], rec.get("num_splits")


@pytest.mark.parametrize("build", sorted(RUNS))
def test_sparse_sm90_idle_partitions_begin_at_block_zero(build):
    # what set the sparse metadata apart from the legacy model: partitions after all work (begin_req == b)
    _, rows = read(f"{RUNS[build][0]}_h200_sparse_cases.jsonl")
    idle = [m for r in rows for m in r["tile_scheduler_metadata"] if m[0] == r["b"]]
    assert len(idle) > 100 and {m[2] for m in idle} == {0}
    assert plan(inputs(rows[0]), "H200", build).gen["name"] == "vllm-0.33-sparse-sm90"


@pytest.mark.parametrize("build", sorted(RUNS))
def test_every_kv_split_on_sm90_even_below_the_current_kernels_gate(build):
    # topk 128 without an extra cache (128 <= 640) still splits and schedules on SM90
    _, probes = read(f"{RUNS[build][0]}_h200_probes.jsonl")
    small = [r for r in probes if r["tag"] == "sparse_sched_rows topk=128 extra=None" and r["outcome"] == "ok"]
    assert small and all(int(r["message"].split()[2]) > r["b"] for r in small)     # num_splits[b] > b


# ----------------------------------------------------------------------------- probes at the limits

def _probes(tag_prefix: str, provider: str = "vllm", build: str = VLLM, **where) -> list[dict]:
    _, probes = read(f"{RUNS[build][0]}_h200_probes.jsonl")
    return [r for r in probes if r["tag"].startswith(tag_prefix) and r["provider"] == provider
            and all(r.get(k) == v for k, v in where.items())]


def _outcomes_at(rows: list[dict], key: str) -> dict:
    return {r[key]: r["outcome"] for r in rows}


@pytest.mark.parametrize("build", sorted(RUNS))
@pytest.mark.parametrize("tag", ["sparse_sched_rows topk=128 extra=None", "sparse_sched_rows topk=1024 extra=None",
                                 "sparse_sched_rows topk=128 extra=640"])
def test_sparse_row_limit_is_the_current_schedulers(tag, build):
    limit = (SMEM - 4) // 16                  # 4*(4b+1) <= 232448 -> 14527
    legacy = (SMEM - 4) // 20                 # 4*(5b+1): 11622, no longer a limit here
    got = _outcomes_at(_probes(tag, build=build), "b")
    assert got == {legacy: "ok", legacy + 1: "ok", limit: "ok", limit + 1: "python_exception",
                   limit + 2: "python_exception"}
    for b, outcome in got.items():
        rep = check_calls([inputs(next(r for r in _probes(tag, build=build) if r["b"] == b))], "H200", build)
        assert rep.legal is (outcome == "ok"), b
        assert ("FMLA001" in rep.codes) is (b > limit)


@pytest.mark.parametrize("build", sorted(RUNS))
def test_sparse_row_limit_failure_is_recoverable_and_named(build):
    r = next(r for r in _probes("sparse_sched_rows topk=128 extra=None", build=build) if r["b"] == (SMEM - 4) // 16 + 1)
    assert r["exit_code"] == 0 and "get_decoding_sched_meta.cu:143" in r["message"]
    p = plan(inputs(r), "H200", build)
    mv = model_view(p)
    assert mv.codes == ("FMLA001",) and mv.expected_failure == "python_exception"


@pytest.mark.parametrize("build", sorted(RUNS))
def test_dense_row_limit_is_the_legacy_schedulers(build):
    limit = (SMEM - 4) // 20
    rows = _probes("dense_sched_rows", build=build)
    assert _outcomes_at(rows, "b") == {limit - 1: "ok", limit: "ok", limit + 1: "process_exit", limit + 2: "process_exit"}
    for r in rows:
        verdict, why = judge(model_view(plan(inputs(r), "H200", build)), kernel_run(r))
        assert verdict == "agree", (r["b"], why)
    assert all("legacy/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:111" in r["message"]
               for r in rows if r["outcome"] != "ok")


@pytest.mark.parametrize("build", sorted(RUNS))
def test_dense_fp8_batch_limit(build):
    rows = _probes("dense_fp8_max_batch", build=build)
    assert _outcomes_at(rows, "b") == {4094: "ok", 4095: "ok", 4096: "process_exit", 4097: "process_exit"}
    for r in rows:
        verdict, why = judge(model_view(plan(inputs(r), "H200", build)), kernel_run(r))
        assert verdict == "agree", (r["b"], why)


@pytest.mark.parametrize("h_q", [16, 64, 128])
def test_dense_fp8_partitions_sgl_fails_where_vllm_clamps(h_q):
    limit = NUM_SMS * 64 // h_q               # s_q*h_q/64 <= num_sms keeps one partition
    sgl = _probes("dense_fp8_parts", "sgl", h_q=h_q)
    assert _outcomes_at(sgl, "s_q") == {limit - 1: "ok", limit: "ok", limit + 1: "device_assert",
                                        limit + 2: "device_assert"}
    for entry in ("get_mla_decoding_metadata", "fwd_kvcache_mla_fp8"):
        vllm = _probes("dense_fp8_parts", "vllm", h_q=h_q, entry=entry)
        assert set(_outcomes_at(vllm, "s_q").values()) == {"ok"} and len(vllm) == 4
        assert all(len(r["tile_scheduler_metadata"]) == 1 for r in vllm)
    for vllm_build in sorted(RUNS):
        vllm = _probes("dense_fp8_parts", "vllm", build=vllm_build, h_q=h_q)
        assert set(_outcomes_at(vllm, "s_q").values()) == {"ok"} and len(vllm) == 8
        for r in vllm:
            mv = model_view(plan(inputs(r), "H200", vllm_build))
            assert judge(mv, kernel_run(r))[0] == "agree" and "FMLA021" not in mv.codes, (vllm_build, r["s_q"])
    for r in sgl + _probes("dense_fp8_parts", "vllm", h_q=h_q):
        build = SGLFM if r["provider"] == "sgl" else VLLM
        rec = dict(inputs(r), use_legacy=True) if build == SGLFM else inputs(r)
        mv = model_view(plan(rec, "H200", build))
        verdict, why = judge(mv, kernel_run(r))
        assert verdict == "agree", (build, r["s_q"], why)
        assert ("FMLA021" in mv.codes) is (build == SGLFM and r["s_q"] > limit)


@pytest.mark.parametrize("build", sorted(RUNS))
def test_sparse_shape_probes(build):
    for r in sum((_probes(t, build=build) for t in ("sparse_kv_layout", "sparse_topk_block", "sparse_h_q")), []):
        verdict, why = judge(model_view(plan(inputs(r), "H200", build)), kernel_run(r))
        assert verdict == "agree", (r["tag"], why)
    assert {r["bytes_per_token"]: r["outcome"] for r in _probes("sparse_kv_layout", build=build)} == {
        584: "ok", 656: "ok", 528: "python_exception"}


# ----------------------------------------------------------------------------- padding rows (FMLA020)

def test_padding_rows_read_out_of_bounds_only_through_minus_one_entries():
    d = json.loads((MEASURED / "vllm033_h200_densefp8_padding_memcheck.json").read_text())
    assert d["device"] == "NVIDIA H200" and d["date"] == "2026-12-01" and "0.33.0" in d["package"]
    by = {c["name"]: c for c in d["cases"]}
    assert by["pad_last"]["memcheck_errors"] > 0 and by["pad_last"]["kernel"] == "the dense fp8 split-KV attention kernel"
    assert by["pad_last_valid"]["memcheck_errors"] == 0 and by["len1_valid"]["memcheck_errors"] == 0
    for name in ("pad_last", "pad_last_valid"):
        rec = {"kind": "dense_fp8", "entry": "fwd_kvcache_mla_fp8", "b": 4, "s_q": 1, "h_q": 128,
               "seqlens": by[name]["seqlens"], "causal": True}
        assert model_view(plan(rec, "H200", VLLM)).codes == (READS_NEIGHBOUR_PAGE,)
    _, runs = read("vllm033_h200_densefp8_padding_probes.jsonl")
    assert len(runs) == 8 and {r["outcome"] for r in runs} == {"ok"}      # no trap without the checker


# ----------------------------------------------------------------------------- the facts' provenance

def _provenances(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "provenance" or k.endswith("_provenance"):
                for e in (v if isinstance(v, list) else [v]):
                    yield path + (k,), e
            yield from _provenances(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _provenances(v, path + (i,))


def test_the_vllm_measurements_name_device_package_date_fixture_and_build():
    """Every measured entry naming vLLM 0.33 is this H200 run (2026-12-01) with a fixture of it."""
    data = load("flashmla")
    found = [(p, e) for p, e in _provenances({"generations": data["generations"], "builds": data["builds"]})
             if e["kind"] == "measured" and "vllm-0.33" in e["builds"]]
    paths = {p[:2] for p, _ in found}
    assert ("generations", "vllm-0.33-sparse-sm90") in paths and ("builds", "vllm-0.33") in paths
    assert ("generations", "vllm-0.33-legacy") in paths and ("generations", "dense-fp8") in paths
    root = MEASURED.parents[1]
    for path, prov in found:
        assert prov["device"].startswith("NVIDIA H200") and prov["date"] == "2026-12-01", path
        assert "vllm 0.33.0" in prov["package"], path
        for fx in ([prov["fixture"]] if isinstance(prov["fixture"], str) else prov["fixture"]):
            assert fx.startswith(("fixtures/measured/vllm033_h200_", "fixtures/measured/h200_gap_probes")), path
            assert (root / fx).is_file(), path


# ----------------------------------------------------------------------------- limits read elsewhere, probed on both builds

def _gap_probes(build: str | None = None) -> list[dict]:
    """The gap probes of both H200 builds (``provider`` sgl / vllm), or of vLLM 0.34's run."""
    return read("vllm034_h200_gap_probes.jsonl" if build == VLLM34 else "h200_gap_probes.jsonl")[1]


@pytest.mark.parametrize("provider, build", [("sgl", SGLFM), ("vllm", VLLM), ("vllm", VLLM34)])
def test_every_gap_probe_agrees_with_the_model(provider, build):
    rows = [r for r in _gap_probes(build) if r["provider"] == provider]
    assert len(rows) == 30
    for rec in rows:
        r = inputs(rec)
        if "is_fp8" in rec:
            r["is_fp8"] = rec["is_fp8"]
        verdict, why = judge(model_view(plan(r, "H200", build)), kernel_run(rec))
        assert verdict == "agree", (rec["tag"], rec.get("b"), rec.get("s_q"), rec.get("h_q"), why)


@pytest.mark.parametrize("provider, build", [("sgl", SGLFM), ("vllm", VLLM), ("vllm", VLLM34)])
def test_int32_strides_at_the_limit(provider, build):
    # q is [b, s_q, h_q, d_qk]: stride(0) = s_q*h_q*d_qk must fit in int32; at h_q 128, d_qk 512 that is s_q < 32768
    got = {r["s_q"]: r["outcome"] for r in _gap_probes(build) if r["tag"] == "int32_strides" and r["provider"] == provider}
    limit = (2 ** 31 - 1) // (128 * 512)
    assert got == {limit: "ok", limit + 1: "python_exception"}


def test_sparse_prefill_heads_differ_between_the_builds():
    got = {(r["provider"], r["h_q"]): r["outcome"] for r in _gap_probes() if r["tag"] == "prefill_h_q"}
    assert got[("sgl", 32)] == "python_exception" and got[("vllm", 32)] == "ok"
    assert {got[(p, h)] for p in ("sgl", "vllm") for h in (64, 128)} == {"ok"}
    rec = {"kind": "prefill", "s_q": 16, "h_q": 32, "d_qk": 512, "topk": 512}
    assert check_calls([rec], "H200", SGLFM).codes == ["FMLA023"]
    assert check_calls([rec], "H200", VLLM).legal


def test_sgl_flash_mla_refuses_unsupported_heads_with_a_python_exception():
    # h_q 32 / 96 and d_qk 448: the wheel raises (recoverable), where 9241ae3 crashed the process on h_q 32 / 96
    rows = [r for r in _gap_probes() if r["provider"] == "sgl" and r["tag"] in ("sparse_h_q", "sparse_d_qk")]
    bad = [r for r in rows if r["outcome"] != "ok"]
    assert {(r.get("h_q"), r.get("d_qk")) for r in bad} == {(32, 512), (96, 512), (64, 448)}
    assert {r["outcome"] for r in bad} == {"python_exception"}
    f = check_calls([inputs(bad[0])], "H200", SGLFM).findings[0]
    assert f.code == "FMLA005" and f.failure.kind == "python_exception"


def test_served_children_gave_the_outcomes_of_one_child_per_call_on_the_h200():
    # bench/bench_kernel_mode.py on the GPU host: the same calls through long-lived children and through a
    # fresh child each (the recorded sparse cases, and the probes with their exits and illegal accesses)
    data = json.loads((MEASURED / "h200_kernel_served_bench.json").read_text())
    assert data["device"] == "NVIDIA H200" and len(data["runs"]) == 2
    for run in data["runs"]:
        assert run["same_outcomes"] and run["differing"] == [] and run["served"]["status"] == "agree"
    probes = data["runs"][1]
    fatal = {"process_exit", "illegal_memory_access", "device_assert", "process_crash"}
    assert fatal & set(probes["served"]["outcomes"])          # fatal calls were among them


def test_a_long_run_of_served_children_on_the_h200():
    # bench/bench_kernel_mode.py --repeat 10: 2200 recorded sparse calls through long-lived children (-j 8 and -j 16),
    # 16 of them again through a fresh child each; the rate counts the whole run, child start-up included
    data = json.loads((MEASURED / "h200_kernel_served_bench_long.json").read_text())
    assert data["device"] == "NVIDIA H200" and [r["jobs"] for r in data["runs"]] == [8, 16]
    for run in data["runs"]:
        s = run["served"]
        assert s["calls"] == 2200 == sum(s["outcomes"].values()) and s["status"] == "agree"
        assert run["same_outcomes"] and run["differing"] == []
        assert abs(s["calls_per_s"] - s["calls"] / s["wall_s"]) < 0.5       # the figure is the run's own arithmetic
        assert s["calls_per_s"] >= 50 and s["steady_calls_per_s"] > s["calls_per_s"]
