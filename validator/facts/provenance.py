"""Where each fact comes from, as data: measured on a real kernel, tested against an engine's real
code, read from source or a binary, or inferred.

Every object of a knowledge file (``rules/*.json``) that says where a fact comes from in prose
(``source``, or ``<name>_source`` for the key ``<name>``) carries the same in structure:
``provenance`` (or ``<name>_provenance``), one entry or a list of entries, each one of

``{"kind": "measured", "device": ..., "package": ..., "date": ..., "fixture": ..., "builds": [...]}``
    the real kernel ran on ``device`` (its ``package`` and version) on ``date`` (``by DATE`` where
    only a bound is known); ``fixture`` names the recorded results in the repository (a path or a
    list); ``builds`` the kernel builds (``rules/flashmla.json`` names) the measurement covers.
``{"kind": "tested", "package": ..., "test": ...}``
    engine code (Python, the same on every machine) checked by a test against the real package;
    ``test`` names it (``tests/test_x.py::test_name`` or a list).
``{"kind": "read", "from": "source" | "binary" | "docs", "at": ..., "package" | "commit": ...}``
    read at ``at`` (``file:line``, a list of them, or a binary's name) in a package version or
    commit; not confirmed on a device.
``{"kind": "inferred", "from": ..., "at": ..., "note": ...}``
    deduced (from dates, a neighbouring build, a formula); ``note`` says what and why.

A verdict rests on the facts of every rule it ran; :func:`fact_status` says, for one fact and the
build a call ran on, whether that fact was measured on that build (``measured``), checked against
the real engine (``tested``) or neither (``read``: read, inferred, or measured only on other
builds). ``validate-batch check --strict-provenance`` refuses a verdict that rests on a ``read``
fact.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterator, Mapping

from .knowledge import build_record, load

#: the kinds of provenance entry and the fields each must have (``package`` or ``commit`` for ``read``)
KINDS: dict[str, tuple[str, ...]] = {
    "measured": ("device", "package", "date", "fixture", "builds"),
    "tested": ("package", "test"),
    "read": ("from", "at"),
    "inferred": ("from", "at", "note"),
}
READ_FROM = ("source", "binary", "docs", "dates", "metadata")
#: a fact's standing for one build, best first
STATUSES = ("measured", "tested", "read")
DATE = re.compile(r"^(by )?\d{4}-\d{2}-\d{2}$")


def provenance_key(source_key: str) -> str:
    """The provenance key beside a prose source key: ``source`` -> ``provenance``,
    ``grid_source`` -> ``grid_provenance``."""
    return "provenance" if source_key == "source" else source_key[: -len("source")] + "provenance"


def entries(value: Any) -> list[dict]:
    """A provenance value as a list of entries (one entry or a list; nothing: empty)."""
    if value is None:
        return []
    return [value] if isinstance(value, Mapping) else list(value)


def _strings(v: Any) -> list:
    return [v] if isinstance(v, str) else list(v) if isinstance(v, (list, tuple)) else [v]


def problems(value: Any, where: str) -> list[str]:
    """What is wrong with one provenance value (empty: nothing), each naming ``where``."""
    out: list[str] = []
    ents = entries(value)
    if not ents:
        return [f"{where}: no provenance entry"]
    for i, e in enumerate(ents):
        at = f"{where}[{i}]" if len(ents) > 1 else where
        if not isinstance(e, Mapping):
            out.append(f"{at}: expected an object, got {type(e).__name__}")
            continue
        kind = e.get("kind")
        if kind not in KINDS:
            out.append(f"{at}.kind: expected one of {', '.join(KINDS)}, got {kind!r}")
            continue
        for f in KINDS[kind]:
            if e.get(f) in (None, "", []):
                out.append(f"{at}.{f}: missing (a {kind} entry needs {', '.join(KINDS[kind])})")
        if kind == "read" and not (e.get("package") or e.get("commit")):
            out.append(f"{at}: a read entry names the package version or the commit it was read in")
        if kind in ("read", "inferred") and e.get("from") not in READ_FROM:
            out.append(f"{at}.from: expected one of {', '.join(READ_FROM)}, got {e.get('from')!r}")
        if kind == "measured":
            if not isinstance(e.get("date"), str) or not DATE.match(e["date"]):
                out.append(f"{at}.date: expected YYYY-MM-DD or 'by YYYY-MM-DD', got {e.get('date')!r}")
            if not isinstance(e.get("builds"), list):
                out.append(f"{at}.builds: expected a list of build names")
        for f in ("fixture", "test", "at"):
            if f in e and not all(isinstance(s, str) and s for s in _strings(e[f])):
                out.append(f"{at}.{f}: expected a string or a list of strings")
    return out


def sourced(data: Any, path: tuple = ()) -> Iterator[tuple[tuple, Mapping, str, str]]:
    """Every prose source in a knowledge file: ``(path of its object, the object, source key,
    provenance key)``."""
    if isinstance(data, Mapping):
        for k, v in data.items():
            if isinstance(k, str) and (k == "source" or k.endswith("_source")) and isinstance(v, str):
                yield path, data, k, provenance_key(k)
        for k, v in data.items():
            if isinstance(v, (Mapping, list)):
                yield from sourced(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from sourced(v, path + (i,))


@dataclass(frozen=True)
class FactStatus:
    """One fact's standing for one build: ``status`` (``measured``, ``tested``, ``read``), the
    entry it rests on, and a line for people."""

    fact: str
    build: str
    status: str
    entry: Mapping
    line: str

    def to_dict(self) -> dict:
        d = {"fact": self.fact, "build": self.build, "status": self.status, "says": self.line}
        if self.entry:
            d["entry"] = dict(self.entry)
        return d


def _short(text) -> str:
    """A device or package name without its parenthesised details."""
    return str(text).split(" (")[0]


def describe(entry: Mapping, build: str | None = None) -> str:
    """One line: where an entry's fact comes from, for ``build``."""
    kind = entry.get("kind")
    if kind == "measured":
        builds = entry.get("builds") or ()
        on = ", ".join(b for b in builds if b != "*")
        fx = _strings(entry.get("fixture"))
        where = (f"{_short(entry.get('device'))}, {_short(entry.get('package'))}, {entry.get('date')}; "
                 f"{fx[0]}{f' and {len(fx) - 1} more' if len(fx) > 1 else ''}")
        if build is not None and build not in builds and "*" not in builds:
            return f"measured on {on}, not on {build} ({where})"
        return f"measured ({where})"
    if kind == "tested":
        return f"tested against {entry.get('package')} ({', '.join(_strings(entry.get('test')))})"
    if kind == "read":
        what = {"source": "read from source", "binary": "read from the binary", "docs": "read from docs",
                "dates": "read from dates", "metadata": "read from package metadata"}.get(entry.get("from"), "read")
        at = ", ".join(_strings(entry.get("at")))
        return f"{what} ({entry.get('package') or entry.get('commit')}: {at}), not measured"
    if kind == "inferred":
        return f"inferred, not measured: {entry.get('note')}"
    return "no provenance"


