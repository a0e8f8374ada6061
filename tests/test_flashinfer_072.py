"""FlashInfer MLA plan() in the flashinfer-python wheels the engines pin (0.7.2: SGLang 0.5.23; 0.7.2.post1:
vLLM 0.33.0), next to the source tree fb28d72, and the two ways an MLA plan is called.

What the expectations are read from (the wheels' own files):
* 0.7.2 flashinfer/mla/_batch_mla/_planning.py:66-73 - the wrapper's plan() refuses an indptr that decreases
  (ValueError "<name> metadata must be nondecreasing."), :128-130 - and a negative kv_len_arr entry
  (ValueError "kv_len_arr metadata must be nonnegative."), both before the native MLAPlan runs.
* 0.7.2 include/flashinfer/attention/scheduler.cuh:1629-1635 - MLAPlan (the JIT module's plan, which SGLang
  0.5.23 calls directly on CUDA-graph replays) throws for a negative query length at :1634; :1641 and
  :1745-1746 - it takes a KV length as given and a negative one gets no work.
* fb28d72 flashinfer/mla/_core.py:2134-2262 - its wrapper adds no check of its own: both entries alike.
"""
from __future__ import annotations

import pytest

from validate_batch.api import check_calls
from validate_batch.errors import InputError
from validate_batch.facts.knowledge import load
from validate_batch.flashinfer.calls import plan as fi_plan
from validate_batch.ingest.crash_lines import ErrorEvent, classify_error
from validate_batch.ingest.signatures import matching_codes

PINNED = ("flashinfer-python-0.7.2", "flashinfer-python-0.7.2.post1", "flashinfer-python-0.7.4")
ALL = ("flashinfer-fb28d72",) + PINNED


def codes(report):
    return [f.code for f in report.findings]


def finding(rec, code):
    return next(f for f in check_calls([rec]).findings if f.code == code)


def qo_rec(qo_len, version, entry=None):
    rec = {"kind": "mla_plan", "qo_indptr": [0, 4, 4 + qo_len], "kv_indptr": [0, 1, 2], "version": version}
    if entry:
        rec["entry"] = entry
    return rec


# --------------------------------------------------------------------------- FI002 at -1 / 0 / +1
@pytest.mark.parametrize("version", ALL)
@pytest.mark.parametrize("entry", [None, "wrapper", "module"])
def test_query_length_limit_is_zero_on_every_version_and_entry(version, entry):
    for qo_len, bad in ((-1, True), (0, False), (1, False)):
        assert ("FI002" in codes(check_calls([qo_rec(qo_len, version, entry)]))) == bad, (version, entry, qo_len)


@pytest.mark.parametrize("version", PINNED)
def test_pinned_wrapper_refuses_a_negative_query_length_in_python(version):
    f = finding(qo_rec(-1, version), "FI002")
    assert f.failure.startswith("python_exception") and "qo_indptr metadata must be nondecreasing" in f.failure
    assert f.numbers == {"request": 1, "qo_len": -1, "count": 1}


@pytest.mark.parametrize("version", PINNED)
def test_pinned_module_plan_fails_in_mlaplan_at_its_own_line(version):
    f = finding(qo_rec(-1, version, "module"), "FI002")
    at = 1642 if version == "flashinfer-python-0.7.4" else 1634       # the line each wheel's scheduler.cuh has it on
    assert f.failure.startswith("python_exception") and f"scheduler.cuh:{at}" in f.failure
    assert "MLAPlan" in f.failure


def test_source_tree_fails_in_mlaplan_on_both_entries():
    for entry in ("wrapper", "module"):
        assert "scheduler.cuh:1599" in finding(qo_rec(-1, "flashinfer-fb28d72", entry), "FI002").failure


# --------------------------------------------------------------------------- FI003 at -1 / 0 / +1
def kv_rec(kv_len, version, entry=None):
    rec = {"kind": "mla_plan", "qo_indptr": [0, 1, 2], "kv_indptr": [0, 1, 2], "kv_len": [7, kv_len],
           "version": version}
    if entry:
        rec["entry"] = entry
    return rec


