"""CI-grade output: corpus mode (a directory of batches), --output-format text|json|jsonl|github|junit|
sarif, --select / --ignore / --statistics, -h."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import validate_batch
from validate_batch.cli.main import app
from validate_batch.output.formats import gh_data, gh_property

ROOT = Path(__file__).resolve().parent.parent
BATCHES = ROOT / "fixtures" / "batches"
WIDE = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
ILLEGAL_CALL = {"kind": "sparse", "b": 11623, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
LEGAL_CALL = {"kind": "sparse", "b": 11622, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}


def invoke(args, stdin: str | None = None):
    result = CliRunner(env=WIDE).invoke(app, [str(a) for a in args], input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"validate-batch {args} raised {result.exception!r}") from result.exception
    return result


def _load(path: Path):
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def fixture_verdicts() -> dict[str, bool]:
    """Each fixture batch's legality by the Python API (not by the CLI under test)."""
    return {str(p): validate_batch.check(_load(p)).legal for p in sorted(BATCHES.iterdir())
            if p.suffix in (".yaml", ".yml", ".json")}


@pytest.fixture
def corpus(tmp_path):
    """A directory with a legal call, an illegal call, a broken file and a file that is not a batch."""
    (tmp_path / "a-legal.json").write_text(json.dumps(LEGAL_CALL))
    (tmp_path / "b-illegal.jsonl").write_text(json.dumps(ILLEGAL_CALL) + "\n")
    (tmp_path / "c-broken.yaml").write_text("requests: [1, 2\n")
    (tmp_path / "notes.txt").write_text("not checked")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "d-illegal.json").write_text(json.dumps(ILLEGAL_CALL))
    return tmp_path


# corpus mode ------------------------------------------------------------------------------------
def test_corpus_of_fixture_batches_table_and_exit_1():
    r = invoke(["check", BATCHES])
    verdicts = fixture_verdicts()
    assert r.exit_code == 1 and any(not v for v in verdicts.values())
    rows = [line for line in r.output.splitlines() if "fixtures/batches/" in line]
    assert len(rows) == len(verdicts)
    for path, legal in verdicts.items():
        row = next(line for line in rows if path in line)
        assert ("ILLEGAL" in row) is (not legal), row
    assert f"{sum(verdicts.values())} legal, {sum(not v for v in verdicts.values())} illegal" in r.output


def test_corpus_legal_only_exits_0(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps(LEGAL_CALL))
    r = invoke(["check", tmp_path])
    assert r.exit_code == 0, r.output
    assert "1 legal, 0 illegal, 0 bad input" in r.output


def test_corpus_bad_input_exits_2_and_still_checks_the_others(corpus):
    r = invoke(["check", corpus])
    assert r.exit_code == 2, r.output
    assert "b-illegal.jsonl" in r.output and "ILLEGAL" in r.output and "a-legal.json" in r.output
    assert "notes.txt" not in r.output and "d-illegal" not in r.output          # not recursive
    errs = [line for line in r.output.splitlines() if line.startswith("error: ") and "c-broken.yaml" in line]
    assert len(errs) == 1


def test_corpus_recursive_and_exit_zero(corpus):
    (corpus / "c-broken.yaml").unlink()
    r = invoke(["check", corpus, "--recursive", "--exit-zero"])
    assert r.exit_code == 0
    assert "d-illegal.json" in r.output


def test_corpus_empty_directory_is_bad_input(tmp_path):
    r = invoke(["check", tmp_path])
    assert r.exit_code == 2


def test_corpus_json(corpus):
    r = invoke(["check", corpus, "--output-format", "json"])
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["schema"] == "validate-batch/corpus/1"
    by = {Path(f["file"]).name: f for f in doc["files"]}
    assert [Path(f["file"]).name for f in doc["files"]] == ["a-legal.json", "b-illegal.jsonl", "c-broken.yaml"]
    assert by["a-legal.json"]["status"] == "legal" and by["a-legal.json"]["report"]["legal"] is True
    assert by["b-illegal.jsonl"]["status"] == "illegal" and "FMLA001" in by["b-illegal.jsonl"]["codes"]
    assert by["c-broken.yaml"]["status"] == "bad_input" and by["c-broken.yaml"]["error"]
    assert doc["summary"] == {"legal": 1, "illegal": 1, "bad_input": 1, "files": 3}
    assert invoke(["check", corpus, "--json"]).stdout == r.stdout            # --json is the alias


def test_corpus_jsonl_one_object_per_file(corpus):
    r = invoke(["check", corpus, "-f", "jsonl"])
    objs = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(objs) == 3
    assert [o.get("legal") for o in objs] == [True, False, None]
    assert all(o["schema"] == "validate-batch/report/1" for o in objs)


