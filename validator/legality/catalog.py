"""The rule catalog as a data file: ``rules/catalog.json``, generated from the rule definitions.

``validate-batch rules`` in a fresh process lists the catalog from this file, without importing the
rule modules (they and what they load are most of that command's start-up); a process that has
loaded the rules already (a library caller, a test that registers one of its own) lists its live
registry instead (:func:`current`). The file is what :func:`generated` returns for the definitions
as they are, written by ``python -m validate_batch.legality.catalog --write``;
``tests/test_rule_catalog.py`` fails when it and the definitions differ, and names that command.

The file also records a checksum of each file the entries are read from (the rule modules, the
registry, the failure classes, the knowledge files). Where one of them has changed since (a rule
edited and the catalog not written again), the listing comes from the live registry instead: the
file only ever makes ``rules`` faster, never different.

This module imports no rule module until :func:`generated` is called.
"""
from __future__ import annotations

import json
import os
import sys
import zlib

#: the data file, in the package's rules/ folder
FILE = "catalog.json"
DOC = ("Every rule's catalog entry (validate-batch rules --json), generated from the rule definitions by "
       "`python -m validate_batch.legality.catalog --write`; a test fails when the two differ.")
#: the module that loads every rule: once imported, the registry is what a listing shows
RULESET = "validate_batch.legality.ruleset"


#: the modules besides the rule modules that a catalog entry is written from
READ_FROM = ("validate_batch.legality.registry", "validate_batch.legality.failure")


def generated() -> list[dict]:
    """The catalog of the rules registered now (every rule module imported)."""
    from .ruleset import all_rules

    return [r.to_dict() for r in all_rules()]


def _package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def inputs() -> list[str]:
    """The files the entries are written from, relative to the package (every rule module loaded)."""
    from .ruleset import all_rules

    mods = sorted({r.func.__module__ for r in all_rules()} | set(READ_FROM))
    top = _package_dir()
    out = [os.path.relpath(sys.modules[m].__file__, top) for m in mods if getattr(sys.modules.get(m), "__file__", None)]
    out = [p.replace(os.sep, "/") for p in out]
    data = _path()
    if data is not None:       # (the data folder is named rules/ wherever the package puts it)
        out += sorted("rules/" + f for f in os.listdir(os.path.dirname(data)) if f.endswith(".json") and f != FILE)
    return out


def checksums(files: list[str]) -> dict:
    """``{file: CRC-32 of its bytes}`` for files relative to the package, ``rules/...`` in its data
    folder (None for one not there)."""
    top = _package_dir()
    data = _path()
    out = {}
    for rel in files:
        parts = rel.split("/")
        path = os.path.join(os.path.dirname(data), *parts[1:]) if parts[0] == "rules" and data else os.path.join(top, *parts)
        try:
            with open(path, "rb") as f:
                out[rel] = zlib.crc32(f.read())
        except OSError:
            out[rel] = None
    return out


def file_text(entries: list[dict] | None = None) -> str:
    """The text :data:`FILE` holds for ``entries`` (default: :func:`generated`), with the checksums of
    the files they are written from."""
    rules = generated() if entries is None else entries
    doc = {"_doc": DOC, "read_from": checksums(inputs()), "rules": rules}
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def _path() -> str | None:
    from .. import rules as data

    init = getattr(data, "__file__", None)
    return None if init is None else os.path.join(os.path.dirname(init), FILE)


def shipped() -> dict | None:
    """The catalog file as the package ships it (:data:`FILE`): ``read_from`` and ``rules``; None
    where the package is not a plain folder (a zip) or the file is missing."""
    path = _path()
    if path is None or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def fresh(doc: dict | None) -> bool:
    """Whether every file ``doc`` was written from is as it was then."""
    if not doc or not doc.get("read_from"):
        return False
    return checksums(list(doc["read_from"])) == doc["read_from"]


def current() -> list[dict]:
    """What a listing shows: the live registry where this process has loaded the rules or the
    shipped file is not fresh (:func:`fresh`), else the shipped file's entries (the same: the test
    above holds them equal)."""
    if RULESET not in sys.modules:
        doc = shipped()
        if fresh(doc):
            return doc["rules"]
    return generated()


def main(argv: list[str] | None = None) -> int:
    """``python -m validate_batch.legality.catalog [--write | --check]``: write the file into the
    package's rules/ folder, or exit 1 naming what differs (the default: --check)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--check"], ["--write"]):
        print("usage: python -m validate_batch.legality.catalog [--write | --check]", file=sys.stderr)
        return 2
    path = _path()
    if path is None:
        print("error: the package's rules/ folder is not on disk; nothing to write or check", file=sys.stderr)
        return 2
    want = file_text()
    if argv == ["--write"]:
        with open(path, "w", encoding="utf-8") as f:
            f.write(want)
        print(f"wrote {path} ({len(json.loads(want)['rules'])} rules)")
        return 0
    have = ""
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            have = f.read()
    if have == want:
        print(f"{path}: up to date")
        return 0
    theirs = {e["code"]: e for e in json.loads(have)["rules"]} if have else {}
    ours = {e["code"]: e for e in json.loads(want)["rules"]}
    differ = sorted(c for c in theirs.keys() | ours.keys() if theirs.get(c) != ours.get(c))
    print(f"{path} differs from the rule definitions ({', '.join(differ) or 'layout'}); "
          f"run: python -m validate_batch.legality.catalog --write", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
