"""Hostile input, round three: memory of large call records, the time of a log line at its request
limit, settings no rule reads, and sparse-prefill calls on a GPU or with a shape the kernel lacks."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time

import pytest

from validate_batch.errors import InputError
from validate_batch.inputs import documents
from hostile_cli import FUZZ_EXAMPLES, TIME_BOUND_S, refused as _refused
from hostile_cli import cli as _cli


# ------------------------------------------------------------------ a large dense record's memory
def _dense_record(b: int, width: int) -> str:
    table = [[(i * width + j) % 1000 for j in range(width)] for i in range(b)]
    return json.dumps({"kind": "dense", "b": b, "s_q": 1, "h_q": 64, "d_qk": 576, "seqlens": [64 * width] * b,
                       "block_table": table, "num_blocks": 1000}) + "\n"


# (VmHWM, not ru_maxrss: the latter can start at the forking parent's size)
_PEAK = textwrap.dedent("""
    import sys
    from validate_batch.cli.session import check_documents
    def status_kib(key):
        with open("/proc/self/status") as fh:
            return next(int(ln.split()[1]) for ln in fh if ln.startswith(key + ":"))
    check_documents(sys.argv[1], None, None)        # a small record first: every module is loaded
    before = status_kib("VmRSS")
    report, _ = check_documents(sys.argv[2], None, None)
    print(before, status_kib("VmHWM"), report.legal)
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
@pytest.mark.parametrize("record", [
    # 16 K rows of 160 pages: 2.6 M values in about 12 MB of text. As Python lists (an int and a slot
    # of about 36 bytes for 4 to 5 characters) this peaked near 15 times the file; read as arrays it
    # is the text and the int64 values, twice while the block table is stacked
    lambda: _dense_record(16384, 160),
    # one list of 1.5 M lengths (12 MB): its one regex match kept a record per value (28 times the file)
    lambda: json.dumps({"kind": "dense", "b": 1_500_000, "s_q": 1, "h_q": 64, "d_qk": 576,
                        "seqlens": [1234567] * 1_500_000}) + "\n",
])
def test_a_large_dense_record_takes_a_small_multiple_of_its_size(tmp_path, record):
    p = tmp_path / "dense.json"
    p.write_text(record())
    small = tmp_path / "small.json"
    small.write_text(_dense_record(4, 2))
    size_kib = p.stat().st_size // 1024
    r = subprocess.run([sys.executable, "-c", _PEAK, str(small), str(p)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    before, peak, legal = r.stdout.split()
    grown = int(peak) - int(before)
    assert legal == "False"                  # 16384 rows are past every SM90 build's scheduler limit
    assert grown < 6 * size_kib, (grown, size_kib)


def _lifted(text: str):
    arrays: dict = {}
    out, long_digits = documents._lift_int_lists(text, arrays)
    return out, arrays, long_digits


def _plain(doc):
    """``doc`` with every array as the list it was written as."""
    if isinstance(doc, dict):
        return {k: _plain(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_plain(v) for v in doc]
    return doc.tolist() if hasattr(doc, "tolist") else doc


def _both(text: str, monkeypatch):
    plain = documents.parse_documents(text)
    monkeypatch.setattr(documents, "MIN_ARRAY_TEXT", 0)
    lifted = documents.parse_documents(text)
    return plain, lifted


LONG = list(range(-40, 40))


@pytest.mark.parametrize("text", [
    json.dumps({"seqlens": LONG}),                                           # json.dumps's ", "
    json.dumps({"seqlens": LONG}, separators=(",", ":")),                    # compact
    json.dumps({"seqlens": LONG}, indent=2),                                 # one value a line
    json.dumps({"t": [LONG, LONG[::-1], [0] * 40]}),                         # a table of rows
    json.dumps({"a": {"b": [{"c": LONG}]}, "s": str(LONG)}),                 # a list inside a string stays text
    json.dumps([{"x": LONG}, {"x": LONG}]),                                  # a list of records
    json.dumps(LONG),                                                        # a whole document that is a list
    json.dumps({"v": [2 ** 62] * 8 + [-(2 ** 62)] * 8, "w": [10 ** 17] * 8}),  # 18 and 19 digit values
])
def test_integer_lists_read_as_arrays_hold_the_values_written(text, monkeypatch):
    plain, lifted = _both(text, monkeypatch)
    doc = json.loads(text)
    assert _plain(lifted) == plain == (doc if isinstance(doc, list) else [doc])
    if isinstance(doc, list) and all(type(v) is int for v in doc):
        assert type(lifted) is list and all(type(v) is int for v in lifted)


@pytest.mark.parametrize("body,lifted", [
    (", ".join(["7"] * 40), True),
    (", ".join(["-0"] * 40), True),                       # -0 is JSON
    (", ".join(["1"] * 39 + ["1.5"]), False),             # a float: a list for the JSON reader
    (", ".join(["1"] * 39 + ["1e3"]), False),
    (", ".join(["1"] * 39 + ["9" * 19]), False),          # past 18 digits: the JSON reader (and its digit limit)
    (", ".join(["1"] * 39 + ["9" * 18]), True),
])
def test_only_exact_integer_lists_are_read_as_arrays(body, lifted):
    text = '{"x": [' + body + "]}"
    _, arrays, _ = _lifted(text)
    assert bool(arrays) is lifted
    if lifted:
        assert next(iter(arrays.values())).tolist() == json.loads(text)["x"]


@pytest.mark.parametrize("text", [
    '{"x": [' + ", ".join(["01"] * 40) + "]}",           # a leading zero is not JSON
    '{"x": [' + ", ".join(["1"] * 40) + ",]}",           # nor a trailing comma
    '{"x": [' + " ".join(["1"] * 40) + "]}",             # nor numbers without commas
    '{"x": [' + ", ".join(["1"] * 40) + "] \n "          # a document that never closes
    + '"y": [' + ", ".join(["2"] * 40) + "]}",
    '{"x" [' + ", ".join(["1"] * 40) + "]}",             # an error right at a list
    '{"x": [' + ", ".join(["1"] * 40) + '], \n\n  "y": }',
])
def test_a_json_error_reads_the_same_with_lists_read_as_arrays(text, monkeypatch):
    with pytest.raises(InputError) as plain:
        documents.parse_documents(text)
    monkeypatch.setattr(documents, "MIN_ARRAY_TEXT", 0)
    with pytest.raises(InputError) as lifted:
        documents.parse_documents(text)
    assert lifted.value.message == plain.value.message


def test_a_long_digit_run_outside_the_lists_is_still_refused(monkeypatch):
    monkeypatch.setattr(documents, "MIN_ARRAY_TEXT", 0)
    text = '{"x": [' + ", ".join(["1"] * 40) + '], "b": ' + "9" * 1001 + "}"
    with pytest.raises(InputError, match="1001 digits"):
        documents.parse_documents(text)


def test_strings_with_unclosed_quotes_are_scanned_in_linear_time():
    # every quote of a text without closing quotes used to be able to start a scan to the end
    text = '{"a": "' + '\\"' * 500_000 + "\n" + '"' * 200_000
    t0 = time.monotonic()
    _lifted(text)
    assert time.monotonic() - t0 < 2.0


def test_a_lifted_list_counts_as_its_values(monkeypatch):
    from validate_batch.facts import limits

    text = json.dumps({"x": [5] * 50, "t": [[1] * 40] * 3})
    plain = limits.check_tree(documents._parse_documents(text, "x"), "FILE")
    monkeypatch.setattr(documents, "MIN_ARRAY_TEXT", 0)
    lifted = documents._parse_documents(text, "x")
    assert limits.check_tree(lifted, "FILE") == plain == 1 + 1 + 2 + 51 + 1 + 3 * 41
    with pytest.raises(InputError):
        limits.check_tree(lifted, "FILE", max_nodes=plain - 1)


def _fuzz_value(rng: random.Random, depth: int = 0):
    pick = rng.random()
    if depth > 3 or pick < 0.3:
        return rng.choice([None, True, False, 0, -1, 17, 2 ** 40, 1.5, "s", "[1, 2]", "\\", '"'])
    if pick < 0.55:   # a long list of integers, maybe with one value the arrays do not take
        n = rng.randrange(10, 60)
        vals = [rng.randrange(-10 ** rng.randrange(1, 19), 10 ** rng.randrange(1, 19)) for _ in range(n)]
        if rng.random() < 0.2:
            vals[rng.randrange(n)] = rng.choice([1.25, "x", None, 10 ** 19, [1]])
        return vals
    if pick < 0.8:
        return [_fuzz_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": _fuzz_value(rng, depth + 1) for i in range(rng.randrange(4))}


@pytest.mark.parametrize("seed", range(FUZZ_EXAMPLES))
def test_fuzz_lists_read_as_arrays(seed, monkeypatch):
    rng = random.Random(seed)
    doc = {"d": _fuzz_value(rng)}
    opts = rng.choice([{}, {"indent": 1}, {"separators": (",", ":")}])
    text = json.dumps(doc, **opts)
    plain, lifted = _both(text, monkeypatch)
    assert _plain(lifted) == plain == [doc]


# ------------------------------------------------------------------ a log line at the request limit
def _log_at_the_limit(n: int) -> str:
    return (f"[2025-01-01 00:00:00 DP0 TP0] Prefill batch. #new-seq: 1, #new-token: 10, #cached-token: 0, "
            f"token usage: 0.00, #running-req: {n}, #queue-req: 0\n"
            f"[2025-01-01 00:00:01 DP0 TP0] Decode batch. #running-req: {n}, #token: 100, token usage: 0.00, "
            f"gen throughput (token/s): 1.0, #queue-req: 0\n")


@pytest.mark.parametrize("delta", [-1, 0])
def test_a_log_at_the_running_request_limit_is_bisected_without_a_request_object_each(monkeypatch, delta):
    # the boundary search tries about 50 steps, each with up to 65536 running decodes: read entry by
    # entry that was 1.8 M request objects (15 s); as columns it is a few passes per step
    from validate_batch.facts.fields import MAX_REQUESTS
    from validate_batch.inputs import batch

    made = []
    real = batch.parse_request
    monkeypatch.setattr(batch, "parse_request", lambda *a: made.append(1) or real(*a))
    r, took = _cli(["bisect", "-"], stdin=_log_at_the_limit(MAX_REQUESTS + delta))
    assert r.exit_code == 0, (r.stdout[-500:], r.stderr[-500:])
    assert f"illegal at {MAX_REQUESTS + delta} batch size" in r.stdout
    assert len(made) < 1000, len(made)
    assert took < TIME_BOUND_S, took


def test_a_log_past_the_running_request_limit_is_refused():
    from validate_batch.facts.fields import MAX_REQUESTS

    _refused(*_cli(["bisect", "-"], stdin=_log_at_the_limit(MAX_REQUESTS + 1)), ":1:")


@pytest.mark.parametrize("n,ok", [(2 ** 20 - 1, True), (2 ** 20, True), (2 ** 20 + 1, False)])
def test_running_requests_of_a_batch_document_stop_at_the_request_limit(n, ok, monkeypatch):
    from validate_batch.facts import fields
    from validate_batch.inputs import batch
    from validate_batch.inputs.batch import batch_from_dict

    # the limit scaled down (the same check), so the list stays small
    monkeypatch.setattr(batch, "MAX_REQUESTS", 64)
    n = 64 + (n - 2 ** 20)
    doc = {"engine": "sglang-dsv4", "forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": 1}],
           "running": [{"id": f"d{i}", "seq_len": 10} for i in range(n)]}
    if ok:
        b = batch_from_dict(doc)
        assert len(b.running) == n and [r.seq_len for r in b.running] == [10] * n
        assert all(r.is_decode for r in b.running)
    else:
        with pytest.raises(InputError) as e:
            batch_from_dict(doc)
        assert e.value.field == "running"
    assert fields.MAX_REQUESTS == 2 ** 20


@pytest.mark.parametrize("running", [
    [{"id": "d1", "seq_len": 10}, {"id": "d2", "seq_len": 20}],                           # columns
    [{"id": "d1", "seq_len": 10}, {"id": "d2", "seq_len": 20, "req_pool_idx": 3}],        # entry by entry
    [{"id": "d1", "extend_tokens": 4}, {"id": "d2", "extend_tokens": 5}],                 # columns, extend shape
    [{"id": "d1", "seq_len": 10, "dp_rank": 1}],
])
def test_running_requests_read_as_columns_are_the_requests_read_one_by_one(running):
    from validate_batch.inputs.batch import batch_from_dict, parse_request

    doc = {"engine": "sglang-dsv4", "forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": 1}],
           "running": running}
    want = tuple(parse_request(r, f"running[{i}]", True, i) for i, r in enumerate(running))
    assert tuple(batch_from_dict(doc).running) == want


