"""``validate-batch bisect``: the story, --json, exit codes, and one-line errors for bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validate_batch.cli.main import app

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
MAX_B = (232448 // 4 - 1) // 5


def invoke(*args, input=None):
    return CliRunner().invoke(app, ["bisect", *args], input=input)


def test_story_for_the_seed_crash():
    r = invoke(str(LOGS / "sglang-dsv4-prefill-12288.log"))
    assert r.exit_code == 1, r.output
    out = r.stdout
    assert "crashing step (DP0): the last logged prefill (line 14)" in out
    assert "<- crashing step" in out
    assert f"largest legal query rows = {MAX_B}, first illegal = {MAX_B + 1}; over by {12288 - MAX_B}" in out
    assert "rule: FMLA001, SGL001" in out
    assert "--chunked-prefill-size 8192" in out


def test_json_mode():
    r = invoke(str(LOGS / "sglang-pd-decode-slot-96.log"), "--json")
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert d["rule"] == ["SLOT002"] and d["boundary"]["largest_legal"] == 32 and d["boundary"]["observed"] == 96
    assert d["error"]["numbers"]["size"] == 33


def test_stdin_and_overrides():
    text = (LOGS / "sglang-pd-decode-slot-96.log").read_text()
    # Override the extra slots the log states: with E = 0 the table has R + 1 rows and slot 96 is outside it.
    r = invoke("-", "--json", "--server-arg", "disaggregation_decode_extra_slots=0", input=text)
    d = json.loads(r.stdout)
    assert d["config"]["sources"]["disaggregation_decode_extra_slots"] == "--server-arg"
    assert "SLOT001" in d["rule"]


def test_help_has_examples():
    r = CliRunner().invoke(app, ["bisect", "--help"])
    assert r.exit_code == 0
    assert "validate-batch bisect server.log" in r.output and "--trust-pickle" in r.output


@pytest.mark.parametrize("args,needle", [
    ([], "LOG"),
    (["/nonexistent/server.log"], "no such file"),
    (["{log}", "--server-arg", "chunked_prefill_size"], "--server-arg"),
    (["{log}", "--sglang-version", "newest"], "--sglang-version"),
    (["{log}", "--rank", "DP7"], "--rank"),
    (["{log}", "--gpu", "RTX-9999"], "gpu"),
    (["{log}", "--engine", "trtllm"], "engine"),
    (["{log}", "--launch", "echo hello"], "--launch"),
    (["{pkl}"], "--dump"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, needle):
    pkl = tmp_path / "dump.pkl"
    pkl.write_bytes(b"\x80\x04N.")
    args = [a.format(log=LOGS / "sglang-dsv4-prefill-12288.log", pkl=pkl) for a in args]
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_binary_garbage_is_a_partial_answer_not_a_traceback(tmp_path):
    p = tmp_path / "garbage.log"
    p.write_bytes(bytes(range(1, 256)) * 50 + b"\nPrefill batch, #new-seq: \xff\xfe\n")
    r = invoke(str(p))
    assert r.exit_code == 0, r.output
    assert "batch line(s) not parsed" in r.stdout and "error: none found" in r.stdout
    assert "Traceback" not in r.output


def test_kernel_flag_reports_availability_instead_of_failing():
    r = invoke(str(LOGS / "sglang-dsv4-prefill-12288.log"), "--json", "--kernel")
    assert r.exit_code == 1
    k = json.loads(r.stdout)["kernel"]
    assert isinstance(k, dict) and "available" in k
    if not k["available"]:
        assert k["reason"]
