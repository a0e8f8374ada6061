"""Provenance as data: every sourced fact says whether it was measured (where, on what, when, with
which recorded fixture), tested against a real engine, read, or inferred; verdicts say which facts
they rest on, and ``--strict-provenance`` refuses one that rests on a fact not measured on its build.

Ground truth: the fixtures themselves (their headers name the device they were recorded on), and
first principles: a kernel that only runs on Blackwell (the 2026.09.30 current kernels) cannot have
been measured on the project's H200, so every verdict about it rests on read facts.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validate_batch.api import check
from validate_batch.cli.main import app
from validate_batch.facts import provenance as pv
from validate_batch.facts.knowledge import build_names, load

ROOT = Path(__file__).resolve().parents[1]
LABELLED = ("flashmla", "gpus", "crash_sites", "deepgemm", "flashinfer", "engines", "engine_args", "settings")
#: knowledge files whose sources are not labelled yet (each must still have an unlabelled source)
UNLABELLED = ()
#: labelled files none of whose facts has been measured yet (each must still have no measured entry)
NOT_MEASURED: tuple = ("engine_args", "settings")
H200_SPARSE = {"kind": "sparse", "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}


def _sources(name: str):
    return list(pv.sourced(load(name)))


def _entries(name: str):
    for path, obj, _, pk in _sources(name):
        for e in pv.entries(obj.get(pk)):
            yield path, pk, e


@pytest.mark.parametrize("name", LABELLED)
def test_every_source_carries_a_valid_provenance(name):
    srcs = _sources(name)
    assert srcs, name
    bad = []
    for path, obj, sk, pk in srcs:
        where = f"{name}:{'.'.join(map(str, path))}.{pk}"
        bad += [f"{where}: missing beside {sk}"] if pk not in obj else pv.problems(obj[pk], where)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", UNLABELLED)
def test_files_not_yet_labelled_are_listed_as_such(name):
    assert any(pk not in obj for _, obj, _, pk in _sources(name)), f"{name} is labelled: move it to LABELLED"


def _known_builds() -> set:
    return set(build_names()) | set(load("flashmla")["generations"]) | set(load("deepgemm")["versions"]) \
        | set(load("flashinfer")["versions"]) | {"*"}


@pytest.mark.parametrize("name", LABELLED)
def test_measured_entries_name_a_recorded_fixture_of_an_h200_and_known_builds(name):
    measured = [(p, e) for p, _, e in _entries(name) if e["kind"] == "measured"]
    if name in NOT_MEASURED:
        assert not measured, f"{name} has measured facts: take it off NOT_MEASURED"
        return
    assert measured, name
    for path, e in measured:
        assert set(e["builds"]) <= _known_builds(), (path, e["builds"])
        assert "H200" in e["device"], path
        for fx in ([e["fixture"]] if isinstance(e["fixture"], str) else e["fixture"]):
            f = ROOT / fx
            assert f.is_file() and fx.startswith("fixtures/"), (path, fx)
            text = gzip.decompress(f.read_bytes()).decode() if fx.endswith(".gz") else f.read_text()
            head = json.loads(text.splitlines()[0]) if fx.endswith((".jsonl", ".jsonl.gz")) else json.loads(text)
            dev = head.get("device") if isinstance(head, dict) else None
            dev = dev.get("name") if isinstance(dev, dict) else dev
            if dev is None:        # a recording without a header: the shared oracle's, all from one H200
                assert fx.startswith("fixtures/oracle/") and "_h200_" in fx, (path, fx)
            else:
                assert "H200" in str(dev), (path, fx, dev)


def test_a_malformed_entry_is_named_field_by_field():
    assert pv.problems(None, "x") == ["x: no provenance entry"]
    assert pv.problems({"kind": "guessed"}, "x") == ["x.kind: expected one of measured, tested, read, inferred, got 'guessed'"]
    got = pv.problems({"kind": "measured", "device": "NVIDIA H200", "package": "p", "date": "yesterday",
                       "fixture": "f.jsonl"}, "x")
    assert "x.builds: missing (a measured entry needs device, package, date, fixture, builds)" in got
    assert "x.date: expected YYYY-MM-DD or 'by YYYY-MM-DD', got 'yesterday'" in got
    assert pv.problems({"kind": "read", "from": "source", "at": "a.cu:1"}, "x") == \
        ["x: a read entry names the package version or the commit it was read in"]
    assert pv.problems({"kind": "read", "from": "vibes", "at": "a.cu:1", "commit": "c"}, "x") == \
        ["x.from: expected one of source, binary, docs, dates, metadata, got 'vibes'"]


def test_a_measurement_counts_only_for_the_builds_it_ran_on():
    e = {"kind": "measured", "device": "NVIDIA H200 (132 SMs)", "package": "lib 1.0 (wheel)", "date": "2026-12-01",
         "fixture": ["fixtures/a.jsonl", "fixtures/b.jsonl"], "builds": ["lib-1.0"]}
    here = pv.fact_status([{"kind": "read", "from": "source", "at": "x.cu:3", "commit": "c"}, e], "f", "lib-1.0")
    assert here.status == "measured" and here.line == "measured (NVIDIA H200, lib 1.0, 2026-12-01; fixtures/a.jsonl and 1 more)"
    other = pv.fact_status(e, "f", "lib-2.0")
    assert other.status == "read" and other.line.startswith("measured on lib-1.0, not on lib-2.0")
    assert pv.fact_status({"kind": "tested", "package": "sglang 0.5.23", "test": "t.py::x"}, "f", "b").status == "tested"
    assert pv.fact_status(None, "f", "b").status == "read"


def test_the_measured_scheduler_limit_says_so_and_passes_strict():
    r = check(dict(H200_SPARSE, b=11623), gpu="H200", build="flashmla-9241ae3")
    assert r.codes == ["FMLA001"]
    d = r.to_dict()
    assert d["findings"][0]["provenance"]["status"] == "measured"
    assert "fixtures/oracle/flashmla_h200_" in d["findings"][0]["provenance"]["says"]
    assert not r.rests_on_read_facts         # the illegal verdict rests on FMLA001's measured limit alone


def test_a_blackwell_only_kernel_rests_on_read_facts_only():
    # 4*(4b+1) <= 232448: 14527 rows fit, 14528 do not (read from the binary: no H200 runs these kernels);
    # topk 1024 > 640, so the call splits the KV and runs the scheduler
    r = check(dict(H200_SPARSE, b=14528, topk=1024), gpu="B200", build="flashmla-2026.09.30")
    assert r.codes == ["FMLA001"] and r.rests_on_read_facts
    prov = r.provenance
    assert prov["counts"]["measured"] == 0 and prov["status"] == "read"
    sched = [f for f in prov["read_facts"] if f["fact"] == "flashmla:flashmla-2026.09.30.sched_smem"]
    assert sched and sched[0]["rules"] == ["FMLA001"] and sched[0]["says"].startswith("read from the binary")
    assert any(f["fact"] == "gpu:B200" for f in prov["read_facts"])
    legal = check(dict(H200_SPARSE, b=14527, topk=1024), gpu="B200", build="flashmla-2026.09.30")
    assert legal.legal and legal.rests_on_read_facts


def test_a_fact_measured_on_another_build_is_not_measured_on_this_one():
    # sparse_shapes (h_q 64/128, d_qk 512/576) was measured on 9241ae3 and vLLM 0.33; sgl-kernel's fork is read
    r = check(dict(H200_SPARSE, b=8, h_q=32), gpu="H200", build="sgl-kernel-flashmla")
    got = r.to_dict()["findings"][0]
    assert got["code"] == "FMLA005" and got["provenance"]["status"] == "read"
    assert "not on sgl-kernel-flashmla" in got["provenance"]["says"]


def test_strict_provenance_exit_codes():
    runner = CliRunner()
    rec = json.dumps(dict(H200_SPARSE, b=14528, topk=1024))
    plain = runner.invoke(app, ["check", "-", "--gpu", "B200", "--build", "flashmla-2026.09.30"], input=rec)
    strict = runner.invoke(app, ["check", "-", "--gpu", "B200", "--build", "flashmla-2026.09.30",
                                 "--strict-provenance"], input=rec)
    assert plain.exit_code == 1 and strict.exit_code == 5
    assert "strict provenance: the illegal verdict rests on" in strict.output and "FMLA001" in strict.output
    measured = runner.invoke(app, ["check", "-", "--gpu", "H200", "--build", "flashmla-9241ae3",
                                   "--strict-provenance"], input=json.dumps(dict(H200_SPARSE, b=11623)))
    assert measured.exit_code == 1                    # illegal, on a measured limit: strict has nothing to say
    human = runner.invoke(app, ["check", "-", "--gpu", "B200", "--build", "flashmla-2026.09.30"], input=rec)
    assert "limit: read from the binary" in human.output and "Provenance: " in human.output


def test_an_h200_measurement_does_not_vouch_for_a_blackwell_call():
    # sgl-flash-mla's legacy scheduler limit was measured on an H200 (SM90); the same build on a B200 runs SM100 code
    h200 = check(dict(H200_SPARSE, b=100), gpu="H200", build="sgl-flash-mla-1.0.0").provenance["rules"]["FMLA001"]
    b200 = check(dict(H200_SPARSE, b=100), gpu="B200", build="sgl-flash-mla-1.0.0").provenance["rules"]["FMLA001"]
    assert h200["status"] == "measured" and b200["status"] == "read"
    assert "not on SM100" in b200["says"]


def test_explain_and_builds_say_what_is_measured_where():
    runner = CliRunner()
    page = runner.invoke(app, ["explain", "FMLA001"]).output
    assert "## Provenance" in page
    assert "- sgl-flash-mla-1.0.0 on H200: measured" in page and "- flashmla-2026.09.30 on B200: read" in page
    rows = json.loads(runner.invoke(app, ["builds", "--json"]).output)
    by = {r["build"]: r["provenance"] for r in rows}
    assert all(p["B200"]["measured"] == 0 for p in by.values())          # nothing here ran on Blackwell
    assert by["flashmla-2026.09.30"]["H200"]["measured"] == 0            # an SM100-only build
    assert by["sgl-flash-mla-1.0.0"]["H200"]["measured"] > by["sgl-flash-mla-1.0.0"]["H200"]["read"]


@pytest.mark.parametrize("name", LABELLED)
def test_tested_entries_name_tests_that_exist(name):
    for path, _, e in _entries(name):
        if e["kind"] != "tested":
            continue
        for t in ([e["test"]] if isinstance(e["test"], str) else e["test"]):
            file, _, func = t.partition("::")
            src = ROOT / file
            assert src.is_file(), (path, t)
            assert not func or f"def {func.split('[')[0]}(" in src.read_text(), (path, t)
