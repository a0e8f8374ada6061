"""The README's "to add a GPU" and "to add an engine version" lists, done: each is a data entry only
(added here to the loaded data at run time, as the file would hold it), and every path follows.

Expected numbers come from the kernels' arithmetic written in the test: FlashMLA 9241ae3's scheduler
needs ``4*(5b+1)`` bytes of shared memory for ``b`` query rows, and SGLang's DeepSeek-V4 backend sends
an extend forward of more than ``threshold`` rows to sparse prefill (no row limit) and the rest to the
decode kernel.
"""
from __future__ import annotations

import copy

import pytest
from typer.testing import CliRunner

import validate_batch
from validate_batch.cli.main import app
from validate_batch.engines import get_profile, resolve_version
from validate_batch.facts import knowledge


def _max_rows(smem_optin: int) -> int:
    b = 0
    while 4 * (5 * (b + 1) + 1) <= smem_optin:
        b += 1
    return b


@pytest.fixture
def new_gpu(monkeypatch):
    gpus = knowledge.load("gpus")["gpus"]
    monkeypatch.setitem(gpus, "X100", {"aliases": ["NVIDIA X100"], "num_sms": 100, "cc": [9, 0], "smem_optin": 200000,
                                       "source": "a GPU added for this test", "memory_bytes": 80_000_000_000})
    knowledge.gpu_by_name.cache_clear()
    yield "X100"
    knowledge.gpu_by_name.cache_clear()


def test_a_gpu_is_one_data_entry(new_gpu):
    limit = _max_rows(200000)
    assert limit == 9999
    rec = {"kind": "sparse", "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}
    for b, legal in ((limit - 1, True), (limit, True), (limit + 1, False)):
        r = validate_batch.check({**rec, "b": b}, gpu=new_gpu, build="flashmla-9241ae3")
        assert r.legal is legal, b
        assert ("FMLA001" in [f.code for f in r.findings]) is (not legal)
    out = CliRunner().invoke(app, ["gpus"])
    row = next(line for line in out.output.splitlines() if "X100" in line)
    assert str(limit) in row


@pytest.fixture
def new_version(monkeypatch):
    versions = knowledge.load("engines")["profiles"]["sglang-dsv4"]["versions"]
    base = next(v for v in versions if v["name"] == "pre-routing")
    added = copy.deepcopy(base)
    added.update(name="routing-at-12000", aliases=[], sparse_prefill_threshold=12000,
                 note="a version added for this test: extends above 12000 rows go to sparse prefill")
    added.pop("max_release", None)
    monkeypatch.setitem(knowledge.load("engines")["profiles"]["sglang-dsv4"], "versions", versions + [added])
    get_profile.cache_clear()
    resolve_version.cache_clear()
    yield "sglang-dsv4@routing-at-12000"
    get_profile.cache_clear()
    resolve_version.cache_clear()


def test_an_engine_version_is_one_data_entry(new_version):
    limit = _max_rows(232448)          # H200
    assert limit == 11622
    guard = validate_batch.Checker(engine=new_version, gpu="H200")
    # at or below the threshold the extend runs on the decode kernel: legal up to its row limit
    for rows, legal in ((limit, True), (limit + 1, False), (12000, False), (12001, True)):
        v = guard.verdict("extend", extend_lens=[rows], rids=["r"])
        assert v.legal is legal, rows
    full = guard.check("extend", extend_lens=[12000], rids=["r"])
    assert "FMLA001" in [f.code for f in full.findings]
