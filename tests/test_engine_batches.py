"""Engine batches end to end: the two seed crashes, routing, slots, and the safe split.

Ground truth is first-principles arithmetic written here: FlashMLA's scheduler needs 4*(5b+1)
bytes of shared memory and an H200 grants 232448, so the largest legal b is (232448 - 4) // 20.
"""
from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

import validate_batch
from validate_batch.cli.main import app
from validate_batch.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "batches"
H200_SMEM = 232448
LIMIT = (H200_SMEM - 4) // 20          # 11622
ROUTING_THRESHOLD = 11673              # SGLang's threshold (floor((228*1024/4 - 1)/5))
runner = CliRunner()


def cli_json(*args):
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def codes(d):
    return {f["code"] for f in d["findings"] if f["severity"] == "error"}


def test_limit_arithmetic_matches_the_facts():
    assert 4 * (5 * LIMIT + 1) <= H200_SMEM < 4 * (5 * (LIMIT + 1) + 1)
    assert LIMIT == 11622


# ------------------------------------------------------------------ seed crash 1 (DSv4 prefill)
def test_seed_dsv4_3x4096_is_illegal_and_splits_in_two():
    rc, d = cli_json("check", "--example", "dsv4-prefill-3x4096")
    assert rc == 1 and d["legal"] is False
    assert {"FMLA001", "SGL001"} <= codes(d)
    f = next(f for f in d["findings"] if f["code"] == "FMLA001")
    assert f["numbers"]["b"] == 3 * 4096
    assert f["numbers"]["smem_bytes"] == 4 * (5 * 3 * 4096 + 1)
    assert f["numbers"]["max_b"] == LIMIT
    assert d["query_rows"] == 3 * 4096
    assert len(d["kernel_calls"]) == 3 and all(c["call"]["b"] == 12288 for c in d["kernel_calls"])
    sp = d["safe_split"]
    assert sp["possible"] and sp["num_steps"] == math.ceil(3 * 4096 / LIMIT) == 2
    assert sp["steps"] == [["p1", "p2"], ["p3"]]
    assert sp["naive_guard"]["steps"] == 3 and sp["naive_guard"]["crashes"] is False


def test_seed_dsv4_1x4096_is_legal():
    rc, d = cli_json("check", str(FIX / "dsv4-1x4096.yaml"))
    assert rc == 0 and d["legal"] is True and d["query_rows"] == 4096
    assert "safe_split" not in d


def test_seed_dsv4_mixed_chunking_adds_the_running_decode():
    rc, d = cli_json("check", str(FIX / "dsv4-3x4096-mixed.yaml"))
    assert rc == 1 and d["query_rows"] == 3 * 4096 + 1
    f = next(f for f in d["findings"] if f["code"] == "FMLA001")
    assert f["numbers"]["b"] == 12289
    steps = d["safe_split"]["steps"]
    assert len(steps) == 2
    for st in steps:  # the running decode joins every step: 4096 per prompt + 1
        assert 4096 * len(st) + 1 <= LIMIT


def test_single_12000_prompt_crashes_even_under_the_naive_guard_but_chunks():
    rc, d = cli_json("check", str(FIX / "dsv4-1x12000.json"))
    assert rc == 1 and "FMLA001" in codes(d)
    sp = d["safe_split"]
    assert sp["naive_guard"]["crashes"] is True and sp["naive_guard"]["illegal_steps"] == ["long"]
    assert sp["steps"] is None and "chunking" in sp["unchunked_reason"]
    chunks = sp["chunked_steps"]
    assert len(chunks) == math.ceil(12000 / LIMIT) == 2
    assert sum(c["tokens"] for st in chunks for c in st) == 12000
    assert all(sum(c["tokens"] for c in st) <= LIMIT for st in chunks)
    starts = [c["start"] for st in chunks for c in st]
    assert starts == sorted(starts) and starts[0] == 0


