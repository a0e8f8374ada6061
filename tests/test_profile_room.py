"""An engine profile is a room: a data entry in ``rules/engines.json`` plus one module defining
``PROFILE`` is all it takes; the guard, headroom, the split and the renderers follow.

The profile here is a stand-in written for this test (no engine has it): every forward's query
rows must stay within a row budget that its version gives, enforced by the existing rule SGL001.
Expected numbers come from that budget (100 rows) and from the forward-mode row arithmetic.
"""
from __future__ import annotations

import sys
import types

import pytest

import validate_batch
from validate_batch.engines.forward import forward_rows
from validate_batch.facts.knowledge import load
from validate_batch.engines import Profile, get_profile

BUDGET = 100


class ToyProfile(Profile):
    name = "toy-rows"
    provides = frozenset({"rows"})

    def setup(self, batch, version, build):
        return version["row_budget"]

    def derive(self, batch, version, setup, bp, build, memo=None):
        bp.rows, bp.row_breakdown = forward_rows(batch)
        bp.max_rows = setup
        bp.routing = {"threshold": None, "routed": False, "reason": "never routed", "version": version["name"]}

    def bound_hints(self, setup, bp):
        return {"max_rows": setup, "threshold": None}

    def prevention(self, batch, bp, bounds):
        return [{"flag": "--max-running-requests", "value": bounds.max_rows, "why": "toy budget"}]

    def summary_lines(self, bp):
        return [f"  toy rows {bp.rows} of {bp.max_rows}"]


@pytest.fixture
def toy(monkeypatch):
    mod = types.ModuleType("validate_batch.engines.toy")
    mod.PROFILE = ToyProfile()
    monkeypatch.setitem(sys.modules, "validate_batch.engines.toy", mod)
    monkeypatch.setitem(load("engines")["profiles"], "toy-rows", {
        "title": "test stand-in", "module": "toy", "default_version": "v1", "defaults": {},
        "versions": [{"name": "v1", "row_budget": BUDGET}]})
    get_profile.cache_clear()
    yield "toy-rows"
    get_profile.cache_clear()


def test_guard_headroom_and_split_follow_a_new_profile(toy):
    guard = validate_batch.Checker(engine=toy, gpu="H200")
    assert guard.has_rows and guard.max_rows == BUDGET and not guard.has_slots
    for n, legal in [(BUDGET - 1, True), (BUDGET, True), (BUDGET + 1, False)]:
        v = guard.verdict("decode", seq_lens=[5] * n)
        assert bool(v) is legal
        assert guard.check("decode", seq_lens=[5] * n).legal is legal
    v = guard.verdict("extend", extend_lens=[60, 30, 40], rids=["a", "b", "c"])
    assert not v and v.report.codes == ["SGL001"]
    assert v.safe_split.steps == [["a", "b"], ["c"]]            # 60 + 30 <= 100 < 60 + 30 + 40
    assert v.safe_split.settings == [{"flag": "--max-running-requests", "value": BUDGET, "why": "toy budget"}]
    room = guard.headroom("extend", extend_lens=[30])
    assert room.more_rows == BUDGET - 30 and room.can_add(BUDGET - 30) and not room.can_add(BUDGET - 29)


def test_a_new_profile_renders_its_own_summary(toy, tmp_path):
    from typer.testing import CliRunner

    from validate_batch.cli.main import app

    doc = tmp_path / "b.json"
    doc.write_text('{"engine": "toy-rows", "forward_mode": "decode", "requests": '
                   + str([{"id": f"r{i}", "seq_len": 3} for i in range(BUDGET + 1)]).replace("'", '"') + "}")
    res = CliRunner().invoke(app, ["check", str(doc)])
    assert res.exit_code == 1, res.output
    assert f"toy rows {BUDGET + 1} of {BUDGET}" in res.output and "SGL001" in res.output
