"""One step, one verdict: an extend of 3 x 4096 new tokens under chunked_prefill_size 8192.

As written it is one step of 12288 query rows, past the 11622 rows FlashMLA's decode scheduler
fits in an H200's 232448 B (4*(5b+1) B: 4*(5*11622+1) = 232444 <= 232448 < 4*(5*11623+1) = 232464).
The engine does not run that forward: chunking cuts it into 8192 + 4096 new tokens, each within the
limit. Every path judges the step as written the same way, and a document the engine would chunk says
so in its verdict and can be asked for the step as written.
"""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import validate_batch
from validate_batch.cli.main import app
from validate_batch.guard.checker import Checker
from validate_batch.pytest_plugin import assert_batch_illegal, assert_batch_legal

ENGINE = "sglang-dsv4@pre-25418"
LIMIT = 11622
assert 4 * (5 * LIMIT + 1) <= 232448 < 4 * (5 * (LIMIT + 1) + 1)


def doc(chunk: int, n: int = 3, tokens: int = 4096, **extra) -> dict:
    return {"engine": ENGINE, "gpu": "H200", "forward_mode": "extend",
            "server_args": {"chunked_prefill_size": chunk, "enable_mixed_chunk": False},
            "requests": [{"id": f"p{i}", "extend_tokens": tokens} for i in range(n)], **extra}


def checker(chunk: int) -> Checker:
    return Checker(ENGINE, "H200", {"chunked_prefill_size": chunk, "enable_mixed_chunk": False})


@pytest.mark.parametrize("chunk", [8192, 16384])
def test_the_step_as_written_gets_one_verdict_on_every_path(chunk):
    c = checker(chunk)
    lists = c.verdict("extend", [4096] * 3)
    full = c.check("extend", [4096] * 3)
    as_doc = c.check(doc(chunk), as_written=True)
    in_doc = c.check(doc(chunk, as_written=True))
    api = validate_batch.check(doc(chunk), chunk=False)
    api_doc = validate_batch.check(doc(chunk, as_written=True))
    verdicts = [lists.legal, full.legal, as_doc.legal, in_doc.legal, api.legal, api_doc.legal]
    assert verdicts == [False] * 6
    assert {tuple(r.codes) for r in (lists.report, full, as_doc, in_doc, api, api_doc)} == {("FMLA001", "SGL001")}
    r = CliRunner().invoke(app, ["check", "--engine", ENGINE, "--extend", "3x4096", "--server-arg",
                                 f"chunked_prefill_size={chunk}", "--as-written", "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["legal"] is False
    with pytest.raises(pytest.fail.Exception):
        assert_batch_legal(doc(chunk), as_written=True)
    assert_batch_illegal(doc(chunk), "FMLA001", as_written=True)


def test_a_document_the_engine_chunks_says_so_and_gives_both_verdicts():
    r = validate_batch.check(doc(8192))
    assert r.legal
    es = r.context["engine_steps"]
    assert [s["query_rows"] for s in es["steps"]] == [8192, 4096] and all(s["legal"] for s in es["steps"])
    assert es["as_written"] == {"legal": False, "codes": ["FMLA001", "SGL001"], "query_rows": 12288}
    assert checker(8192).check(doc(8192)).context["engine_steps"]["as_written"]["legal"] is False
    # 3 x 3874 = 11622 rows as written: legal either way (the limit); 3 x 3875 = 11625: illegal as written
    assert validate_batch.check(doc(8192, tokens=3874)).context["engine_steps"]["as_written"]["legal"] is True
    assert validate_batch.check(doc(8192, tokens=3875)).context["engine_steps"]["as_written"]["legal"] is False
    out = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["check", "--engine", ENGINE, "--extend", "3x4096",
                                                         "--server-arg", "chunked_prefill_size=8192"])
    assert out.exit_code == 0
    assert "verdict: LEGAL (as the engine's 2 chunk steps)" in out.stdout
    assert "as written (one step of 12288 rows" in out.stdout and "ILLEGAL FMLA001, SGL001" in out.stdout


def test_the_pytest_failure_names_the_chunking():
    with pytest.raises(pytest.fail.Exception) as e:
        assert_batch_illegal(doc(8192))
    msg = str(e.value)
    assert "expected an illegal batch, but it is legal" in msg
    assert "chunked_prefill_size 8192 cuts the 12288 new tokens into 2 steps" in msg
    assert "as written, one step of 12288 rows is ILLEGAL (FMLA001, SGL001)" in msg and "as_written=True" in msg


def test_a_step_judged_as_written_notes_the_chunking():
    v = checker(8192).verdict("extend", [4096] * 3)
    notes = v.report.context["notes"]
    assert any("the engine cuts such a forward into 2 steps" in n for n in notes)
    # within one chunk: no note (8192 new tokens, the budget)
    r = checker(8192).check("extend", [4096, 4096])
    assert not any("as written" in n for n in r.context.get("notes", []))
    r = checker(8192).check("extend", [4096, 4097])
    assert any("as written" in n for n in r.context.get("notes", []))


def test_as_written_must_be_a_boolean():
    with pytest.raises(validate_batch.InputError, match="as_written"):
        validate_batch.check(doc(8192, as_written="yes"))


def test_as_written_in_corpus_mode(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(doc(8192)))
    (tmp_path / "b.json").write_text(json.dumps(doc(8192, tokens=3874)))     # 11622 rows as written: legal
    r = CliRunner().invoke(app, ["check", str(tmp_path), "--json"])
    assert r.exit_code == 0 and [f["status"] for f in json.loads(r.stdout)["files"]] == ["legal", "legal"]
    r = CliRunner().invoke(app, ["check", str(tmp_path), "--json", "--as-written"])
    assert r.exit_code == 1 and [f["status"] for f in json.loads(r.stdout)["files"]] == ["illegal", "legal"]