# ------------------------------------------------------------------ settings held to the engine's values
# (SGLang 0.5.23: the parallel widths are ints of default 1, srt/arg_groups/fields/parallel.py:45-104;
# disaggregation_mode is Literal["null", "prefill", "decode"], fields/disagg.py:55-58)
_BASE = {"engine": "sglang-dsv4", "forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": 10}]}
POSITIVE = ["tp_size", "dp_size", "attn_dp_size", "attn_cp_size", "max_running_requests", "page_size",
            "max_prefill_tokens", "context_length"]


@pytest.mark.parametrize("key", POSITIVE)
@pytest.mark.parametrize("value,ok", [(0, False), (1, True), (2, True)])
def test_a_count_or_width_of_zero_is_bad_input(key, value, ok):
    from validate_batch.api import check

    doc = {**_BASE, "server_args": {key: value}}
    if ok:
        assert check(doc).legal in (True, False)
    else:
        with pytest.raises(InputError) as e:
            check(doc)
        assert e.value.field == f"server_args.{key}" and "expected >= 1, got 0" in e.value.message


@pytest.mark.parametrize("alias,key", [("tensor_parallel_size", "tp_size"), ("max_model_len", "context_length")])
def test_a_vllm_name_is_held_to_the_same_values(alias, key):
    _refused(*_cli(["check", "--engine", "vllm-flashmla-sparse", "--extend", "10", "--server-arg", f"{alias}=0"]),
             f"server_args.{key}")