# github -----------------------------------------------------------------------------------------
def test_github_escaping():
    assert gh_data("50% a\r\nb") == "50%25 a%0D%0Ab"
    assert gh_property("a,b:c%\n") == "a%2Cb%3Ac%25%0A"


def test_github_one_error_per_illegal_fixture_batch():
    """Done when: one ::error annotation per illegal file of fixtures/batches/ and none for the others."""
    verdicts = fixture_verdicts()
    r = invoke(["check", BATCHES, "--output-format", "github"])
    errors = [line for line in r.stdout.splitlines() if line.startswith("::error ")]
    illegal = [p for p, legal in verdicts.items() if not legal]
    assert len(errors) == len(illegal) > 0
    for path in illegal:
        assert sum(line.startswith(f"::error file={path},") for line in errors) == 1
    for line in errors:
        props, message = line[len("::error "):].split("::", 1)
        assert props.count(",") == 1 and "title=" in props and message
        assert "\n" not in message


def test_github_bad_input_and_warning(corpus):
    r = invoke(["check", corpus, "-f", "github"])
    lines = r.stdout.splitlines()
    assert any(line.startswith("::error ") and "c-broken.yaml" in line and "title=bad input" in line for line in lines)
    assert not any("a-legal.json" in line for line in lines)


# junit ------------------------------------------------------------------------------------------
def test_junit_testcase_per_file(corpus):
    r = invoke(["check", corpus, "-f", "junit"])
    assert r.exit_code == 2
    root = ET.fromstring(r.stdout)
    cases = root.findall(".//testcase")
    assert len(cases) == 3
    by = {Path(c.get("name")).name: c for c in cases}
    assert by["a-legal.json"].find("failure") is None and by["a-legal.json"].find("error") is None
    assert "FMLA001" in by["b-illegal.jsonl"].find("failure").get("type")
    assert by["c-broken.yaml"].find("error") is not None
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")


# sarif ------------------------------------------------------------------------------------------
def test_sarif_rules_and_results():
    r = invoke(["check", BATCHES, "-f", "sarif"])
    log = json.loads(r.stdout)
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    ids = [x["id"] for x in rules]
    assert len(ids) == len(set(ids)) and "FMLA001" in ids
    catalog = {r["code"]: r for r in json.loads(invoke(["rules", "--json"]).stdout)}
    for x in rules:
        assert x["shortDescription"]["text"] == catalog[x["id"]]["title"]
        assert x["fullDescription"]["text"] and "helpUri" not in x
    n_findings = sum(len(validate_batch.check(_load(p)).findings) for p in sorted(BATCHES.iterdir()))
    assert len(run["results"]) == n_findings
    for res in run["results"]:
        assert res["ruleId"] in ids and res["level"] in ("error", "warning", "note")
        assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith(str(BATCHES))


