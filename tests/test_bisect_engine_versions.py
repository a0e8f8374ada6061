"""``bisect --engine PROFILE@VERSION``: every spelling ``check`` accepts works on bisect too, and a
version that does not exist is an input error (exit 2), never an internal one (exit 4) or a guess.

Ground truth for the seed log (one prefill of 12288 query rows on an H200): FlashMLA 9241ae3's scheduler
needs 4*(5b+1) bytes for b rows, so b = 11622 is the largest that fits 232448 bytes; a version that routes
extends of more than 11673 rows to sparse prefill (no scheduler) runs this prefill.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validate_batch.cli.main import app
from validate_batch.facts.knowledge import load

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "fixtures" / "logs" / "sglang-dsv4-prefill-12288.log"
SLOT_LOG = ROOT / "fixtures" / "logs" / "sglang-pd-decode-slot-96.log"
runner = CliRunner()


def spellings(profile: str) -> list[str]:
    out = []
    for v in load("engines")["profiles"][profile]["versions"]:
        out += [v["name"], *v.get("aliases", [])]
    return out


def largest_rows(smem: int) -> int:
    return (smem - 4) // 20


@pytest.mark.parametrize("profile,log", [("sglang-dsv4", SEED), ("sglang-slots", SLOT_LOG)])
def test_every_version_spelling_check_accepts_runs_on_bisect(profile, log):
    for version in spellings(profile):
        spec = f"{profile}@{version}"
        assert runner.invoke(app, ["check", "--engine", spec, "--extend", "100", "--server-arg", "max_running_requests=8", "-q"]).exit_code in (0, 1), spec
        res = runner.invoke(app, ["bisect", str(log), "--engine", spec, "--json"])
        assert res.exit_code in (0, 1), (spec, res.output[-400:])


def test_a_pinned_version_decides_the_verdict():
    assert largest_rows(232448) == 11622 < 12288
    old = runner.invoke(app, ["bisect", str(SEED), "--engine", "sglang-dsv4@pre-25418", "--json"])
    d = json.loads(old.stdout)
    assert old.exit_code == 1 and "FMLA001" in d["rule"] and d["boundary"]["largest_legal"] == 11622
    routed = runner.invoke(app, ["bisect", str(SEED), "--engine", "sglang-dsv4@routing", "--json"])
    assert routed.exit_code == 0 and "FMLA001" not in (json.loads(routed.stdout).get("rule") or [])


@pytest.mark.parametrize("spec", ["sglang-dsv4@9.9.9x", "sglang-dsv4@nope", "sglang-dsv4@"])
def test_an_unknown_version_is_an_input_error(spec):
    res = runner.invoke(app, ["bisect", str(SEED), "--engine", spec])
    assert res.exit_code == 2, res.output
    assert "internal error" not in res.output