def pages_rec(pages, version, entry=None):
    rec = {"kind": "mla_plan", "qo_indptr": [0, 1, 2], "kv_indptr": [0, 3, 3 + pages], "version": version}
    if entry:
        rec["entry"] = entry
    return rec


@pytest.mark.parametrize("version", ALL)
@pytest.mark.parametrize("entry", [None, "module"])
def test_kv_limits_are_zero_on_every_version_and_entry(version, entry):
    for d, bad in ((-1, True), (0, False), (1, False)):
        assert ("FI003" in codes(check_calls([kv_rec(d, version, entry)]))) == bad, (version, entry, "kv", d)
        assert ("FI003" in codes(check_calls([pages_rec(d, version, entry)]))) == bad, (version, entry, "pages", d)


@pytest.mark.parametrize("version", PINNED)
def test_pinned_wrapper_refuses_negative_kv_in_python_the_module_does_not(version):
    wrapper = finding(kv_rec(-1, version), "FI003")
    assert wrapper.failure.startswith("python_exception") and "kv_len_arr metadata must be nonnegative" in wrapper.failure
    assert wrapper.numbers == {"request": 1, "field": "kv_len", "value": -1}
    pages = finding(pages_rec(-1, version), "FI003")
    assert "kv_indptr metadata must be nondecreasing" in pages.failure
    module = finding(kv_rec(-1, version, "module"), "FI003")
    assert module.failure.startswith("silent_wrong")


def test_source_tree_drops_a_negative_kv_request_silently():
    for entry in (None, "module"):
        assert finding(kv_rec(-1, "flashinfer-fb28d72", entry), "FI003").failure.startswith("silent_wrong")


# --------------------------------------------------------------------------- the entry field
def test_entry_names_the_function_and_is_checked():
    p = fi_plan(qo_rec(0, "flashinfer-python-0.7.2", "module"))
    assert "_cached_module.plan" in p.entry and p.call.to_record()["entry"] == "module"
    assert fi_plan(qo_rec(0, "flashinfer-python-0.7.2")).entry == "flashinfer.mla.BatchMLAPagedAttentionWrapper.plan"
    with pytest.raises(InputError) as e:
        fi_plan(qo_rec(0, "flashinfer-python-0.7.2", "kernel"))
    assert "entry" in str(e.value)


# --------------------------------------------------------------------------- error lines
def event(line: str) -> ErrorEvent:
    got = classify_error(line)
    assert got is not None, line
    return ErrorEvent(got[0], 1, line, numbers=got[1])


@pytest.mark.parametrize("version", PINNED)
def test_pinned_error_lines_are_read_as_their_rules(version):
    # the wrapper's messages, verbatim from _planning.py:73 and :130 (0.7.2)
    assert matching_codes(event("ValueError: qo_indptr metadata must be nondecreasing."), version) == ["FI002"]
    assert matching_codes(event("ValueError: kv_len_arr metadata must be nonnegative."), version) == ["FI003"]
    assert matching_codes(event("ValueError: kv_indptr metadata must be nondecreasing."), version) == ["FI003"]
    # MLAPlan's check moved from scheduler.cuh:1599 (fb28d72) to :1634 (0.7.2, 0.7.2.post1) and :1642 (0.7.4)
    line = ("RuntimeError: Error in function 'MLAPlan' at /x/flashinfer/data/include/flashinfer/attention/"
            "scheduler.cuh:{}: qo_indptr[2]3 - qo_indptr[1]4 should be non-negative")
    at = 1642 if version == "flashinfer-python-0.7.4" else 1634
    assert "FI002" in matching_codes(event(line.format(at)), version)
    assert "FI002" in matching_codes(event(line.format(1599)), "flashinfer-fb28d72")


