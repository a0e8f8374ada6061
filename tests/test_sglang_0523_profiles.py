"""SGLang 0.5.23 engine profiles: DeepSeek-V4 routing under SGLANG_OPT_FLASHMLA_SPARSE_PREFILL,
late-layer tails, the KV layout's kernel half, and the request slots after the tail fix with
``attn_dp_size`` (the engine's own schedule precompute, SGL003: test_sglang_precompute_releases.py).

Ground truth is arithmetic written here from the facts (shared/reference/flashmla-builds.md and the
0.5.23 source, cited in rules/engines.json):
- FlashMLA 9241ae3's scheduler needs 4*(5b+1) bytes; an H200 grants 232448: b <= 11622.
- SGLang's routing threshold 11673; with the switch on (its default) every non-speculative extend
  forward goes to flash_mla_sparse_fwd whatever its rows; 0 rows is still a sparse-prefill failure.
- A late-layer tail is each request's last min(128, extend) tokens, on the decode kernel.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import validate_batch
from validate_batch.bisect import BisectOptions, diagnose
from validate_batch.bisect import server_args as batch_server_args
from validate_batch.cli.main import app
from validate_batch.errors import InputError
from validate_batch.ingest import build_config, read_inputs

runner = CliRunner()
H200_SMEM = 232448
LIMIT = (H200_SMEM - 4) // 20          # 11622 rows on upstream 9241ae3
THRESHOLD = 11673
TAIL = 128
SWITCH = "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"
B200_SMS = 148


def check(doc, build=None):
    return validate_batch.check(doc, build=build)


def errors(report) -> set:
    return {f.code for f in report.errors}


def extend_doc(tokens, version="0.5.23", server_args=None, env=None, model=None, gpu="H200"):
    doc = {"engine": f"sglang-dsv4@{version}", "gpu": gpu, "forward_mode": "extend",
           "server_args": dict(server_args or {}),
           "requests": [{"id": f"p{i}", "extend_tokens": t} for i, t in enumerate(tokens)]}
    if env:
        doc["env"] = env
    if model:
        doc["model"] = model
    return doc


def decode_doc(n, gpu="B200", model_type="deepseek_v41", version="0.5.23"):
    return {"engine": f"sglang-dsv4@{version}", "gpu": gpu, "forward_mode": "decode",
            "model": {"model_type": model_type},
            "requests": [{"id": f"r{i}", "seq_len": 300} for i in range(n)]}


# ------------------------------------------------------------------------------ routing switch
def test_the_cli_case_is_legal_by_default_and_illegal_with_the_switch_off_on_a_build_without_fallback():
    base = ["check", "--engine", "sglang-dsv4@0.5.23", "--extend", "11640", "--json"]
    res = runner.invoke(app, base)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["routing"]["routed"] is True
    res = runner.invoke(app, [*base, "--kernel-gen", "flashmla-9241ae3"])       # routed: no scheduler at all
    assert res.exit_code == 0, res.output
    for switch in (["--env", f"{SWITCH}=0"], ["--server-arg", f"{SWITCH}=false"]):
        res = runner.invoke(app, [*base, *switch, "--kernel-gen", "flashmla-9241ae3"])
        assert res.exit_code == 1, res.output
        assert "FMLA001" in {f["code"] for f in json.loads(res.stdout)["findings"]}
    # sgl-flash-mla 1.0.0, the build 0.5.23 ships, has no row limit on the decode kernel: legal either way
    res = runner.invoke(app, [*base, "--env", f"{SWITCH}=0"])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("rows,legal", [(LIMIT - 1, True), (LIMIT, True), (LIMIT + 1, False),
                                        (THRESHOLD, False), (THRESHOLD + 1, True)])
def test_with_the_switch_off_the_threshold_routes_again(rows, legal):
    r = check(extend_doc([rows], env={SWITCH: "0"}), build="flashmla-9241ae3")
    assert r.legal is legal, r.codes
    assert r.to_dict()["routing"]["routed"] is (rows > THRESHOLD)


@pytest.mark.parametrize("rows", [1, LIMIT, LIMIT + 1, THRESHOLD, 200000])
def test_with_the_switch_on_every_extend_is_routed(rows):
    r = check(extend_doc([rows]), build="flashmla-9241ae3")
    assert r.legal, r.codes
    ctx = r.to_dict()
    assert ctx["routing"]["routed"] and {c["route"] for c in ctx["kernel_calls"]} == {"sparse_prefill"}


def test_with_the_switch_on_an_empty_extend_is_still_a_sparse_prefill_failure():
    r = check(extend_doc([0]))
    assert "SGL002" in errors(r)


def test_decode_and_verify_are_never_routed_by_the_switch():
    doc = {"engine": "sglang-dsv4@0.5.23", "forward_mode": "decode",
           "requests": [{"id": f"r{i}", "seq_len": 10} for i in range(LIMIT + 1)]}
    assert "FMLA001" in errors(check(doc, build="flashmla-9241ae3"))
    doc["requests"] = doc["requests"][:LIMIT]
    assert check(doc, build="flashmla-9241ae3").legal


@pytest.mark.parametrize("version", ["0.5.13", "0.5.14", "post-25418"])
def test_older_versions_keep_the_threshold_only(version):
    # the switch exists from 0.5.13 but is off by default until 0.5.15 (sglang 0.5.14 srt/environ.py:796
    # EnvBool(False), 0.5.15 :851 EnvBool(True)); tests/test_sglang_releases.py checks each release
    r = check(extend_doc([11640], version=version), build="flashmla-9241ae3")
    assert "FMLA001" in errors(r)


def test_the_switch_takes_the_engines_spellings_and_refuses_others():
    for text, on in (("1", True), ("TRUE", True), ("yes", True), ("0", False), ("n", False)):
        r = check(extend_doc([11640], env={SWITCH: text}), build="flashmla-9241ae3")
        assert r.legal is on
    with pytest.raises(InputError) as e:
        check(extend_doc([10], env={SWITCH: "maybe"}))
    assert e.value.field == f"env.{SWITCH}"
    with pytest.raises(InputError) as e:
        check(extend_doc([10], env={"SGLANG_NOT_A_SWITCH": "1"}))
    assert e.value.field == "env.SGLANG_NOT_A_SWITCH"


def test_the_guard_follows_the_switch():
    on = validate_batch.Checker(engine="sglang-dsv4@0.5.23", build="flashmla-9241ae3")
    off = validate_batch.Checker(engine="sglang-dsv4@0.5.23", build="flashmla-9241ae3", server_args={SWITCH: "0"})
    assert on.verdict("extend", extend_lens=[11640])
    assert not off.verdict("extend", extend_lens=[11640])
    assert off.verdict("extend", extend_lens=[LIMIT]) and not off.verdict("extend", extend_lens=[LIMIT + 1])


# ------------------------------------------------------------------------------ late-layer tails
def _tail_doc(last: int, on=True):
    # 90 requests of 200 tokens give 90 x 128 tail rows; the last request adds min(128, last)
    return extend_doc([200] * 90 + [last], server_args={"enable_decoder_swa_bounded_replay": on})


@pytest.mark.parametrize("last,legal", [(LIMIT - 90 * TAIL - 1, True), (LIMIT - 90 * TAIL, True),
                                        (LIMIT - 90 * TAIL + 1, False)])
def test_late_layer_tail_rows_run_the_decode_kernel(last, legal):
    assert LIMIT - 90 * TAIL < TAIL                     # the last request's tail is all of it
    r = check(_tail_doc(last), build="flashmla-9241ae3")
    assert r.legal is legal, r.codes
    ctx = r.to_dict()
    assert ctx["routing"]["late_layer_tail_rows"] == 90 * TAIL + last
    tails = [c for c in ctx["kernel_calls"] if c["route"] == "decode_kernel"]
    assert len(tails) == 1 and tails[0]["call"]["b"] == 90 * TAIL + last


def test_tails_are_off_without_the_setting_for_v4_and_on_by_default_for_v41():
    assert check(_tail_doc(TAIL, on=False), build="flashmla-9241ae3").legal
    doc = extend_doc([200] * 91)                                   # 91 x 128 = 11648 tail rows
    assert check(doc, build="flashmla-9241ae3").legal              # a DeepSeek-V4 model: no tails
    doc["model"] = {"model_type": "deepseek_v41"}
    assert "FMLA001" in errors(check(doc, build="flashmla-9241ae3"))
    doc["server_args"]["enable_decoder_swa_bounded_replay"] = False
    assert check(doc, build="flashmla-9241ae3").legal


def test_the_guard_takes_the_full_check_for_routed_forwards_with_tails():
    g = validate_batch.Checker(engine="sglang-dsv4@0.5.23", build="flashmla-9241ae3",
                          server_args={"enable_decoder_swa_bounded_replay": True})
    assert not g.verdict("extend", extend_lens=[200] * 91)          # 11648 tail rows
    assert g.verdict("extend", extend_lens=[20000])                 # one request: a 128-row tail
    assert g.verdict("extend", extend_lens=[200] * 90)


# ------------------------------------------------------------------------------ KV layout
def test_kv_layout_picks_the_kernel_half():
    ctx = check(extend_doc([1], env={"SGLANG_DSV4_KV_LAYOUT": "v4"})).to_dict()["routing"]
    assert ctx["kv_layout"] == "v4" and ctx["use_legacy"] is True
    ctx = check(extend_doc([1], gpu="B200", env={"SGLANG_DSV4_KV_LAYOUT": "v41_new"})).to_dict()["routing"]
    assert ctx["use_legacy"] is False
    ctx = check(extend_doc([1], gpu="B200", env={"SGLANG_DSV4_KV_LAYOUT": "auto"})).to_dict()["routing"]
    assert ctx["kv_layout"] == "v41"
    ctx = check(extend_doc([1], env={"SGLANG_DSV4_KV_LAYOUT": "auto"})).to_dict()["routing"]
    assert ctx["kv_layout"] == "v4"


@pytest.mark.parametrize("layout", ["v41", "v41_new"])
def test_a_v41_layout_cannot_run_on_an_h200(layout):
    doc = extend_doc([1], env={"SGLANG_DSV4_KV_LAYOUT": layout})
    doc["forward_mode"], doc["requests"] = "decode", [{"id": "r", "seq_len": 10}]
    r = check(doc)
    assert "SGL004" in errors(r)
    text = " ".join(f.message for f in r.errors if f.code == "SGL004")
    assert "H200" in text and ("current" in text) is (layout == "v41_new")


# ------------------------------------------------------------------------------ schedule precompute
# SGL003 per release (0.5.21 / 0.5.22 / 0.5.23 differ): tests/test_sglang_precompute_releases.py


# ------------------------------------------------------------------------------ slots
def slots_doc(slot, version="0.5.23", **sa):
    return {"engine": f"sglang-slots@{version}", "forward_mode": "decode",
            "server_args": {"disaggregation_mode": "decode", "speculative_algorithm": "NEXTN",
                            "speculative_num_draft_tokens": 2, **sa},
            "requests": [{"id": "a", "seq_len": 10, "req_pool_idx": slot}]}


@pytest.mark.parametrize("sa", [{"max_running_requests": 256, "attn_dp_size": 8},
                                {"max_running_requests": 256, "dp_size": 8, "enable_dp_attention": True},
                                {"max_running_requests": 32}])
def test_pd_table_rows_after_the_tail_fix(sa):
    R = 32                                   # per attention-DP worker: 256 // 8, or 32 on one worker
    E = 2 * R                                # default extra slots: 2 x R when R <= 32
    t_rows = R + E + 1                       # size + pre_alloc + 1
    for slot, legal in [(t_rows - 2, True), (t_rows - 1, True), (t_rows, False)]:
        r = check(slots_doc(slot, **sa))
        assert r.legal is legal, (slot, r.codes)
    ctx = check(slots_doc(1, **sa)).to_dict()["slots"]
    assert ctx["table_rows"] == t_rows
    assert {b["rows"] for b in ctx["buffers"][1:]} == {t_rows + 1}     # tails from the table: T_rows + 1


def test_the_pre_fix_version_keeps_its_draft_tails():
    R, E = 32, 64
    r = check(slots_doc(R + E, version="pre-fix", max_running_requests=256, attn_dp_size=8))
    assert "SLOT002" in errors(r)            # the draft's tails have R + 1 = 33 rows


def test_default_extra_slots_count_replicas_next_to_attn_dp_size():
    # 0.5.23: 2 x max(1, 512 // (dp_size 2 x attn_dp_size 8)) = 64 when that per-worker count is <= 32
    ctx = check(slots_doc(1, max_running_requests=512, attn_dp_size=8, dp_size=2)).to_dict()["slots"]
    assert ctx["max_running_requests_per_dp"] == 512 // 8 and ctx["extra_slots"] == 2 * (512 // 16)


# ------------------------------------------------------------------------------ bisect advice
@pytest.mark.parametrize("dp_flags", [["attn_dp_size=8"], ["dp_size=8", "enable_dp_attention=true"]])
def test_bisect_chunk_advice_is_per_attention_dp_worker(dp_flags):
    log = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "sglang-dsv4-prefill-12288.log"
    ev, dump = read_inputs(str(log), None)
    cfg = build_config(ev, dump, None, ["chunked_prefill_size=131072", "tp_size=8", *dp_flags])
    assert cfg.attn_dp_size == 8 and cfg.chunk_per_rank() == 131072 // 8
    flags = {(f["flag"], f["value"]) for f in diagnose(ev, cfg, dump, BisectOptions()).fixes}
    assert ("--chunked-prefill-size", LIMIT * 8) in flags     # the flag is divided by the width: 8 x 11622


def test_headroom_follows_the_switch():
    on = validate_batch.Checker(engine="sglang-dsv4@0.5.23", build="flashmla-9241ae3")
    h = on.headroom("extend", extend_lens=[100])
    assert h.routed and h.more_rows is None and "switch" in h.note
    assert on.headroom("decode", seq_lens=[100] * 10).more_rows == LIMIT - 10
    off = validate_batch.Checker(engine="sglang-dsv4@0.5.23", build="flashmla-9241ae3", server_args={SWITCH: False})
    h = off.headroom("extend", extend_lens=[100])
    assert not h.routed and h.more_rows == LIMIT - 100 and h.rows_to_route == THRESHOLD + 1 - 100


@pytest.mark.parametrize("text,routed", [("0", False), ("false", False), ("1", True)])
def test_bisect_reads_the_switch_as_the_engine_does(text, routed):
    cfg = build_config(None, None, None, [f"{SWITCH}={text}"])
    assert batch_server_args(cfg)[SWITCH] is routed
