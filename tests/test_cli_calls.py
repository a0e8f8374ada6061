"""The ``validate-batch`` command line on kernel-call records: outputs, exit codes, bad input.

Exit codes: 0 legal, 1 illegal, 2 bad input (one line on stderr naming the field, never a traceback).
Expected schedules here are worked out by hand in the comments from the facts' algorithm.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from validate_batch.cli.main import app

WIDE = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def invoke(args, stdin: str | None = None):
    result = CliRunner(env=WIDE).invoke(app, args, input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"validate-batch {' '.join(args)} raised {result.exception!r}") from result.exception
    return result


def rec_json(**kw) -> str:
    rec = {"kind": "sparse", "b": 8, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
    rec.update(kw)
    return json.dumps(rec)


# One request of topk 640 = 10 blocks, s_q = 66, h_q = 64 -> P = 132 / 66 / 1 = 2 partitions.
# total = 10 + 5 = 15, payload = ceil(15 / 2) + 5 = 13. P0 cannot take 15: takes 13 - 5 = 8 blocks (split);
# P1 takes the remaining 2 (+5 <= 13). Rows [0,0,0,8,0,1,1] and [0,0,8,10,1,1,1]; num_splits [0, 2].
SMALL = rec_json(b=1, s_q=66, topk=640)
SMALL_ROWS = [[0, 0, 0, 8, 0, 1, 1], [0, 0, 8, 10, 1, 1, 1]]


# ------------------------------------------------------------------------------------------------
# metadata
# ------------------------------------------------------------------------------------------------
def test_metadata_json_small_call():
    r = invoke(["metadata", "--json", "-"], SMALL)
    assert r.exit_code == 0, r.stderr
    (line,) = r.stdout.splitlines()
    d = json.loads(line)
    assert d["index"] == 0 and d["num_sm_parts"] == 2 and d["legal"] is True and d["findings"] == []
    assert [row[:7] for row in d["tile_scheduler_metadata"]] == SMALL_ROWS
    assert all(len(row) == 8 for row in d["tile_scheduler_metadata"])
    assert d["num_splits"] == [0, 2]


def test_metadata_json_reference_flag_gives_the_same():
    a = invoke(["metadata", "--json", "-"], SMALL).stdout
    b = invoke(["metadata", "--json", "--reference", "-"], SMALL).stdout
    assert json.loads(a) == json.loads(b)


def test_metadata_human_output():
    r = invoke(["metadata", "-"], SMALL)
    assert r.exit_code == 0
    text = r.stdout
    assert "legal" in text and "ILLEGAL" not in text
    assert "num_sm_parts = 2" in text
    assert "sparse-sm90" in text
    # scheduler shared memory 4*(5*1+1) = 24 B; workspace (1+2)*66*64*4*513 B
    assert "24 B of 232448 B" in text
    assert str(3 * 66 * 64 * 4 * 513) in text
    table_rows = [[int(x) for x in re.findall(r"-?\d+", ln)] for ln in text.splitlines()
                  if re.match(r"^\W*\d+\W+\d+\W+\d+", ln)]
    assert [row[1:8] for row in table_rows] == SMALL_ROWS
    assert "num_splits = [0, 2]" in text
    assert "largest split row 1" in text


def test_metadata_human_truncates_rows_and_says_so():
    # b = 8, P = 132: 132 partitions, 16 shown, 116 counted
    r = invoke(["metadata", "-"], rec_json())
    assert r.exit_code == 0
    assert "116 more partitions" in r.stdout


def test_metadata_illegal_call_exits_1_and_shows_no_schedule():
    r = invoke(["metadata", "--json", "-"], rec_json(b=11623))
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert d["legal"] is False and d["tile_scheduler_metadata"] is None and d["num_splits"] is None
    assert [f["code"] for f in d["findings"]] == ["FMLA001"]


def test_metadata_several_calls_in_one_array_keep_their_order():
    docs = "[" + ",".join([SMALL, rec_json(b=3, s_q=132, topk=64)]) + "]"
    r = invoke(["metadata", "--json", "-"], docs)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["index"] for d in lines] == [0, 1]
    # second: P = max(132/132/1, 1) = 1, three 1-block requests all in partition 0
    assert lines[1]["num_sm_parts"] == 1
    assert lines[1]["tile_scheduler_metadata"][0][:7] == [0, 2, 0, 1, 0, 0, 0]
    assert lines[1]["num_splits"] == [0, 1, 2, 3]


def test_metadata_device_header_and_gpu_flag():
    header = json.dumps({"num_sms": 66, "cc": [9, 0], "smem_optin": 232448})
    r = invoke(["metadata", "--json", "-"], header + "\n" + rec_json(b=4))
    assert json.loads(r.stdout)["num_sm_parts"] == 66            # 66 / 1 / (64/64)
    r = invoke(["metadata", "--json", "--gpu", "num_sms=10,cc=9.0,smem_optin=232448", "-"],
               header + "\n" + rec_json(b=4))
    assert json.loads(r.stdout)["num_sm_parts"] == 10            # --gpu overrides the header
    r = invoke(["metadata", "--json", "--gpu", "B200", "-"], rec_json(b=4, h_q=128, topk=512))
    d = json.loads(r.stdout)
    assert d["implementation"] == "sparse-sm100-head128" and d["num_sm_parts"] == 148 // 1 // 2


def test_metadata_from_a_file(tmp_path):
    f = tmp_path / "calls.jsonl"
    f.write_text(SMALL + "\n" + rec_json(b=12288) + "\n")
    r = invoke(["metadata", "--json", str(f)])
    assert r.exit_code == 1
    assert [json.loads(x)["legal"] for x in r.stdout.splitlines()] == [True, False]


# ------------------------------------------------------------------------------------------------
# check
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, code", [
    (rec_json(b=11622), 0),
    (rec_json(b=11623), 1),
    (rec_json(topk=100), 1),
    (rec_json(b="x"), 2),
    ("", 2),
])
def test_check_exit_codes(text, code):
    for extra in ([], ["--json"], ["--quiet"]):
        assert invoke(["check", *extra, "-"], text).exit_code == code


def test_check_json_and_quiet():
    r = invoke(["check", "--json", "-"], rec_json(b=12288, topk=512))
    d = json.loads(r.stdout)
    assert d["legal"] is False
    (f,) = d["findings"]
    assert f["code"] == "FMLA001"
    assert f["numbers"] == {"b": 12288, "max_b": 11622, "smem_bytes": 4 * (5 * 12288 + 1), "smem_limit": 232448}
    r = invoke(["check", "--quiet", "-"], rec_json(b=12288))
    assert r.exit_code == 1 and r.stdout == ""


def test_check_human_output_names_rule_numbers_and_fix():
    r = invoke(["check", "-"], rec_json(b=12288, topk=512))
    assert r.exit_code == 1
    assert "ILLEGAL" in r.stdout and "FMLA001" in r.stdout
    assert "12288" in r.stdout and "11622" in r.stdout and "245764" in r.stdout
    assert "split into at least 2 calls" in r.stdout
    r = invoke(["check", "-"], rec_json())
    findings = [ln for ln in r.stdout.splitlines() if not ln.startswith("Provenance:")]   # that line names rules read
    assert r.exit_code == 0 and "LEGAL" in r.stdout and not any("FMLA" in ln for ln in findings)


# ------------------------------------------------------------------------------------------------
# rules / explain
# ------------------------------------------------------------------------------------------------
FMLA_CODES = [f"FMLA{i:03d}" for i in range(1, 15)]


def _all_codes() -> list[str]:
    from validate_batch.legality.registry import all_rules

    return [r.code for r in all_rules()]


def test_rules_lists_every_code():
    r = invoke(["rules"])
    assert r.exit_code == 0
    for code in _all_codes():
        assert code in r.stdout
    r = invoke(["rules", "--json"])
    data = json.loads(r.stdout)
    codes = [d["code"] for d in data]
    assert set(FMLA_CODES) <= set(codes)
    assert codes == sorted(codes)
    assert all(d["severity"] in ("error", "warning", "info") and d["title"] and d["source"] for d in data)


@pytest.mark.parametrize("code", _all_codes())
def test_explain_every_code_has_the_fixed_sections(code):
    r = invoke(["explain", code])
    assert r.exit_code == 0, r.stderr
    text = r.stdout
    assert text.startswith(code)
    positions = [text.find(f"## {s}") for s in ("What it checks", "Why it crashes", "Example", "Fix", "Source")]
    assert all(p >= 0 for p in positions), positions
    assert positions == sorted(positions)
    assert "Cited source:" in text


def test_explain_is_case_insensitive_and_unknown_code_exits_2():
    assert invoke(["explain", "fmla001"]).stdout.startswith("FMLA001")
    r = invoke(["explain", "FMLA999"])
    assert r.exit_code == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "FMLA999" in r.stderr


# ------------------------------------------------------------------------------------------------
# bad input: exit 2, one line on stderr naming the field, nothing on stdout
# ------------------------------------------------------------------------------------------------
BASE = {"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}


def _bad(**kw) -> str:
    rec = dict(BASE)
    for k, v in kw.items():
        if v is ...:
            rec.pop(k)
        else:
            rec[k] = v
    return json.dumps(rec)


BAD_INPUTS = [
    ("missing b", _bad(b=...), "b"),
    ("missing h_q", _bad(h_q=...), "h_q"),
    ("dense without seqlens", json.dumps({"kind": "dense", "b": 2, "s_q": 1, "h_q": 64}), "seqlens"),
    ("string b", _bad(b="2"), "b"),
    ("float b", _bad(b=2.0), "b"),
    ("null topk", _bad(topk=None), "topk"),
    ("bool instead of int", _bad(s_q=True), "s_q"),
    ("bool in list", _bad(topk_length=[1, False]), "topk_length[1]"),
    ("negative b", _bad(b=-1), "b"),
    ("zero b", _bad(b=0), "b"),
    ("b = 10**9", _bad(b=10**9), "b"),
    ("huge s_q", _bad(s_q=10**12), "s_q"),
    ("huge topk", _bad(topk=2**40), "topk"),
    ("list too short", _bad(topk_length=[1]), "topk_length"),
    ("list too long", _bad(topk_length=[1, 2, 3]), "topk_length"),
    ("dense seqlens wrong length", json.dumps({"kind": "dense", "b": 3, "s_q": 1, "h_q": 64, "seqlens": [1]}), "seqlens"),
    ("non-integer element", _bad(topk_length=[1, "x"]), "topk_length[1]"),
    ("float element", _bad(topk_length=[1, 2.5]), "topk_length[1]"),
    ("nested element", _bad(topk_length=[[1], 2]), "topk_length[0]"),
    ("element beyond int64", _bad(topk_length=[1, 10**30]), "topk_length"),
    ("element beyond int32", _bad(topk_length=[1, 2**31]), "topk_length[1]"),
    ("negative seqlen", json.dumps({"kind": "dense", "b": 2, "s_q": 1, "h_q": 64, "seqlens": [1, -1]}), "seqlens[1]"),
    ("list is a string", _bad(topk_length="12"), "topk_length"),
    ("unknown field", _bad(bogus=1), "bogus"),
    ("unknown kind", _bad(kind="sparse2"), "kind"),
    ("extra length without extra_topk", _bad(extra_topk_length=[1, 1]), "extra_topk_length"),
    ("seqlens on a sparse call", _bad(seqlens=[1, 1]), "seqlens"),
    ("topk on a dense call", json.dumps({"kind": "dense", "b": 1, "s_q": 1, "h_q": 64, "seqlens": [1], "topk": 64}), "topk"),
    ("record is a number", "42", "calls[0]"),
    ("empty input", "", "empty"),
    ("blank input", "  \n \n", "empty"),
    ("device header with bad cc string", '{"num_sms": 132, "cc": "nine", "smem_optin": 232448}\n' + _bad(), "cc"),
    ("device header with short cc", '{"num_sms": 132, "cc": [9], "smem_optin": 232448}\n' + _bad(), "cc"),
    ("device header with bool num_sms", '{"num_sms": true, "cc": [9, 0], "smem_optin": 232448}\n' + _bad(), "num_sms"),
]


def _assert_one_line_error(r, needle: str):
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ")
    assert needle in lines[0], lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("text, field", [x[1:] for x in BAD_INPUTS], ids=[x[0] for x in BAD_INPUTS])
@pytest.mark.parametrize("command", [["check", "-"], ["metadata", "--json", "-"]])
def test_bad_input(command, text, field):
    _assert_one_line_error(invoke(command, text), field)


HEADER_ONLY = '{"num_sms": 132, "cc": [9, 0], "smem_optin": 232448}\n'


def test_device_header_without_calls_check():
    _assert_one_line_error(invoke(["check", "-"], HEADER_ONLY), "no call records")


def test_device_header_without_calls_metadata():
    _assert_one_line_error(invoke(["metadata", "--json", "-"], HEADER_ONLY), "no call records")


def test_bad_input_in_second_record_names_its_index():
    text = _bad() + "\n" + _bad(h_q="x") + "\n"
    _assert_one_line_error(invoke(["check", "-"], text), "calls[1].h_q")


@pytest.mark.parametrize("text, line", [
    ('{"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "topk": 128}\n{"kind": "sparse", "b": 2,,}\n', 2),
    ('{"kind": "sparse", "b": 2}\n{"kind": "sparse"}\n{"b": 3 "s_q": 1}\n', 3),
    ('[{"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "topk": 128},]', 1),
    ('{\n  "kind": "sparse",\n  "b": 2,\n  "s_q": 1,,\n  "h_q": 64\n}\n', 4),    # pretty-printed
])
def test_invalid_json_reports_the_line(text, line):
    r = invoke(["check", "-"], text)
    _assert_one_line_error(r, f":{line}:")
    assert "JSON" in r.stderr


def test_bad_gpu_option_and_missing_file(tmp_path):
    _assert_one_line_error(invoke(["check", "--gpu", "RTX-9999", "-"], _bad()), "gpu")
    _assert_one_line_error(invoke(["check", "--gpu", "num_sms=abc,cc=9.0,smem_optin=1", "-"], _bad()), "num_sms")
    _assert_one_line_error(invoke(["check", str(tmp_path / "nope.json")]), "no such file")
    _assert_one_line_error(invoke(["metadata", str(tmp_path)]), "directory")


def test_subprocess_bad_input_no_traceback_no_hang():
    """The installed entry point, in a child process with a timeout."""
    cases = [(_bad(b=10**9), "b"), ("{not json", "JSON"), (_bad(topk_length=[1, 2, 3]), "topk_length")]
    for text, needle in cases:
        proc = subprocess.run([sys.executable, "-m", "validate_batch.cli.main", "check", "-"], input=text,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
        assert "Traceback" not in proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and needle in lines[0]


# ------------------------------------------------------------------------------------------------
# --help shows real examples, and they run
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["metadata", "check", "rules", "explain"])
def test_help_shows_examples(command):
    r = invoke([command, "--help"])
    assert r.exit_code == 0
    assert "Example" in r.stdout
    assert f"validate-batch {command}" in r.stdout


def _docstring_examples() -> list[tuple[str, list[str], str | None]]:
    from validate_batch.cli.main import app as typer_app

    out = []
    for cmd in typer_app.registered_commands:
        doc = cmd.callback.__doc__ or ""
        for m in re.finditer(r"`echo '(\{.*?\})' \| validate-batch (\w+) -`", doc):
            out.append((f"{m.group(2)}-stdin", [m.group(2), "-"], m.group(1)))
        for m in re.finditer(r"`validate-batch (explain \w+|rules)`", doc):
            out.append((m.group(1), m.group(1).split(), None))
        for m in re.finditer(r"`validate-batch check --example ([\w-]+)`", doc):
            out.append((f"example-{m.group(1)}", ["check", "--example", m.group(1)], None))
        for m in re.finditer(r"`validate-batch (check --engine [^`]+)`", doc):      # quick batches from flags
            out.append((m.group(1), m.group(1).split(), None))
    return out


@pytest.mark.parametrize("name, args, stdin", _docstring_examples(), ids=lambda x: x if isinstance(x, str) else None)
def test_help_examples_run(name, args, stdin):
    r = invoke(args, stdin)
    assert r.exit_code in (0, 1), (args, r.stderr)
    assert r.stdout.strip()


def test_help_examples_were_found():
    names = [x[0] for x in _docstring_examples()]
    assert "metadata-stdin" in names and "check-stdin" in names and "rules" in names
    assert sum(n.startswith("check --engine") for n in names) >= 4


def test_version_says_which_implementation_runs(monkeypatch):
    from validate_batch import _accel

    r = invoke(["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("validate-batch ")
    assert _accel.status() in r.stdout
    monkeypatch.setattr(_accel, "compiled", None)
    monkeypatch.setattr(_accel, "reason", "turned off for this test")
    assert "pure Python (turned off for this test)" in invoke(["--version"]).stdout
