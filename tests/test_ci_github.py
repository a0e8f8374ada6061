"""CI conventions a new user expects: GitHub code scanning's SARIF properties, annotations on the
error line, several files in one ``check``, ``--output-file``, and settings from ``pyproject.toml``
with the precedence flags > environment > config."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validate_batch.cli import config
from validate_batch.cli.main import app
from validate_batch.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
BATCHES = ROOT / "fixtures" / "batches"
LOG = ROOT / "fixtures" / "logs" / "sglang-dsv4-prefill-12288.log"
WIDE = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
ILLEGAL = BATCHES / "dsv4-1x12000.json"      # one prompt of 12000 rows > 11622 (FMLA001)
LEGAL = BATCHES / "dsv4-1x4096.yaml"
ENV_KEYS = ("VALIDATE_BATCH_ENGINE", "VALIDATE_BATCH_GPU", "VALIDATE_BATCH_BUILD", "VALIDATE_BATCH_SELECT",
            "VALIDATE_BATCH_IGNORE")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ENV_KEYS:
        monkeypatch.delenv(k, raising=False)


def invoke(args, env=None):
    r = CliRunner(env={**WIDE, **(env or {})}).invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"{args} raised {r.exception!r}") from r.exception
    return r


# GitHub's "SARIF support for code scanning" page (github/docs, content/code-security/code-scanning/
# integrating-with-code-scanning/sarif-support-for-code-scanning.md): the properties it marks required.
def _required(obj: dict, *paths: str) -> None:
    for path in paths:
        v = obj
        for key in path.split("."):
            assert isinstance(v, dict) and key in v, f"missing {path}"
            v = v[key]
        assert v not in ("", None, []), f"empty {path}"    # "the empty string is not supported"


def _github_accepts(log: dict) -> None:
    _required(log, "$schema", "version", "runs")
    assert log["version"] == "2.1.0"
    for run in log["runs"]:
        _required(run, "tool.driver.name", "tool.driver.version", "tool.driver.informationUri")
        assert "results" in run and "rules" in run["tool"]["driver"]
        rules = run["tool"]["driver"]["rules"]
        for r in rules:
            _required(r, "id", "shortDescription.text", "fullDescription.text", "help.text")
            assert len(r["shortDescription"]["text"]) <= 1024 and len(r["fullDescription"]["text"]) <= 1024
            assert r.get("defaultConfiguration", {}).get("level", "warning") in ("note", "warning", "error")
        for res in run["results"]:
            _required(res, "message.text", "locations")
            assert 1 <= len(res["locations"]) <= 10
            assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
            loc = res["locations"][0]
            _required(loc, "physicalLocation.artifactLocation.uri", "physicalLocation.region.startLine",
                      "physicalLocation.region.startColumn", "physicalLocation.region.endLine",
                      "physicalLocation.region.endColumn")
            reg = loc["physicalLocation"]["region"]
            assert reg["startLine"] >= 1 and reg["endLine"] >= reg["startLine"] and reg["endColumn"] > reg["startColumn"] >= 1


def test_sarif_has_what_github_requires():
    log = json.loads(invoke(["check", BATCHES, "-f", "sarif"]).stdout)
    _github_accepts(log)
    from importlib.metadata import version

    assert log["runs"][0]["tool"]["driver"]["version"] == version("validate-batch")
    rule = {r["id"]: r for r in log["runs"][0]["tool"]["driver"]["rules"]}["FMLA001"]
    assert "validate-batch explain FMLA001" in rule["help"]["text"] and rule["help"]["markdown"].startswith("**FMLA001")


def test_sarif_result_points_at_the_step_line(tmp_path):
    f = tmp_path / "b.yaml"
    text = ILLEGAL.read_text()
    doc = json.loads(text)
    lines = ["label: x", f"engine: {doc['engine']}", "gpu: H200", "forward_mode: extend",
             "server_args: {enable_mixed_chunk: false}", "requests:", "  - {id: long, extend_tokens: 12000}"]
    f.write_text("\n".join(lines) + "\n")
    log = json.loads(invoke(["check", f, "-f", "sarif"]).stdout)
    _github_accepts(log)
    # the first step key found in the file: forward_mode on line 4 ("requests" on line 6 comes first in the key order)
    regions = {r["locations"][0]["physicalLocation"]["region"]["startLine"] for r in log["runs"][0]["results"]}
    assert regions == {6}


def test_bisect_sarif_and_github_name_the_error_line():
    no = next(i for i, ln in enumerate(LOG.read_text().splitlines(), 1) if "CUDA error" in ln)
    r = invoke(["bisect", LOG, "-f", "github", "--no-progress"])
    assert r.exit_code == 1
    (err,) = [ln for ln in r.stdout.splitlines() if ln.startswith("::error ")]
    assert f",line={no}," in err
    log = json.loads(invoke(["bisect", LOG, "-f", "sarif", "--no-progress"]).stdout)
    _github_accepts(log)
    assert {x["locations"][0]["physicalLocation"]["region"]["startLine"] for x in log["runs"][0]["results"]} == {no}


def test_sarif_validates_against_the_sarif_schema():
    """The SARIF 2.1.0 JSON schema where it is on this machine: OASIS's sarif-schema-2.1.0.json (in the
    oasis-tcs/sarif-spec repository, sarif-2.1/schema/; read at commit e058381), named by
    VALIDATE_BATCH_SARIF_SCHEMA; it is not shipped with the tests."""
    jsonschema = pytest.importorskip("jsonschema")
    path = os.environ.get("VALIDATE_BATCH_SARIF_SCHEMA") or str(ROOT / "fixtures" / "sarif" / "sarif-schema-2.1.0.json")
    if not os.path.isfile(path):
        pytest.skip(f"no SARIF 2.1.0 schema at {path} (set VALIDATE_BATCH_SARIF_SCHEMA)")
    schema = json.loads(Path(path).read_text())
    for args in (["check", BATCHES, "-f", "sarif"], ["bisect", LOG, "-f", "sarif", "--no-progress"]):
        jsonschema.validate(json.loads(invoke(args).stdout), schema)


# several files, --output-file -----------------------------------------------------------------------
def test_check_several_files_is_corpus_mode(tmp_path):
    r = invoke(["check", LEGAL, ILLEGAL])
    assert r.exit_code == 1, r.output
    assert "2 file(s): 1 legal, 1 illegal, 0 bad input" in r.stdout
    d = json.loads(invoke(["check", LEGAL, ILLEGAL, "--json"]).stdout)
    assert [(Path(f["file"]).name, f["status"]) for f in d["files"]] == [(LEGAL.name, "legal"), (ILLEGAL.name, "illegal")]
    assert d["inputs"] == [str(LEGAL), str(ILLEGAL)]
    assert invoke(["check", LEGAL, LEGAL]).exit_code == 0
    r = invoke(["check", LEGAL, tmp_path / "missing.yaml"])
    assert r.exit_code == 2 and "missing.yaml" in r.stdout


def test_output_file(tmp_path):
    out = tmp_path / "batches.sarif"
    r = invoke(["check", BATCHES, "-f", "sarif", "--output-file", out])
    assert r.exit_code == 1 and r.stdout == ""
    _github_accepts(json.loads(out.read_text()))
    out = tmp_path / "v.json"
    r = invoke(["check", LEGAL, "--json", "--output-file", out])
    assert r.exit_code == 0 and r.stdout == "" and json.loads(out.read_text())["legal"] is True
    out = tmp_path / "v.txt"
    assert invoke(["check", ILLEGAL, "--output-file", out]).exit_code == 1
    assert "verdict: ILLEGAL" in out.read_text()
    out = tmp_path / "m.jsonl"
    assert invoke(["metadata", ROOT / "fixtures" / "oracle" / "flashmla_h200_cases.jsonl", "-f", "jsonl",
                   "--output-file", out]).exit_code in (0, 1)
    assert out.read_text().count("\n") > 10
    r = invoke(["check", LEGAL, "--output-file", tmp_path / "no" / "such" / "dir.txt"])
    assert r.exit_code == 2 and "--output-file" in r.output


# config: flags > environment > [tool.validate-batch] ---------------------------------------------------
def _project(tmp_path, table: str) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n\n[tool.validate-batch]\n" + table)
    (tmp_path / "sub").mkdir()
    return tmp_path / "sub"          # run from a subdirectory: the nearest pyproject.toml above is read


def _codes(r) -> list[str]:
    return sorted({f["code"] for f in json.loads(r.stdout)["findings"]})


def test_config_select_ignore_precedence(tmp_path, monkeypatch):
    assert _codes(invoke(["check", ILLEGAL, "--json"])) == ["FMLA001", "SGL001"]
    monkeypatch.chdir(_project(tmp_path, 'ignore = ["SGL"]\n'))
    assert _codes(invoke(["check", ILLEGAL, "--json"])) == ["FMLA001"]                   # config
    env = {"VALIDATE_BATCH_IGNORE": "FMLA001"}
    assert _codes(invoke(["check", ILLEGAL, "--json"], env)) == ["SGL001"]               # env > config
    assert _codes(invoke(["check", ILLEGAL, "--json", "--ignore", "FMLA001,SGL"], env)) == []   # flag > env
    assert invoke(["check", ILLEGAL], {"VALIDATE_BATCH_IGNORE": "FMLA001,SGL"}).exit_code == 0


def test_config_gpu_build_engine(tmp_path, monkeypatch):
    call = tmp_path / "call.json"       # 12000 rows: FMLA001 by the default build (limit 11622), not by sgl-flash-mla 1.0.0
    call.write_text(json.dumps({"kind": "sparse", "b": 12000, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}))
    base = json.loads(invoke(["check", call, "--json"]).stdout)
    assert base["gpu"]["name"] == "H200" and not base["legal"]
    monkeypatch.chdir(_project(tmp_path, 'build = "sgl-flash-mla-1.0.0"\nengine = "sglang-dsv4@pre-25418"\n'))
    assert json.loads(invoke(["check", call, "--json"]).stdout)["legal"] is True                       # config
    assert invoke(["check", call], {"VALIDATE_BATCH_BUILD": "flashmla-9241ae3"}).exit_code == 1        # env > config
    assert invoke(["check", call, "--build", "sgl-flash-mla-1.0.0"], {"VALIDATE_BATCH_BUILD": "flashmla-9241ae3"}).exit_code == 0
    # engine: a quick batch without --engine, and a batch document that names none
    r = invoke(["check", "--extend", "3x4096", "--decode", "1", "--json", "--build", "flashmla-9241ae3"])
    assert r.exit_code == 1 and "FMLA001" in _codes(r)
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text("forward_mode: extend\nrequests:\n  - {id: a, extend_tokens: 12000}\nrunning:\n  - {id: d, seq_len: 9}\n")
    assert "FMLA001" in _codes(invoke(["check", nameless, "--json", "--build", "flashmla-9241ae3"]))
    monkeypatch.chdir(_project(tmp_path / "g" if (tmp_path / "g").mkdir() is None else tmp_path, 'gpu = "H20"\n'))
    assert json.loads(invoke(["check", call, "--json"]).stdout)["gpu"]["name"] == "H20"
    assert json.loads(invoke(["check", call, "--json"], {"VALIDATE_BATCH_GPU": "H100-SXM"}).stdout)["gpu"]["name"] == "H100-SXM"
    assert json.loads(invoke(["check", call, "--json", "--gpu", "H200"], {"VALIDATE_BATCH_GPU": "H100-SXM"}).stdout)["gpu"]["name"] == "H200"


def test_config_errors_are_bad_input(tmp_path, monkeypatch):
    monkeypatch.chdir(_project(tmp_path, 'selekt = ["SGL"]\n'))
    r = invoke(["check", ILLEGAL])
    assert r.exit_code == 2 and "selekt" in r.output and "tool.validate-batch" in r.output
    monkeypatch.chdir(_project(tmp_path / "b" if (tmp_path / "b").mkdir() is None else tmp_path, 'gpu = 3\n'))
    r = invoke(["check", ILLEGAL])
    assert r.exit_code == 2 and "gpu" in r.output
    r = invoke(["check", "--extend", "4096"])
    assert r.exit_code == 2


# the table is found wherever TOML can spell its key; a file that cannot spell it is not parsed
@pytest.mark.parametrize("text", [
    "[tool.validate-batch]\ngpu = 'H20'\n",
    '[ tool . "validate-batch" ]\ngpu = "H20"\n',
    "[tool]\nvalidate-batch = { gpu = 'H20' }\n",
    'tool.validate-batch.gpu = "H20"\n',
    '[tool."validate\\u002dbatch"]\ngpu = "H20"\n',          # the hyphen as a \u escape
    '[tool."validate\\U0000002Dbatch"]\ngpu = "H20"\n',
])
def test_config_table_in_every_spelling(tmp_path, text):
    # (first in the file: a dotted key after another table's header would be that table's)
    (tmp_path / "pyproject.toml").write_text(text + "\n[project]\nname = 'x'\n")
    assert config.resolve({"gpu": None}, str(tmp_path)) == {"gpu": "H20"}


def test_config_file_that_cannot_hold_the_table_is_not_parsed(tmp_path):
    # not TOML at all (an unclosed table header), but no spelling of the key: no table, no error
    (tmp_path / "pyproject.toml").write_text("[project\nname = 'x'\n[tool.ruff]\nline-length = 100\n")
    assert config.resolve({"gpu": None, "build": None}, str(tmp_path)) == {"gpu": None, "build": None}
    # the same file naming the table is read, and its syntax error is bad input naming the file
    (tmp_path / "pyproject.toml").write_text("[project\nname = 'x'\n[tool.validate-batch]\ngpu = 'H20'\n")
    with pytest.raises(InputError) as e:
        config.resolve({"gpu": None}, str(tmp_path))
    assert "pyproject.toml" in e.value.field and "cannot read [tool.validate-batch]" in str(e.value)
