"""Crash-report bisection end to end: each fixture log yields the right step, rule and boundary.

Expected numbers are derived here from first principles, not read from the code under test:
* FlashMLA's scheduler needs 4*(5b+1) bytes of shared memory; an H200 opts in to 232448 bytes,
  so the largest legal b is (232448/4 - 1) // 5 (flashmla-facts.md section 4);
* DSv4 on SGLang sends one query row per new token (sglang-facts.md A);
* a PD decode worker's NextN draft tails have R + 1 rows when sized from the running limit R, so
  the largest slot they hold is R (sglang-facts.md B).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from validate_batch.bisect import BisectChecker, BisectOptions, diagnose, find_boundary
from validate_batch.ingest import build_config, read_inputs
from validate_batch.ingest.scan import scan_lines

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
H200_SMEM = 232448
MAX_B = (H200_SMEM // 4 - 1) // 5          # 11622


def run(name: str | None = None, launch=None, server_args=(), dump=None, **opts):
    ev, d = read_inputs(str(LOGS / name) if name else None, dump)
    cfg = build_config(ev, d, launch, server_args)
    return diagnose(ev, cfg, d, BisectOptions(**opts))


def test_boundary_arithmetic_is_what_the_facts_say():
    assert 4 * (5 * MAX_B + 1) <= H200_SMEM < 4 * (5 * (MAX_B + 1) + 1)


def test_seed_crash_1_dsv4_prefill_logged_before_its_forward():
    diag = run("sglang-dsv4-prefill-12288.log")
    ex = diag.explained
    assert diag.after_forward is False                    # comma era without graph fields: <= 0.5.8
    assert ex.kind == "prefill" and ex.exact and ex.step.line_no == 14
    assert ex.value == 3 * 4096
    assert {"FMLA001", "SGL001"} <= set(ex.codes) and ex.matches_error
    b = ex.boundary
    assert (b.largest_legal, b.first_illegal, b.margin) == (MAX_B, MAX_B + 1, 3 * 4096 - MAX_B)
    assert diag.error.kind == "flashmla_sched" and diag.error.line_no == 15
    flags = {(f["flag"], f["value"]): f["verified"] for f in diag.fixes}
    assert flags[("--chunked-prefill-size", MAX_B)] is True
    assert flags[("--chunked-prefill-size", 8192)] is True
    # The running decode is not the cause: the decode candidate with the same requests is legal.
    dec = next(c for c in diag.candidates if c.kind == "decode")
    assert dec.verdict == "legal"


def test_seed_crash_2_pd_decode_slot():
    diag = run("sglang-pd-decode-slot-96.log")
    ex = diag.explained
    R, E = 32, 64
    assert ex.kind == "slot" and ex.exact and ex.value == R + E
    assert ex.codes == ["SLOT002"] and ex.matches_error
    b = ex.boundary
    assert (b.largest_legal, b.first_illegal, b.margin) == (R, R + 1, R + E - R)
    # the traceback's innermost frame is SGLang's memory pool: an engine buffer, not a kernel library's
    assert diag.error.numbers == {"index": 96, "dim": 0, "size": R + 1, "failure": "python_exception",
                                  "owner": "sglang", "owner_from": "traceback frame on line 10 (/sgl-workspace/"
                                  "sglang/python/sglang/srt/mem_cache/memory_pool.py)"}
    assert diag.error.rank == "DP0" and diag.error.rank_inferred
    fixes = {f["flag"]: f for f in diag.fixes}
    assert fixes["--disaggregation-decode-extra-slots"]["value"] == 0 and fixes["--disaggregation-decode-extra-slots"]["verified"]
    assert fixes["(upgrade)"]["verified"]
    assert any("agrees with the error" in n for n in diag.notes)


def test_0512_log_printed_after_forward_reconstructs_the_next_chunk_per_dp_rank():
    diag = run("sglang-0512-dsv4-dp-pending.log")
    ex = diag.explained
    chunk = 131072 // 8                                    # --chunked-prefill-size divided by dp_size under DP attention
    assert diag.after_forward is True
    assert ex.rank == "DP2" and ex.kind == "prefill" and ex.exact
    assert ex.step.line_no == 13 and ex.likely == chunk    # #pending-token 40960 >= one chunk
    assert {"FMLA001", "SGL001"} <= set(ex.codes)
    assert (ex.boundary.largest_legal, ex.boundary.margin) == (MAX_B, chunk - MAX_B)
    assert ex.version == "0.5.12"                          # the release without sparse-prefill routing explains it
    # Ranks with nothing pending are only "partly illegal": a new arrival could have filled a chunk.
    others = [c for c in diag.candidates if c.kind == "prefill" and c.rank != "DP2"]
    assert others and all(c.verdict == "partly illegal" and c.likely is None for c in others)
    flags = {(f["flag"], f["value"]) for f in diag.fixes}
    assert ("--chunked-prefill-size", MAX_B * 8) in flags and ("--chunked-prefill-size", 8192 * 8) in flags


def test_user_version_decides_the_print_order():
    # The same DSv4 log read as 0.5.12: the 12288-token line ran, so the crash is the NEXT batch.
    diag = run("sglang-dsv4-prefill-12288.log", sglang_version="0.5.12")
    assert diag.after_forward is True
    assert diag.explained.kind == "prefill" and not diag.explained.exact
    assert any("completed, above the model's boundary" in n for n in diag.notes)


def test_vllm_dump_is_the_crashing_step():
    diag = run("vllm-scheduler-dump.log")
    ex = diag.explained
    assert diag.engine == "vllm" and ex.kind == "vllm"
    assert ex.value == 12000 + 3
    assert ex.codes == ["FMLA001"]
    assert (ex.boundary.largest_legal, ex.boundary.margin) == (MAX_B, 12003 - MAX_B)
    assert diag.config.values["max_num_batched_tokens"] == 16384
    assert diag.fixes[0]["flag"] == "--max-num-batched-tokens" and diag.fixes[0]["value"] == MAX_B


def test_truncated_log_gives_a_partial_answer(tmp_path):
    text = (LOGS / "sglang-dsv4-prefill-12288.log").read_text()
    cut = text[: text.index("#new-token: 12288")]          # the log ends mid-line, before the crash
    p = tmp_path / "cut.log"
    p.write_text(cut)
    ev, _ = read_inputs(str(p), None)
    diag = diagnose(ev, build_config(ev, None, None), None)
    assert diag.error is None and diag.explained is None and diag.partial
    assert ev.counts["unparsed_batch_line"] == 1
    assert any("no error line" in n for n in diag.notes)
    assert all(c.verdict == "legal" for c in diag.candidates)


def test_settings_alone_bound_the_crash_when_the_log_has_no_scheduler_lines(tmp_path):
    p = tmp_path / "only-error.log"
    p.write_text("CUDA error (/x/get_decoding_sched_meta.cu:111): invalid argument\n")
    ev, _ = read_inputs(str(p), None)
    cfg = build_config(ev, None, "sglang serve deepseek-ai/DeepSeek-V4-Flash --chunked-prefill-size 16384")
    diag = diagnose(ev, cfg, None, BisectOptions(sglang_version="0.5.8"))
    ex = diag.explained
    assert ex.verdict == "partly illegal" and (ex.lo, ex.hi) == (1, 16384)
    assert ex.boundary.largest_legal == MAX_B


def test_crash_dump_alone(tmp_path, monkeypatch):
    from test_ingest_crash_dump import _make_dump

    p = _make_dump(tmp_path / "crash_dump.pkl", monkeypatch)
    ev, d = read_inputs(None, str(p))
    cfg = build_config(ev, d, None)
    assert cfg.values["chunked_prefill_size"] == 16384 and cfg.sources["chunked_prefill_size"] == "crash dump (server_args)"
    diag = diagnose(ev, cfg, d, BisectOptions(sglang_version="0.5.8"))
    pre = next(c for c in diag.candidates if c.kind == "prefill")
    assert pre.value == 4096 + 4096                        # the two waiting requests' prompts
    assert pre.verdict == "legal"


def test_find_boundary_bisects_any_monotone_rule():
    # A stand-in checker: legal below 1000; the bisection must find 999 in a handful of calls.
    class R:
        def __init__(self, bad):
            self.findings = [type("F", (), {"is_error": True, "code": "X"})()] if bad else []

    class C(BisectChecker):
        def __call__(self, doc, split=False):
            self.calls += 1
            return R(doc["v"] >= 1000)

    ch = C()
    b = find_boundary(lambda v: {"v": v}, ch, 1, 5000, None, "rows")
    assert (b.largest_legal, b.first_illegal, b.margin) == (999, 1000, 4001)
    assert ch.calls < 20
    b = find_boundary(lambda v: {"v": v}, C(), 1, 10, None, "rows")   # legal where it crashed: gallop up
    assert (b.largest_legal, b.first_illegal) == (999, 1000)


def test_unknown_print_order_checks_both_batches():
    lines = [
        "Prefill batch, #new-seq: 1, #new-token: 12000, #cached-token: 0, token usage: 0.04, #running-req: 3, "
        "#queue-req: 0, input throughput (token/s): 8000.00, cuda graph: False",
        "CUDA error (/x/get_decoding_sched_meta.cu:111): invalid argument",
    ]
    ev = scan_lines(lines)
    cfg = build_config(ev, None, "sglang serve deepseek-ai/DeepSeek-V4 --chunked-prefill-size 8192")
    diag = diagnose(ev, cfg, None)
    assert diag.after_forward is None
    labels = [c.label for c in diag.candidates if c.kind == "prefill"]
    assert any("last logged prefill" in x for x in labels) and any("after line 1" in x for x in labels)
    assert diag.explained.value == 12000 and diag.explained.boundary.largest_legal == MAX_B


def test_json_is_complete_and_serialisable():
    diag = run("sglang-dsv4-prefill-12288.log")
    d = json.loads(json.dumps(diag.to_dict(), default=str))
    assert d["crashing_step"]["from_line"] == 14 and d["rule"] == ["FMLA001", "SGL001"]
    assert d["boundary"]["largest_legal"] == MAX_B and d["boundary"]["first_illegal"] == MAX_B + 1
    assert d["log"]["unparsed"]["count"] == 0 and d["error"]["kind"] == "flashmla_sched"
    assert d["crashing_step"]["batch"]["forward_mode"] == "extend"


@pytest.mark.parametrize("gpu", ["H100", "B200"])
def test_boundary_follows_the_gpu_profile(gpu):
    from validate_batch.facts.knowledge import resolve_gpu

    smem = resolve_gpu(gpu).smem_optin
    diag = run("sglang-dsv4-prefill-12288.log", gpu=gpu)
    assert diag.explained.boundary.largest_legal == (smem // 4 - 1) // 5


def test_pd_slot_crash_on_gpu_without_a_slot_number():
    # DP attention halves --max-running-requests 64 to R = 32 per worker; extra slots default to 2 x R
    # (sglang-facts.md B); the draft tails have R + 1 rows. The crashed rank (DP1, from its traceback)
    # holds 32 running + 33 pre-allocated + 12 transferring slots: some slot is >= 77.
    diag = run("sglang-pd-decode-dp-illegal-access.log")
    ex = diag.explained
    R = 64 // 2
    held = 32 + 33 + 12
    assert diag.error.kind == "illegal_memory_access" and diag.error.rank == "DP1"
    assert ex.rank == "DP1" and ex.kind == "slot" and not ex.exact
    assert (ex.lo, ex.hi) == (held, R + 2 * R)
    assert ex.codes == ["SLOT002"]
    assert (ex.boundary.largest_legal, ex.boundary.first_illegal, ex.boundary.margin) == (R, R + 1, held - R)
    assert ex.version == "0.5.10"      # the line format says >= 0.5.10; only a pre-fix build explains it


def test_verify_step_rows_are_batch_size_times_draft_tokens():
    # 0.5.12-format log, EAGLE with 4 draft tokens: a verify forward has batch x 4 query rows, and
    # verify forwards are never routed away from the decode kernel (sglang-facts.md A).
    lines = [
        "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V4-Pro --max-running-requests 4096 "
        "--speculative-algorithm EAGLE --speculative-num-draft-tokens 4 --chunked-prefill-size 8192",
        "[2026-08-01 00:00:01 TP0] Prefill batch, #new-seq: 310, #new-token: 8192, #cached-token: 0, token usage: 0.70, "
        "#running-req: 2700, #queue-req: 190, #pending-token: 300000, cuda graph: False, input throughput (token/s): 1.00",
        "CUDA error (/x/get_decoding_sched_meta.cu:111): invalid argument",
    ]
    ev = scan_lines(lines)
    diag = diagnose(ev, build_config(ev, None, None), None)
    ex = diag.explained
    assert ex.kind == "verify" and ex.likely == 2700 + 310
    assert ex.boundary.largest_legal == MAX_B // 4
    fix = next(f for f in diag.fixes if f["flag"] == "--max-running-requests")
    assert fix["value"] == MAX_B // 4 and fix["verified"]
    # The next prefill (one 8192-token chunk) is legal: it is not the cause.
    assert next(c for c in diag.candidates if c.kind == "prefill").verdict == "legal"


def test_0510_log_without_pending_tokens_uses_the_queue():
    lines = [
        "[2026-03-01 00:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 16384, #cached-token: 0, token usage: 0.02, "
        "#running-req: 0, #queue-req: 2, cuda graph: False, input throughput (token/s): 5000.00",
        "CUDA error (/x/get_decoding_sched_meta.cu:111): invalid argument",
    ]
    ev = scan_lines(lines)
    cfg = build_config(ev, None, "--chunked-prefill-size 16384 --model-path deepseek-ai/DeepSeek-V4-Flash")
    diag = diagnose(ev, cfg, None)
    ex = diag.explained
    assert diag.after_forward is True and ex.step.line_no == 1
    assert (ex.lo, ex.hi) == (1, 16384) and ex.likely == 16384 and not ex.exact   # a full chunk ran: likely another
    assert any("#queue-req 2" in b for b in ex.basis)


def test_log_and_dump_together(tmp_path, monkeypatch):
    from test_ingest_crash_dump import _make_dump

    p = _make_dump(tmp_path / "crash_dump.pkl", monkeypatch)
    diag = run("sglang-dsv4-prefill-12288.log", dump=str(p))
    assert diag.explained.step.line_no == 14 and diag.dump is not None
    assert diag.config.sources["chunked_prefill_size"] == "crash dump (server_args)"
    assert diag.to_dict()["crash_dump"]["num_unfinished"] == 3


def test_mamba_slot_mapping_indexed_by_a_global_slot():
    # --max-running-requests 64 over 2 DP-attention workers: the mapping table has 64 / 2 rows, so the
    # largest global slot it can take is 31 (sglang-facts.md B, last item).
    lines = [
        "python3 -m sglang.launch_server --model-path Qwen/Qwen3-Next-80B-A3B-Instruct --tp 4 --dp 2 "
        "--enable-dp-attention --max-running-requests 64",
        "[2026-02-10 11:00:00 DP1 TP2] Decode batch, #running-req: 30, #full token: 90000, full token usage: 0.10, "
        "mamba num: 30, mamba usage: 0.47, cuda graph: True, gen throughput (token/s): 800.00, #queue-req: 0, ",
        "[2026-02-10 11:00:02 DP1 TP2] Scheduler hit an exception: Traceback (most recent call last):",
        "IndexError: index 32 is out of bounds for dimension 0 with size 32",
    ]
    ev = scan_lines(lines)
    diag = diagnose(ev, build_config(ev, None, None), None)
    ex = diag.explained
    assert ex.rank == "DP1" and ex.codes == ["SLOT004"]
    assert (ex.boundary.largest_legal, ex.boundary.first_illegal) == (64 // 2 - 1, 64 // 2)


def test_slot_error_without_settings_still_reads_the_message():
    ev = scan_lines(["IndexError: index 96 is out of bounds for dimension 0 with size 33"])
    diag = diagnose(ev, build_config(ev, None, None), None)
    assert diag.explained is None
    assert any("largest legal index there is 32 (over by 64)" in n for n in diag.notes)


def test_settings_that_contradict_the_log_are_flagged():
    # The log shows a 12288-token prefill; a chunk budget of 8192 cannot have produced it.
    diag = run("sglang-dsv4-prefill-12288.log", server_args=["chunked_prefill_size=8192"])
    assert any("12288 new tokens" in n and "do not match" in n for n in diag.notes)


def test_vllm_dump_names_its_profile_and_release():
    # the log is vLLM 0.19.0 serving DeepSeek-V3.2: recognised as vllm-flashmla-sparse, whose only
    # version is 0.33, so the dump keeps the raw row model (test_vllm_dump_is_the_crashing_step)
    diag = run("vllm-scheduler-dump.log")
    assert "vLLM profile: vllm-flashmla-sparse (from the log's settings)" in diag.notes
    assert diag.config.values["model_path"] == "deepseek-ai/DeepSeek-V3.2" and diag.config.values["tp_size"] == 8
    assert any("has no version for vLLM 0.19.0" in n for n in diag.notes)
    assert diag.explained.codes == ["FMLA001"]


def dump_033(tmp_path, prefill: int):
    """The fixture's dump as vLLM 0.33.0 wrote it, with a prefill of ``prefill`` tokens beside its 3 decodes."""
    text = (LOGS / "vllm-scheduler-dump.log").read_text().replace("0.19.0", "0.33.0")
    text = text.replace("12003", str(prefill + 3)).replace("12000", str(prefill))
    log = tmp_path / "vllm-033.log"
    log.write_text(text)
    return log


