"""``validate-batch metadata`` on JSON Lines reads its input twice instead of holding it.

The ground truth for the outputs is the whole-document reader, which every other input (a JSON
array, one object, YAML) still takes: the same records as a JSON array must give the same bytes on
stdout and stderr and the same exit code in every output format, for every oracle file (the oracle's
recorded schedules themselves are compared with ``metadata --json`` in tests/test_oracle.py, which
now runs on this path). Bad input anywhere gives exit 2, one line naming the field and nothing on
stdout, as it did when every record was validated before anything was written.
"""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validate_batch.facts import limits
from validate_batch.inputs import streaming
from validate_batch.cli.main import app
from validate_batch.errors import InputError
from validate_batch.inputs.documents import parse_documents, read_text
from validate_batch.inputs.streaming import CallRecords, open_input

ORACLE = Path(__file__).resolve().parent.parent / "fixtures" / "oracle"
FILES = sorted(ORACLE.glob("*.jsonl"))
WIDE = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
FLAGS = [
    [], ["--json"], ["-f", "jsonl"], ["-f", "json"], ["-f", "github"], ["-f", "junit"], ["-f", "sarif"], ["-q"],
    ["--statistics"], ["--statistics", "--json"], ["--select", "FMLA0", "--ignore", "FMLA01"], ["--reference", "--rows", "3"],
    ["--gpu", "H20"],
]


def invoke(args, stdin: str | None = None):
    r = CliRunner(env=WIDE).invoke(app, args, input=stdin)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"validate-batch {' '.join(args)} raised {r.exception!r}") from r.exception
    return r.exit_code, r.stdout, r.stderr


def as_array(jsonl: str) -> str:
    return json.dumps([json.loads(ln) for ln in jsonl.splitlines() if ln.strip()])


def records(n: int) -> list[str]:
    """``n`` call records: the oracle file's inputs (its recorded outputs left out), repeated."""
    skip = {"tile_scheduler_metadata", "num_splits"}
    lines = [json.dumps({k: v for k, v in json.loads(ln).items() if k not in skip})
             for ln in (ORACLE / "flashmla_h200_cases.jsonl").read_text().splitlines() if '"kind"' in ln]
    return [lines[i % len(lines)] for i in range(n)]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_oracle_files_take_the_streamed_path(path):
    if path.name == "sglfm_h200_probes.jsonl":   # records with an "op" field: a bad record, found by the first pass
        with pytest.raises(InputError, match=r"^calls\[0\]\.op: unknown field"):
            CallRecords(str(path), None, None)
        return
    r = CallRecords(str(path), None, None)
    assert r.streamed and r.docs is None
    n = sum(1 for ln in path.read_text().splitlines() if ln.strip())
    assert r.count + r.header == n
    assert len(list(r.plans())) == r.count


CASES = [(p, f) for p in FILES for f in (FLAGS if p.name == "flashmla_h200_cases.jsonl" else [[], ["--json"], ["-f", "github"]])]


@pytest.mark.parametrize("path, flags", CASES, ids=lambda x: x.name if isinstance(x, Path) else " ".join(x))
def test_streamed_file_matches_whole_document_path(tmp_path, path, flags):
    f = tmp_path / "calls"          # one name for both runs: it is part of the CI formats' output
    text = path.read_text()
    f.write_text(text)
    streamed = invoke(["metadata", *flags, str(f)])
    f.write_text(as_array(text))
    whole = invoke(["metadata", *flags, str(f)])
    assert streamed == whole
    assert streamed[0] in (0, 1, 2)


@pytest.mark.parametrize("flags", [["--json"], ["-f", "sarif"], []], ids=" ".join)
@pytest.mark.parametrize("path", FILES[:2], ids=lambda p: p.name)
def test_streamed_stdin_matches_whole_document_path(path, flags):
    text = path.read_text()
    streamed = invoke(["metadata", *flags, "-"], stdin=text)
    whole = invoke(["metadata", *flags, "-"], stdin=as_array(text))
    assert streamed == whole
    assert streamed[0] in (0, 1) and streamed[1]


