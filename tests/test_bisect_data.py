"""Bisection's assumptions are read from rules/*.json: change a value in the data, the diagnosis changes.

Each test reads the shipped data file itself (not the code under test) for the expected value, then
patches the loaded data and checks that the answer follows it.
"""
from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import pytest

import validate_batch.bisect.data as bdata
import validate_batch.bisect.docs as bdocs
import validate_batch.engines.slots as slots_profile
from validate_batch.bisect import BisectOptions, Builder, choose_profile, diagnose, server_args, versions_to_try
from validate_batch.ingest import build_config, read_inputs
from validate_batch.ingest.launch import EngineConfig
from validate_batch.ingest.scan import scan_lines
from validate_batch.ingest.sglang_log import Era
from validate_batch.facts.knowledge import load

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def rules_file(name: str) -> dict:
    return json.loads(resources.files("rules").joinpath(f"{name}.json").read_text(encoding="utf-8"))


@pytest.fixture
def patch_data(monkeypatch):
    """patch_data(name, edit): the bisect package sees rules/<name>.json as edited by ``edit(data)``."""
    edits: dict = {}

    def fake_load(name: str) -> dict:
        d = load(name)
        if name in edits:
            d = copy.deepcopy(d)
            edits[name](d)
        return d

    monkeypatch.setattr(bdata, "load", fake_load)
    monkeypatch.setattr(slots_profile, "load", fake_load)     # the PD extra-slot default is the profile's

    def patch(name, edit):
        edits[name] = edit
    return patch


def cfg_of(**values) -> EngineConfig:
    c = EngineConfig()
    c.update(values, "test")
    return c


def run(name: str, launch=None, server_args=(), **opts):
    ev, d = read_inputs(str(LOGS / name), None)
    cfg = build_config(ev, d, launch, server_args)
    return diagnose(ev, cfg, d, BisectOptions(**opts))


# --------------------------------------------------------------------------- rules/bisect.json
def test_bisect_rules_file_ships_and_documents_itself():
    d = rules_file("bisect")
    assert d["_doc"] and set(d["sources"])
    assert {"era_release", "default_max_prefill_tokens", "model_families"} <= set(d)


def test_era_release_comes_from_the_data(patch_data):
    era = Era("E5", "0.5.5-0.5.8", False, 5)
    shipped = rules_file("bisect")["era_release"]["E5"]
    assert versions_to_try(None, era)[0] == shipped
    patch_data("bisect", lambda d: d["era_release"].update({"E5": ["0.5.3", "0.5.8"]}))
    assert versions_to_try(None, era)[0] == ["0.5.3", "0.5.8"]
    patch_data("bisect", lambda d: d["era_release"].pop("E5"))
    assert versions_to_try(None, era)[0] == ["latest"]      # an era not in the table stands for the newest


def test_era_release_drives_the_version_a_log_is_checked_under(patch_data):
    shipped = rules_file("bisect")["era_release"]["E5"]
    assert run("sglang-dsv4-prefill-12288.log").explained.version == shipped[-1]
    patch_data("bisect", lambda d: d["era_release"].update({"E5": ["latest"]}))
    diag = run("sglang-dsv4-prefill-12288.log")
    assert {c.version for c in diag.candidates} == {"latest"}
    # the newest profile routes a 12288-token extend to the sparse prefill kernel: nothing explains the crash
    assert diag.explained is None


def _next_prefill_hi(cfg: EngineConfig) -> int:
    ev = scan_lines(["Prefill batch, #new-seq: 1, #new-token: 100, #cached-token: 0, token usage: 0.04, "
                     "#running-req: 0, #queue-req: 0"])
    tl = ev.ranks["DP0"]
    b = Builder(cfg, ["sglang-dsv4"], None, [None], True, [])
    return b.prefill_next("DP0", tl.last("prefill", None), tl).hi


def test_default_max_prefill_tokens_bounds_an_unchunked_prefill(patch_data):
    cfg = cfg_of(model_path="deepseek-ai/DeepSeek-V4")       # no chunking, no --max-prefill-tokens
    assert _next_prefill_hi(cfg) == rules_file("bisect")["default_max_prefill_tokens"]
    patch_data("bisect", lambda d: d.update(default_max_prefill_tokens=5000))
    assert _next_prefill_hi(cfg) == 5000
    assert _next_prefill_hi(cfg_of(max_prefill_tokens=7000)) == 7000    # a given value wins over the default


