"""One table of error-line recognisers, read by bisect's log scan and by kernel mode's outcome parser.

Ground truth is ``fixtures/error_lines.jsonl``: error lines in the printing libraries' own formats
(FlashMLA csrc/utils.h CHECK_CUDA and FLASH_ASSERT, kerutils KU_ASSERT, FlashInfer exception.h and
trtllm/common.h, DeepGEMM exception.hpp, CUTLASS's TMA descriptor dump, torch's and the engines' lines),
each with the class, failure and fields its format says, and its source. Adding a format is one row in
``validator/ingest/recognisers.py`` plus one line there; the last tests add one at run time.
"""
from __future__ import annotations

import json
import re
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

import validate_batch.ingest.recognisers as rec
from validate_batch.errors import InputError
from validate_batch.ingest.recognisers import RECOGNISERS, Recogniser, check_table, classify, classify_block, prefilter
from validate_batch.ingest.scan import scan_lines
from validate_batch.kernel_mode.outcome import CUDA_ERROR_FORMAT, RESULT_PREFIX, STAGE_PREFIX
from validate_batch.kernel_mode.outcome import classify as classify_run
from validate_batch.facts.limits import parse_int

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "error_lines.jsonl"


def fixture_lines(path: Path = FIXTURE) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


FIXTURES = fixture_lines()


def check_fixture(fx: dict) -> None:
    """The fixture line is read as it says by the table, by bisect's log scan and by kernel mode."""
    got = classify(fx["line"])
    assert got is not None, fx["line"]
    assert (got.recogniser.name, got.kind, got.failure, got.numbers.get("library")) == (
        fx["recogniser"], fx["kind"], fx["failure"], fx["library"])
    for k, v in fx["fields"].items():
        assert got.numbers[k] == v, k
    # bisect: the line in a log is its root error, with the same class, failure and numbers
    err = scan_lines([fx["line"]]).root_error()
    assert err is not None and (err.kind, err.failure) == (fx["kind"], fx["failure"])
    for k, v in fx["fields"].items():
        assert err.numbers[k] == v, k
    # kernel mode: a child that printed the line and exited reports it as what it recognised
    run = classify_run(1, f"{STAGE_PREFIX}call\n", "some noise\n" + fx["line"] + "\n")
    assert run.recognised is not None
    assert (run.recognised["recogniser"], run.recognised["kind"], run.recognised["failure"]) == (
        fx["recogniser"], fx["kind"], fx["failure"])
    assert run.to_dict()["recognised"]["kind"] == fx["kind"]
    for k, v in fx["fields"].items():
        assert run.recognised[k] == v, k


def test_every_row_has_a_fixture_line_and_the_table_is_well_formed():
    check_table()
    assert {r.name for r in RECOGNISERS} == {fx["recogniser"] for fx in FIXTURES}
    assert all(fx["source"] for fx in FIXTURES)
    assert CUDA_ERROR_FORMAT in {r.name for r in RECOGNISERS}      # the row kernel mode takes its site from


@pytest.mark.parametrize("fx", FIXTURES, ids=[f"{i}-{fx['recogniser']}" for i, fx in enumerate(FIXTURES)])
def test_fixture_lines_are_read_alike_by_the_table_bisect_and_kernel_mode(fx):
    check_fixture(fx)


def test_the_prefilter_is_every_rows_markers():
    lits = prefilter(RECOGNISERS)
    for row in RECOGNISERS:
        for m in row.markers:
            assert any(k in m.lower() for k in lits), (row.name, m)
    # a line with none of them is no error, whatever else it says
    assert classify("[2026-01-01 00:00:00] INFO: 127.0.0.1 - POST /generate 200 OK") is None


@pytest.mark.parametrize("row", RECOGNISERS, ids=[r.name for r in RECOGNISERS])
def test_each_row_reads_a_long_hostile_line_in_bounded_time(row):
    # its markers among long runs of digits, path parts, parentheses and of the markers themselves
    # (many starts of a format and no end of it): a search at every start must not rescan the line
    for marker in row.markers + row.needs:
        for filler in ("9" * 200000, "a/" * 100000, "(" * 200000, (marker + " ") * 20000, marker * 20000,
                       "Scheduler" * 20000, "Expected " * 20000):
            for line in (marker + filler, filler + marker, marker + filler + "".join(row.needs)):
                t = time.perf_counter()
                try:
                    classify(line)
                except InputError:
                    pass           # a number of thousands of digits is refused, not read
                assert time.perf_counter() - t < 1.0, (row.name, line[:40])


def test_check_table_names_the_row():
    bad = replace(RECOGNISERS[0], name="bad_row", kind="no_such_kind")
    with pytest.raises(ValueError, match="bad_row.*kind"):
        check_table(RECOGNISERS + (bad,))
    with pytest.raises(ValueError, match="used twice"):
        check_table(RECOGNISERS + (RECOGNISERS[0],))
    dump = next(r for r in RECOGNISERS if r.block is not None)
    with pytest.raises(ValueError, match="block.closer"):
        check_table((dump,))