@pytest.mark.parametrize("value,ok", [("null", True), ("prefill", True), ("decode", True), (None, True),
                                      ("bogus", False), ("Decode", False), ("", False)])
def test_disaggregation_mode_is_one_of_the_engine_roles(value, ok):
    from validate_batch.api import check

    doc = {**_BASE, "server_args": {"disaggregation_mode": value}}
    if ok:
        assert check(doc).legal in (True, False)
    else:
        with pytest.raises(InputError) as e:
            check(doc)
        assert e.value.field == "server_args.disaggregation_mode"


@pytest.mark.parametrize("name,value,ok", [
    ("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", [1], False),
    ("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", {"a": 1}, False),
    ("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", 1.0, False),
    ("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", 2, False),
    ("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", "maybe", False),
    ("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", "0", True),
    ("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", "YES", True),        # EnvBool reads it case-insensitively
    ("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", 1, True),
    ("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", False, True),
    ("SGLANG_DSV4_KV_LAYOUT", 1, False),
    ("SGLANG_DSV4_KV_LAYOUT", ["v4"], False),
    ("SGLANG_DSV4_KV_LAYOUT", "v41", True),
])
def test_an_environment_switch_holds_text_or_its_boolean(name, value, ok):
    from validate_batch.api import check

    doc = {**_BASE, "env": {name: value}}
    if ok:
        assert check(doc).legal in (True, False)
    else:
        with pytest.raises(InputError) as e:
            check(doc)
        assert e.value.field == f"env.{name}"