#: the compute-capability major of the devices measurements name (the first name found in ``device``)
DEVICE_ARCH = {"H100": 9, "H200": 9, "H800": 9, "H20": 9, "B200": 10, "GB200": 10, "B300": 10}


def device_arch(device: str | None) -> int | None:
    """The compute-capability major of a measurement's device (None: not known)."""
    words = str(device or "").replace("(", " ").split()
    return next((DEVICE_ARCH[w] for w in words if w in DEVICE_ARCH), None)


def _covers(e: Mapping, build: str, arch: int | None) -> bool:
    builds = e.get("builds") or ()
    if build not in builds and "*" not in builds:
        return False
    return arch is None or device_arch(e.get("device")) in (None, arch)


def fact_status(value: Any, fact: str, build: str, arch: int | None = None) -> FactStatus:
    """The standing of one fact (its provenance ``value``) for a call on ``build`` (on a GPU of
    compute-capability major ``arch``: a measurement on another architecture does not count)."""
    ents = entries(value)
    for e in ents:
        if e.get("kind") == "measured" and _covers(e, build, arch):
            return FactStatus(fact, build, "measured", e, describe(e, build))
    for e in ents:
        if e.get("kind") == "tested":
            return FactStatus(fact, build, "tested", e, describe(e, build))
    e = next((e for e in ents if e.get("kind") == "measured"), None) or (ents[0] if ents else {})
    line = describe(e, build) if e else "no provenance recorded"
    if e and e.get("kind") == "measured" and _covers(e, build, None):     # the build, on another architecture
        line = f"measured on SM{device_arch(e.get('device'))}0 only, not on SM{arch}0 ({describe(e, build)})"
    return FactStatus(fact, build, "read", e, line)


