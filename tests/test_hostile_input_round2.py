"""Hostile input, round two: the newer surfaces (metadata's two passes, corpus mode, vLLM steps, log
counts, CI output) end in a result or exit 2 with one line, and nothing the input holds reaches a
terminal or a CI log as a control sequence or a workflow command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import validate_batch
from validate_batch.errors import InputError
from validate_batch.inputs.streaming import CallRecords
from hostile_cli import TIME_BOUND_S, refused as _refused
from hostile_cli import cli as _cli

SPARSE = "kind: sparse\nb: {b}\ns_q: 1\nh_q: 64\nd_qk: 576\ntopk: 64\n"
CALL = {"kind": "sparse", "b": 1, "s_q": 1, "h_q": 64, "d_qk": 576, "topk": 64}


# ------------------------------------------------------------------ crashes
TAGGED = ["!!bool 1", "!!int ''", "!!timestamp 1", "!!float x"]


@pytest.mark.parametrize("value", TAGGED)
@pytest.mark.parametrize("command", [["check"], ["metadata"], ["map", "--x", "b", "--y", "s_q"]])
def test_yaml_tag_with_an_odd_scalar_is_bad_input(tmp_path, value, command):
    p = tmp_path / "a.yaml"
    p.write_text(SPARSE.format(b=value))
    r, took = _cli([command[0], p, *command[1:]])
    _refused(r, took, "YAML")


def test_one_odd_yaml_file_does_not_abort_the_corpus(tmp_path):
    (tmp_path / "a.yaml").write_text(SPARSE.format(b="!!bool 1"))
    (tmp_path / "b.json").write_text(json.dumps(CALL))
    r, _ = _cli(["check", tmp_path])
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert "2 file(s): 1 legal, 0 illegal, 1 bad input" in r.stdout
    assert "internal error" not in r.stderr


def _records(tmp_path, n=3):
    p = tmp_path / "calls.jsonl"
    p.write_text("".join(json.dumps({**CALL, "b": i + 1}) + "\n" for i in range(n)))
    return p


@pytest.mark.parametrize("change", ["edit", "append", "truncate"])
def test_metadata_second_pass_reads_what_the_first_pass_checked(tmp_path, change):
    p = _records(tmp_path)
    recs = CallRecords(str(p), None, None)
    assert recs.streamed
    if change == "edit":
        p.write_text(p.read_text().replace('"b": 2', '"b": "x"'))
    elif change == "append":
        with open(p, "a") as fh:
            fh.write('{"kind": "sparse", "b": "x"}\n')
    else:
        with open(p, "r+") as fh:
            fh.truncate(10)
    assert [pl.call.b for pl in recs.plans()] == [1, 2, 3]


def _sparse_sep_doc(reqs):
    # fp8 cache and 32 heads per rank (128 / tp 4): vLLM runs decodes and prefills as separate calls
    return {"engine": "vllm-flashmla-sparse", "forward_mode": "extend",
            "server_args": {"kv_cache_dtype": "fp8_ds_mla", "tp_size": 4}, "requests": reqs}


def test_vllm_sparse_step_with_a_zero_token_request_is_bad_input(tmp_path):
    reqs = [{"id": "a", "extend_tokens": 0, "prefix_len": 5}, {"id": "b", "extend_tokens": 300}]
    p = tmp_path / "a.json"
    p.write_text(json.dumps(_sparse_sep_doc(reqs)))
    _refused(*_cli(["check", p]), "extend_tokens")
    guard = validate_batch.Checker("vllm-flashmla-sparse", "H200", {"kv_cache_dtype": "fp8_ds_mla", "tp_size": 4})
    with pytest.raises(InputError):
        guard.verdict("extend", extend_lens=[0, 300], prefix_lens=[5, 0], seq_lens=[5, 300])
    with pytest.raises(InputError):
        validate_batch.check(_sparse_sep_doc(reqs))
    # one token each is a step vLLM schedules: a result, not an error
    ok = _sparse_sep_doc([{"id": "a", "extend_tokens": 1, "prefix_len": 5}, {"id": "b", "extend_tokens": 300}])
    assert validate_batch.check(ok).legal in (True, False)


@pytest.mark.parametrize("field", ["#new-seq", "#cached-token", "#running-req"])
def test_log_counts_past_one_forward_are_refused(tmp_path, field):
    vals = {"#new-seq": 1, "#new-token": 10, "#cached-token": 0, "#running-req": 0, "#queue-req": 0}
    vals[field] = 99999999999
    line = ("[2025-01-01 00:00:00 DP0 TP0] Prefill batch. " + ", ".join(f"{k}: {v}" for k, v in vals.items())
            .replace("#running-req", "token usage: 0.00, #running-req"))
    p = tmp_path / "x.log"
    p.write_text(line + "\n")
    _refused(*_cli(["bisect", p]), ":1:")


def test_log_counts_at_the_request_limit_are_read():
    from validate_batch.facts.fields import MAX_REQUESTS
    from validate_batch.ingest.sglang_log import parse_batch_line

    head = "[2025-01-01 00:00:00 DP0 TP0] Prefill batch. #new-seq: {n}, #new-token: 10, #cached-token: 0, " \
           "token usage: 0.00, #running-req: 0, #queue-req: 0"
    for n in (MAX_REQUESTS - 1, MAX_REQUESTS):
        assert parse_batch_line(head.format(n=n), 1).num("new_seq") == n
    with pytest.raises(InputError):
        parse_batch_line(head.format(n=MAX_REQUESTS + 1), 1)


def test_a_file_name_that_is_not_utf8_under_a_strict_stdout(tmp_path):
    d = tmp_path.as_posix().encode() + b"/c"
    os.makedirs(d)
    with open(d + b"/\xff\xfe.json", "w") as fh:
        fh.write(json.dumps(CALL))
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8"}
    r = subprocess.run([sys.executable, "-m", "validate_batch.cli.main", "check", d.decode()], capture_output=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    assert b"internal error" not in r.stderr and b"1 legal" in r.stdout


# ------------------------------------------------------------------ output injection
def _bad_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.lstrip().startswith("::") or "##[" in ln or "\x1b" in ln
            or "\x07" in ln or "\r" in ln]


HOSTILE = "x\n::error file=a::owned\n##[error]owned \x1b]0;title\x07 \x1b[2J\r"


@pytest.mark.parametrize("fmt", ["text", "json", "jsonl", "junit", "sarif"])
def test_a_label_holds_no_command_or_escape_in_any_format(tmp_path, fmt):
    doc = {"engine": "sglang-dsv4", "forward_mode": "extend", "label": HOSTILE,
           "requests": [{"id": HOSTILE, "extend_tokens": 10}]}
    p = tmp_path / "a.json"
    p.write_text(json.dumps(doc))
    r, _ = _cli(["check", p, "--output-format", fmt])
    assert r.exit_code in (0, 1), (r.stdout[-500:], r.stderr[-500:])
    assert _bad_lines(r.stdout) == [] and _bad_lines(r.stderr) == []
    if fmt == "text":
        assert "owned" in r.stdout or "owned" not in HOSTILE


def test_github_format_keeps_its_own_commands_only(tmp_path):
    doc = {"engine": "sglang-dsv4", "forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": 10}],
           HOSTILE: 1}
    p = tmp_path / "a.json"
    p.write_text(json.dumps(doc))
    r, _ = _cli(["check", p, "--output-format", "github"])
    assert r.exit_code == 2
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert lines and all(ln.startswith(("::error file=", "::warning file=")) for ln in lines), r.stdout
    assert "##[" not in r.stdout and "\x1b" not in r.stdout


def test_an_error_line_holds_no_command_or_escape(tmp_path):
    doc = {"engine": "sglang-dsv4", "forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": 10}],
           HOSTILE: 1}
    p = tmp_path / "a.json"
    p.write_text(json.dumps(doc))
    r, _ = _cli(["check", p])
    assert r.exit_code == 2
    assert _bad_lines(r.stderr) == [] and len(r.stderr.strip().splitlines()) == 1


def test_corpus_file_names_hold_no_escape(tmp_path, monkeypatch):
    (tmp_path / "\x1b[2J##[error]x.json").write_text(json.dumps(CALL))
    monkeypatch.chdir(tmp_path)
    r, _ = _cli(["check", "."])
    assert r.exit_code == 0, r.stderr
    assert _bad_lines(r.stdout) == [] and "1 legal" in r.stdout and "\\x1b" in r.stdout


# ------------------------------------------------------------------ hangs
def _recognised(text):
    from validate_batch.ingest.recognisers import RECOGNISERS, Recognised

    return Recognised("host_assert", {}, RECOGNISERS[0], text)


@pytest.mark.parametrize("line", [
    "Assertion '" * 10 ** 6,
    "Assertion `" * 10 ** 6,
    "Assertion '" * 10 ** 6 + "failed",
])
def test_assertion_text_is_linear_in_the_line(line):
    from validate_batch.ingest.recognisers import assertion_text

    t0 = time.monotonic()
    got = assertion_text(_recognised(line))
    assert time.monotonic() - t0 < 2.0
    assert got == (line.strip() if line.endswith("failed") else None)


@pytest.mark.parametrize("text,want", [
    ("x.cu:10: f: Assertion `a < b' failed.", "Assertion `a < b' failed."),
    ("RuntimeError: Assertion `s_q == 1` failed (host.h:57): bad", "Assertion `s_q == 1` failed (host.h:57): bad"),
    ("Assertion 'x' passed\nthen Assertion `y` failed here", "Assertion `y` failed here"),
    ("failed before: Assertion `x`", None),
    ("no assertion here failed", None),
])
def test_assertion_text_quotes_from_the_keyword_to_the_end_of_its_line(text, want):
    from validate_batch.ingest.recognisers import assertion_text

    assert assertion_text(_recognised(text)) == want


def test_map_requests_axis_stops_at_one_forward():
    from validate_batch.facts.fields import MAX_REQUESTS

    r, took = _cli(["map", "--engine", "sglang-dsv4", "--x", "requests", "--y", "draft_tokens", "--x-max", 16777216])
    _refused(r, took, "--x-max")
    assert str(MAX_REQUESTS) in r.stderr and "requests is absurd" not in r.stderr


@pytest.mark.parametrize("x_max", [7, 8, 9])
def test_map_requests_work_is_bounded(monkeypatch, x_max):
    import validate_batch.legality.maps as maps

    monkeypatch.setattr(maps, "MAX_MAP_REQUEST_ROWS", 64)     # 8 rows (draft tokens 1..8) of x_max requests
    r, took = _cli(["map", "--engine", "sglang-dsv4", "--x", "requests", "--y", "draft_tokens", "--x-max", x_max])
    if x_max * 8 <= 64:
        assert r.exit_code == 0, r.stderr
        assert f"1..{x_max}" in r.stdout
    else:
        _refused(r, took, "--x-max")


def test_map_of_an_empty_document_is_bad_input():
    _refused(*_cli(["map", "-"], stdin="{}"), "engine")


def test_a_long_yaml_list_is_refused_in_bounded_time(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("kind: dense\nb: 1\ns_q: 1\nh_q: 64\nd_qk: 576\nseqlens:\n" + "- 1\n" * 1_000_000)
    _refused(*_check_file_cli(p), "YAML")


def _check_file_cli(p):
    return _cli(["check", p])


@pytest.mark.parametrize("n", [98, 99, 100])
def test_yaml_values_limit(monkeypatch, n):
    from validate_batch.facts import limits
    from validate_batch.inputs.documents import parse_documents

    monkeypatch.setattr(limits, "MAX_YAML_NODES", 100)
    text = "- 1\n" * n                       # one list and n values: n + 1 nodes
    if n + 1 <= 100:
        assert parse_documents(text) == [1] * n
    else:
        with pytest.raises(InputError, match="more than 100 values in a YAML document"):
            parse_documents(text)


@pytest.mark.parametrize("text,value", [("b: 012000", None), ("b: 1:20", None), ("b: -017", None),
                                        ("b: 12000", 12000), ("b: '012000'", "012000"), ("b: 0", 0),
                                        ("b: 0x10", 16), ("b: 1.5", 1.5)])
def test_yaml_11_octal_and_base_60_are_refused(text, value):
    from validate_batch.inputs.documents import parse_documents

    if value is None:
        with pytest.raises(InputError, match="octal or base-60"):
            parse_documents(text)
    else:
        assert parse_documents(text) == [{"b": value}]


# ------------------------------------------------------------------ fail open
@pytest.mark.parametrize("name,text", [
    ("a.json", '{"kind": "sparse", "b": 1, "b": 99999, "s_q": 1, "h_q": 64, "d_qk": 576, "topk": 64}'),
    ("a.jsonl", json.dumps(CALL) + '\n{"kind": "sparse", "b": 1, "b": 2, "s_q": 1, "h_q": 64, "d_qk": 576, "topk": 64}\n'),
    ("a.yaml", SPARSE.format(b=1) + "b: 99999\n"),
    ("b.yaml", "engine: sglang-dsv4\nforward_mode: extend\nrequests:\n- {id: a, extend_tokens: 1, extend_tokens: 999999}\n"),
])
def test_a_key_given_twice_is_bad_input(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    _refused(*_cli(["check", p]), "twice")


def test_keys_once_per_mapping_are_read():
    from validate_batch.inputs.documents import parse_documents

    assert parse_documents("a: {x: 1}\nb: {x: 2}\nc: [{x: 3}, {x: 4}]") == [
        {"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 3}, {"x": 4}]}]
    assert parse_documents('{"a": {"x": 1}, "b": {"x": 2}}') == [{"a": {"x": 1}, "b": {"x": 2}}]


@pytest.mark.parametrize("call", [
    lambda g: g.verdict(None), lambda g: g.check(None), lambda g: g.assert_legal(None), lambda g: g.full_legal(None),
])
def test_none_is_no_step(call):
    with pytest.raises(InputError) as e:
        call(validate_batch.Checker(engine="sglang-dsv4"))
    assert e.value.field == "step"


def test_an_idle_step_is_still_legal():
    g = validate_batch.Checker(engine="sglang-dsv4")
    assert g.verdict("idle") and g.full_legal("idle") and g.check("idle").legal


def test_the_fixture_does_not_pass_none():
    from validate_batch.pytest_plugin import BatchValidator

    with pytest.raises(InputError):
        BatchValidator(engine="sglang-dsv4").assert_legal(None)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_wait_on_a_memo_lock_held_by_a_parent_thread():
    import threading

    guard = validate_batch.Checker(engine="sglang-dsv4")
    memo = guard.schedule_memo
    held, release = threading.Event(), threading.Event()

    def hold():
        with memo._lock:              # a thread in the middle of a lookup when the process forks
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:                      # the child: one lookup, then out
        try:
            memo.get(("x",))
            memo.put(("x",), 1)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 10
        done = 0
        while time.monotonic() < deadline and not done:
            done, _ = os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)
        if not done:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert done, "the child blocked on the memo's lock"
    finally:
        release.set()
        t.join()


@pytest.mark.parametrize("cc,ok", [("-1.0", False), ("0.0", False), ("0.9", False), ("1.0", True), ("9.0", True),
                                   ("9.9", True), ("9.10", False), ("99.0", True), ("100.0", False)])
def test_gpu_compute_capability_range(cc, ok):
    r, took = _cli(["check", "--gpu", f"num_sms=132,cc={cc},smem_optin=232448", "--engine", "sglang-dsv4",
                    "--extend", "10"])
    if ok:
        assert r.exit_code in (0, 1), r.stderr
    else:
        _refused(r, took, "cc")


@pytest.mark.parametrize("flags", [["--env", "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=0"], ["--server-arg", "tp_size=8"],
                                   ["--extend", "10"], ["--decode", "3"], ["--mode", "decode"], ["--seq-len", "5"],
                                   ["--prefix", "1"], ["--slots", "1"]])
def test_quick_batch_flags_with_a_file_are_bad_input(tmp_path, flags):
    p = tmp_path / "a.json"
    p.write_text(json.dumps(CALL))
    _refused(*_cli(["check", p, *flags]), flags[0])
    _refused(*_cli(["check", tmp_path, *flags]), flags[0])
    _refused(*_cli(["check", "--example", "dsv4-prefill-3x4096", *flags]), flags[0])


def test_a_file_without_quick_flags_is_checked(tmp_path):
    p = tmp_path / "a.json"
    p.write_text(json.dumps(CALL))
    r, _ = _cli(["check", p])
    assert r.exit_code in (0, 1), r.stderr


def test_corpus_notes_what_it_does_not_read(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "good.json").write_text(json.dumps(CALL))
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(CALL))
    (d / "out.json").symlink_to(outside)
    (d / "inside.json").symlink_to(d / "good.json")
    (d / "dangling.json").symlink_to(tmp_path / "missing.json")
    os.mkfifo(d / "fifo.json")
    r, took = _cli(["check", d])
    assert took < TIME_BOUND_S
    assert r.exit_code == 0, r.stderr
    assert "2 file(s): 2 legal" in r.stdout                # good.json and inside.json
    for name, why in (("out.json", "out of the directory"), ("dangling.json", "dangling"),
                      ("fifo.json", "not a regular file")):
        assert any(name in ln and why in ln for ln in r.stderr.splitlines()), (name, r.stderr)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_corpus_notes_an_unreadable_directory(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(CALL))
    sub = tmp_path / "locked"
    sub.mkdir()
    sub.chmod(0)
    try:
        r, _ = _cli(["check", tmp_path, "--recursive"])
    finally:
        sub.chmod(0o755)
    assert "locked" in r.stderr and "cannot be read" in r.stderr


@pytest.mark.parametrize("mode", ["decode", "target_verify"])
@pytest.mark.parametrize("reqs,bad", [
    ([{"id": "a", "extend_tokens": 10}], 0),                                       # the column reader's shape
    ([{"id": "a", "seq_len": 10}, {"id": "b", "extend_tokens": 5, "seq_len": 9}], 1),  # entry by entry
    ([{"id": "a", "seq_len": 10}], None),
])
def test_new_tokens_in_a_decode_forward_are_bad_input(mode, reqs, bad):
    doc = {"engine": "sglang-dsv4", "forward_mode": mode, "requests": reqs,
           "server_args": {"speculative_num_draft_tokens": 2}}
    if bad is None:
        assert validate_batch.check(doc).legal in (True, False)
    else:
        with pytest.raises(InputError) as e:
            validate_batch.check(doc)
        assert e.value.field == f"requests[{bad}].extend_tokens"


@pytest.mark.parametrize("value,ok", [(2 ** 31 - 2, True), (2 ** 31 - 1, True), (2 ** 31, False)])
@pytest.mark.parametrize("field", ["seq_len", "prefix_len"])
def test_batch_lengths_stop_at_int32_as_call_records_do(field, value, ok):
    req = {"id": "a", "seq_len": value} if field == "seq_len" else {"id": "a", "extend_tokens": 1, "prefix_len": value}
    doc = {"engine": "sglang-dsv4", "forward_mode": "decode" if field == "seq_len" else "extend", "requests": [req]}
    from validate_batch.inputs.batch import batch_from_dict

    if ok:
        batch_from_dict(doc)
    else:
        with pytest.raises(InputError) as e:
            batch_from_dict(doc)
        assert field in e.value.field


def test_safe_stream_sees_a_line_start_across_writes():
    import io

    from validate_batch.output.safe import SafeStream

    buf = io.StringIO()
    s = SafeStream(buf)
    for piece in ("ok ", "::not a line start\n", "  ", None, "::error x\n", "##", "[error] y\n"):
        if piece is None:
            s.flush()
        else:
            s.write(piece)
    s.flush()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "ok ::not a line start"
    assert lines[1] == "  \\::error x" and lines[2] == "##\\[error] y"


@pytest.mark.parametrize("args,needle", [
    (["check", "--engine", "sglang-dsv4", "--mode", "decode", "--decode", "nan"], "--decode"),
    (["check", "--no-such-option"], "--no-such-option"),
    (["no-such-command"], "no-such-command"),
])
def test_usage_errors_are_one_line(args, needle):
    r = subprocess.run([sys.executable, "-m", "validate_batch.cli.main", *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


def test_help_and_results_keep_their_exit_codes():
    def run(*a):
        return subprocess.run([sys.executable, "-m", "validate_batch.cli.main", *a], capture_output=True, text=True,
                              timeout=120)

    assert run("check", "--help").returncode == 0
    assert run("check", "--engine", "sglang-dsv4", "--extend", "10", "-q").returncode == 0
    assert run("check", "--example", "dsv4-prefill-3x4096", "-q").returncode == 1