def test_settings_are_held_on_every_way_in():
    import validate_batch

    _refused(*_cli(["check", "--engine", "sglang-dsv4", "--extend", "10", "--server-arg", "tp_size=0"]),
             "server_args.tp_size")
    _refused(*_cli(["check", "--engine", "sglang-dsv4", "--extend", "10", "--server-arg", "disaggregation_mode=bogus"]),
             "server_args.disaggregation_mode")
    _refused(*_cli(["check", "-"], stdin=json.dumps({**_BASE, "env": {"SGLANG_OPT_FLASHMLA_SPARSE_PREFILL": [1]}})),
             "env.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL")
    with pytest.raises(InputError) as e:
        validate_batch.Checker("sglang-dsv4", "H200", {"max_running_requests": 0})
    assert e.value.field == "server_args.max_running_requests"


def test_a_launch_command_with_a_width_of_zero_leaves_the_setting_unknown():
    from validate_batch.bisect.docs import server_args
    from validate_batch.ingest.launch import EngineConfig, parse_launch

    cfg = EngineConfig()
    cfg.update(parse_launch("python -m sglang.launch_server --tp 0 --max-running-requests 8"), "launch")
    sa = server_args(cfg)
    assert "tp_size" not in sa and sa["max_running_requests"] == 8


# ------------------------------------------------------------------ sparse prefill: heads and architecture
# FlashMLA 9241ae3 csrc/api/sparse_fwd.h: the entry refuses any GPU but SM90a / SM100f (lines 113-115)
# and any h_q but 64 or 128 (lines 192-197); the H200 ran h_q 64 and 128 (oracle sparse prefill probes)
def _prefill_codes(h_q, gpu="H200", d_qk=512):
    from validate_batch.api import check

    rec = {"kind": "prefill", "s_q": 128, "h_q": h_q, "d_qk": d_qk, "topk": 512}
    return {f.code for f in check(rec, gpu=gpu, kernel="flashmla-9241ae3").findings if f.is_error}