def test_blank_lines_crlf_and_a_leading_device_header(tmp_path):
    text = "\n\n" + "\r\n".join([json.dumps({"num_sms": 78, "cc": [9, 0], "smem_optin": 232448})] + records(5)) + "\n\n"
    f = tmp_path / "c.jsonl"
    f.write_text(text)
    r = CallRecords(str(f), None, None)
    assert r.streamed and r.header and r.count == 5 and r.gpu.num_sms == 78
    streamed = invoke(["metadata", "--json", str(f)])
    f.write_text(as_array(text))
    assert invoke(["metadata", "--json", str(f)]) == streamed
    assert [json.loads(ln)["index"] for ln in streamed[1].splitlines()] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("text", [
    '{"kind": "dense", "b": 1, "s_q": 1, "h_q": 64, "seqlens": [5]}',                 # one record
    '[{"kind": "dense", "b": 1, "s_q": 1, "h_q": 64, "seqlens": [5]}]',               # an array
    '{"kind": "dense",\n "b": 1, "s_q": 1, "h_q": 64, "seqlens": [5]}',               # one object on two lines
    'kind: dense\nb: 1\ns_q: 1\nh_q: 64\nseqlens: [5]\n',                             # YAML
])
def test_other_inputs_are_read_whole(tmp_path, text):
    f = tmp_path / "c"
    f.write_text(text)
    r = CallRecords(str(f), None, None)
    assert not r.streamed
    assert r.docs == parse_documents(text, str(f))


# ---------------------------------------------------------------------------------- bad input
N_LATE = 5000


@pytest.fixture(scope="module")
def late_bad(tmp_path_factory):
    """5,000 good records, then one with h_q = 0 (h_q is 1..4096): the last record is bad."""
    lines = records(N_LATE - 1) + [json.dumps({"kind": "sparse", "b": 1, "s_q": 1, "h_q": 0, "topk": 64})]
    f = tmp_path_factory.mktemp("late") / "calls.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


@pytest.mark.parametrize("flags", [["--json"], [], ["-f", "junit"], ["-q"]], ids=" ".join)
def test_a_bad_record_late_in_a_large_input_writes_nothing(late_bad, flags):
    rc, out, err = invoke(["metadata", *flags, str(late_bad)])
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(f"error: calls[{N_LATE - 1}].h_q: ")
    if flags == ["-f", "junit"]:    # the CI formats: one bad-input unit for the file, no call of it
        assert out.count("<testcase ") == 1 and f"calls[{N_LATE - 1}].h_q" in out and " call 0" not in out
    else:
        assert out == ""


def test_a_bad_record_late_on_stdin_writes_nothing(late_bad):
    rc, out, err = invoke(["metadata", "--json", "-"], stdin=late_bad.read_text())
    assert (rc, out) == (2, "")
    assert err.startswith(f"error: calls[{N_LATE - 1}].h_q: ") and err.count("\n") == 1


def test_the_first_bad_record_is_named_and_a_later_bad_json_line_wins(tmp_path):
    good = records(300)
    bad_rec = json.dumps({"kind": "sparse", "b": 1, "s_q": 1, "h_q": 64, "topk": 64, "bogus": 1})
    lines = good[:10] + [bad_rec] + good[10:200] + [bad_rec.replace('"h_q": 64', '"h_q": 0')] + good[200:]
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(lines))
    rc, out, err = invoke(["metadata", "--json", str(f)])
    assert (rc, out) == (2, "") and err.startswith("error: calls[10].bogus: unknown field")
    # a line that is not JSON, after both: the whole-document reader's error (its line number), as before
    lines.insert(250, '{"kind": "sparse", "b": 1,')
    f.write_text("\n".join(lines))
    rc, out, err = invoke(["metadata", "--json", str(f)])
    with pytest.raises(InputError) as whole:
        parse_documents(f.read_text(), str(f))
    assert (rc, out) == (2, "")
    assert err == f"error: {whole.value}\n" and ":251: invalid JSON Lines record" in err


