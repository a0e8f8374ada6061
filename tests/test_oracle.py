"""Bit-exactness and verdicts against the real FlashMLA kernels, recorded on an H200.

* ``flashmla_h200_cases.jsonl``: what the scheduling kernel wrote (columns 0..6 of every partition,
  trailing ones included, and num_splits) must be reproduced exactly by the reference loop, the fast
  path, and ``validate-batch metadata --json`` (fast and ``--reference``).
* ``flashmla_h200_probes.jsonl`` / ``..._sparse_prefill_probes.jsonl``: the verdict the real kernel
  gave (crash / exit / exception = illegal), the rule that names the cause, and for runs that
  succeeded the ``num_sm_parts`` and ``num_splits[b]`` it printed.
"""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from validate_batch.api import check_calls
from validate_batch.cli.main import app
from validate_batch.flashmla.plan import plan
from validate_batch.facts.knowledge import resolve_gpu


def _expected(rec: dict) -> tuple[list[list[int]], list[int]]:
    return [row[:7] for row in rec["tile_scheduler_metadata"]], rec["num_splits"]


def _first_diff(got: list, exp: list) -> str:
    if len(got) != len(exp):
        return f"{len(got)} rows, expected {len(exp)}"
    i = next(i for i, (a, e) in enumerate(zip(got, exp)) if a != e)
    return f"row {i}: got {got[i]}, expected {exp[i]}"


@pytest.fixture(scope="module")
def device_gpu(oracle_device):
    return resolve_gpu(oracle_device)


@pytest.fixture(scope="module")
def scheduled_cases(oracle_cases):
    cases = [r for r in oracle_cases if "error" not in r]
    assert len(cases) >= 200, "the cases file holds a few hundred recorded calls"
    return cases


def test_device_header_is_the_h200_profile(oracle_device, h200):
    g = resolve_gpu(oracle_device)
    assert (g.num_sms, g.cc, g.smem_optin) == (oracle_device["num_sms"], tuple(oracle_device["cc"]),
                                               oracle_device["smem_optin"])
    assert (g.num_sms, g.cc, g.smem_optin) == (h200.num_sms, h200.cc, h200.smem_optin)


@pytest.mark.parametrize("path", ["reference", "fast"])
def test_cases_bit_exact(scheduled_cases, device_gpu, path, impl):
    failures = []
    for rec in scheduled_cases:
        p = plan(rec, device_gpu)
        rows, num_splits = _expected(rec)
        assert p.num_sm_parts == len(rows), f"case {rec['i']}: num_sm_parts"
        sch = p.reference_schedule() if path == "reference" else p.schedule
        got_rows = sch.metadata[:, :7].tolist()
        if got_rows != rows:
            failures.append(f"case {rec['i']} ({p.call.summary()}): {_first_diff(got_rows, rows)}")
        elif sch.num_splits.tolist() != num_splits:
            failures.append(f"case {rec['i']} ({p.call.summary()}): num_splits differ")
        elif sch.total_splits != num_splits[-1]:
            failures.append(f"case {rec['i']}: total_splits {sch.total_splits} != {num_splits[-1]}")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:10])


def test_cases_cover_the_interesting_shapes(scheduled_cases):
    """The file exercises what the model must get right (so a pass above means something)."""
    kinds = {(r["kind"], r.get("d_qk"), "topk_length" in r, "extra_topk" in r) for r in scheduled_cases}
    assert ("dense", None, False, False) in kinds
    assert ("sparse", 576, False, False) in kinds
    assert ("sparse", 512, True, True) in kinds
    trailing = sum(1 for r in scheduled_cases if any(row[0] == r["b"] for row in r["tile_scheduler_metadata"]))
    split = sum(1 for r in scheduled_cases if r["num_splits"][-1] > r["b"])
    assert trailing > 10 and split > 10


def test_cases_are_legal(scheduled_cases, device_gpu):
    """Every recorded call ran to completion on the GPU, so none may be reported illegal."""
    report = check_calls(scheduled_cases, device_gpu)
    assert report.legal, [f.one_line() for f in report.errors][:5]


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_cli_metadata_json_over_the_whole_file(oracle_dir, scheduled_cases, reference):
    args = ["metadata", "--json", str(oracle_dir / "flashmla_h200_cases.jsonl")]
    if reference:
        args.append("--reference")
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(ln) for ln in result.stdout.splitlines() if ln.strip()]
    assert len(lines) == len(scheduled_cases)
    failures = []
    for i, (got, rec) in enumerate(zip(lines, scheduled_cases)):
        rows, num_splits = _expected(rec)
        assert got["index"] == i
        assert got["legal"] is True
        assert got["num_sm_parts"] == len(rows)
        got_rows = [row[:7] for row in got["tile_scheduler_metadata"]]
        if got_rows != rows or got["num_splits"] != num_splits:
            failures.append(f"case {rec['i']}: {_first_diff(got_rows, rows) if got_rows != rows else 'num_splits'}")
    assert not failures, "\n".join(failures[:10])


