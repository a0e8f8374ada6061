"""How each rule's facts stand per build, for ``explain`` and ``builds``: measured there, tested, or
read (see :mod:`validate_batch.facts.provenance`).

A rule names its facts per call (a sparse call reads the sparse facts, an SM100 call the SM100
ones), so the standing of a rule on a build is taken over a fixed set of representative calls: a
sparse decode call of each KV layout, a dense bf16 call, dense fp8 attention and its metadata op,
and a sparse prefill, on an H200 and on a B200 (each build's SM90 and SM100 halves). Rules of other kernel families are judged on each of
their versions' records (DeepGEMM, FlashInfer) or engine versions.
"""
from __future__ import annotations

from functools import lru_cache

from ..errors import InputError
from ..facts.knowledge import build_names, load
from ..facts.provenance import STATUSES, FactStatus, fact_status, provenance_record, record_facts, rule_facts
from ..flashmla.plan import plan as make_plan
from .registry import Rule, all_rules

#: the representative FlashMLA calls a rule's facts are looked up on
CALLS = (
    {"kind": "sparse", "b": 64, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 1024},
    {"kind": "sparse", "b": 64, "s_q": 1, "h_q": 128, "d_qk": 576, "topk": 1024},
    {"kind": "dense", "b": 64, "s_q": 1, "h_q": 128, "seqlens": [512] * 64},
    {"kind": "dense_fp8", "b": 64, "s_q": 1, "h_q": 128, "seqlens": [512] * 64, "entry": "fwd_kvcache_mla_fp8"},
    {"kind": "dense_fp8", "b": 64, "s_q": 1, "h_q": 128, "seqlens": [512] * 64, "entry": "get_mla_decoding_metadata"},
    {"kind": "prefill", "s_q": 64, "h_q": 64, "d_qk": 512, "topk": 512},
)
GPUS = ("H200", "B200")


@lru_cache(maxsize=64)
def _plans(build: str, gpu: str) -> tuple:
    out = []
    if True:
        for rec in CALLS:
            try:
                out.append(make_plan(rec, gpu, build))
            except InputError:          # a call this build cannot take (no such kernel there)
                continue
    return tuple(out)


def _flashmla(rule: Rule, build: str, gpu: str) -> list[FactStatus]:
    seen: dict[str, FactStatus] = {}
    for p in _plans(build, gpu):
        for st in rule_facts(rule, p):
            seen.setdefault(st.fact, st)
    return list(seen.values())


def _versioned(rule: Rule, kind: str, name: str) -> list[FactStatus]:
    record = provenance_record(kind, name)
    paths: list[str] = []
    for path in (() if callable(rule.facts) else rule.facts) or ("",):
        if "{layout}" in path:
            paths += [path.format(layout=k) for k in record.get("metadata", {})]
        else:
            paths.append(path)
    return list(record_facts(kind, name, name, tuple(paths)))


def _engine(profile: str) -> list[tuple[str, FactStatus]]:
    prof = load("engines")["profiles"][profile]
    out = []
    for v in prof.get("versions", ()):
        name = f"{profile}@{v['name']}"
        out.append((name, fact_status(provenance_record("engine", name).get("provenance"), f"engine:{name}", name)))
    return out


def rule_standing(rule: Rule) -> dict[str, list[FactStatus]]:
    """``{build or version: [fact standing, ...]}`` for one rule (empty lists dropped)."""
    out: dict[str, list[FactStatus]] = {}
    if rule.scope == "call" and rule.subject == "flashmla":
        for b in build_names():
            for gpu in GPUS:
                got = _flashmla(rule, b, gpu)
                if got:
                    out[f"{b} on {gpu}"] = got
    elif rule.scope == "call" and rule.subject.startswith("deepgemm"):
        for name in load("deepgemm")["versions"]:
            out[name] = _versioned(rule, "deepgemm", name)
    elif rule.scope == "call" and rule.subject.startswith("flashinfer"):
        for name in load("flashinfer")["versions"]:
            out[name] = _versioned(rule, "flashinfer", name)
    elif rule.scope == "batch":
        for profile in load("engines")["profiles"]:
            for name, st in _engine(profile):
                out.setdefault(name, []).append(st)
    return out


def worst(statuses) -> str:
    """The weakest standing among ``statuses`` (``measured`` when empty)."""
    return max((s.status for s in statuses), key=STATUSES.index, default="measured")


def build_counts(build: str) -> dict:
    """Per FlashMLA build and GPU: how many of the facts its rules rest on are measured on that
    build, tested, or read."""
    out = {}
    for gpu in GPUS:
        seen: dict[str, FactStatus] = {}
        for r in all_rules():
            if r.scope == "call" and r.subject == "flashmla":
                for st in _flashmla(r, build, gpu):
                    seen.setdefault(st.fact, st)
        counts = {s: 0 for s in STATUSES}
        for st in seen.values():
            counts[st.status] += 1
        out[gpu] = counts
    return out
