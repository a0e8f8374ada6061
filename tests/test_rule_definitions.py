"""A rule is one definition: its page has the fixed sections and every number filled, its failure class
is data that agrees with the prose, and a rule added with a definition only reaches every reader
(``explain``, ``rules``, the generated catalog, bisect's signature matching).

Expected numbers are worked out here from first principles: FlashMLA's scheduler needs ``4*(5b+1)``
bytes of the H200's 232448 (``shared_memory_per_block_optin``, measured), DeepGEMM's paged MQA-logits
metadata ``4*align(b, 32)`` (SM90), ``8*b`` (SM100) or ``4 + 12*align(b, 32)`` (varlen) bytes of the
same capacity, CUDA's grid allows 65535 blocks on y and z.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validate_batch.api import check
from validate_batch.cli.main import app
from validate_batch.legality.failure import KINDS, Failure, failure_of
from validate_batch.ingest.crash_lines import ErrorEvent, classify_error
from validate_batch.ingest.signatures import matching_codes
from validate_batch.legality.ruleset import all_rules, all_signatures, get_rule, rule, unregister

ROOT = Path(__file__).resolve().parents[1]
H200_SMEM = 232448
SECTIONS = ("What it checks", "Why it crashes", "Example", "Fix", "Source")


def _align(x: int, m: int) -> int:
    return -(-x // m) * m


def _largest(fits) -> int:
    """The largest b >= 1 for which ``fits(b)`` holds (monotone), by bisection."""
    lo, hi = 1, 1 << 20
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


# ------------------------------------------------------------------ pages
@pytest.mark.parametrize("code", [r.code for r in all_rules()])
def test_every_page_has_the_sections_in_order_and_no_placeholder_left(code):
    doc = get_rule(code).doc
    heads = re.findall(r"^## (.+)$", doc, flags=re.M)
    assert tuple(heads) == SECTIONS, (code, heads)
    summary = doc.split("\n## ", 1)[0].strip()
    assert summary, f"{code}: the page starts with a one-paragraph summary"
    for name in SECTIONS:
        body = doc.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0].strip()
        assert body, (code, name)
    assert "{{" not in doc and "}}" not in doc, code


def test_pages_quote_the_numbers_the_data_gives():
    rows = _largest(lambda b: 4 * (5 * b + 1) <= H200_SMEM)                 # 11622
    page = get_rule("FMLA001").doc
    assert f"so ``b <= {rows}``" in page and f"({H200_SMEM} bytes on SM90" in page
    assert f"needs {4 * (5 * 12288 + 1)} B\nof {H200_SMEM} B" in page
    assert f"at or below {rows} rows" in page
    threshold = next(v["sparse_prefill_threshold"] for v in
                     json.loads((ROOT / "rules/engines.json").read_text())["profiles"]["sglang-dsv4"]["versions"]
                     if v.get("sparse_prefill_threshold") is not None)
    assert f"the real limit is {rows}, so {rows + 1}..{threshold}-row" in get_rule("SGL001").doc
    dg = get_rule("DG001").doc
    sm90 = _largest(lambda b: 4 * _align(b, 32) <= H200_SMEM)
    varlen = _largest(lambda b: 4 + 12 * _align(b, 32) <= H200_SMEM) // 32 * 32
    sm100 = _largest(lambda b: 8 * b <= H200_SMEM)
    assert (sm90, varlen, sm100) == (58112, 19360, 29056)
    assert f"b <= {sm90}" in dg and f"b <= {varlen}" in dg and f"(b <= {sm100})" in dg
    assert f'"batch": {sm100 + 1}' in dg and f"more than {threshold} rows" in dg
    assert "at most 65535 requests per call" in get_rule("FI001").doc
    grid = get_rule("FMLA017").doc
    assert "y <= 65535, z <= 65535" in grid and f"``s_q*h_q <= {65535 * 8}``" in grid
    assert f"``s_q <= {65535 * 8 // 128}`` at\n``h_q = 128``" in grid


def test_explain_prints_the_filled_page():
    out = CliRunner().invoke(app, ["explain", "FMLA001"])
    assert out.exit_code == 0 and "b <= 11622" in out.stdout and "{{" not in out.stdout


# ------------------------------------------------------------------ failure classes as data
def _names(text: str, kind: str) -> bool:
    """Whether the prose names the failure kind (in its own words where it has them)."""
    words = {"process_crash": ("host assertion", "SIGSEGV", "segfault"), "device_assert": ("device-side assert",),
             "illegal_memory_access": ("illegal memory access",)}
    return kind in text or any(w in text for w in words.get(kind, ()))


@pytest.mark.parametrize("code", [r.code for r in all_rules()])
def test_failure_class_agrees_with_its_prose_and_signatures(code):
    r = get_rule(code)
    f = r.failure
    assert isinstance(f, Failure)
    assert set(f.kinds) <= set(KINDS), (code, f.kinds)
    if r.severity == "error":
        assert f.kind and str(f).startswith(f.kind), code
    for k in f.also:
        assert _names(str(f), k), (code, k)
    files = {s.file for s in r.signatures}
    if f.site:
        assert f.site.split(":", 1)[0] in files, (code, f.site)
    if f.message:
        assert f.message in {s.message.pattern for s in r.signatures if s.message is not None}, (code, f.message)


def test_a_knowledge_file_failure_is_read_into_its_kinds():
    f = failure_of("python_exception or host assertion")
    assert (f.kind, f.kinds) == ("python_exception", ("python_exception", "process_crash"))
    f = failure_of("process_exit: a 64-token tile is unsupported")     # "ok" in "token" is no kind
    assert f.kinds == ("process_exit",) and str(f) == "process_exit: a 64-token tile is unsupported"
    same = Failure("process_exit", "exit(1)", site="x.cu:1")
    assert failure_of(same) is same and str(same) == "process_exit: exit(1)"


def test_a_finding_carries_its_rules_failure_class():
    rep = check({"kind": "sparse", "b": 12288, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512})
    f = next(x for x in rep.findings if x.code == "FMLA001")
    assert f.failure.kind == "process_exit" and f.failure.site == "get_decoding_sched_meta.cu:111"
    assert json.loads(json.dumps(f.to_dict()))["failure"] == str(get_rule("FMLA001").failure)


def test_the_rules_table_shows_failure_kinds():
    out = CliRunner().invoke(app, ["rules"], env={"COLUMNS": "300"}).stdout
    row = next(line for line in out.splitlines() if "FMLA005" in line)
    assert "process_crash or python_exception" in row and "h_q outside" not in row


def test_the_catalog_is_generated_from_the_definitions():
    cat = json.loads(CliRunner().invoke(app, ["rules", "--json"]).stdout)
    assert [e["code"] for e in cat] == sorted(r.code for r in all_rules())
    fmla001 = next(e for e in cat if e["code"] == "FMLA001")
    assert fmla001["failure_class"] == {"kind": "process_exit", "site": "get_decoding_sched_meta.cu:111",
                                        "message": "invalid argument"}
    assert {"file": "get_decoding_sched_meta.cu", "lines": [111, 111], "message": "invalid argument"}.items() <= \
        fmla001["signatures"][0].items()
    assert sum(len(e["signatures"]) for e in cat) == len(all_signatures())
    # (rules/catalog.json is this listing written out for a fast start: tests/test_rule_catalog.py)


# ------------------------------------------------------------------ a rule added with its definition only
LOG = """[2026-04-28 10:12:05 TP0 EP0] Prefill batch, #new-seq: 3, #new-token: 12288, #cached-token: 0, full token usage: 0.01, swa token usage: 0.04, #running-req: 1, #queue-req: 0, 
CUDA error (/opt/tst/csrc/tst_rows_kernel.cu:12): too many rows
"""


@pytest.fixture
def new_rule():
    @rule("TST950", scope="batch", reads="rows", title="more than the test kernel's rows",
          failure=Failure("process_exit", "the test kernel prints its error and exits", site="tst_rows_kernel.cu:12",
                          message="too many rows"),
          source="this test",
          signatures=[{"library": "tst", "file": "tst_rows_kernel.cu", "lines": [12, 12], "message": "too many rows",
                       "failure": "process_exit", "source": "this test"}],
          page=lambda: {"limit": 5000})
    def rows_5000(bp):
        """At most {{limit}} query rows per forward (test rule).

        ## What it checks
        The forward's query rows, at most {{limit}}.

        ## Why it crashes
        The test kernel exits.

        ## Example
        A prefill of {{limit}} + 1 tokens.

        ## Fix
        Chunk prefills at {{limit}}.

        ## Source
        This test.
        """
        if bp.rows is not None and bp.rows > 5000:
            return [rows_5000.rule.finding(f"expected <= 5000 rows, got {bp.rows}", numbers={"rows": bp.rows})]
        return None

    yield rows_5000.rule
    unregister("TST950")


def test_a_rule_defined_once_reaches_explain_rules_the_catalog_and_bisect(new_rule, tmp_path):
    runner = CliRunner()
    page = runner.invoke(app, ["explain", "TST950"])
    assert page.exit_code == 0
    assert "TST950 - more than the test kernel's rows  (severity: error)" in page.stdout
    assert "At most 5000 query rows per forward" in page.stdout and "Chunk prefills at 5000." in page.stdout
    assert "How it fails: process_exit: the test kernel prints its error and exits" in page.stdout
    assert "TST950" in runner.invoke(app, ["rules"], env={"COLUMNS": "300"}).stdout
    entry = next(e for e in json.loads(runner.invoke(app, ["rules", "--json"]).stdout) if e["code"] == "TST950")
    assert entry["family"] == "TST" and entry["failure_class"]["site"] == "tst_rows_kernel.cu:12"
    assert entry["signatures"] == [{"library": "tst", "failure": "process_exit", "file": "tst_rows_kernel.cu", "lines": [12, 12],
                                    "message": "too many rows", "source": "this test"}]
    test_every_page_has_the_sections_in_order_and_no_placeholder_left("TST950")
    log = tmp_path / "server.log"
    log.write_text(LOG)
    res = runner.invoke(app, ["bisect", str(log), "--json"])
    d = json.loads(res.stdout)
    assert d["explanation"]["signature_matches"] == ["TST950"]
    assert "TST950" in d["rule"] and res.exit_code == 1


def test_a_removed_rule_leaves_every_reader(new_rule):
    line = "CUDA error (/opt/tst/csrc/tst_rows_kernel.cu:12): too many rows"
    got = classify_error(line)
    kind, nums = got[0], got[1]
    err = ErrorEvent(kind, 1, line, numbers=nums)
    assert matching_codes(err) == ["TST950"]
    unregister("TST950")
    assert matching_codes(err) == [] and get_rule("TST950") is None
    assert "TST950" not in CliRunner().invoke(app, ["rules", "--json"]).stdout
