"""The sample crash dump for ``bisect --dump`` (fixtures/dumps/): what its generator writes, read by the
restricted loader, and the verdicts the README gives for it."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from validate_batch.cli.main import app
from validate_batch.ingest.crash_dump import read_crash_dump

ROOT = Path(__file__).resolve().parent.parent
DUMP = ROOT / "fixtures" / "dumps" / "sglang-dsv4-3x4096.pkl"
LOG = ROOT / "fixtures" / "logs" / "sglang-dsv4-prefill-12288.log"


def _generator(monkeypatch):
    spec = importlib.util.spec_from_file_location("make_sample_dump", ROOT / "fixtures" / "dumps" / "make_sample_dump.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_sample_dump", mod)     # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_dump_is_what_the_generator_writes(monkeypatch):
    assert DUMP.read_bytes() == _generator(monkeypatch).dump_bytes()


def test_the_dump_reads_without_sglang():
    d = read_crash_dump(str(DUMP))
    assert d.server_args["chunked_prefill_size"] == 16384
    assert "--chunked-prefill-size 16384" in d.launch_command


def test_bisect_on_the_sample_dump():
    r = CliRunner().invoke(app, ["bisect", "--dump", str(DUMP), "--sglang-version", "0.5.12", "--json", "--no-progress"])
    assert r.exit_code == 0, r.output               # no error line: nothing is explained
    d = json.loads(r.stdout)
    prefill = [c for c in d["candidates"] if "waiting" in json.dumps(c)]
    assert prefill and "FMLA001" in json.dumps(prefill[0])
    r = CliRunner().invoke(app, ["bisect", str(LOG), "--dump", str(DUMP), "--json", "--no-progress"])
    assert r.exit_code == 1, r.output
    d = json.loads(r.stdout)
    # 3 x 4096 = 12288 query rows > 11622, the largest legal (4*(5*11622+1) <= 232448 B on an H200)
    assert "FMLA001" in d["rule"] and d["boundary"]["largest_legal"] == 11622


def test_the_generator_leaves_an_imported_module_as_it_found_it(monkeypatch):
    # where the real sglang is imported (CI installs 0.5.23), its ServerArgs must stay its own afterwards
    import types
    mod = types.ModuleType("sglang.srt.server_args")
    sentinel = type("ServerArgs", (), {})
    mod.ServerArgs = sentinel
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", mod)
    _generator(monkeypatch).dump_bytes()
    assert sys.modules["sglang.srt.server_args"] is mod and mod.ServerArgs is sentinel
