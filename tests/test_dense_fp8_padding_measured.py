"""Dense fp8 attention with length-0 rows (FMLA020) and block-table pages (FMLA022), against the
real kernel: vLLM 0.33's and 0.34's bundled ``fwd_kvcache_mla_fp8`` (the same binary) and
sgl-flash-mla 1.0.0's on an H200, 13 padding layouts run plain and under compute-sanitizer memcheck
(``fixtures/measured/vllm033_h200_densefp8_padding_memcheck_probes.jsonl``,
``vllm034_h200_densefp8_padding_probes.jsonl``, ``sglfm_h200_densefp8_padding_probes.jsonl``).

The block table of each probe is rebuilt here from how the recording harness makes it (documented in
``fixtures/measured/README.md``): page 64, ``ceil(max(seqlens)/64)`` entries per row (at least 1),
a pool of ``min(that, 64)`` pages, every row ``0, 1, 2, ...`` modulo the pool, then the rows of
``pad_rows`` (default: the length-0 rows) overwritten with ``pad_block``.

Ground truth per probe: memcheck's error count and the plain run's outcome. A probe with no memcheck
error and a plain ``ok`` is legal; errors with a plain ``ok`` are an undefined read (illegal, class
``undefined_behaviour``); a plain illegal memory access is that class.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from validate_batch.api import check

MEASURED = Path(__file__).resolve().parents[1] / "fixtures" / "measured"
LINES = [json.loads(x) for x in (MEASURED / "vllm033_h200_densefp8_padding_memcheck_probes.jsonl").read_text().splitlines()
         if x.strip()]
HEAD, PROBES = LINES[0], LINES[1:]
SGL_LINES = [json.loads(x) for x in (MEASURED / "sglfm_h200_densefp8_padding_probes.jsonl").read_text().splitlines()
             if x.strip()]
SGL_HEAD, SGL_PROBES = SGL_LINES[0], SGL_LINES[1:]
V34_LINES = [json.loads(x) for x in (MEASURED / "vllm034_h200_densefp8_padding_probes.jsonl").read_text().splitlines()
             if x.strip()]
V34_HEAD, V34_PROBES = V34_LINES[0], [dict(p, build="vllm-0.34") for p in V34_LINES[1:]]
BUILDS = {"vllm": "vllm-0.33", "sgl": "sgl-flash-mla-1.0.0"}


def build_of(probe: dict) -> str:
    return probe.get("build") or BUILDS[probe["provider"]]


def block_table(seqlens: list[int], pad_block, pad_rows) -> tuple[list[list[int]], int]:
    per_row = max(1, -(-max(seqlens) // 64))
    pool = min(per_row, 64)
    rows = [[j % pool for j in range(per_row)] for _ in seqlens]
    if pad_block is not None:
        for i, n in enumerate(seqlens):
            if (i in pad_rows) if pad_rows is not None else n == 0:
                rows[i] = [pad_block] * per_row
    return rows, pool


def record(p: dict, with_table: bool = True) -> dict:
    rec = {"kind": "dense_fp8", "entry": "fwd_kvcache_mla_fp8", "b": len(p["seqlens"]), "s_q": 1, "h_q": 128,
           "seqlens": p["seqlens"], "causal": True}
    if with_table:
        rec["block_table"], rec["num_blocks"] = block_table(p["seqlens"], p["pad_block"], p["pad_rows"])
    return rec


def test_the_recordings_are_both_builds_on_an_h200_under_memcheck():
    assert {p["name"]: p["version"] for p in V34_HEAD["providers"]}["vllm"] == "0.34.0"
    for head, probes, prov in ((HEAD, PROBES, "vllm"), (SGL_HEAD, SGL_PROBES, "sgl"), (V34_HEAD, V34_PROBES, "vllm")):
        assert head["device"] == "NVIDIA H200" and head["provider"] == prov and head["torch"].startswith("2.11")
        assert "memcheck" in head["memcheck"] and len(probes) == 13
        assert all(p["memcheck"]["ran"] for p in probes)
        assert [p["tag"] for p in probes] == [p["tag"] for p in PROBES]


ALL = PROBES + SGL_PROBES + V34_PROBES


@pytest.mark.parametrize("probe", ALL, ids=[f"{build_of(p)}: {p['tag']}" for p in ALL])
def test_each_padding_layout_matches_the_kernel_with_its_block_table(probe):
    r = check(record(probe), gpu="H200", build=build_of(probe))
    errors = [f for f in r.findings if f.is_error]
    measured_clean = probe["outcome"] == "ok" and probe["memcheck"]["errors"] == 0
    if probe["seqlens"][0] == 0 and measured_clean:
        # request 0 reads whatever precedes the table: undefined, clean on this run (see below)
        assert [f.failure.kind for f in errors] == ["undefined_behaviour"]
        assert "illegal_memory_access" in errors[0].failure.kinds        # as it crashed on the other build
        return
    assert (not errors) == measured_clean, ([f.message for f in errors], probe["outcome"], probe["memcheck"])
    if errors and probe["outcome"] == "illegal_memory_access":
        assert "illegal_memory_access" in errors[0].failure.kinds, errors[0].failure
    elif errors:      # the kernel ran and memcheck saw the invalid read
        assert errors[0].failure.kind == "undefined_behaviour", errors[0].failure


def test_the_neighbour_decides_not_the_row_itself():
    # [900, 12, 0, 0]: -1 only in row 2 faults (row 3 reads row 2's last entry); -1 only in row 3 does not
    by = {p["tag"]: p for p in PROBES}
    neighbour = by["length-0 row whose neighbour row is -1"]
    own = by["length-0 row after a valid length-0 row"]
    assert neighbour["memcheck"]["errors"] > 0 and own["memcheck"]["errors"] == 0
    f = next(f for f in check(record(neighbour), gpu="H200", build="vllm-0.33").findings if f.code == "FMLA020")
    assert f.numbers == {"request": 3, "page": -1, "count": 1}
    assert check(record(own), gpu="H200", build="vllm-0.33").legal


def test_request_zero_reads_whatever_precedes_the_table():
    # the same layout crashed sgl-flash-mla 1.0.0 (illegal memory access, valid pages or not) and ran on vLLM
    sgl = {p["tag"]: p for p in SGL_PROBES}
    for tag in ("padding row first", "padding row first, valid pages"):
        assert sgl[tag]["outcome"] == "illegal_memory_access"
        vllm = next(p for p in PROBES if p["tag"] == tag)
        assert vllm["outcome"] == "ok" and vllm["memcheck"]["errors"] == 0
        for build, p in (("sgl-flash-mla-1.0.0", sgl[tag]), ("vllm-0.33", vllm)):
            r = check(record(p), gpu="H200", build=build)
            assert r.codes == ["FMLA020"] and not r.legal
            assert r.findings[0].numbers == {"request": 0} and r.findings[0].failure.kind == "undefined_behaviour"


def test_the_same_binary_differs_only_where_request_zero_reads_before_the_table():
    # vLLM 0.34's dense fp8 extension is 0.33's byte for byte: every layout whose request 0 has tokens gave
    # the same outcome and the same memcheck error or none; those whose request 0 is empty did not (0.34's run
    # crashed on them, as sgl-flash-mla's did), which is why FMLA020 calls request 0 undefined
    old = {p["tag"]: p for p in PROBES}
    differ = set()
    for p in V34_PROBES:
        o = old[p["tag"]]
        same = (o["outcome"], o["memcheck"]["errors"] > 0) == (p["outcome"], p["memcheck"]["errors"] > 0)
        if p["seqlens"][0] != 0:
            assert same, p["tag"]
        elif not same:
            differ.add(p["tag"])
            assert p["outcome"] == "illegal_memory_access" and o["outcome"] == "ok"
            assert check(record(p), gpu="H200", build="vllm-0.34").codes == ["FMLA020"]
    assert differ >= {"padding row first", "padding row first, valid pages"}


def test_without_the_block_table_every_empty_row_is_flagged():
    for p in PROBES:
        r = check(record(p, with_table=False), gpu="H200", build="vllm-0.33")
        assert ("FMLA020" in r.codes) == (0 in p["seqlens"]), p["tag"]


def test_length_one_padding_needs_a_valid_page_too():
    p = next(p for p in PROBES if p["tag"] == "padding with length 1")
    f = next(f for f in check(record(p), gpu="H200", build="vllm-0.33").findings if f.code == "FMLA022")
    assert f.numbers == {"request": 2, "entry": 0, "page": -1, "count": 2} and p["memcheck"]["errors"] == 18


def test_pages_at_the_pool_edge():
    # pool of 4 pages, one request of 128 tokens (2 pages): pages 3 (limit-1 of the pool) is fine, 4 is not
    base = {"kind": "dense_fp8", "entry": "fwd_kvcache_mla_fp8", "b": 1, "s_q": 1, "h_q": 128, "seqlens": [128],
            "num_blocks": 4}
    for last, ok in ((2, True), (3, True), (4, False)):
        r = check(dict(base, block_table=[[0, last]]), gpu="H200", build="vllm-0.33")
        assert r.legal == ok, last
    # an entry past the request's length is never read
    assert check(dict(base, block_table=[[0, 1, -1]]), gpu="H200", build="vllm-0.33").legal


def test_a_block_table_of_the_wrong_shape_is_named():
    from validate_batch.errors import InputError
    base = {"kind": "dense_fp8", "entry": "fwd_kvcache_mla_fp8", "b": 2, "s_q": 1, "h_q": 128, "seqlens": [1, 1]}
    with pytest.raises(InputError, match="block_table"):
        check(dict(base, block_table=[[0]]), gpu="H200", build="vllm-0.33")
    with pytest.raises(InputError, match="block_table"):
        check(dict(base, block_table=[[0], [0, 1]]), gpu="H200", build="vllm-0.33")
    with pytest.raises(InputError, match="block_table"):
        check({"kind": "sparse", "b": 1, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 64, "block_table": [[0]]},
              gpu="H200", build="vllm-0.33")