def test_routing_gap_still_reaches_the_decode_kernel():
    rc, d = cli_json("check", str(FIX / "dsv4-routing-gap-11640.yaml"))
    assert rc == 1
    assert d["query_rows"] == 8192 + 3448 == 11640 and LIMIT < 11640 <= ROUTING_THRESHOLD
    assert {"FMLA001", "SGL001"} <= codes(d)
    sgl = next(f for f in d["findings"] if f["code"] == "SGL001")
    assert sgl["numbers"]["threshold"] == ROUTING_THRESHOLD and sgl["numbers"]["max_rows"] == LIMIT
    assert d["safe_split"]["num_steps"] == 2


def test_large_prefill_is_routed_to_sparse_prefill_when_the_version_has_routing():
    rc, d = cli_json("check", str(FIX / "dsv4-routed-12288.yaml"))
    assert rc == 0 and d["legal"] is True
    assert d["routing"]["routed"] is True
    assert {c["kernel"] for c in d["kernel_calls"]} == {"flash_mla_sparse_fwd"}


@pytest.mark.parametrize("rows,legal", [(LIMIT - 1, True), (LIMIT, True), (LIMIT + 1, False)])
def test_decode_forward_rows_at_the_limit(rows, legal):
    doc = {"engine": "sglang-dsv4@post-25418", "kernel_build": "flashmla-9241ae3", "gpu": "H200", "forward_mode": "decode",
           "requests": [{"id": f"r{i}", "seq_len": 100 + i} for i in range(rows)]}
    rep = validate_batch.check(doc)
    assert rep.legal is legal
    if not legal:
        assert {"FMLA001", "SGL001"} <= set(rep.codes)


@pytest.mark.parametrize("bs,draft", [(2905, 4), (2906, 4), (1452, 8), (1453, 8)])
def test_target_verify_rows_are_batch_times_draft_tokens_and_never_routed(bs, draft):
    doc = {"engine": "sglang-dsv4@post-25418", "kernel_build": "flashmla-9241ae3", "gpu": "H200", "forward_mode": "target_verify",
           "server_args": {"speculative_num_draft_tokens": draft},
           "requests": [{"id": f"r{i}", "seq_len": 500} for i in range(bs)]}
    rep = validate_batch.check(doc)
    assert rep.context["query_rows"] == bs * draft
    assert rep.legal is (bs * draft <= LIMIT)
    assert rep.context["routing"]["routed"] is False


@pytest.mark.parametrize("rows", [ROUTING_THRESHOLD, ROUTING_THRESHOLD + 1])
def test_routing_threshold_edges(rows):
    doc = {"engine": "sglang-dsv4@post-25418", "kernel_build": "flashmla-9241ae3", "gpu": "H200", "forward_mode": "extend",
           "requests": [{"id": "p", "extend_tokens": rows}]}
    rep = validate_batch.check(doc)
    assert rep.legal is (rows > ROUTING_THRESHOLD)


def test_version_numbers_map_to_routing_behaviour():
    base = {"gpu": "H200", "forward_mode": "extend", "requests": [{"id": "p", "extend_tokens": 12288}]}
    assert validate_batch.check({**base, "engine": "sglang-dsv4@0.5.10"}).legal is False
    assert validate_batch.check({**base, "engine": "sglang-dsv4@0.5.23"}).legal is True


