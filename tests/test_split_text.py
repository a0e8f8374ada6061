"""The one rendering of a safe split, read by reports, explain and bisect."""
from __future__ import annotations

import validator
from validator.split_text import abbreviated, piece, split_lines, split_summary


def test_pieces_and_abbreviation():
    assert piece({"id": "p3", "start": 3430, "tokens": 666}) == "p3[3430:4096]"
    assert piece({"id": "d1", "start": 0, "tokens": 1, "decode": True}) == "d1"
    assert abbreviated(["a", "b", "c", "d"], "requests") == "a, b, c, d"
    assert abbreviated([f"r{i}" for i in range(11622)], "requests") == "11622 requests (r0 .. r11621)"


def test_every_output_renders_the_same_split():
    v = validator.Checker(engine="sglang-dsv4@pre-25418").verdict("extend", extend_lens=[4096] * 3, rids=["p1", "p2", "p3"])
    d = v.safe_split.to_dict()
    lines = split_lines(d)
    assert lines[:4] == ["safe split:", "  2 step(s), whole requests in order:", "    step 1: p1, p2", "    step 2: p3"]
    # 11622 - 8192 = 3430 tokens of p3 fit in the first chunked step
    assert "    step 1: p1[0:4096], p2[0:4096], p3[0:3430]" in lines
    assert "\n".join(lines) in validator.explain(v.report)
    assert split_summary(d) == "safe split: 2 step(s) of whole requests: p1, p2; p3"
    assert split_summary({"possible": False, "reason": "why"}) == "safe split: none (why)"
