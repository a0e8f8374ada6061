"""SGLang scheduler lines of every era: fields, ranks, era and print order.

Lines are written here following the f-strings of each release (sglang-log-formats.md section 2);
the expected print order comes from section 3 of that document: up to 0.5.8 a Prefill line is
printed before its forward, from 0.5.10 after it.
"""
from __future__ import annotations

import pytest

from validate_batch.ingest.scan import scan_lines
from validate_batch.ingest.sglang_log import (
    LineParseError,
    after_forward_for_version,
    parse_batch_line,
    parse_prefix,
    parse_version,
)

# (release, line, kind, expected fields subset, prefill printed after its forward?)
ERA_LINES = [
    ("0.3.0", "[2024-09-02 11:00:01 TP0] Prefill batch. #new-seq: 2, #new-token: 900, #cached-token: 12, "
              "cache hit rate: 1.31%, #running-req: 3, #queue-req: 1",
     "prefill", {"new_seq": 2, "new_token": 900, "cached_token": 12, "cache_hit_rate": 1.31, "running_req": 3}, False),
    ("0.3.0 mixed", "[2024-09-02 11:00:02 TP0] Prefill batch(mixed #running-req: 5). #new-seq: 1, #new-token: 77, "
                    "#cached-token: 0, cache hit rate: 0.00%, #queue-req: 0",
     "prefill", {"new_seq": 1, "new_token": 77, "queue_req": 0}, False),
    ("0.4.0", "[2024-12-01 08:00:00 TP0] Decode batch. #running-req: 7, #token: 4410, token usage: 0.01, "
              "gen throughput (token/s): 250.40, #queue-req: 0",
     "decode", {"running_req": 7, "token": 4410, "token_usage": 0.01, "gen_throughput_token_s": 250.4}, False),
    ("0.4.6 PD prefill", "[2025-05-01 10:00:00 DP1 TP1] Prefill batch. #new-seq: 1, #new-token: 3000, #cached-token: 0, "
                         "token usage: 0.10, #running-req: 0, #unbootstrapped-req: 2, #queue-req: 4, #transferring-req: 1 ",
     "prefill", {"new_token": 3000, "unbootstrapped_req": 2, "transferring_req": 1, "queue_req": 4}, False),
    ("0.4.9 SWA allocator", "[2025-07-01 09:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 640, #cached-token: 0, "
                            "#token: full=2200, swa=300, token usage: full=0.02, swa=0.05, #running-req: 1, #queue-req: 0",
     "prefill", {"token": {"full": 2200, "swa": 300}, "token_usage": {"full": 0.02, "swa": 0.05}, "running_req": 1}, False),
    ("0.5.1 hybrid decode", "[2025-08-20 12:00:00 TP0 EP0] Decode batch. #running-req: 4, #full token: 9000, "
                            "full token usage: 0.03, #swa token: 2048, swa token usage: 0.10, accept len: 2.50, "
                            "cuda graph: True, gen throughput (token/s): 310.00, #queue-req: 0, ",
     "decode", {"running_req": 4, "full_token": 9000, "swa_token": 2048, "accept_len": 2.5, "graph": True}, False),
    ("0.5.3 PD decode", "[2025-10-10 10:10:10 DP0 TP0] Decode batch. #running-req: 20, #token: 70000, token usage: 0.20, "
                        "pre-allocated usage: 0.05, #prealloc-req: 9, #transfer-req: 3, #retracted-req: 0, "
                        "cuda graph: True, gen throughput (token/s): 700.00, #queue-req: 0, ",
     "decode", {"running_req": 20, "prealloc_req": 9, "transfer_req": 3, "retracted_req": 0}, False),
    ("0.5.5 iter tag", "[2025-11-20 01:02:03 DP2 PP1 TP2 EP2] Prefill batch [118], #new-seq: 3, #new-token: 2500, "
                       "#cached-token: 64, token usage: 0.04, #running-req: 6, #queue-req: 2, ",
     "prefill", {"new_seq": 3, "new_token": 2500, "cached_token": 64}, False),
    ("0.5.8 mamba", "[2026-01-15 07:00:00 TP0] Decode batch, #running-req: 3, #full token: 1200, full token usage: 0.01, "
                    "mamba num: 3, mamba usage: 0.02, accept len: 3.10, accept rate: 0.70, cuda graph: True, "
                    "gen throughput (token/s): 99.50, #queue-req: 0, ",
     "decode", {"mamba_num": 3, "mamba_usage": 0.02, "accept_rate": 0.7}, False),
    ("0.5.10", "[2026-03-01 00:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 4000, #cached-token: 0, token usage: 0.02, "
               "#running-req: 0, #queue-req: 1, cuda graph: False, input throughput (token/s): 5000.00",
     "prefill", {"new_token": 4000, "graph": False, "input_throughput_token_s": 5000.0}, True),
    ("0.5.12", "[2026-05-02 03:04:05 DP3 TP6] Prefill batch, #new-seq: 2, #new-token: 8192, #cached-token: 100, "
               "full token usage: 0.01, swa token usage: 0.02, #running-req: 1, #queue-req: 3, #pending-token: 99000, "
               "#bootstrap-req: 0, #inflight-req: 2, npu graph: False, input throughput (token/s): 700.00, "
               "est. prefill TFLOPS/s (per GPU): 12.50, fwd occupancy: 88.10%",
     "prefill", {"pending_token": 99000, "bootstrap_req": 0, "graph": False, "graph_backend": "npu",
                 "fwd_occupancy": 88.1}, True),
    ("0.5.18", "[2026-08-01 10:00:00 DP0 TP0] Prefill batch, #new-seq: 1, #new-token: 1000, #cached-token: 0, "
               "token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, #bootstrap-req: 1, "
               "#inflight-req: 0, #optimistic-req: 1, cuda graph: False, input throughput (token/s): 10.00",
     "prefill", {"optimistic_req": 1}, True),
    ("0.5.23 ms", "[2026-09-01 10:00:00.042 TP0] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, "
                  "token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, #replay-token: 64, "
                  "musa graph: False, input throughput (token/s): 1.00",
     "prefill", {"replay_token": 64, "graph_backend": "musa"}, True),
    ("main decode", "[2026-10-01 10:00:00 TP0] Decode batch [9], #running-req: 2, #cached-token: 300, #token: 900, "
                    "token usage: 0.00, cuda graph: True, gen throughput (token/s): 40.00, #queue-req: 0",
     "decode", {"cached_token": 300, "running_req": 2}, True),
]


