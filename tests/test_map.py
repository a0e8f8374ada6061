"""Legality maps: exact boundaries against the shared-memory arithmetic, pictures, JSON/CSV, the CLI."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from validate_batch.cli.main import app
from validate_batch.legality.maps import Source, boundary_csv, legality_map, maps_across_builds

EXAMPLE = Path(__file__).resolve().parent.parent / "rules" / "examples" / "dsv4-prefill-3x4096.yaml"
SMEM = 232448  # H200 opt-in shared memory per block


def _doc(**server_args) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["server_args"] = {**doc["server_args"], **server_args}
    return doc


def test_mixed_chunking_moves_the_edge_by_the_merged_decodes():
    limit = (SMEM - 4) // 20          # 4*(5b+1) <= smem
    m = legality_map(Source("engine", _doc(enable_mixed_chunk=True)), kernel_build="flashmla-9241ae3",
                     y_max=40, y_step=1)
    assert limit == 11622
    for d in (0, 1, 7, 40):
        r = m.row(d)
        assert r.largest_legal == limit - d
        assert m.verdict(limit - d, d).kind == "legal"
        bad = m.verdict(limit - d + 1, d)
        assert bad.kind == "illegal" and "FMLA001" in bad.codes


def test_without_mixed_chunking_running_decodes_do_not_change_the_step():
    m = legality_map(Source("engine", _doc()), kernel_build="flashmla-9241ae3", y_max=32)
    assert {r.largest_legal for r in m.rows} == {(SMEM - 4) // 20}
    assert m.seed == (3 * 4096, 1)


def test_sgl_flash_mla_has_no_row_limit_but_falls_back():
    fast = (SMEM - 4) // 12            # legacy kernels: 4*(3b+1)
    m = legality_map(Source("engine", _doc()), kernel_build="sgl-flash-mla-1.0.0", x_max=24576, y_max=4)
    for r in m.rows:
        assert [(s.start, s.end, s.kind) for s in r.segments] == [(1, fast, "legal"), (fast + 1, 24576, "fallback")]
        assert r.segments[1].codes == ("FMLA015",)


def test_routing_makes_a_row_non_monotone():
    doc = _doc()
    doc["engine"] = "sglang-dsv4@post-25418"
    m = legality_map(Source("engine", doc), kernel_build="flashmla-9241ae3", y_max=0)
    kinds = [(s.start, s.end, s.kind) for s in m.row(0).segments]
    # the decode kernel up to 11622 rows, the routing gap up to the 11673-row threshold, then sparse prefill
    assert kinds == [(1, 11622, "legal"), (11623, 11673, "illegal"), (11674, 24576, "legal")]


def test_verify_edges_divide_by_the_draft_tokens():
    doc = _doc(speculative_num_draft_tokens=2)
    doc["engine"] = "sglang-dsv4@pre-25418"
    m = legality_map(Source("engine", doc), "requests", "draft_tokens", kernel_build="flashmla-9241ae3",
                     x_max=8000, y_max=4)
    for k in (1, 2, 3, 4):
        want = min(8000, 11622 // k)
        assert m.row(k).largest_legal == want


def test_call_record_template():
    call = {"kind": "sparse", "b": 100, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
    m = legality_map(Source("call", call, "H200"), "b", "s_q", kernel_build="flashmla-9241ae3", y_max=1)
    assert m.row(1).largest_legal == 11622 and m.seed == (100, 1)


def test_across_builds_and_csv_and_json():
    maps = maps_across_builds(Source("engine", _doc()), y_max=2)
    by = {m.build: m for m in maps}
    assert by["flashmla-1408756"].row(0).edges == [11622]
    assert by["sgl-kernel-flashmla"].verdict(12288, 1).kind == "fallback"
    assert by["flashmla-2026.09.30"].row(0).largest_legal is None       # SM100 only: nothing runs on H200
    rows = list(csv.DictReader(io.StringIO(boundary_csv(maps))))
    hit = [r for r in rows if r["build"] == "flashmla-9241ae3" and r["y"] == "0"]
    assert [(r["x_start"], r["x_end"], r["kind"], r["codes"]) for r in hit] == [
        ("1", "11622", "legal", ""), ("11623", "24576", "illegal", "FMLA001+SGL001")]
    d = json.loads(json.dumps(by["flashmla-9241ae3"].to_dict()))
    assert d["rows"][0]["edges"] == [11622] and d["x_axis"] == "prefill_tokens"


def test_png_pixels_have_the_region_colors(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    from validate_batch.legality.maps import render_figure

    m = legality_map(Source("engine", _doc()), kernel_build="flashmla-9241ae3", y_max=64)
    fig = render_figure([m])
    fig.canvas.draw()
    ax = fig.axes[0]
    img = np.asarray(fig.canvas.buffer_rgba())
    h = img.shape[0]

    def pixel(x, y):
        px, py = ax.transData.transform((x, y))
        return img[int(round(h - py)), int(round(px))][:3].astype(int)

    r, g, b = pixel(3000, 40)      # legal: 3000 rows
    assert g > r + 40 and g > b + 40
    r, g, b = pixel(22000, 20)     # illegal: far past 11622 rows
    assert r > g + 60 and r > b + 60


def test_cli_map(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["map", "--example", "dsv4-prefill-3x4096", "--y-max", "4"])
    assert res.exit_code == 0, res.output
    assert "1..11622 legal" in res.output and "11623..24576 illegal" in res.output
    out = tmp_path / "m.json"
    res = runner.invoke(app, ["map", "--engine", "sglang-dsv4@pre-25418", "--server-arg", "enable_mixed_chunk=true",
                              "--y-max", "10", "--y-step", "5", "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["maps"][0]["rows"]
    assert {r["y"]: r["largest_legal"] for r in rows} == {0: 11622, 5: 11617, 10: 11612}
    csv_out = tmp_path / "m.csv"
    res = runner.invoke(app, ["map", "--example", "dsv4-prefill-3x4096", "--across-builds", "--y-max", "1", "-o", str(csv_out)])
    assert res.exit_code == 0 and "sgl-flash-mla-1.0.0,running_decodes,0,prefill_tokens,19371,24576,fallback,FMLA015" in csv_out.read_text()
    assert runner.invoke(app, ["map", "--example", "dsv4-prefill-3x4096", "--x", "nope"]).exit_code == 2
    assert runner.invoke(app, ["map", "--example", "dsv4-prefill-3x4096", "--x", "b", "--y", "s_q"]).exit_code == 2
    assert runner.invoke(app, ["map", "--example", "dsv4-prefill-3x4096", "-o", str(tmp_path / "m.gif")]).exit_code == 2
    if pytest.importorskip("matplotlib"):
        png = tmp_path / "m.png"
        res = runner.invoke(app, ["map", "--example", "dsv4-prefill-3x4096", "--y-max", "8", "-o", str(png)])
        assert res.exit_code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_pictures_fail_clearly(monkeypatch, tmp_path):
    import builtins

    real = builtins.__import__

    def no_mpl(name, *a, **k):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    res = CliRunner().invoke(app, ["map", "--example", "dsv4-prefill-3x4096", "--y-max", "2", "-o", str(tmp_path / "m.svg")])
    assert res.exit_code == 2 and "pip install '.[map]'" in res.output and "matplotlib>=3.5" in res.output
    res = CliRunner().invoke(app, ["map", "--example", "dsv4-prefill-3x4096", "--y-max", "2", "-o", str(tmp_path / "m.csv")])
    assert res.exit_code == 0


def test_map_progress_and_picture_size(tmp_path):
    """`map` says how far it is (rows done of rows), and one panel is a readable picture (800 x 600 px,
    not 336 x 320)."""
    import struct

    pytest.importorskip("matplotlib")
    seen = []
    from validate_batch.inputs.documents import example_path, load_documents
    from validate_batch.legality.maps import Source, legality_map

    doc = load_documents(example_path("dsv4-prefill-3x4096"))[0]
    m = legality_map(Source("engine", doc), y_max=3, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)] and len(m.rows) == 4
    out = tmp_path / "m.png"
    res = CliRunner().invoke(app, ["map", "--example", "dsv4-prefill-3x4096", "--y-max", "3", "--progress", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("map: ")] == [f"map: {i}/4 rows" for i in (1, 2, 3, 4)]
    head = out.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (800, 600)
    res = CliRunner().invoke(app, ["map", "--example", "dsv4-prefill-3x4096", "--y-max", "3", "-o", str(tmp_path / "q.csv")])
    assert res.exit_code == 0 and "map: " not in res.stderr          # not a terminal, not asked for: quiet
