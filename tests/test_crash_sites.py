"""A CUDA error line is a FlashMLA crash class because the data says where each build reports it:
every generation's ``error_site`` in rules/flashmla.json, other builds' sites in rules/crash_sites.json."""
from __future__ import annotations

import copy
import json
from importlib import resources

import pytest

import validate_batch.ingest.recognisers as recognisers
from validate_batch.ingest.crash_lines import classify_error, site_patterns
from validate_batch.ingest.scan import scan_lines
from validate_batch.facts.knowledge import load

KIND_OF_PART = [("sched_smem", "flashmla_sched"), ("combine", "flashmla_combine")]


def rules_file(name: str) -> dict:
    return json.loads(resources.files("rules").joinpath(f"{name}.json").read_text(encoding="utf-8"))


def cuda_error_line(site: str, msg: str = "invalid argument") -> str:
    path, _, line = site.partition(":")
    return f"CUDA error (/opt/FlashMLA/{path}:{line or 1}): {msg}"


GENERATION_SITES = [(gen, kind, g[part]["error_site"])
                    for gen, g in rules_file("flashmla")["generations"].items()
                    for part, kind in KIND_OF_PART if g.get(part, {}).get("error_site")]


@pytest.fixture
def patch_sites(monkeypatch):
    """patch_sites(edit): classify with rules/flashmla.json and rules/crash_sites.json as ``edit`` leaves them."""
    site_patterns.cache_clear()

    def patch(edit):
        data = {n: copy.deepcopy(load(n)) for n in ("flashmla", "crash_sites")}
        edit(data)
        monkeypatch.setattr(recognisers, "load", lambda name: data[name] if name in data else load(name))
        site_patterns.cache_clear()
    yield patch
    monkeypatch.undo()
    site_patterns.cache_clear()


def test_every_generation_has_error_sites():
    gens = rules_file("flashmla")["generations"]
    assert {gen for gen, kind, _ in GENERATION_SITES if kind == "flashmla_sched"} == set(gens)
    # a combine site may be unknown, but then the data says so
    assert {gen for gen, kind, _ in GENERATION_SITES if kind == "flashmla_combine"} == {
        g for g, rec in gens.items() if "error_site_note" not in rec["combine"]}
    assert {kind for _, kind, _ in GENERATION_SITES} == {"flashmla_sched", "flashmla_combine"}


@pytest.mark.parametrize("gen,kind,site", GENERATION_SITES)
def test_a_line_citing_a_generations_error_site_is_its_crash_class(gen, kind, site):
    assert classify_error(cuda_error_line(site))[0] == kind
    ev = scan_lines([cuda_error_line(site)])
    assert ev.root_error().kind == kind


@pytest.mark.parametrize("gen,kind,site", GENERATION_SITES)
def test_without_its_site_in_the_data_the_line_is_a_plain_cuda_error(patch_sites, gen, kind, site):
    def no_sites(data):
        for g in data["flashmla"]["generations"].values():
            for part, _ in KIND_OF_PART:
                g[part].pop("error_site", None)
        data["crash_sites"] = {}
    patch_sites(no_sites)
    assert classify_error(cuda_error_line(site))[0] == "cuda_error"


@pytest.mark.parametrize("gen,kind,site", GENERATION_SITES)
def test_a_moved_site_moves_the_recognised_file(patch_sites, gen, kind, site):
    part = dict((k, p) for p, k in KIND_OF_PART)[kind]

    def move(data):
        data["flashmla"]["generations"][gen][part]["error_site"] = "csrc/new/renamed_kernel.cu:7"
    patch_sites(move)
    assert classify_error(cuda_error_line("csrc/new/renamed_kernel.cu:7"))[0] == kind


def test_other_builds_sites_come_from_crash_sites_json(patch_sites):
    extra = rules_file("crash_sites")
    for kind in ("flashmla_sched", "flashmla_combine"):
        for site in extra[kind]["sites"]:
            assert classify_error(cuda_error_line(site))[0] == kind
    frag = extra["flashmla_combine"]["contains"][0]
    line = cuda_error_line(f"csrc/sm90/decode/x_{frag}_y.cuh:5")
    assert classify_error(line)[0] == "flashmla_combine"
    patch_sites(lambda d: d["crash_sites"]["flashmla_combine"].update(contains=[]))
    assert classify_error(line)[0] == "cuda_error"