def test_a_device_header_error_beats_a_bad_record(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join([json.dumps({"num_sms": 0, "cc": [9, 0], "smem_optin": 232448}), records(1)[0],
                            json.dumps({"kind": "sparse", "b": 0, "s_q": 1, "h_q": 64, "topk": 64})]))
    streamed = invoke(["metadata", str(f)])
    assert streamed[0] == 2 and streamed[1] == "" and "device header" in streamed[2]
    f.write_text(as_array(f.read_text()))
    assert invoke(["metadata", str(f)]) == streamed


def test_a_limit_broken_late_is_the_whole_document_readers_error(tmp_path):
    """A string one character over :data:`limits.MAX_STRING_CHARS` in the last record (at the limit
    it is only an unknown label; the limit's own tests are in tests/test_hostile_input.py)."""
    f = tmp_path / "c.jsonl"
    for n, bad in ((limits.MAX_STRING_CHARS - 1, False), (limits.MAX_STRING_CHARS, False),
                   (limits.MAX_STRING_CHARS + 1, True)):
        f.write_text("\n".join(records(50) + [json.dumps({"kind": "sparse", "b": 1, "s_q": 1, "h_q": 64, "topk": 64,
                                                          "label": "x" * n})]))
        rc, out, err = invoke(["metadata", "--json", str(f)])
        if bad:
            assert (rc, out) == (2, "") and err.startswith(f"error: FILE: a string of {n} characters")
        else:
            assert rc in (0, 1) and len(out.splitlines()) == 51


# ---------------------------------------------------------------------------------- the byte budget
@pytest.mark.parametrize("extra, ok", [(-1, True), (0, True), (1, False)])
def test_the_byte_budget_on_a_file_and_on_stdin(tmp_path, monkeypatch, extra, ok):
    data = b"x" * (100 + extra)
    f = tmp_path / "c"
    f.write_bytes(data)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    for path, name in ((str(f), str(f)), ("-", "<stdin>")):
        if ok:
            fh, got = open_input(path, limit=100)
            with fh:
                assert got == name and fh.read() == data
        else:
            with pytest.raises(InputError, match=rf"^FILE: {name}: larger than 100 bytes"):
                open_input(path, limit=100)


def test_the_default_budget_is_the_document_limit():
    assert streaming.open_input.__defaults__ == (limits.MAX_DOCUMENT_BYTES,)


def test_missing_file_and_directory_say_what_the_whole_document_reader_says(tmp_path):
    for path in (tmp_path / "nope", tmp_path):
        with pytest.raises(InputError) as whole:
            read_text(str(path))
        assert invoke(["metadata", "--json", str(path)]) == (2, "", f"error: {whole.value}\n")


# ---------------------------------------------------------------------------------- memory
def _peak_bytes(path: Path) -> int:
    """Python-heap peak (tracemalloc) of both passes over ``path``, every plan's schedule computed."""
    import tracemalloc

    tracemalloc.start()
    try:
        r = CallRecords(str(path), None, None)
        for p in r.plans():
            p.schedule
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_does_not_grow_with_the_number_of_calls(tmp_path):
    """Eight times the records, about the same peak: the whole-document path held every record
    (each of these is about 2 KB of lists once parsed) before writing any."""
    rec = json.dumps({"kind": "sparse", "b": 64, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128,
                      "topk_length": list(range(1, 65))})
    peaks = []
    for n in (300, 2400):
        f = tmp_path / f"c{n}.jsonl"
        f.write_text("\n".join([rec] * n))
        peaks.append(_peak_bytes(f))
    assert peaks[1] < 1.5 * peaks[0], peaks
    assert peaks[1] < 2400 * 1000        # less than the 2,400 records would take held at once