@pytest.mark.parametrize("release,line,kind,fields,after", ERA_LINES, ids=[e[0] for e in ERA_LINES])
def test_every_era_parses(release, line, kind, fields, after):
    s = parse_batch_line(line, 7)
    assert s.kind == kind
    for k, v in fields.items():
        assert s.fields[k] == v, k
    if kind == "prefill" or release == "main decode":
        assert s.era.after_forward is after
    assert s.extra == []


def test_mixed_head_and_iteration_tag():
    s = parse_batch_line(ERA_LINES[1][1])
    assert s.mixed_running == 5 and s.running_req == 5
    s = parse_batch_line(ERA_LINES[7][1])
    assert s.iteration == 118 and s.rank == "DP2 PP1"


@pytest.mark.parametrize("line,rank,ts", [
    ("[2026-04-27 16:44:38 DP3 TP6] Prefill batch, #new-seq: 1, #new-token: 9, #cached-token: 0, #running-req: 0, #queue-req: 0, ",
     "DP3", "2026-04-27 16:44:38"),
    ("[2026-08-23 09:09:50 TP0 EP0] Decode batch, #running-req: 1, #token: 5, token usage: 0.00, #queue-req: 0, ", "DP0",
     "2026-08-23 09:09:50"),
    ("[2026-08-27 03:46:31] Decode batch, #running-req: 1, #token: 5, token usage: 0.00, #queue-req: 0, ", "DP0",
     "2026-08-27 03:46:31"),
    ("[timestamp DP5 TP5] Decode batch, #running-req: 1, #token: 5, token usage: 0.00, #queue-req: 0, ", "DP5", None),
    ("(SGLangEngine pid=4410, ip=10.1.2.3) [2026-02-02 02:02:02 DP1 TP1] Decode batch, #running-req: 2, #token: 5, "
     "token usage: 0.00, #queue-req: 0, ", "DP1", "2026-02-02 02:02:02"),
    (" Prefill batch, #new-seq: 1, #new-token: 10, #cached-token: 0, token usage: 0.04, #running-req: 3, #queue-req: 0, "
     "input throughput (token/s): 10.00, cuda graph: False", "DP0", None),
])
def test_rank_prefixes(line, rank, ts):
    s = parse_batch_line(line)
    assert s.rank == rank and s.timestamp == ts


