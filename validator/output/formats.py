"""Machine formats for CI: one result per checked unit (a file, or a call of a file), rendered as JSON
Lines, GitHub Actions annotations, JUnit XML or SARIF 2.1.0.

A unit is a dict: ``file`` (the path), ``name`` (what a test case is called: the file, or
``FILE call N``), ``status`` (``legal`` | ``illegal`` | ``bad_input``), ``findings`` (finding dicts:
``code``, ``severity``, ``message``, ...) and ``error`` (the one-line bad-input message, or None);
optionally ``line`` (the 1-based line of the file the unit is about: a log's error line).
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter

from ..facts.knowledge import data_text
from ..errors import InputError
from ..legality.ruleset import all_rules, get_rule


def xml_escape(text: str) -> str:
    """``&``, ``<`` and ``>`` as XML entities (what ``xml.sax.saxutils.escape`` does; that module
    pulls in urllib and http.client, a measurable part of the command line's start-up)."""
    return text.replace("&", "&amp;").replace(">", "&gt;").replace("<", "&lt;")


def quoteattr(text: str) -> str:
    """``text`` as a quoted XML attribute value, escaped, with newlines, returns and tabs as
    character references; single quotes around it when it holds double quotes but no single ones
    (the rules of ``xml.sax.saxutils.quoteattr``)."""
    text = xml_escape(text).replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;")
    if '"' not in text:
        return f'"{text}"'
    if "'" not in text:
        return f"'{text}'"
    return '"' + text.replace('"', "&quot;") + '"'

FORMATS = ("text", "json", "jsonl", "github", "junit", "sarif")
SCHEMA_VERSIONS = {"report": "validate-batch/report/1", "corpus": "validate-batch/corpus/1",
                   "metadata": "validate-batch/metadata/1", "bisect": "validate-batch/bisect/1",
                   "batch": "validate-batch/batch/1"}
SCHEMA_NAMES = ("report", "batch", "metadata")


def schema_text(name: str) -> str:
    """The JSON schema ``rules/schema/NAME.schema.json`` shipped in the package (ValueError when
    NAME is not one of :data:`SCHEMA_NAMES`)."""
    if name not in SCHEMA_NAMES:
        raise ValueError(f"unknown schema {name!r}; known: {', '.join(SCHEMA_NAMES)}")
    return data_text("schema", f"{name}.schema.json")


SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


# ----------------------------------------------------------------------------------- selection
def parse_codes(value: str | None, option: str) -> list[str]:
    """``--select`` / ``--ignore``: comma-separated codes or prefixes (``SLOT``); each must match a
    known rule code, else an InputError naming the option."""
    if not value:
        return []
    known = [r.code for r in all_rules()]
    out = []
    for raw in value.split(","):
        c = raw.strip().upper()
        if not c:
            continue
        if not any(k.startswith(c) for k in known):
            raise InputError(option, f"unknown rule code {raw.strip()!r}; known: {', '.join(known)}")
        out.append(c)
    return out


def selected(code: str, select: list[str], ignore: list[str]) -> bool:
    """Whether findings of ``code`` count: matched by a ``select`` prefix (all when empty) and by no
    ``ignore`` prefix."""
    if select and not any(code.startswith(s) for s in select):
        return False
    return not any(code.startswith(i) for i in ignore)


def bad_input_unit(name: str, error: object) -> dict:
    """A file that could not be read or parsed, with its one-line error."""
    return {"file": name, "name": name, "status": "bad_input", "findings": [], "error": " ".join(str(error).split())}


def statistics(units: list[dict]) -> dict[str, int]:
    """Findings per rule code over all units, codes in order."""
    c = Counter(f["code"] for u in units for f in u.get("findings") or ())
    return dict(sorted(c.items()))


def render_statistics(counts: dict, console) -> None:
    """``--statistics``: findings per rule code, one line each (check, metadata and bisect)."""
    console.print("statistics:" if counts else "statistics: no findings")
    for code, n in counts.items():
        r = get_rule(code)
        console.print(f"  {code} {n:>6}  {r.title if r else ''}".rstrip())


def exit_code(units: list[dict], exit_zero: bool = False) -> int:
    """2 when any unit is bad input, else 1 when any is illegal (0 with ``exit_zero``), else 0."""
    if any(u["status"] == "bad_input" for u in units):
        return 2
    if any(u["status"] == "illegal" for u in units) and not exit_zero:
        return 1
    return 0


# ----------------------------------------------------------------------------------- jsonl
def jsonl(objects: list[dict]) -> str:
    return "".join(json.dumps(o, separators=(",", ":"), default=str) + "\n" for o in objects)


# ----------------------------------------------------------------------------------- github
def gh_data(s: str) -> str:
    """A workflow command's message: ``%``, ``\\r``, ``\\n`` percent-encoded."""
    return str(s).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def gh_property(s: str) -> str:
    """A workflow command's property value: as a message, plus ``:`` and ``,``."""
    return gh_data(s).replace(":", "%3A").replace(",", "%2C")


def _label(u: dict) -> str:
    """``NAME: `` before a message when the unit is part of its file (a call), else nothing."""
    return "" if u["name"] == u["file"] else f"{u['name']}: "


def _gh(kind: str, file: str, title: str, message: str, line: int | None = None) -> str:
    at = f",line={int(line)}" if line else ""
    return f"::{kind} file={gh_property(file)}{at},title={gh_property(title)}::{gh_data(message)}"


def github(units: list[dict]) -> str:
    """One ``::error`` per illegal or bad-input unit (its broken rules in one message), one
    ``::warning`` per warning finding."""
    lines = []
    for u in units:
        errors = [f for f in u.get("findings") or () if f["severity"] == "error"]
        if u["status"] == "bad_input":
            lines.append(_gh("error", u["file"], "bad input", u.get("error") or "bad input", u.get("line")))
        elif u["status"] == "illegal":
            codes = sorted({f["code"] for f in errors})
            msg = f"{_label(u)}ILLEGAL - " + "; ".join(f"{f['code']} {f['message']}" for f in errors)
            lines.append(_gh("error", u["file"], ", ".join(codes), msg, u.get("line")))
        for f in u.get("findings") or ():
            if f["severity"] == "warning":
                lines.append(_gh("warning", u["file"], f["code"], f"{_label(u)}{f['message']}", u.get("line")))
    return "".join(line + "\n" for line in lines)


# ----------------------------------------------------------------------------------- junit
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _x(s: str) -> str:
    return _XML_BAD.sub("?", str(s))


def junit(units: list[dict], suite: str = "validate-batch") -> str:
    """One testcase per unit: ``failure`` when illegal, ``error`` when bad input."""
    fails = sum(u["status"] == "illegal" for u in units)
    errs = sum(u["status"] == "bad_input" for u in units)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuites name={quoteattr(suite)} tests="{len(units)}" failures="{fails}" errors="{errs}">',
           f'  <testsuite name={quoteattr(suite)} tests="{len(units)}" failures="{fails}" errors="{errs}">']
    for u in units:
        head = f'    <testcase classname={quoteattr(suite)} name={quoteattr(_x(u["name"]))} file={quoteattr(_x(u["file"]))}'
        if u["status"] == "legal":
            out.append(head + "/>")
            continue
        out.append(head + ">")
        if u["status"] == "bad_input":
            msg = _x(u.get("error") or "bad input")
            out.append(f'      <error type="bad input" message={quoteattr(msg)}>{xml_escape(msg)}</error>')
        else:
            errors = [f for f in u["findings"] if f["severity"] == "error"]
            codes = ", ".join(sorted({f["code"] for f in errors}))
            body = "\n".join(f"{f['code']} {f['message']}" for f in errors)
            out.append(f'      <failure type={quoteattr(codes)} message={quoteattr(_x(codes + " broken"))}>'
                       f'{xml_escape(_x(body))}</failure>')
        out.append("    </testcase>")
    out += ["  </testsuite>", "</testsuites>"]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------- sarif