@pytest.mark.parametrize("h_q,ok", [(3, False), (63, False), (64, True), (65, False), (127, False), (128, True),
                                    (129, False)])
def test_sparse_prefill_takes_the_heads_its_kernel_is_built_for(h_q, ok):
    assert _prefill_codes(h_q) == (set() if ok else {"FMLA023"})
    assert _prefill_codes(h_q, d_qk=576) == (set() if ok else {"FMLA023"})


@pytest.mark.parametrize("cc,ok", [("1.0", False), ("8.0", False), ("8.9", False), ("9.0", True), ("10.0", True),
                                   ("12.0", False)])
def test_sparse_prefill_runs_only_on_the_architectures_it_is_built_for(cc, ok):
    gpu = f"num_sms=132,cc={cc},smem_optin=232448"
    assert _prefill_codes(64, gpu=gpu) == (set() if ok else {"FMLA013"})


def test_the_recorded_sparse_prefill_probes_keep_their_verdicts(oracle_prefill_probes):
    from validate_batch.api import check

    for rec in oracle_prefill_probes:
        call = {k: rec[k] for k in ("kind", "s_q", "h_q", "d_qk", "topk")}
        assert check(call, gpu="H200", kernel="flashmla-9241ae3").legal is (rec["verdict"] == "legal"), rec


def test_a_three_head_sparse_prefill_is_illegal_from_the_command_line():
    r, _ = _cli(["check", "-"], stdin=json.dumps({"kind": "prefill", "s_q": 128, "h_q": 3, "d_qk": 576, "topk": 2048}))
    assert r.exit_code == 1 and "FMLA023" in r.stdout and "got 3" in r.stdout, (r.stdout, r.stderr)
    r, _ = _cli(["check", "-", "--gpu", "num_sms=108,cc=8.0,smem_optin=166912"],
                stdin=json.dumps({"kind": "prefill", "s_q": 128, "h_q": 64, "d_qk": 576, "topk": 2048}))
    assert r.exit_code == 1 and "FMLA013" in r.stdout, (r.stdout, r.stderr)


# ------------------------------------------------------------------ the four entry points agree
def _outcome(call):
    try:
        r = call()
    except InputError as e:
        return ("bad input", e.field)
    return ("legal", bool(r.legal if hasattr(r, "legal") else r))


@pytest.mark.parametrize("seed", range(FUZZ_EXAMPLES))
def test_fuzz_the_four_entry_points_agree_on_every_step(seed):
    import validate_batch

    rng = random.Random(seed)
    g = validate_batch.Checker(engine=rng.choice(["sglang-dsv4", "sglang-dsv4@pre-25418", "vllm-flashmla-sparse"]))
    mode = rng.choice(["extend", "decode", "mixed", "target_verify", "draft_extend", "idle", None, "bogus"])
    n = rng.choice([0, 1, 3, 200, 4000, 12000])
    kw = {}
    if rng.random() < 0.8:
        kw["extend_lens"] = [rng.choice([0, 1, 7, 4096, -1]) for _ in range(n)]
    if rng.random() < 0.8:
        kw["seq_lens"] = [rng.choice([1, 50, 2 ** 31, 0]) for _ in range(n)]
    if rng.random() < 0.3:
        kw["prefix_lens"] = [rng.choice([0, 5]) for _ in range(n)]

    def assert_legal():
        g.assert_legal(mode, **kw)
        return True

    got = {name: _outcome(lambda f=f: f(mode, **kw)) for name, f in
           (("verdict", g.verdict), ("check", g.check), ("full_legal", g.full_legal))}
    from validate_batch.errors import BatchIllegalError

    try:
        got["assert_legal"] = _outcome(assert_legal)
    except BatchIllegalError:
        got["assert_legal"] = ("legal", False)
    assert len(set(got.values())) == 1, (mode, n, sorted(kw), got)


@pytest.mark.parametrize("spec,ok", [("sglang-dsv4@", False), ("sglang-dsv4@ ", False), ("sglang-dsv4", True),
                                     ("sglang-dsv4@latest", True), ("sglang-dsv4@-1", False)])