MIXED_EDGE = (2 ** 31 - 1) // (64 * 576)   # the mixed call's q.stride(0) = tokens x 64 heads x 576 in int32


@pytest.mark.parametrize("server_args, prefill, codes", [
    # 0.33.0 at tp 8 (16 heads per rank), bf16 cache: every MQA token through flash_mla_sparse_fwd
    ((), 12000, []),
    # fp8 cache, 16 < 32 heads: one decode-kernel call, b = 1, s_q = the step's tokens
    (("kv_cache_dtype=fp8_ds_mla",), 12000, []),
    (("kv_cache_dtype=fp8_ds_mla",), MIXED_EDGE - 3, []),
    (("kv_cache_dtype=fp8_ds_mla",), MIXED_EDGE - 2, ["FMLA009"]),
])
def test_vllm_033_dump_is_judged_by_its_profile(tmp_path, server_args, prefill, codes):
    ev, d = read_inputs(str(dump_033(tmp_path, prefill)), None)
    diag = diagnose(ev, build_config(ev, d, None, server_args), d, BisectOptions())
    (c,) = diag.candidates
    assert c.batch["engine"] == "vllm-flashmla-sparse@0.33.0" and c.codes == codes
    if codes:
        # the step breaks the stride limit, but the log's error is the scheduler's shared-memory exit
        # (get_decoding_sched_meta.cu:111): illegal, and said not to explain this error
        assert diag.explained is None and c.boundary.largest_legal == MIXED_EDGE and not diag.fixes
        also = diag.explanation.also_illegal
        assert [a["codes"] for a in also] == [codes] and "does not explain this error" in also[0]["reason"]
    else:
        assert diag.explained is None