def first_paragraph(doc: str) -> str:
    """The first paragraph of a rule's page, on one line."""
    for para in re.split(r"\n\s*\n", (doc or "").strip()):
        text = " ".join(para.split())
        if text:
            return text
    return ""


#: where the tool is described (SARIF ``informationUri``), when the installed metadata names no URL
INFORMATION_URI = "urn:validate-batch:README"
#: the largest file read to place a result on its line
REGION_READ_LIMIT = 1 << 20
#: the key a batch document's step is written under: a result points at its line
STEP_KEYS = ("requests", "forward_mode", "kind")


def tool_version() -> str:
    """The installed validate-batch version ("0.0.0" from a source tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("validate-batch")
    except PackageNotFoundError:
        return "0.0.0"


def information_uri() -> str:
    """The project's URL from the installed metadata (``Project-URL``/``Home-page``), else :data:`INFORMATION_URI`."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        md = metadata("validate-batch")
    except PackageNotFoundError:
        return INFORMATION_URI
    for v in md.get_all("Project-URL") or ():
        url = v.split(",", 1)[-1].strip()
        if url.startswith(("https://", "http://")):
            return url
    home = md.get("Home-page") or ""
    return home if home.startswith(("https://", "http://")) else INFORMATION_URI


def region(file: str, line: int | None = None) -> dict:
    """The region a result of ``file`` points at (1-based, end column exclusive): ``line`` when
    given, else the line of the step's key (``requests:``, ``"requests":``, ...), else line 1."""
    text = ""
    try:
        if file not in ("", "-") and not file.startswith("example:") and os.path.getsize(file) <= REGION_READ_LIMIT:
            with open(file, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
    except OSError:
        text = ""
    lines = text.splitlines() or [""]
    if line is None or not 1 <= line <= len(lines):
        line = 1
        for key in STEP_KEYS:
            pat = re.compile(r"""(^|[{,\s])["']?%s["']?\s*:""" % key)
            hit = next((i for i, ln in enumerate(lines, 1) if pat.search(ln)), None)
            if hit is not None:
                line = hit
                break
    body = lines[line - 1]
    start = len(body) - len(body.lstrip()) + 1
    return {"startLine": line, "startColumn": start, "endLine": line, "endColumn": max(len(body) + 1, start + 1)}


def _location(file: str, line: int | None = None) -> list[dict]:
    return [{"physicalLocation": {"artifactLocation": {"uri": file.replace("\\", "/")}, "region": region(file, line)}}]


def rule_help(r) -> dict:
    """A rule's SARIF ``help``: its page as text and as Markdown, with the fix and the cited source."""
    doc = (r.doc or "").strip()
    tail = f"\n\nHow it fails: {r.failure}\n\nSource: {r.source}\n\n`validate-batch explain {r.code}` prints this page."
    return {"text": (doc or r.title) + tail, "markdown": f"**{r.code}: {r.title}**\n\n{doc}{tail}"}


def sarif(units: list[dict], version: str | None = None) -> dict:
    """A SARIF 2.1.0 log, with what GitHub code scanning reads: one rule per code found (id, name,
    short and full description, help, default level, tags, precision), one result per finding with
    its file and line, the tool's version and information URI; bad input as tool execution
    notifications."""
    codes = sorted({f["code"] for u in units for f in u.get("findings") or ()})
    rules, index = [], {}
    for c in codes:
        r = get_rule(c)
        index[c] = len(rules)
        entry = {"id": c, "name": c, "shortDescription": {"text": r.title if r else c}}
        entry["fullDescription"] = {"text": (first_paragraph(r.doc) if r else "") or (r.title if r else c)}
        if r:
            entry["help"] = rule_help(r)
            entry["defaultConfiguration"] = {"level": SARIF_LEVELS.get(r.severity, "note")}
            entry["properties"] = {"tags": ["validate-batch", re.sub(r"\d+$", "", c).lower()],
                                   "precision": "very-high",
                                   "problem.severity": "recommendation" if r.severity == "info" else r.severity}
        else:
            entry["help"] = {"text": f"{c}: see `validate-batch rules`"}
        rules.append(entry)
    results = []
    for u in units:
        for f in u.get("findings") or ():
            results.append({"ruleId": f["code"], "ruleIndex": index[f["code"]],
                            "level": SARIF_LEVELS.get(f["severity"], "note"),
                            "message": {"text": f"{_label(u)}{f['message']}"},
                            "locations": _location(u["file"], u.get("line"))})
    notes = [{"level": "error", "message": {"text": u.get("error") or "bad input"},
              "locations": _location(u["file"], u.get("line"))}
             for u in units if u["status"] == "bad_input"]
    driver = {"name": "validate-batch", "version": version or tool_version(), "informationUri": information_uri(),
              "rules": rules}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0",
            "runs": [{"tool": {"driver": driver}, "results": results,
                      "invocations": [{"executionSuccessful": not notes, "toolExecutionNotifications": notes}]}]}


def _with_severity(f: dict) -> dict:
    """A finding dict with its severity (the catalog's when the dict has none, as in a diagnosis)."""
    if "severity" in f:
        return f
    r = get_rule(f.get("code", ""))
    return {**f, "severity": r.severity if r else "error"}


def render(fmt: str, units: list[dict]) -> str:
    """``github``, ``junit`` or ``sarif`` output for ``units``."""
    units = [{**u, "findings": [_with_severity(f) for f in u.get("findings") or ()]} for u in units]
    if fmt == "github":
        return github(units)
    if fmt == "junit":
        return junit(units)
    if fmt == "sarif":
        return json.dumps(sarif(units), indent=2) + "\n"
    raise ValueError(f"not a unit format: {fmt}")