def test_sarif_validates_against_a_minimal_shape(corpus):
    log = json.loads(invoke(["check", corpus, "-f", "sarif"]).stdout)
    inv = log["runs"][0]["invocations"][0]
    assert inv["executionSuccessful"] is False
    assert any("c-broken.yaml" in n["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
               for n in inv["toolExecutionNotifications"])


# single files, select / ignore / statistics -------------------------------------------------------
def test_single_file_formats(tmp_path):
    f = tmp_path / "call.json"
    f.write_text(json.dumps(ILLEGAL_CALL))
    assert invoke(["check", f, "-f", "github"]).stdout.startswith(f"::error file={f},title=")
    assert ET.fromstring(invoke(["check", f, "-f", "junit"]).stdout).find(".//failure") is not None
    d = json.loads(invoke(["check", f, "-f", "json"]).stdout)
    assert d["schema"] == "validate-batch/report/1" and d["legal"] is False
    assert invoke(["check", f, "-f", "nonsense"]).exit_code == 2


def test_select_ignore(tmp_path):
    f = BATCHES / "dsv4-1x12000.json"
    assert not validate_batch.check(_load(f)).legal
    assert invoke(["check", f, "--ignore", "FMLA001,SGL"]).exit_code == 0
    d = json.loads(invoke(["check", f, "--select", "SGL", "--json"]).stdout)
    assert d["findings"] and all(x["code"].startswith("SGL") for x in d["findings"])
    assert invoke(["check", f, "--select", "SLOT"]).exit_code == 0
    r = invoke(["check", f, "--select", "NOPE123"])
    assert r.exit_code == 2 and "NOPE123" in r.output


def test_statistics():
    verdicts = fixture_verdicts()
    d = json.loads(invoke(["check", BATCHES, "--json", "--statistics"]).stdout)
    expect: dict = {}
    for p in verdicts:
        for x in validate_batch.check(_load(Path(p))).findings:
            expect[x.code] = expect.get(x.code, 0) + 1
    assert d["statistics"] == expect
    r = invoke(["check", BATCHES, "--statistics"])
    tail = r.output.split("statistics:", 1)[1]
    for code, n in expect.items():
        assert any(line.split()[:2] == [code, str(n)] for line in tail.splitlines())


def test_h_is_help():
    assert invoke(["-h"]).exit_code == 0
    r = invoke(["check", "-h"])
    assert r.exit_code == 0 and "--output-format" in r.output


# metadata and bisect ------------------------------------------------------------------------------
def test_metadata_formats(tmp_path):
    f = tmp_path / "calls.jsonl"
    f.write_text(json.dumps(LEGAL_CALL) + "\n" + json.dumps(ILLEGAL_CALL) + "\n")
    r = invoke(["metadata", f, "-f", "github"])
    assert r.exit_code == 1
    errors = [line for line in r.stdout.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1 and "call 1" in errors[0] and "FMLA001" in errors[0]
    cases = ET.fromstring(invoke(["metadata", f, "-f", "junit"]).stdout).findall(".//testcase")
    assert [c.find("failure") is not None for c in cases] == [False, True]
    objs = [json.loads(line) for line in invoke(["metadata", f, "-f", "jsonl"]).stdout.splitlines()]
    assert [o["legal"] for o in objs] == [True, False]
    assert invoke(["metadata", f, "--json"]).stdout == invoke(["metadata", f, "-f", "json"]).stdout


def test_bisect_formats():
    log = ROOT / "fixtures" / "logs" / "sglang-dsv4-prefill-12288.log"
    r = invoke(["bisect", log, "-f", "github", "--no-progress"])
    assert r.exit_code == 1
    errors = [line for line in r.stdout.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1 and "FMLA001" in errors[0]
    log_ = json.loads(invoke(["bisect", log, "-f", "sarif"]).stdout)
    assert {x["ruleId"] for x in log_["runs"][0]["results"]} >= {"FMLA001"}
    assert all(x["level"] == "error" for x in log_["runs"][0]["results"])
    d = json.loads(invoke(["bisect", log, "-f", "json"]).stdout)
    assert d["schema"] == "validate-batch/bisect/1" and "FMLA001" in d["rule"]


# schemas ----------------------------------------------------------------------------------------
jsonschema = pytest.importorskip("jsonschema")
ORACLE = ROOT / "fixtures" / "oracle"
LOGS = ROOT / "fixtures" / "logs"


def schema(name: str) -> dict:
    r = invoke(["schema", name])
    assert r.exit_code == 0
    s = json.loads(r.stdout)
    jsonschema.Draft202012Validator.check_schema(s)
    return s


def validate(instance, name: str) -> None:
    jsonschema.Draft202012Validator(schema(name)).validate(instance)


def test_schema_command_and_versions():
    assert {n: schema(n)["$id"] for n in ("report", "batch", "metadata")} == {
        "report": "validate-batch/report/1", "batch": "validate-batch/batch/1", "metadata": "validate-batch/metadata/1"}
    assert invoke(["schema"]).stdout == invoke(["schema", "report"]).stdout
    assert invoke(["schema", "nope"]).exit_code == 2


@pytest.mark.parametrize("path", sorted(p for p in BATCHES.iterdir() if p.suffix in (".yaml", ".json")), ids=lambda p: p.name)
def test_fixture_batch_and_its_report_match_the_schemas(path):
    validate(_load(path), "batch")
    validate(json.loads(invoke(["check", path, "--json"]).stdout), "report")


def test_batch_schema_rejects_what_the_checker_rejects(tmp_path):
    doc = _load(BATCHES / "dsv4-1x4096.yaml")
    doc["reqests"] = doc["requests"]
    with pytest.raises(jsonschema.ValidationError):
        validate(doc, "batch")
    f = tmp_path / "typo.json"
    f.write_text(json.dumps(doc))
    assert invoke(["check", f]).exit_code == 2
    doc2 = _load(BATCHES / "dsv4-1x4096.yaml")
    doc2["requests"][0]["extend_tokens"] = "many"
    with pytest.raises(jsonschema.ValidationError):
        validate(doc2, "batch")


def test_call_records_and_corpus_match_the_report_schema(corpus):
    validate(json.loads(invoke(["check", ORACLE / "flashmla_h200_probes.jsonl", "--json"]).stdout), "report")
    validate(json.loads(invoke(["check", corpus, "--json", "--statistics"]).stdout), "report")
    validate(json.loads(invoke(["check", BATCHES, "--json"]).stdout), "report")
    for line in invoke(["check", corpus, "-f", "jsonl"]).stdout.splitlines():
        validate(json.loads(line), "report")
    broken = json.loads(invoke(["check", corpus, "--json"]).stdout)
    broken["files"][2]["report"] = {"legal": True}
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "report")


@pytest.mark.parametrize("name", ["flashmla_h200_cases.jsonl", "sglfm_h200_legacy_cases.jsonl"])
def test_metadata_of_oracle_cases_matches_the_schema(name):
    lines = invoke(["metadata", ORACLE / name, "--json"]).stdout.splitlines()
    assert lines
    s = schema("metadata")
    v = jsonschema.Draft202012Validator(s)
    for line in lines:
        v.validate(json.loads(line))


@pytest.mark.parametrize("path", sorted(LOGS.iterdir()), ids=lambda p: p.name)
def test_bisect_of_fixture_logs_matches_the_schema(path):
    d = json.loads(invoke(["bisect", path, "--json"]).stdout)
    validate(d, "report")
    assert d["schema"] == "validate-batch/bisect/1"


def test_schemas_ship_as_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"schema/*.json"' in text
    assert (ROOT / "rules" / "schema" / "report.schema.json").is_file()


def test_readme_workflow_snippet_is_valid_yaml_running_a_documented_format():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("# .github/workflows/batches.yml\n", 1)[1].split("```", 1)[0]
    wf = yaml.safe_load(block)
    runs = [s["run"] for s in wf["jobs"]["validate"]["steps"] if "run" in s]
    gate = next(r for r in runs if r.startswith("validate-batch check"))
    args = gate.split()[1:]
    fmt = args[args.index("--output-format") + 1]
    r = invoke(["check", BATCHES, "--output-format", fmt])
    assert r.exit_code == 1 and r.stdout.startswith("::error ")


def test_single_file_bad_input_is_reported_in_the_ci_formats(tmp_path):
    f = tmp_path / "broken.json"
    f.write_text('{"kind": "sparse"')
    r = invoke(["check", f, "-f", "github"])
    assert r.exit_code == 2
    assert [x for x in r.stdout.splitlines() if x.startswith("::error ")] == [
        x for x in r.stdout.splitlines() if x.startswith(f"::error file={f},title=bad input::")]
    assert len(r.stdout.splitlines()) == 1
    cases = ET.fromstring(invoke(["metadata", f, "-f", "junit"]).stdout).findall(".//testcase")
    assert len(cases) == 1 and cases[0].find("error") is not None
    log = json.loads(invoke(["bisect", tmp_path / "missing.log", "-f", "sarif"]).stdout)
    assert log["runs"][0]["invocations"][0]["executionSuccessful"] is False
    assert invoke(["check", f, "--json"]).stdout == ""                     # json keeps stderr only


def test_github_properties_of_an_odd_file_name(tmp_path):
    d = tmp_path / "odd"
    d.mkdir()
    (d / "a,b:c%.json").write_text(json.dumps(ILLEGAL_CALL))
    line = invoke(["check", d, "-f", "github"]).stdout.splitlines()[0]
    props = line[len("::error "):].split("::", 1)[0]
    assert props.startswith("file=") and props.endswith("a%2Cb%3Ac%25.json,title=FMLA001")
    assert props.count(",") == 1


def test_shell_completion_is_offered():
    out = invoke(["--help"]).output
    assert "--install-completion" in out and "--show-completion" in out


def test_metadata_select_ignore_statistics():
    from validate_batch.api import check_calls
    from validate_batch.inputs.documents import load_documents
    from validate_batch.cli.session import split_device_header

    path = ORACLE / "flashmla_h200_probes.jsonl"
    docs, g = split_device_header(load_documents(str(path)), None)
    expect: dict = {}
    for rec in docs:
        for x in check_calls([rec], g).findings:
            expect[x.code] = expect.get(x.code, 0) + 1
    r = invoke(["metadata", path, "--statistics", "-f", "jsonl"])
    got = {}
    for line in r.stderr.split("statistics:", 1)[1].splitlines():
        if line.strip():
            code, n = line.split()[:2]
            got[code] = int(n)
    assert got == expect and r.exit_code == 1
    assert invoke(["metadata", path, "--ignore", "FMLA", "-q"]).exit_code == 0
    only = [json.loads(x) for x in invoke(["metadata", path, "--select", "FMLA001", "--json"]).stdout.splitlines()]
    assert sum(len(o["findings"]) for o in only) == expect["FMLA001"]
    assert all(f["code"] == "FMLA001" for o in only for f in o["findings"])
    assert invoke(["metadata", path, "--select", "XYZ9"]).exit_code == 2


def test_corpus_select_changes_the_verdicts():
    r = invoke(["check", BATCHES, "--select", "SLOT", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["summary"]["illegal"] == 0
    assert all(c.startswith("SLOT") for f in doc["files"] for c in f["codes"])