#: :func:`lookup`'s answer for a path whose key the record does not have at all (the fact is not part of it)
ABSENT = object()


def lookup(record: Mapping, path: str) -> Any:
    """The provenance of the fact at dotted ``path`` inside ``record``: the object's own
    ``provenance`` when the path ends at an object that has one, else ``<last>_provenance``
    beside it; ``""`` is the record's own. None: the fact is there without a provenance of its own;
    :data:`ABSENT`: the record has no such fact."""
    if not path:
        return record.get("provenance")
    *parents, last = path.split(".")
    obj: Any = record
    for p in parents:
        obj = obj.get(p) if isinstance(obj, Mapping) else None
        if obj is None:
            return ABSENT
    if not isinstance(obj, Mapping):
        return ABSENT
    if last not in obj and f"{last}_provenance" not in obj:
        return ABSENT
    val = obj.get(last)
    if isinstance(val, Mapping) and "provenance" in val:
        return val["provenance"]
    return obj.get(f"{last}_provenance")


#: how a fact scope's kind names its record: ``kind -> (name -> record)``; engine profiles add theirs
RECORDS: dict[str, Callable[[str], Mapping]] = {}


def record_kind(kind: str):
    """Register the function that gives the knowledge record of fact scopes of ``kind``."""
    def deco(fn):
        RECORDS[kind] = fn
        return fn
    return deco


@record_kind("flashmla")
def _generation_record(name: str) -> dict:
    """A FlashMLA generation with the shared facts it does not replace (a replaced key's shared
    source and provenance go with it)."""
    data = load("flashmla")
    own = data["generations"][name]
    replaced = {f"{k}_{suffix}" for k in own for suffix in ("source", "provenance")}
    shared = {k: v for k, v in data.get("shared", {}).items() if not k.startswith("_") and k not in replaced}
    return {**shared, **own}


RECORDS["flashmla-build"] = build_record
RECORDS["deepgemm"] = lambda name: load("deepgemm")["versions"][name]
RECORDS["flashinfer"] = lambda name: load("flashinfer")["versions"][name]


@lru_cache(maxsize=512)
def provenance_record(kind: str, name: str) -> Mapping:
    """The knowledge record a fact scope names."""
    if kind not in RECORDS:
        raise KeyError(f"unknown fact scope {kind!r}; known: {', '.join(sorted(RECORDS))}")
    return RECORDS[kind](name)


