"""Forwards as SGLang forms them: chunked prefill, and speculative decode steps run as verify.

Ground truth is arithmetic written here from SGLang's prefill adder (each step gets
``chunked_prefill_size`` tokens, less one per merged decode under mixed chunking; the request that
does not fit is cut at the budget, rounded down to a page boundary of its position, and continues
first in the next step) and the decode kernel's row limit on an H200 (4*(5b+1) <= 232448 B).
"""
import json

import pytest
from typer.testing import CliRunner

from validate_batch import Checker, check
from validate_batch.cli.main import app
from validate_batch.errors import InputError

LIMIT = (232448 - 4) // 20          # 11622 rows on FlashMLA 9241ae3, H200
ENGINE = "sglang-dsv4@pre-25418"    # every forward reaches the decode kernel
runner = CliRunner()


def doc(chunk, *extends, **sa):
    return {"engine": ENGINE, "forward_mode": "extend",
            "server_args": {"chunked_prefill_size": chunk, **sa},
            "requests": [{"id": f"p{i + 1}", "extend_tokens": e} for i, e in enumerate(extends)]}


def pieces(rep):
    return [[(p["id"], p.get("start"), p.get("tokens")) for p in st["pieces"]] for st in rep.context["engine_steps"]["steps"]]


def test_a_long_request_is_checked_as_the_chunks_the_engine_runs():
    rep = check(doc(8192, 20000, 3000))
    assert rep.legal
    assert pieces(rep) == [[("p1", 0, 8192)], [("p1", 8192, 8192)], [("p1", 16384, 20000 - 16384), ("p2", 0, 3000)]]
    assert [s["query_rows"] for s in rep.context["engine_steps"]["steps"]] == [8192, 8192, 20000 - 16384 + 3000]


@pytest.mark.parametrize("chunk,legal", [(LIMIT - 1, True), (LIMIT, True), (LIMIT + 1, False)])
def test_chunk_size_at_the_row_limit(chunk, legal):
    rep = check(doc(chunk, 30000))
    steps = rep.context["engine_steps"]["steps"]
    assert [s["query_rows"] for s in steps][:2] == [chunk, chunk]
    assert rep.legal is legal
    if not legal:
        assert rep.context["engine_steps"]["shown_step"] == 1 and "FMLA001" in rep.codes
        assert rep.context["query_rows"] == chunk


def test_the_first_illegal_step_is_reported_and_later_ones_listed():
    rep = check(doc(16384, 20000, 3000))
    steps = rep.context["engine_steps"]["steps"]
    assert [s["legal"] for s in steps] == [False, True]
    assert rep.context["query_rows"] == 16384 and not rep.legal


def test_a_forward_within_one_chunk_is_checked_as_given():
    rep = check(doc(8192, 4096, 4096))
    assert "engine_steps" not in rep.context and rep.context["query_rows"] == 8192


def test_page_alignment_of_the_cut():
    d = doc(8192, 20000, page_size=64)
    d["requests"][0]["prefix_len"] = 10
    rep = check(d)
    first = (10 + 8192) // 64 * 64 - 10              # the chunk ends on a page boundary of its position
    assert pieces(rep)[0] == [("p1", 0, first)]
    second = (10 + first + 8192) // 64 * 64 - (10 + first)
    assert pieces(rep)[1] == [("p1", first, second)]


def test_mixed_decodes_are_charged_against_the_budget():
    d = doc(8192, 16384, enable_mixed_chunk=True)
    d["running"] = [{"id": "d1", "seq_len": 100}, {"id": "d2", "seq_len": 200}]
    rep = check(d)
    steps = rep.context["engine_steps"]["steps"]
    assert pieces(rep)[0] == [("p1", 0, 8192 - 2)]
    assert [s["query_rows"] for s in steps][0] == 8192          # 8190 tokens + 2 merged decodes


def test_a_budget_the_merged_decodes_use_up_is_an_error():
    d = doc(2, 100, enable_mixed_chunk=True)
    d["running"] = [{"id": "d1", "seq_len": 100}, {"id": "d2", "seq_len": 200}]
    with pytest.raises(InputError) as e:
        check(d)
    assert e.value.field == "server_args.chunked_prefill_size"


def test_checker_document_path_chunks_too():
    c = Checker(ENGINE, server_args={"chunked_prefill_size": 8192})
    rep = c.check({"forward_mode": "extend", "requests": [{"id": "p1", "extend_tokens": 20000}]})
    assert rep.legal and len(rep.context["engine_steps"]["steps"]) == 3


@pytest.mark.parametrize("chunk", [4096, 16384, 65536])
def test_advice_never_raises_the_configured_chunk_size(chunk):
    # the guard's list path checks a step as given (the engine formed it); its advice must not raise
    # the configured chunk size
    c = Checker(ENGINE, server_args={"chunked_prefill_size": chunk})
    rep = c.check("extend", extend_lens=[12000])
    assert not rep.legal
    caps = [s["value"] for s in rep.safe_split.settings if s["flag"] == "--chunked-prefill-size"]
    assert all(v <= chunk for v in caps)
    assert caps == ([LIMIT] if chunk > LIMIT else [])
    fix = next(f.fix for f in rep.findings if f.code == "SGL001")
    assert ("--chunked-prefill-size" in fix) is (chunk > LIMIT)


def test_cli_shows_the_steps():
    res = runner.invoke(app, ["check", "--engine", ENGINE, "--extend", "20000,3000",
                              "--server-arg", "chunked_prefill_size=16384"])
    assert res.exit_code == 1
    assert "into 2 steps" in res.stdout and "p1[0:16384]" in res.stdout and "p1[16384:20000], p2[0:3000]" in res.stdout
    res = runner.invoke(app, ["check", "--engine", ENGINE, "--extend", "20000,3000",
                              "--server-arg", "chunked_prefill_size=16384", "--json"])
    d = json.loads(res.stdout)
    assert d["engine_steps"]["chunk_size"] == 16384 and d["legal"] is False


# ------------------------------------------------------------------ speculative decoding
SPEC = {"speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4}


@pytest.mark.parametrize("n,legal", [(LIMIT // 4, True), (LIMIT // 4 + 1, False)])
def test_a_decode_document_under_speculative_decoding_is_a_verify_forward(n, legal):
    d = {"engine": ENGINE, "forward_mode": "decode", "server_args": SPEC,
         "requests": [{"id": f"r{i}", "seq_len": 100} for i in range(n)]}
    rep = check(d)
    assert rep.context["query_rows"] == 4 * n and rep.legal is legal
    assert any("target_verify" in x for x in rep.context["notes"])


def test_spec_off_keeps_decode():
    d = {"engine": ENGINE, "forward_mode": "decode", "server_args": {"speculative_algorithm": "NONE"},
         "requests": [{"id": f"r{i}", "seq_len": 100} for i in range(3000)]}
    rep = check(d)
    assert rep.context["query_rows"] == 3000 and "notes" not in rep.context


def test_spec_without_draft_tokens_names_the_setting():
    d = {"engine": ENGINE, "forward_mode": "decode", "server_args": {"speculative_algorithm": "EAGLE"},
         "requests": [{"id": "r0", "seq_len": 100}]}
    with pytest.raises(InputError) as e:
        check(d)
    assert e.value.field == "server_args.speculative_num_draft_tokens"