def test_model_families_choose_the_profile(patch_data):
    cfg = cfg_of(model_path="deepseek-ai/DeepSeek-V4-Flash")
    assert choose_profile(cfg, None, None, None)[0] == ["sglang-dsv4"]
    pd = cfg_of(model_path="acme/newmodel-7b", disaggregation_mode="decode")
    assert "DSA-indexer" not in choose_profile(pd, None, None, None)[1]
    patch_data("bisect", lambda d: d["model_families"].update(dsa_pd_decode=["newmodel"]))
    assert "DSA-indexer" in choose_profile(pd, None, None, None)[1]
    patch_data("bisect", lambda d: d["model_families"].update(deepseek_v4=["newmodel"]))
    assert "is DeepSeek-V4" in choose_profile(pd, None, None, None)[1]
    assert choose_profile(pd, None, None, None)[0] == ["sglang-dsv4", "sglang-slots"]


def _slot_buffers(model: str):
    b = Builder(cfg_of(model_path=model), ["sglang-slots"], None, [None], None, [])
    basis: list = []
    return b.slot_buffers(None, basis)


def test_model_families_decide_the_slot_indexed_buffers(patch_data):
    fam = rules_file("bisect")["model_families"]
    dsa_model = f"org/{fam['dsa'][0]}-fp8"
    mamba_model = f"org/{fam['mamba'][0]}-9b"
    assert _slot_buffers(dsa_model) == ({}, [])                      # DSA tails, no mamba table
    model_doc, buffers = _slot_buffers(mamba_model)
    assert model_doc == {"dsa_tails": False} and [b["name"] for b in buffers] == ["mamba slot mapping"]
    patch_data("bisect", lambda d: d["model_families"].update(dsa=[], mamba=[]))
    assert _slot_buffers(dsa_model) == ({"dsa_tails": False}, [])
    assert _slot_buffers(mamba_model) == ({"dsa_tails": False}, [])


# --------------------------------------------------------------------------- rules/engines.json
def _pd_slot_range(R: int) -> tuple[int, int, list[str]]:
    cfg = cfg_of(max_running_requests=R, disaggregation_mode="decode")
    c = Builder(cfg, ["sglang-slots"], None, [None], None, []).slot_step("DP0", None, None)
    return c.lo, c.hi, c.basis


def test_pd_extra_slots_default_is_read_from_the_engine_profile(patch_data):
    dflt = rules_file("engines")["profiles"]["sglang-slots"]["defaults"]
    factor, lim = dflt["extra_slots_default_factor"], dflt["extra_slots_default_max_running"]
    # sglang-facts.md B: live slots on a PD decode worker reach R + E.
    assert _pd_slot_range(lim)[1] == lim + factor * lim
    assert _pd_slot_range(lim + 1)[1] == lim + 1                     # above the limit: no extra slots
    patch_data("engines", lambda d: d["profiles"]["sglang-slots"]["defaults"].update(extra_slots_default_factor=3))
    lo, hi, basis = _pd_slot_range(16)
    assert hi == 16 + 3 * 16 and any("(3 x R when R <=" in s for s in basis)
    patch_data("engines", lambda d: d["profiles"]["sglang-slots"]["defaults"].update(extra_slots_default_max_running=8))
    assert _pd_slot_range(16)[1] == 16


def test_pd_extra_slots_default_changes_a_diagnosis(patch_data):
    before = run("sglang-pd-decode-dp-illegal-access.log").explained
    patch_data("engines", lambda d: d["profiles"]["sglang-slots"]["defaults"].update(extra_slots_default_max_running=0))
    after = run("sglang-pd-decode-dp-illegal-access.log").explained
    assert before is not None and before.hi > (after.hi if after is not None else 0)


# --------------------------------------------------------------------------- rules/settings.json
def test_batch_server_args_follow_the_settings_table(monkeypatch):
    table = rules_file("settings")["settings"]
    batch = {k for k, v in table.items() if "batch" in v["used_by"]}
    values = {k: (True if v["type"] == "bool" else 7 if v["type"] == "int" else (v.get("choices") or ["x"])[0])
              for k, v in table.items()}
    values["enable_dp_attention"] = False                   # no per-rank chunk budget
    values["attn_dp_size"] = 1                              # (nor under the 0.5.23 name)
    assert set(server_args(cfg_of(**values))) == batch
    # nullable settings take their value's type too: a wrong type or a negative count is dropped
    nullable_int = next(k for k in sorted(batch) if table[k]["type"] == "int" and table[k]["nullable"])
    assert nullable_int not in server_args(cfg_of(**{nullable_int: "many"}))
    assert nullable_int not in server_args(cfg_of(**{nullable_int: -1}))
    assert server_args(cfg_of(**{nullable_int: 3}))[nullable_int] == 3
    monkeypatch.setattr(bdocs, "BATCH_SETTINGS", {"page_size": int})
    assert server_args(cfg_of(**values)) == {"page_size": 7}