@lru_cache(maxsize=4096)
def record_facts(kind: str, name: str, build: str, paths: tuple[str, ...], arch: int | None = None) -> tuple[FactStatus, ...]:
    out = []
    absent = []
    for path in paths:
        rkind, rname, p = (("flashmla-build", build, path[len("build."):]) if path.startswith("build.")
                           else (kind, name, path))
        record = provenance_record(rkind, rname)
        value = lookup(record, p)
        if value is ABSENT:               # not a fact of this record: the others stand for the rule
            absent.append((rkind, rname, record))
            continue
        if value is None:                  # there, with nothing of its own: the record's
            value, p = record.get("provenance"), ""
        out.append(fact_status(value, f"{rkind}:{rname}{'.' + p if p else ''}", build, arch))
    if not out and absent:                 # none of them here: the record's own provenance
        rkind, rname, record = absent[0]
        out.append(fact_status(record.get("provenance"), f"{rkind}:{rname}", build, arch))
    return tuple(out)


@lru_cache(maxsize=64)
def gpu_fact(name: str) -> FactStatus:
    """The standing of a GPU's facts (SM count, shared memory): measured on that GPU, or read."""
    rec = load("gpus")["gpus"].get(name)
    if rec is None:
        return FactStatus(f"gpu:{name}", "*", "read", {}, "GPU facts given by the caller, not measured here")
    return fact_status(rec.get("provenance"), f"gpu:{name}", "*")


def rule_facts(rule, plan) -> tuple[FactStatus, ...]:
    """The standing of the facts ``rule`` reads on ``plan`` (the records its ``facts`` name, in
    the plan's fact scope), for the build the plan runs on. A plan's ``fact_scope()`` gives
    ``(kind, record name, build, values)``; ``values`` fill ``{name}`` in the rule's paths."""
    scope = getattr(plan, "fact_scope", None)
    scope = scope() if scope is not None else None
    if scope is None:
        return ()
    kind, name, build, values = scope
    if callable(rule.facts):
        facts = rule.facts(plan)
        if not facts:                   # the rule cannot fire on this plan
            return ()
    else:
        facts = rule.facts or ("",)     # none named: the scope record's own provenance
    paths = tuple(p.format(**values) if "{" in p else p for p in facts)
    gpu = getattr(plan, "gpu", None)
    return record_facts(kind, name, build, paths, getattr(gpu, "arch", None))


def summary(statuses) -> dict:
    """A verdict's provenance: counts per status, each rule's weakest standing (``rules``), and
    every fact that is neither measured on its build nor tested (``read_facts``)."""
    seen: dict[tuple, FactStatus] = {}
    rules: dict[tuple, set] = {}
    per_rule: dict[str, dict] = {}
    for code, st in statuses:
        key = (st.fact, st.build)
        seen.setdefault(key, st)
        rules.setdefault(key, set()).add(code)
        cur = per_rule.get(code)
        if cur is None or STATUSES.index(st.status) > STATUSES.index(cur["status"]):
            per_rule[code] = {"status": st.status, "says": st.line}
    counts = {s: 0 for s in STATUSES}
    read = []
    for key, st in seen.items():
        counts[st.status] += 1
        if st.status == "read":
            read.append({"rules": sorted(rules[key]), **st.to_dict()})
    read.sort(key=lambda r: (r["rules"], r["fact"]))
    status = "none" if not seen else "read" if read else "tested" if counts["tested"] else "measured"
    return {"status": status, "counts": counts, "rules": dict(sorted(per_rule.items())), "read_facts": read}


def one_line(prov: Mapping) -> str:
    """The human verdict's provenance line."""
    counts = prov.get("counts", {})
    n = sum(counts.values())
    if not n:
        return "Provenance: no modelled limit applied"
    read = prov.get("read_facts") or []
    if not read:
        return f"Provenance: all {n} facts this verdict rests on were measured or tested on the build it names"
    codes = sorted({c for r in read for c in r["rules"]})
    shown = ", ".join(codes[:6]) + (f" and {len(codes) - 6} more" if len(codes) > 6 else "")
    return (f"Provenance: {len(read)} of {n} facts this verdict rests on are not measured on the build it names "
            f"(read from source, a binary or docs, inferred, or measured elsewhere: {shown}); "
            f"--strict-provenance makes this an error")