def test_trtllm_gen_launch_line_moves_with_the_build():
    line = "CUDA Error: CUDA_ERROR_INVALID_VALUE /x/include/flashinfer/trtllm/fmha/fmhaKernels.cuh {}"
    for ln, build in ((451, "flashinfer-fb28d72"), (475, "flashinfer-python-0.7.2"), (478, "flashinfer-python-0.7.2.post1"),
                      (526, "flashinfer-python-0.7.4")):
        assert matching_codes(event(line.format(ln)), build) == ["FI001"], (ln, build)
        for other in set(ALL) - {build}:
            assert matching_codes(event(line.format(ln)), other) == [], (ln, other)


# --------------------------------------------------------------------------- the data's provenance
def _sourced(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, str) and (k == "source" or k.endswith("_source")):
                yield path, k, node
            yield from _sourced(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _sourced(v, path + (i,))


def test_every_flashinfer_source_has_an_honest_provenance():
    found = list(_sourced(load("flashinfer")))
    assert len(found) >= 8
    for path, key, node in found:
        pk = "provenance" if key == "source" else key[: -len("source")] + "provenance"
        provs = node.get(pk)
        provs = [provs] if isinstance(provs, dict) else provs
        assert provs, (path, key)
        for prov in provs:
            assert prov["kind"] in ("read", "inferred", "tested", "measured"), (path, key, prov)
            if prov["kind"] == "measured":     # the wheels' plans ran on the H200: each measures its own version
                assert path[0] == "versions" and path[1].startswith("flashinfer-python-") and prov["builds"] == [path[1]]
                continue
            assert prov.get("at"), (path, key)
            if prov["kind"] == "read":
                assert prov["from"] in ("source", "binary", "docs")
                assert prov.get("package") or prov.get("commit"), (path, key)


def test_pinned_versions_share_one_mla_plan():
    v = load("flashinfer")["versions"]
    a, b = v["flashinfer-python-0.7.2"]["mla_plan"], v["flashinfer-python-0.7.2.post1"]["mla_plan"]

    def strip(d):
        return {k: strip(x) if isinstance(x, dict) else x for k, x in d.items()
                if "provenance" not in k and k != "source"}
    assert strip(a) == strip(b)
    assert v["flashinfer-python-0.7.2.post1"]["same_mla_plan_as"] == "flashinfer-python-0.7.2"


# --------------------------------------------------------------------------- 0.7.4's lines, in its wheel
def _fi_wheel(version: str):
    import os
    import zipfile
    from pathlib import Path
    for part in filter(None, os.environ.get("VALIDATE_BATCH_FLASHINFER_WHEELS", "").split(os.pathsep)):
        found = sorted(Path(part).glob(f"flashinfer_python-{version}-*.whl"))
        if found:
            return zipfile.ZipFile(found[0])
    pytest.skip(f"flashinfer_python-{version} wheel not given (VALIDATE_BATCH_FLASHINFER_WHEELS: folders holding "
                f"pip download --no-deps flashinfer-python=={version})")


def test_the_0_7_4_lines_are_its_wheels():
    new = _fi_wheel("0.7.4")

    def line(path, n):
        return new.read(path).decode().splitlines()[n - 1]
    sched = "flashinfer/data/include/flashinfer/attention/scheduler.cuh"
    fmha = "flashinfer/data/include/flashinfer/trtllm/fmha/fmhaKernels.cuh"
    assert "FLASHINFER_ERROR(" in line(sched, 1642) and "should be non-negative" in new.read(sched).decode()
    assert "int max_total_num_works = 16384;" in line(sched, 1783)
    assert "cuLaunchKernelEx(" in line(fmha, 526) and "int numCtasZ = params.mBatchSize;" in line(fmha, 698)
    assert line("flashinfer/mla/_batch_mla/_backends/_fa_common.py", 255).strip() == "_FA_MAX_WORK_ITEMS = 16384"
    old = _fi_wheel("0.7.2.post1")
    planning = "flashinfer/mla/_batch_mla/_planning.py"
    assert new.read(planning) == old.read(planning)          # the wrapper's checks, the same file