def test_wild_variant_has_unknown_print_order():
    wild = ("Prefill batch, #new-seq: 1, #new-token: 300, #cached-token: 0, token usage: 0.01, #running-req: 1, "
            "#queue-req: 0, input throughput (token/s): 42.00, cuda graph: False")
    assert parse_batch_line(wild).era.after_forward is None


@pytest.mark.parametrize("bad,reason", [
    ("[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: one, #new-token: 5, #cached-token: 0, ", "#new-seq"),
    ("[2026-01-01 00:00:00 TP0] Prefill batch, #cached-token: 0, #running-req: 0, ", "#new-token"),
    ("[2026-01-01 00:00:00 TP0] Decode batch, #token: 5, token usage: 0.1", "#running-req"),
    ("[2026-01-01 00:00:00 TP0] Prefill batch: nothing here", "head"),
])
def test_unparseable_batch_lines_say_why(bad, reason):
    with pytest.raises(LineParseError, match=reason):
        parse_batch_line(bad)


def test_unparsed_lines_are_counted_with_examples_never_dropped():
    good = ERA_LINES[9][1]
    bad = "[2026-03-01 00:00:02 TP0] Prefill batch, #new-seq: ?, #new-token: 77"
    lines = [good, bad, "plain text", bad.replace("77", "78"), good]
    ev = scan_lines(lines)
    assert ev.counts["unparsed_batch_line"] == 2
    assert [x["line"] for x in ev.unparsed_examples] == [2, 4]
    assert ev.counts["prefill_step"] == 2 and ev.counts["other"] == 1
    assert sum(ev.counts.values()) == len(lines)


def test_prefix_rejects_other_brackets():
    assert parse_prefix("(EngineCore_DP0 pid=176) ERROR 05-11 09:30:14 [dump_input.py:79] Dumping") is None
    p = parse_prefix("[2026-01-01 00:00:00.123 DP1 PP0 ATTN_CP0 MOE_DP1 TP3 EP3] hello")
    assert p.ranks == {"DP": 1, "PP": 0, "ATTN_CP": 0, "MOE_DP": 1, "TP": 3, "EP": 3}
    assert p.timestamp == "2026-01-01 00:00:00.123" and p.label() == "DP1 PP0"


@pytest.mark.parametrize("text,after", [("0.5.8", False), ("0.5.9", False), ("0.5.10", True), ("v0.5.12.post1", True),
                                        ("0.4.6.post1", False), ("0.5.10rc0", True), ("0.6", True)])
def test_version_decides_print_order(text, after):
    assert after_forward_for_version(parse_version(text)) is after


def test_bad_version_names_the_flag():
    from validate_batch.errors import InputError

    with pytest.raises(InputError, match="--sglang-version"):
        parse_version("latest-ish")


def test_tp_ranks_of_one_dp_group_are_not_double_counted():
    line = "[2025-04-01 00:00:00 TP{tp}] Prefill batch. #new-seq: 1, #new-token: 100, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0"
    ev = scan_lines([line.format(tp=t) for t in range(4)])
    tl = ev.ranks["DP0"]
    assert tl.num_prefill == 1 and tl.num_mirrored == 3
    assert ev.counts["mirrored_step"] == 3