# ------------------------------------------------------------------ an error that spans lines
TMA_DUMP = ["TMA Desc Addr:   0x7ffd2c41e9c0", "format         0", "dim            3",
            "gmem_address   0x7f3e00000000", "globalDim      (512,64,0,1,1)", "globalStrides  (2,1024,0,0,0)",
            "boxDim         (64,64,1,1,1)", "Failed to initialize the TMA descriptor 1"]


def test_a_descriptor_dump_is_one_error_for_bisect_and_kernel_mode():
    found = classify_block(TMA_DUMP)
    assert len(found) == 1
    no, got = found[0]
    # globalDim's third extent is 0: an empty tensor; the closing line gives the driver's result
    assert no == 1 and got.numbers["zero_extent"] is True and got.numbers["tma_result"] == 1
    assert got.numbers["descriptor"]["globalDim"] == "(512,64,0,1,1)"
    ev = scan_lines(TMA_DUMP + ["Fatal Python error: Segmentation fault"])
    root = ev.root_error()
    assert root.kind == "tma_descriptor" and root.numbers["zero_extent"] and root.numbers["tma_result"] == 1
    assert ev.counts["error"] == len(TMA_DUMP) + 1
    run = classify_run(-signal.SIGSEGV, f"{STAGE_PREFIX}call\n", "\n".join(TMA_DUMP) + "\n")
    assert run.outcome == "process_crash"
    assert run.recognised["kind"] == "tma_descriptor" and run.recognised["zero_extent"] is True
    assert run.recognised["tma_result"] == 1


def test_a_line_far_from_the_dump_is_read_on_its_own():
    found = classify_block(TMA_DUMP[:2] + ["x", "y", "z", "globalDim (0,1)"])
    assert [g.recogniser.name for _, g in found] == ["cutlass_tma_descriptor"]
    assert "globalDim" not in found[0][1].numbers.get("descriptor", {})


# ------------------------------------------------------------------ a new format: one row and one fixture line
# Triton's launch-time exception (python/triton/runtime/errors.py, OutOfResources:
# "out of resource: {name}, Required: {required}, Hardware limit: {limit}"), as a log shows it.
TRITON_ROW = Recogniser(
    "triton_out_of_resources", "triton", "python_error",
    re.compile(r"out of resource: (?P<resource>[\w ]+?), Required: (?P<required>\d+), Hardware limit: (?P<limit>\d+)"),
    ("out of resource: ",),
    lambda m, line: {"resource": m.group("resource"), "required": parse_int(m.group("required"), "required"),
                     "limit": parse_int(m.group("limit"), "hardware limit")},
    failure="python_exception", source="triton python/triton/runtime/errors.py (OutOfResources)")
TRITON_MESSAGE = ("out of resource: shared memory, Required: 233472, Hardware limit: 232448. Reducing block sizes "
                  "or `num_stages` may help.")
TRITON_FIXTURE = {"recogniser": "triton_out_of_resources",
                  "line": f"triton.runtime.errors.OutOfResources: {TRITON_MESSAGE}",
                  "kind": "python_error", "failure": "python_exception", "library": "triton",
                  "fields": {"resource": "shared memory", "required": 233472, "limit": 232448},
                  "source": "triton python/triton/runtime/errors.py"}


def test_a_new_format_is_one_row_and_one_fixture_line(monkeypatch, tmp_path):
    exception_line = f"OutOfResources: {TRITON_MESSAGE}"      # how kernel mode reads the child's exception
    assert classify(TRITON_FIXTURE["line"]) is None and classify(exception_line) is None
    fixture = tmp_path / "error_lines.jsonl"
    fixture.write_text(FIXTURE.read_text(encoding="utf-8") + json.dumps(TRITON_FIXTURE) + "\n", encoding="utf-8")

    monkeypatch.setattr(rec, "RECOGNISERS", RECOGNISERS + (TRITON_ROW,))
    check_table(rec.RECOGNISERS)
    lines = fixture_lines(fixture)
    assert {r.name for r in rec.RECOGNISERS} == {fx["recogniser"] for fx in lines}
    for fx in lines:
        check_fixture(fx)
    # the prefilter follows the table: the child's exception line holds no other row's marker
    assert not any(k in exception_line.lower() for k in prefilter(RECOGNISERS))
    res = json.dumps({"status": "python_exception", "error_type": "OutOfResources", "message": TRITON_MESSAGE})
    run = classify_run(0, f"{STAGE_PREFIX}call\n{RESULT_PREFIX}{res}\n", "")
    assert run.outcome == "python_exception"
    assert (run.recognised["library"], run.recognised["required"], run.recognised["limit"]) == ("triton", 233472, 232448)
