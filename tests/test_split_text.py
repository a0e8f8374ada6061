"""The one rendering of a safe split, read by reports, explain and bisect."""
from __future__ import annotations

import validate_batch
from validate_batch.output.split_text import abbreviated, piece, split_lines, split_summary


def test_pieces_and_abbreviation():
    assert piece({"id": "p3", "start": 3430, "tokens": 666}) == "p3[3430:4096]"
    assert piece({"id": "d1", "start": 0, "tokens": 1, "decode": True}) == "d1"
    assert abbreviated(["a", "b", "c", "d"], "requests") == "a, b, c, d"
    assert abbreviated([f"r{i}" for i in range(11622)], "requests") == "11622 requests (r0 .. r11621)"


def test_every_output_renders_the_same_split():
    v = validate_batch.Checker(engine="sglang-dsv4@pre-25418").verdict("extend", extend_lens=[4096] * 3, rids=["p1", "p2", "p3"])
    d = v.safe_split.to_dict()
    lines = split_lines(d)
    assert lines[:4] == ["safe split:", "  2 step(s), whole requests in order:", "    step 1: p1, p2", "    step 2: p3"]
    # 11622 - 8192 = 3430 tokens of p3 fit in the first chunked step
    assert "    step 1: p1[0:4096], p2[0:4096], p3[0:3430]" in lines
    assert "\n".join(lines) in validate_batch.explain(v.report)
    assert split_summary(d) == "safe split: 2 step(s) of whole requests: p1, p2; p3"
    assert split_summary({"possible": False, "reason": "why"}) == "safe split: none (why)"


def test_long_steps_print_as_a_range():
    from validate_batch.output.split_text import step_items

    assert step_items(["a", "b"]) == "a, b"
    assert step_items([f"p{i}" for i in range(1, 11623)]) == "p1..p11622 (11622 requests)"
    sp = {"possible": True, "steps": [[f"p{i}" for i in range(1, 501)], ["p501"]], "chunked_steps": None}
    assert split_lines(sp)[2:4] == ["    step 1: p1..p500 (500 requests)", "    step 2: p501"]


def test_wrapped_to_the_width():
    from validate_batch.output.split_text import wrapped

    line = "  prevent: --chunked-prefill-size 11622 - " + "word " * 30
    out = wrapped([line, "short"], 40)
    assert all(len(x) <= 40 for x in out) and len(out) > 3 and out[-1] == "short"
    assert all(x.startswith("    ") for x in out[1:-1])
    assert " ".join(x.strip() for x in out[:-1]) == " ".join(line.split())
    assert wrapped([line], None) == [line]


def test_human_output_of_a_many_request_batch_is_abbreviated_and_wrapped(tmp_path):
    from typer.testing import CliRunner

    from validate_batch.cli.main import app

    reqs = "".join(f"  - {{id: p{i}, extend_tokens: 20}}\n" for i in range(1, 1201))
    f = tmp_path / "many.yaml"
    f.write_text("engine: sglang-dsv4@pre-25418\ngpu: H200\nforward_mode: extend\nrequests:\n" + reqs)
    r = CliRunner(env={"COLUMNS": "70", "NO_COLOR": "1", "TERM": "dumb"}).invoke(app, ["check", str(f)])
    assert r.exit_code == 1
    split = r.output.split("safe split:", 1)[1]
    assert all(len(x) <= 70 for x in split.splitlines())
    assert "step 1: p1.." in split and "p22, p23" not in split
    assert "(1200 requests)" not in split          # split into several steps
