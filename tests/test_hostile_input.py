"""Hostile input: every case ends in exit 2 with one short stderr line, quickly, without a traceback."""
from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import time

import pytest

pytest.importorskip("hypothesis")     # the test extra: without it these tests are skipped, not an error

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from validate_batch.inputs import documents as inputs
from validate_batch.cli.main import app
from validate_batch.errors import InputError
from hostile_cli import FUZZ_EXAMPLES, TIME_BOUND_S, refused
from hostile_cli import cli as _cli

BIG = "9" * 5000


def _refused(r, took, needle=None):
    refused(r, took, needle, max_chars=400)


def _check_file(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text) if isinstance(text, str) else p.write_bytes(text)
    return _cli(["check", p])


def _bisect_log(tmp_path, text, name="x.log"):
    p = tmp_path / name
    p.write_text(text) if isinstance(text, str) else p.write_bytes(text)
    return _cli(["bisect", p])


# ------------------------------------------------------------------ 1. long integers
@pytest.mark.parametrize("name,text", [
    ("a.json", '{"kind":"sparse","b":1' + BIG + "}"),
    ("a.yaml", "kind: sparse\nb: 1" + BIG + "\n"),
    ("hex.yaml", "kind: sparse\nb: 0x" + "f" * 5000 + "\n"),
])
def test_document_integer_over_the_digit_limit(tmp_path, name, text):
    _refused(*_check_file(tmp_path, name, text), "digits")


@pytest.mark.parametrize("line", [
    "[2025-01-01 00:00:00 DP0 TP0] Prefill batch. #new-seq: 1, #new-token: " + BIG + ", #cached-token: 0, "
    "token usage: 0.00, #running-req: 0, #queue-req: 0",
    "RuntimeError: index " + BIG + " is out of bounds for dimension 0 with size 3",
    "CUDA error (/src/flash_fwd.cu:" + BIG + "): an illegal memory access was encountered",
    "chunked prefill size is adjusted to " + BIG,
    "max_num_seqs=" + BIG,
])
def test_log_integer_over_the_digit_limit(tmp_path, line):
    _refused(*_bisect_log(tmp_path, line + "\n"), ":1:")


def test_server_arg_and_version_over_the_digit_limit(tmp_path):
    _refused(*_cli(["check", "--engine", "sglang-dsv4", "--extend", "10", "--server-arg", "k=" + BIG]), "--server-arg")
    log = tmp_path / "x.log"
    log.write_text("[2025-01-01 00:00:00 DP0 TP0] Decode batch. #running-req: 1, #token: 10, token usage: 0.00\n")
    _refused(*_cli(["bisect", log, "--sglang-version", "0." + BIG]), "--sglang-version")


def test_context_length_far_beyond_int64(tmp_path):
    doc = {"engine": "sglang-dsv4", "forward_mode": "extend", "server_args": {"context_length": 10 ** 25},
           "requests": [{"id": "a", "extend_tokens": 10}]}
    _refused(*_check_file(tmp_path, "a.json", json.dumps(doc)))


# ------------------------------------------------------------------ 2. nesting
@pytest.mark.parametrize("name,text", [
    ("deep.json", "[" * 1000 + "]" * 1000),
    ("deep.yaml", "a: " + "[" * 1000 + "]" * 1000 + "\n"),
    ("deeper.json", '{"kind":"sparse","b":' + "[" * 100_000 + "]" * 100_000 + "}"),
])
def test_deep_documents(tmp_path, name, text):
    _refused(*_check_file(tmp_path, name, text), "nested deeper")


def _dump_cli(tmp_path, data):
    p = tmp_path / "dump.pkl"
    p.write_bytes(data)
    return _cli(["bisect", "--dump", p])


def test_crash_dump_that_contains_itself(tmp_path):
    s: list = []
    s.append(s)
    _refused(*_dump_cli(tmp_path, pickle.dumps({"requests": s}, protocol=2)), "contains itself")


