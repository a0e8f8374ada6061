"""Every FlashMLA build in the field, against ground truth.

* ``sglfm_h200_legacy_cases.jsonl``: the 250 calls of the 9241ae3 cases re-run through
  sgl-flash-mla 1.0.0's legacy kernels on an H200; reproduced bit for bit under
  ``sgl-flash-mla-1.0.0``. They differ from the 9241ae3 records only in idle partitions'
  ``begin_block`` (checked on the data itself, so the model is not the judge of that).
* ``sglfm_h200_densefp8_cases.jsonl``: 200 calls of the dense fp8 scheduler, columns 0..4 and
  ``num_splits``.
* ``sglfm_h200_probes.jsonl``: one child process per probe on the wheel; the verdict, the fallback
  warning, and ``num_sm_parts`` / ``num_splits[b]`` where the run printed them.
* Each build's row limit at limit-1 / limit / limit+1, from the shared-memory arithmetic written
  here (H200 and B200 grant 232448 B per block).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import oracle_path
from typer.testing import CliRunner

from validate_batch.api import check_calls
from validate_batch.cli.main import app
from validate_batch.flashmla.plan import plan
from validate_batch.facts.knowledge import build_names, resolve_gpu

SMEM = 232448
SGLFM = "sgl-flash-mla-1.0.0"


def _records(name: str) -> list[dict]:
    with oracle_path(name).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="module")
def legacy_cases():
    recs = _records("sglfm_h200_legacy_cases.jsonl")
    assert "num_sms" in recs[0]
    return recs[0], [r for r in recs[1:] if "error" not in r]


@pytest.fixture(scope="module")
def densefp8_cases():
    recs = _records("sglfm_h200_densefp8_cases.jsonl")
    return recs[0], [r for r in recs[1:] if "error" not in r]


def test_the_builds_have_the_names_users_rely_on():
    assert {"flashmla-1408756", "flashmla-9241ae3", "flashmla-2026.09.30", SGLFM, "vllm-0.33",
            "sgl-kernel-flashmla"} <= set(build_names())


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_sglfm_legacy_cases_bit_exact(legacy_cases, path, impl):
    dev, cases = legacy_cases
    assert len(cases) == 250
    g = resolve_gpu({k: dev[k] for k in ("num_sms", "cc", "smem_optin")})
    bad = []
    for rec in cases:
        p = plan(rec, g, SGLFM)
        sch = p.schedule if path == "fast" else p.reference_schedule()
        got = p.metadata_in_layout(sch)[:, :7].tolist()
        if got != [row[:7] for row in rec["tile_scheduler_metadata"]] or sch.num_splits.tolist() != rec["num_splits"]:
            bad.append(rec["i"])
    assert not bad, f"{len(bad)} of {len(cases)} differ: {bad[:10]}"


def test_sglfm_differs_from_9241ae3_only_in_idle_partitions(legacy_cases, oracle_cases):
    _, cases = legacy_cases
    upstream = {r["i"]: r for r in oracle_cases if "error" not in r}
    idle_rows = 0
    for rec in cases:
        up = upstream[rec["i"]]
        assert rec["num_splits"] == up["num_splits"]
        for mine, theirs in zip(rec["tile_scheduler_metadata"], up["tile_scheduler_metadata"]):
            if mine[0] == rec["b"]:                     # a partition after all work is placed
                idle_rows += 1
                assert mine[2] == 0 and mine[:2] + mine[3:7] == theirs[:2] + theirs[3:7]
            else:
                assert mine[:7] == theirs[:7]
    assert idle_rows > 10
    # and the 9241ae3 model keeps writing its own value there
    g = resolve_gpu("H200")
    rec = next(r for r in cases if any(row[0] == r["b"] and upstream[r["i"]]["tile_scheduler_metadata"][k][2]
                                       for k, row in enumerate(r["tile_scheduler_metadata"])))
    assert plan(rec, g, "flashmla-9241ae3").metadata_in_layout()[:, :7].tolist() == \
        [row[:7] for row in upstream[rec["i"]]["tile_scheduler_metadata"]]


def test_densefp8_cases_bit_exact(densefp8_cases):
    dev, cases = densefp8_cases
    assert len(cases) == 200
    g = resolve_gpu({k: dev[k] for k in ("num_sms", "cc", "smem_optin")})
    bad = []
    for rec in cases:
        for build in (SGLFM, "vllm-0.33"):
            p = plan(rec, g, build)
            md = p.metadata_in_layout()
            if (md[:, :5].tolist() != [row[:5] for row in rec["tile_scheduler_metadata"]]
                    or p.schedule.num_splits.tolist() != rec["num_splits"]):
                bad.append((build, rec["i"]))
    assert not bad, f"{len(bad)} differ: {bad[:10]}"


def test_densefp8_metadata_command_bit_exact(densefp8_cases, tmp_path):
    dev, cases = densefp8_cases
    src = tmp_path / "fp8.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [dev] + cases[:40]))
    res = CliRunner().invoke(app, ["metadata", "--json", "--kernel-gen", SGLFM, str(src)])
    assert res.exit_code == 0, res.output
    out = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert len(out) == 40
    for rec, got in zip(cases, out):
        assert [row[:5] for row in got["tile_scheduler_metadata"]] == [row[:5] for row in rec["tile_scheduler_metadata"]]
        assert got["num_splits"] == rec["num_splits"]


OUTPUT_KEYS = {"tag", "outcome", "exit_code", "message", "verdict", "note", "warning", "op"}


def _probe_record(r: dict) -> dict:
    def expand(v):
        m = re.fullmatch(r"<(\d+) values>", v) if isinstance(v, str) else None
        return [100] * int(m.group(1)) if m else v          # "<N values>": N copies of 100

    rec = {k: expand(v) for k, v in r.items() if k not in OUTPUT_KEYS}
    if r["op"] == "hoisted":
        rec["entry"] = "get_mla_decoding_metadata"
    elif r["op"] == "densefp8":
        rec["kind"] = "dense_fp8"
    elif r["op"] == "prefill":
        rec["kind"] = "prefill"
    return rec


def test_sglfm_probes_verdicts_warnings_and_counts():
    probes = _records("sglfm_h200_probes.jsonl")
    assert len(probes) >= 40
    ops = set()
    for r in probes:
        ops.add(r["op"])
        rep = check_calls([_probe_record(r)], "H200", SGLFM)
        assert rep.legal is (r["verdict"] == "legal"), (r["tag"], r.get("b"), rep.codes)
        assert ("FMLA015" in rep.codes) is bool(r.get("warning")), (r["tag"], r.get("b"))
        m = re.fullmatch(r"OK (\d+) (\d+)", r.get("message", ""))
        if m and r["op"] != "prefill":
            p = rep.plans[0]
            assert (p.num_sm_parts, p.schedule.total_splits) == (int(m[1]), int(m[2])), r["tag"]
    assert ops == {"call", "hoisted", "densefp8", "prefill"}


def _sparse(b: int, **kw) -> dict:
    return {"kind": "sparse", "b": b, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128, **kw}


@pytest.mark.parametrize("build,gpu,call,limit", [
    # 4*(5b+1) <= 232448  ->  b <= 11622
    ("flashmla-9241ae3", "H200", {}, (SMEM - 4) // 20),
    ("flashmla-1408756", "H200", {}, (SMEM - 4) // 20),
    ("vllm-0.33", "H200", {"kind": "dense", "h_q": 128}, (SMEM - 4) // 20),
    # 4*(4b+1) <= 232448  ->  b <= 14527, on the SM100 current kernels when the KV is split
    ("flashmla-2026.09.30", "B200", {"topk": 128, "extra_topk": 640}, (SMEM - 4) // 16),
    ("vllm-0.33", "B200", {"topk": 128, "extra_topk": 640}, (SMEM - 4) // 16),
    # SM90 sparse: the current scheduler, 4*(4b+1), in front of the legacy kernels (measured:
    # fixtures/measured/vllm033_h200_probes.jsonl, 14527 ran, 14528 raised)
    ("vllm-0.33", "H200", {}, (SMEM - 4) // 16),
    (SGLFM, "B200", {"topk": 128, "extra_topk": 640, "use_legacy": False}, (SMEM - 4) // 16),
])
def test_row_limits_per_build(build, gpu, call, limit):
    def rec(b):
        r = _sparse(b, **call)
        if r["kind"] == "dense":
            r = {k: v for k, v in r.items() if k not in ("topk", "d_qk")} | {"seqlens": [64] * b}
        return r

    for b, legal in [(limit - 1, True), (limit, True), (limit + 1, False)]:
        rep = check_calls([rec(b)], gpu, build)
        assert rep.legal is legal, (build, b, rep.codes)
        assert ("FMLA001" in rep.codes) is not legal


@pytest.mark.parametrize("build,fast", [(SGLFM, (SMEM - 4) // 12), ("sgl-kernel-flashmla", (SMEM - 4) // 20)])
def test_fallback_builds_warn_and_stay_legal(build, fast):
    # 4*(3b+1) on sgl-flash-mla's legacy fast path (19370 rows on an H200); 4*(5b+1) on sgl-kernel's copy
    for b, warned in [(fast - 1, False), (fast, False), (fast + 1, True), (200000, True)]:
        rep = check_calls([_sparse(b)], "H200", build)
        assert rep.legal, (b, rep.codes)
        assert ("FMLA015" in rep.codes) is warned, b
        assert rep.plans[0].schedule is not None           # the fallback writes the same metadata


def test_densefp8_static_limit():
    for b, legal in [(4094, True), (4095, True), (4096, False)]:
        rep = check_calls([{"kind": "dense_fp8", "b": b, "s_q": 1, "h_q": 128, "seqlens": [64] * b}], "H200", SGLFM)
        assert rep.legal is legal and (("FMLA016" in rep.codes) is not legal), b


def test_current_kernels_split_only_past_640_index_entries():
    # topk + extra_topk > 640 splits the KV; DeepSeek-V4's 128 + 512 = 640 does not, so no scheduler runs
    big = 20000
    assert check_calls([_sparse(big, extra_topk=512)], "B200", "flashmla-2026.09.30").legal
    p = plan(_sparse(big, extra_topk=512), "B200", "flashmla-2026.09.30")
    assert not p.split_kv and p.schedule is None
    assert plan(_sparse(64, extra_topk=576), "B200", "flashmla-2026.09.30").split_kv
    # enable_batch_invariant turns the split off on those kernels; the legacy ones always split
    assert not plan(_sparse(64, extra_topk=576, enable_batch_invariant=True), "B200", "flashmla-2026.09.30").split_kv
    assert plan(_sparse(64, extra_topk=576, enable_batch_invariant=True), "H200", SGLFM).split_kv


def test_use_legacy_picks_the_half_and_sm90_runs_only_legacy():
    assert plan(_sparse(8), "H200", SGLFM).gen["name"] == "sgl-flash-mla-1.0.0-legacy"
    assert plan(_sparse(8, use_legacy=False), "H200", SGLFM).gen["name"] == "flashmla-2026.09.30"
    rep = check_calls([_sparse(8, use_legacy=False)], "H200", SGLFM)
    assert rep.codes == ["FMLA013"]
    prefill = {"kind": "prefill", "s_q": 8, "h_q": 64, "d_qk": 512, "topk": 128}
    assert check_calls([prefill], "H200", SGLFM).legal
    assert check_calls([{**prefill, "use_legacy": False}], "H200", SGLFM).codes == ["FMLA013"]


def test_build_specific_failure_classes():
    # sgl-flash-mla turned two crashes into recoverable Python exceptions
    rep = check_calls([_sparse(4, topk=100)], "H200", SGLFM)
    assert rep.codes == ["FMLA004"] and rep.findings[0].failure.startswith("python_exception")
    up = check_calls([_sparse(4, topk=100)], "H200", "flashmla-9241ae3")
    assert not up.findings[0].failure.startswith("python_exception")


def test_kernel_gen_option_names_a_build_or_fails(tmp_path):
    runner = CliRunner()
    seed = ["check", "--example", "dsv4-prefill-3x4096"]
    # 12288 rows: over 9241ae3's 11622, under sgl-flash-mla's fast path (19370): legal there
    assert runner.invoke(app, seed + ["--kernel-gen", "flashmla-9241ae3", "-q"]).exit_code == 1
    assert runner.invoke(app, seed + ["--kernel-gen", SGLFM, "-q"]).exit_code == 0
    bad = runner.invoke(app, seed + ["--kernel-gen", "nope"])
    assert bad.exit_code == 2 and "--build" in bad.output
    assert runner.invoke(app, ["bisect", "fixtures/logs/sglang-dsv4-prefill-12288.log", "--kernel-gen", "nope"]).exit_code == 2


def test_across_builds_matrix_for_the_seed_batch():
    res = CliRunner().invoke(app, ["check", "--example", "dsv4-prefill-3x4096", "--across-builds", "--json"])
    d = json.loads(res.stdout)
    by = {r["build"]: r for r in d["across_builds"]}
    assert set(by) == set(build_names())
    assert not by["flashmla-9241ae3"]["legal"] and "FMLA001" in by["flashmla-9241ae3"]["errors"]
    assert by["flashmla-9241ae3"]["runs_here"]          # the pre-routing version ships upstream 9241ae3
    assert by[SGLFM]["legal"] and not by[SGLFM]["warnings"]
    # sgl-kernel's copy: 4*(5b+1) > 232448 at 12288 rows, so it falls back: legal, with the warning
    assert by["sgl-kernel-flashmla"]["legal"] and by["sgl-kernel-flashmla"]["warnings"] == ["FMLA015"]
    assert by["flashmla-2026.09.30"]["errors"] == ["FMLA013"]       # SM100 only; the example is an H200
    assert res.exit_code == 1                                        # the verdict of the build used


def test_hoisted_op_runs_alone_past_every_attention_limit():
    # measured on an H200 with sgl-flash-mla 1.0.0 (fixtures/measured/sglfm_h200_hoisted_measured.jsonl):
    # the metadata op by itself ran at every b; above 19370 rows on its fallback kernel
    path = Path(__file__).resolve().parents[1] / "fixtures" / "measured" / "sglfm_h200_hoisted_measured.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert "num_sms" in recs[0] and len(recs) > 10
    for r in recs[1:]:
        rec = {k: v for k, v in r.items() if k not in OUTPUT_KEYS | {"fallback_used", "metadata_matched_model"}}
        rep = check_calls([rec], "H200", SGLFM)
        assert r["outcome"] == "ok" and r["metadata_matched_model"] is True
        assert rep.legal, (r["kind"], r["b"], rep.codes)
        assert ("FMLA015" in rep.codes) is r["fallback_used"], (r["kind"], r["b"])
        _, parts, total = r["message"].split()
        p = rep.plans[0]
        assert (p.num_sm_parts, p.schedule.total_splits) == (int(parts), int(total))


def test_every_build_resolves_without_a_call():
    # what `generation(NAME)` answers when no call says which kernels: a generation of that build
    from validate_batch.facts.knowledge import build_record, generation

    for name in build_names():
        gen = generation(name)
        kernels = build_record(name)["kernels"]
        names = {v for k in kernels.values() for v in (k.values() if isinstance(k, dict) else [k])}
        assert gen["build"] == name and gen["name"] in names