def test_other_gpu_profiles_change_the_limit():
    # B200 has the same opt-in shared memory, so the same limit; a raw profile with half of it halves it.
    half = {"num_sms": 132, "cc": [9, 0], "smem_optin": H200_SMEM // 2}
    lim = (H200_SMEM // 2 - 4) // 20
    doc = {"engine": "sglang-dsv4@pre-25418", "forward_mode": "extend",
           "requests": [{"id": "p", "extend_tokens": lim + 1}]}
    assert validate_batch.check({**doc, "gpu": "B200"}).legal is True
    assert validate_batch.check({**doc, "gpu": half}).legal is False
    assert validate_batch.check({**doc, "gpu": half, "requests": [{"id": "p", "extend_tokens": lim}]}).legal is True


# ------------------------------------------------------------------ seed crash 2 (PD decode slots)
def test_seed_pd_decode_slot_96_against_33_rows():
    rc, d = cli_json("check", "--example", "pd-decode-slot-96")
    assert rc == 1
    R, E = 32, 64
    assert d["slots"]["table_rows"] == R + E + 1
    f = next(f for f in d["findings"] if f["code"] == "SLOT002")
    assert f["numbers"]["slot"] == 96 and f["numbers"]["buffer_rows"] == R + 1
    assert "index 96 is out of bounds for dimension 0 with size 33" in f["message"]
    assert d["safe_split"]["possible"] is False
    assert "no split" in d["safe_split"]["reason"]


def test_seed_pd_decode_with_tails_sized_from_the_table_is_legal():
    rc, d = cli_json("check", str(FIX / "pd-decode-slot-96-fixed.yaml"))
    assert rc == 0 and d["legal"] is True
    draft = next(b for b in d["slots"]["buffers"] if b["owner"] == "draft")
    assert draft["rows"] == (32 + 64 + 1) + 1


@pytest.mark.parametrize("r_total,dp,dp_attn,expect_e", [(32, 1, False, 64), (16, 1, False, 32), (48, 1, False, 0),
                                                          (64, 2, True, 64), (128, 2, True, 0)])
def test_default_extra_slots(r_total, dp, dp_attn, expect_e):
    doc = {"engine": "sglang-slots@post-fix", "forward_mode": "decode",
           "server_args": {"max_running_requests": r_total, "dp_size": dp, "enable_dp_attention": dp_attn,
                           "disaggregation_mode": "decode"},
           "requests": [{"id": "a", "seq_len": 10, "req_pool_idx": 1}]}
    rep = validate_batch.check(doc)
    R = r_total // (dp if dp_attn else 1)
    assert rep.context["slots"]["extra_slots"] == expect_e
    assert rep.context["slots"]["table_rows"] == R + expect_e + 1


@pytest.mark.parametrize("slot,ok", [(31, True), (32, True), (33, False)])
def test_draft_tail_rows_at_the_limit(slot, ok):
    # pre-fix draft tails have R + 1 = 33 rows: slots 0..32 fit, 33 does not (but 33 is a live slot).
    doc = {"engine": "sglang-slots@pre-fix", "forward_mode": "draft_extend",
           "server_args": {"max_running_requests": 32, "disaggregation_mode": "decode",
                           "disaggregation_decode_extra_slots": 64, "speculative_num_draft_tokens": 4},
           "requests": [{"id": "a", "seq_len": 10, "req_pool_idx": slot}]}
    rep = validate_batch.check(doc)
    assert ("SLOT002" in {f.code for f in rep.errors}) is (not ok)


@pytest.mark.parametrize("slot,ok", [(96, True), (97, False)])
def test_slot_beyond_the_table(slot, ok):
    doc = {"engine": "sglang-slots@post-fix", "forward_mode": "decode",
           "server_args": {"max_running_requests": 32, "disaggregation_mode": "decode",
                           "disaggregation_decode_extra_slots": 64},
           "requests": [{"id": "a", "seq_len": 10, "req_pool_idx": slot}]}
    rep = validate_batch.check(doc)
    assert ("SLOT001" in {f.code for f in rep.errors}) is (not ok)


def test_per_dp_buffer_indexed_by_global_slot():
    doc = {"engine": "sglang-slots", "forward_mode": "decode",
           "server_args": {"max_running_requests": 64, "dp_size": 2, "enable_dp_attention": False},
           "buffers": [{"name": "mamba slot mapping", "rows_from": "running_limit_total", "plus": 0, "indexed_by": "global_slot"},
                       {"name": "mamba per-DP mapping", "rows": 32, "indexed_by": "global_slot"}],
           "requests": [{"id": "a", "seq_len": 10, "req_pool_idx": 32}]}
    rep = validate_batch.check(doc)
    f = [f for f in rep.errors if f.code == "SLOT004"]
    assert len(f) == 1 and f[0].numbers["buffer_rows"] == 32 and f[0].numbers["slot"] == 32


def test_tail_width_must_cover_draft_tokens():
    doc = {"engine": "sglang-slots", "forward_mode": "decode", "model": {"index_kpool": 64, "tail_extra_slots": 0},
           "server_args": {"max_running_requests": 8, "speculative_num_draft_tokens": 4},
           "requests": [{"id": "a", "seq_len": 10, "req_pool_idx": 1}]}
    rep = validate_batch.check(doc)
    f = [f for f in rep.errors if f.code == "SLOT003"]
    assert f and f[0].numbers["required_width"] == 64 + 4 and f[0].numbers["width"] == 64


def test_reproduction_with_torch_shows_pytorch_error_text():
    pytest.importorskip("torch")
    res = runner.invoke(app, ["check", "--example", "pd-decode-slot-96", "--reproduce", "--json"])
    d = json.loads(res.stdout)
    rep = [r for r in d["reproduction"] if r.get("available")]
    assert rep and rep[0]["error"] == "index 96 is out of bounds for dimension 0 with size 33"
    assert rep[0]["shape"][0] == 33


# ------------------------------------------------------------------ the split is minimal
def _brute_min_steps(tokens, legal):
    n = len(tokens)
    best = None
    for k in range(1, n + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = (0, *cuts, n)
            if all(legal(sum(tokens[a:b])) for a, b in zip(bounds, bounds[1:])):
                return k
    return best


@pytest.mark.parametrize("seed", range(40))
def test_split_is_minimal_against_brute_force(seed):
    rng = random.Random(seed)
    smem = 4 + 20 * 100  # a custom GPU whose scheduler takes at most 100 rows
    L = (smem - 4) // 20
    n = rng.randint(1, 7)
    tokens = [rng.randint(1, 120) for _ in range(n)]
    doc = {"engine": "sglang-dsv4@pre-25418", "gpu": {"num_sms": 132, "cc": [9, 0], "smem_optin": smem},
           "forward_mode": "extend", "requests": [{"id": f"r{i}", "extend_tokens": t} for i, t in enumerate(tokens)]}
    rep = validate_batch.check(doc)
    assert rep.legal is (sum(tokens) <= L)
    if rep.legal:
        return
    expected = _brute_min_steps(tokens, lambda rows: rows <= L)
    sp = rep.safe_split
    if expected is None:
        assert sp.steps is None
    else:
        assert sp.num_steps == expected
        assert [i for st in sp.steps for i in st] == [f"r{i}" for i in range(n)]
        for st in sp.steps:  # every step is legal when checked on its own
            sub = {**doc, "requests": [r for r in doc["requests"] if r["id"] in st]}
            assert validate_batch.check(sub).legal
    assert sp.num_chunked_steps == math.ceil(sum(tokens) / L)


def test_split_handles_the_non_monotone_routing_gap():
    # With routing, 11700 rows is legal (routed) but 11650 is not: a greedy "fill up" is not enough.
    doc = {"engine": "sglang-dsv4@post-25418", "kernel_build": "flashmla-9241ae3", "gpu": "H200", "forward_mode": "extend",
           "requests": [{"id": "a", "extend_tokens": 11000}, {"id": "b", "extend_tokens": 650},
                        {"id": "c", "extend_tokens": 50}]}
    rep = validate_batch.check(doc)
    assert rep.legal is True  # 11700 > 11673: routed
    doc["requests"][2]["extend_tokens"] = 0
    doc["requests"] = doc["requests"][:2]
    rep = validate_batch.check(doc)  # 11650: inside the gap
    assert rep.legal is False and rep.safe_split.num_steps == 2


# ------------------------------------------------------------------ bad batch input
@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.pop("engine"), "engine"),
    (lambda d: d.update(engine="sglang-nope"), "engine"),
    (lambda d: d.update(engine="sglang-dsv4@9.9.9x"), "engine"),
    (lambda d: d.update(forward_mode="sideways"), "forward_mode"),
    (lambda d: d.update(requests=[]), "requests"),
    (lambda d: d.update(requests=[{"id": "a", "extend_tokens": -1}]), "requests[0].extend_tokens"),
    (lambda d: d.update(requests=[{"id": "a", "extend_tokens": "4096"}]), "requests[0].extend_tokens"),
    (lambda d: d.update(requests=[{"id": "a", "extend_tokens": 10**9}]), "requests[0].extend_tokens"),
    (lambda d: d.update(requests=[{"id": "a", "extend_tokns": 1}]), "requests[0].extend_tokns"),
    (lambda d: d.update(requests=[{"id": "a", "extend_tokens": 1}, {"id": "a", "extend_tokens": 1}]), "requests"),
    (lambda d: d.update(server_args={"chunked_prefill_size": "big"}), "server_args.chunked_prefill_size"),
    (lambda d: d.update(gpu="A100-ish"), "gpu"),
    (lambda d: d.update(colour="red"), "colour"),
    (lambda d: d.update(model={"context_length": [1, 2]}), "model.context_length"),
    (lambda d: d.update(model={"heads": 64}), "model.heads"),
    (lambda d: d.update(buffers=[{"name": "x", "rows_from": [1]}]), "buffers[0].rows_from"),
    (lambda d: d.update(buffers=[{"name": "x", "rows": -3}]), "buffers[0].rows"),
    (lambda d: d.update(buffers=[{"rows": 3}]), "buffers[0]"),
])
def test_bad_batches_name_the_field(mutate, field):
    doc = {"engine": "sglang-dsv4", "gpu": "H200", "forward_mode": "extend",
           "requests": [{"id": "a", "extend_tokens": 10}]}
    mutate(doc)
    with pytest.raises(InputError) as ei:
        validate_batch.check(doc)
    assert ei.value.field == field