def test_crash_dump_nested_100k_levels(tmp_path):
    n = 100_000   # EMPTY_LIST n times, APPEND n-1 times: [[[...]]] without recursion here
    _refused(*_dump_cli(tmp_path, b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."), "nested deeper")


# ------------------------------------------------------------------ 3. expansion bombs
def _alias_bomb(levels=9, width=9) -> str:
    lines = ["a0: &a0 [" + ",".join(["x"] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join("  " + ln for ln in lines)


def test_yaml_alias_bomb_in_a_label(tmp_path):
    text = "engine: sglang-dsv4\nlabel:\n" + _alias_bomb() + "\n"
    assert len(text) < 1000
    _refused(*_check_file(tmp_path, "bomb.yaml", text), "aliases")


def test_crash_dump_of_shared_references(tmp_path):
    x: list = [1]
    for _ in range(24):
        x = [x, x]
    data = pickle.dumps({"requests": x}, protocol=2)
    assert len(data) < 300
    _refused(*_dump_cli(tmp_path, data), "values")


def test_crash_dump_of_many_reductions_over_one_shared_list(tmp_path):
    # 20,000 REDUCEs of one pickled class, each over the same 2,000-entry list (a 124 KB file)
    b = bytearray(b"\x80\x02csglang.srt.managers.schedule_batch\nReq\nq\x00]q\x01(")
    for i in range(2000):
        b += b"K" + bytes([i % 256])
    b += b"e]("
    b += b"h\x00h\x01\x85R" * 20000
    b += b"e."
    assert len(b) < 130_000
    _refused(*_dump_cli(tmp_path, bytes(b)), "values")


def test_gzip_decompression_bomb(tmp_path):
    data = gzip.compress(b"\n" * 20_000_000)
    assert len(data) < 25_000
    _refused(*_bisect_log(tmp_path, data, "x.log.gz"), "gzip")


# ------------------------------------------------------------------ 4. sizes before allocation
@pytest.mark.parametrize("args", [
    ["--extend", "99999999999999x1"],
    ["--extend", "100000000x1"],
    ["--mode", "decode", "--decode", "100000000"],
])
def test_quick_counts_refused_before_lists_are_built(args):
    _refused(*_cli(["check", "--engine", "sglang-dsv4", *args]), "requests")


def test_read_text_stops_at_its_byte_budget():
    t0 = time.monotonic()
    with pytest.raises(InputError, match="larger than 4096 bytes"):
        inputs.read_text("/dev/zero", limit=4096)
    assert time.monotonic() - t0 < TIME_BOUND_S


def test_bisect_of_a_device():
    _refused(*_cli(["bisect", "/dev/zero"]))


def test_bisect_of_a_fifo_without_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _refused(*_cli(["bisect", fifo]), "writer")


def test_bisect_reads_a_pipe_without_seeking(tmp_path):
    log = "[2025-01-01 00:00:00 DP0 TP0] Decode batch. #running-req: 1, #token: 10, token usage: 0.00\n"
    r_fd, w_fd = os.pipe()
    os.write(w_fd, log.encode())
    os.close(w_fd)
    try:
        r = subprocess.run([sys.executable, "-m", "validate_batch.cli.main", "bisect", f"/dev/fd/{r_fd}"], pass_fds=(r_fd,),
                           capture_output=True, text=True, timeout=60)
    finally:
        os.close(r_fd)
    assert r.returncode in (0, 1, 2), r.stderr
    assert "Traceback" not in r.stderr and "seek" not in r.stderr
    assert "internal error" not in r.stderr


def test_carriage_returns_keep_line_numbers(tmp_path):
    text = "a\rb\r\nRuntimeError: index " + BIG + " is out of bounds for dimension 0 with size 3\n"
    r, took = _cli(["bisect", "-"], stdin=text)
    _refused(r, took, ":2:")


# ------------------------------------------------------------------ 5. smaller
def test_lone_surrogate_in_a_request_id(tmp_path):
    text = '{"engine":"sglang-dsv4","forward_mode":"extend","requests":[{"id":"\\ud800","extend_tokens":10}]}'
    _refused(*_check_file(tmp_path, "a.json", text), "surrogate")


def test_long_example_name():
    _refused(*_cli(["check", "--example", "a" * 300]), "--example")


def test_yaml_reader_error_is_one_line(tmp_path):
    _refused(*_check_file(tmp_path, "a.yaml", b"a: \x00\x01\n"), "YAML")


def test_echoed_values_are_capped(tmp_path):
    doc = {"engine": "sglang-dsv4", "forward_mode": "extend", "requests": [{"id": "x" * 100_000, "extend_tokens": -1}]}
    r, took = _check_file(tmp_path, "a.json", json.dumps(doc))
    _refused(r, took)
    assert "x" * 100 not in r.stderr


def test_yaml_flow_document_is_read_as_yaml():
    assert inputs.parse_documents("{kind: sparse, b: 3}") == [{"kind": "sparse", "b": 3}]


# ------------------------------------------------------------------ 6. fuzz
_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                     st.floats(allow_nan=False), st.text(max_size=20))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                       max_leaves=20)
_keys = st.sampled_from(["engine", "forward_mode", "requests", "running", "server_args", "gpu", "kind", "b", "s_q",
                         "h_q", "topk", "label", "id", "extend_tokens", "seq_len", "prefix_len", "req_pool_idx"])
_docs = st.dictionaries(_keys, _values, max_size=8)


def _ok(r):
    assert r.exit_code in (0, 1, 2), (r.exit_code, r.stderr[-500:], r.exception)
    if r.exit_code == 2:
        assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr[:500]


@settings(derandomize=True, max_examples=FUZZ_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(doc=_docs, as_yaml=st.booleans())
def test_fuzz_documents(doc, as_yaml):
    import yaml

    text = yaml.safe_dump(doc) if as_yaml else json.dumps(doc)
    _ok(CliRunner().invoke(app, ["check", "-"], input=text))


_log_words = st.sampled_from(["Prefill batch.", "Decode batch.", "#new-token:", "#running-req:", "#token:", ",",
                              "token usage:", "index", "is out of bounds for dimension", "with size", "CUDA error",
                              "(/x/a.cu:", "):", "chunked prefill size is adjusted to", "max_num_seqs=",
                              "[2025-01-01 00:00:00 DP0 TP0]", "SchedulerOutput(", ")", "ServerArgs(", "=",
                              "Traceback", "\r", "\x1b[0m"])
_log_lines = st.lists(st.lists(st.one_of(_log_words, st.integers(-5, 10 ** 30).map(str), st.text(max_size=5)),
                               max_size=12).map(" ".join), min_size=1, max_size=8)


@settings(derandomize=True, max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=_log_lines)
def test_fuzz_log_lines(lines):
    _ok(CliRunner().invoke(app, ["bisect", "-"], input="\n".join(lines) + "\n"))


def test_an_unbalanced_vllm_dump_is_scanned_once():
    # a dump whose brackets never close: every line used to re-scan the whole buffer (quadratic)
    from validate_batch.ingest.scan import scan_lines

    lines = ["Dumping scheduler output:", "SchedulerOutput(scheduled_new_reqs=["] + ["((( " + "x" * 40] * 10000
    t0 = time.monotonic()
    scan_lines(lines, "dump.log")
    assert time.monotonic() - t0 < 2.0