def test_an_engine_with_an_empty_version_is_bad_input_on_every_command(spec, ok):
    import validate_batch

    r, took = _cli(["check", "--engine", spec, "--extend", "10", "-q"])
    if ok:
        assert r.exit_code == 0, r.stderr
        validate_batch.Checker(engine=spec)
    else:
        _refused(r, took, "engine")
        with pytest.raises(InputError):
            validate_batch.Checker(engine=spec)


@pytest.mark.parametrize("seed", range(FUZZ_EXAMPLES))
def test_fuzz_settings_and_switches_end_in_a_verdict_or_one_line(seed):
    from validate_batch.facts.names import BATCH_SETTINGS, ENV_SETTINGS

    rng = random.Random(seed)
    pool = [0, 1, -1, 2, 64, 2 ** 31, 2 ** 63, True, False, None, "", "0", "1", "null", "decode", "bogus", [1],
            {"a": 1}, 1.5, "fp8_ds_mla", "auto", "\x1b[2J::error::x"]
    keys = sorted(BATCH_SETTINGS)
    doc = {**_BASE, "server_args": {}, "env": {}}
    for _ in range(rng.randrange(1, 4)):
        k = rng.choice(keys)
        (doc["env"] if k in ENV_SETTINGS and rng.random() < 0.5 else doc["server_args"])[k] = rng.choice(pool)
    r, took = _cli(["check", "-"], stdin=json.dumps(doc))
    assert r.exit_code in (0, 1, 2), (doc, r.exit_code, r.stderr[-500:], r.exception)
    assert took < TIME_BOUND_S
    if r.exit_code == 2:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "\x1b" not in lines[0], (doc, r.stderr)


def test_a_map_of_a_record_whose_lists_were_read_as_arrays_is_the_same_map(tmp_path, monkeypatch):
    p = tmp_path / "dense.json"
    p.write_text(json.dumps({"kind": "dense", "b": 40, "s_q": 1, "h_q": 64, "d_qk": 576,
                             "seqlens": [100 + i for i in range(40)]}))
    args = ["map", p, "--x", "b", "--y", "s_q", "--x-max", "64", "--y-max", "4"]
    plain, _ = _cli(args)
    monkeypatch.setattr(documents, "MIN_ARRAY_TEXT", 0)
    lifted, _ = _cli(args)
    assert plain.exit_code == 0, plain.stderr
    assert lifted.exit_code == 0 and lifted.stdout == plain.stdout, lifted.stderr


@pytest.mark.parametrize("value,ok", [(-2, False), (-1, True), (0, True), (1, True)])
def test_chunked_prefill_off_is_a_setting_the_engine_takes(value, ok):
    # SGLang 0.5.23 srt/arg_groups/fields/schedule.py:52-55: -1 disables chunked prefill
    from validate_batch.api import check

    doc = {**_BASE, "requests": [{"id": "a", "extend_tokens": 20000}], "server_args": {"chunked_prefill_size": value}}
    if ok:
        r = check(doc)
        assert r.legal in (True, False)
    else:
        with pytest.raises(InputError) as e:
            check(doc)
        assert e.value.field == "server_args.chunked_prefill_size" and "expected >= -1" in e.value.message


def test_chunked_prefill_off_checks_the_forward_whole():
    from validate_batch.api import check

    big = {**_BASE, "engine": "sglang-dsv4@pre-25418", "requests": [{"id": "a", "extend_tokens": 20000}]}
    off = check({**big, "server_args": {"chunked_prefill_size": -1}})
    unset = check(big)
    on = check({**big, "server_args": {"chunked_prefill_size": 8192}})
    # off and unset: one forward of 20000 rows, past the 11622 rows of 9241ae3's scheduler
    assert not off.legal and not unset.legal and on.legal


def test_the_knowledge_files_say_each_key_once():
    # json keeps the last of two equal keys silently: a fact written twice loses one of its halves
    from pathlib import Path

    def once(pairs):
        keys = [k for k, _ in pairs]
        assert len(set(keys)) == len(keys), sorted({k for k in keys if keys.count(k) > 1})
        return dict(pairs)

    files = sorted((Path(__file__).resolve().parents[1] / "rules").rglob("*.json"))
    assert files
    for f in files:
        json.loads(f.read_text(encoding="utf-8"), object_pairs_hook=once)