def test_bad_batch_on_the_cli_is_one_line_exit_2(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("engine: sglang-dsv4\nforward_mode: extend\nrequests:\n  - {id: a, extend_tokens: -5}\n")
    res = runner.invoke(app, ["check", str(p)])
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0 and "requests[0].extend_tokens" in res.stderr
    assert "Traceback" not in res.output


def test_verify_without_draft_tokens_is_an_input_error():
    doc = {"engine": "sglang-dsv4", "forward_mode": "target_verify", "requests": [{"id": "a", "seq_len": 5}]}
    with pytest.raises(InputError) as ei:
        validate_batch.check(doc)
    assert ei.value.field == "server_args.speculative_num_draft_tokens"


def test_assert_legal_raises_with_findings_and_split():
    doc = json.loads((FIX / "dsv4-1x12000.json").read_text())
    with pytest.raises(validate_batch.BatchIllegalError) as ei:
        validate_batch.assert_legal(doc)
    assert any(f.code == "FMLA001" for f in ei.value.findings)
    assert ei.value.safe_split.num_chunked_steps == 2


@pytest.mark.parametrize("seed", range(40))
def test_extend_row_breakdown_is_new_tokens_decode_entries_and_merged_decodes(seed):
    """An extend (or mixed) forward's rows, first principles: each extend request's new tokens, one
    row per decode entry among the requests, one per running decode merged into a mixed forward;
    with decode entries and without (every request extending)."""
    from validate_batch.engines.forward import forward_rows
    from validate_batch.inputs.batch import batch_from_dict

    rng = random.Random(seed)
    mixed = seed % 2 == 1
    reqs, want_ext, want_dec = [], 0, 0
    for i in range(rng.choice([1, 3, 40])):
        if seed % 4 < 2 and rng.random() < 0.3:
            reqs.append({"id": f"d{i}", "seq_len": rng.randint(1, 9000)})
            want_dec += 1
        else:
            t = rng.randint(1, 4000)
            reqs.append({"id": f"e{i}", "extend_tokens": t, "prefix_len": rng.randint(0, 9000)})
            want_ext += t
    running = [{"id": f"run{j}", "seq_len": 100 + j} for j in range(rng.choice([0, 2, 5]))]
    doc = {"engine": "sglang-dsv4@pre-25418", "gpu": "H200", "forward_mode": "mixed" if mixed else "extend",
           "server_args": {"enable_mixed_chunk": mixed}, "requests": reqs, "running": running}
    rows, bd = forward_rows(batch_from_dict(doc))
    merged = len(running) if mixed else 0
    assert bd == {"extend_tokens": want_ext, "decode_rows_in_forward": want_dec, "merged_running_decodes": merged}
    assert rows == want_ext + want_dec + merged
    assert all(type(v) is int for v in (rows, *bd.values()))