# ------------------------------------------------------------------------------------------------
# Probes: verdicts and the rule that names the failure
# ------------------------------------------------------------------------------------------------
def expected_code(probe: dict) -> str | None:
    """The rule code that must explain an illegal probe, read from what the kernel printed."""
    if probe["verdict"] == "legal":
        return None
    msg = probe["message"]
    if "get_decoding_sched_meta.cu:111" in msg:
        return "FMLA001"                        # scheduler shared memory
    if "V3.2 does not support" in msg:
        return "FMLA006"
    if "topk % TOPK_BLOCK_SIZE" in msg:
        return "FMLA004"
    if "head_size_k" in msg or (probe["outcome"] == "process_crash" and probe["h_q"] not in (64, 128)):
        return "FMLA005"
    widths = (("topk_length", "topk"), ("extra_topk_length", "extra_topk"))
    if any(k in probe and any(not 0 <= v <= probe[w] for v in probe[k]) for k, w in widths):
        return "FMLA003"                        # lengths outside [0, width]
    if "combine.cu:197" in msg:
        return "FMLA002"                        # o_accum offset wrapped
    raise AssertionError(f"probe not understood by the test: {msg!r}")


def test_probes_verdicts_codes_and_numbers(oracle_probes, device_gpu, impl):
    assert len(oracle_probes) >= 50
    failures = []
    n_ok = 0
    for i, probe in enumerate(oracle_probes):
        report = check_calls([probe], device_gpu)
        verdict = "legal" if report.legal else "illegal"
        desc = f"probe {i} ({report.plans[0].call.summary()}, kernel: {probe['outcome']} {probe['message'][:60]!r})"
        if verdict != probe["verdict"]:
            failures.append(f"{desc}: verdict {verdict}, kernel says {probe['verdict']}")
            continue
        want = expected_code(probe)
        if want is not None and want not in [f.code for f in report.errors]:
            failures.append(f"{desc}: expected {want}, got {[f.code for f in report.errors]}")
        if probe["outcome"] == "ok":
            n_ok += 1
            word, parts, total = probe["message"].split()
            assert word == "OK"
            p = report.plans[0]
            if p.num_sm_parts != int(parts):
                failures.append(f"{desc}: num_sm_parts {p.num_sm_parts}, kernel {parts}")
            elif p.schedule is None or p.schedule.total_splits != int(total):
                failures.append(f"{desc}: num_splits[b] {p.schedule and p.schedule.total_splits}, kernel {total}")
    assert not failures, "\n".join(failures)
    assert n_ok >= 30


def test_probes_num_splits_from_the_reference_loop_too(oracle_probes, device_gpu):
    """The plain loop agrees with the kernel's num_splits[b] on every probe that ran."""
    for probe in oracle_probes:
        if probe["outcome"] != "ok":
            continue
        _, parts, total = probe["message"].split()
        ref = plan(probe, device_gpu).reference_schedule()
        assert ref.num_sm_parts == int(parts)
        assert int(ref.num_splits[-1]) == int(total), probe["b"]


@pytest.mark.parametrize("b, topk, verdict", [(4673, 1024, "legal"), (4675, 2048, "illegal")])
def test_oaccum_probes_near_the_boundary(oracle_probes, device_gpu, b, topk, verdict, impl):
    """The two large s_q=8, h_q=128 probes on either side of the 32-bit o_accum offset.

    The kernel decides from the largest split row R: R * 8*128*512 must stay below 2^31, i.e. R <= 4095.
    R is recomputed here from the reference loop's num_splits.
    """
    probe = next(p for p in oracle_probes if p["b"] == b and p["topk"] == topk and p["s_q"] == 8)
    assert probe["verdict"] == verdict
    ns = plan(probe, device_gpu).reference_schedule().num_splits.tolist()
    rows = [ns[r + 1] - 1 for r in range(b) if ns[r + 1] - ns[r] > 1]
    max_row = max(rows)
    assert (max_row * 8 * 128 * 512 < 2**31) == (verdict == "legal")
    report = check_calls([probe], device_gpu)
    assert report.legal == (verdict == "legal")
    if verdict == "illegal":
        f = next(f for f in report.errors if f.code == "FMLA002")
        assert f.numbers["row"] == max_row
        assert f.numbers["max_row"] == 2**31 // (8 * 128 * 512) - 1 == 4095
        assert f.numbers["offset"] == max_row * 8 * 128 * 512


def test_sparse_prefill_probes(oracle_prefill_probes, device_gpu):
    """flash_mla_sparse_fwd: s_q = 0 crashes (FMLA014); 1 .. 200000 rows all ran (no row limit)."""
    assert len(oracle_prefill_probes) >= 10
    for probe in oracle_prefill_probes:
        report = check_calls([probe], device_gpu)
        assert ("legal" if report.legal else "illegal") == probe["verdict"], probe
        if probe["verdict"] == "illegal":
            assert probe["s_q"] == 0
            assert [f.code for f in report.errors] == ["FMLA014"]
        else:
            # The prober printed "OK 1 <s_q>": one launch over all s_q query rows.
            assert probe["message"] == f"OK 1 {probe['s_q']}"
            assert report.findings == []
