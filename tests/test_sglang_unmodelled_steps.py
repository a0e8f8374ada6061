"""Steps that SGLang runs on a kernel other than FlashMLA are judged "not modelled", per step.

Ground truth, read from the released wheels (sglang/srt/layers/attention/deepseek_v4_backend.py and
sglang/kernels/ops/attention/dsv4/decode_attention_sm100.py of each release; the data's lines are
checked against the wheels by tests/test_sglang_release_wheels.py):

* 0.5.21 and 0.5.22: a DeepSeek-V4.1 decode / verify / draft-extend step on an SM100 GPU with
  1..8 query rows and 16 query heads per attention rank, caches in the V4 layout, runs
  ``swapab_attention`` instead of FlashMLA;
* 0.5.23: the same with 1..40 rows and 16 or 32 heads per rank;
* before 0.5.21 there is no such branch.

Heads per rank are the model's heads over the attention TP width, unpadded (128 heads at TP 8: 16).
"""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import validate_batch
from validate_batch.cli.main import app
from validate_batch.errors import NotModelled

runner = CliRunner()

#: release -> (most rows the small-batch kernel takes, heads per rank it takes)
GATE = {"0.5.21": (8, {16}), "0.5.22": (8, {16}), "0.5.23": (40, {16, 32})}
BEFORE = ["0.5.12", "0.5.15", "0.5.20"]


def doc(n, release, gpu="B200", heads=128, tp=8, mode="decode", model_type="deepseek_v41", env=None, sa=None):
    model = {"model_type": model_type}
    if heads is not None:
        model["num_attention_heads"] = heads
    d = {"engine": f"sglang-dsv4@{release}", "gpu": gpu, "forward_mode": mode, "model": model,
         # attention TP > 1: 0.5.23's auto backend is flashmla (MegaAttention only without attention TP)
         "server_args": {"tp_size": tp, **(sa or {})},
         "requests": [{"id": f"r{i}", "seq_len": 300} for i in range(n)]}
    if env:
        d["env"] = env
    return d


def verdict(d) -> str:
    return validate_batch.check(d).verdict


# ------------------------------------------------------------------------------------ the row edge
@pytest.mark.parametrize("release", sorted(GATE))
def test_rows_at_the_edge(release):
    top, _ = GATE[release]
    for n in (1, top - 1, top):
        r = validate_batch.check(doc(n, release))
        assert r.verdict == "not_modelled" and not r.legal and not r.errors, (release, n)
        assert r.safe_split is None                       # no split is offered for a step not modelled
        rec = r.not_modelled[0]
        assert "swapab_attention" in rec["path"] and rec["release"] == release
        assert "deepseek_v4_backend.py:" in rec["source"] and "decode_attention_sm100.py:" in rec["source"]
        assert r.context["kernel_calls"] == [] and r.context["query_rows"] == n
    assert verdict(doc(top + 1, release)) == "legal"


@pytest.mark.parametrize("release", BEFORE)
def test_no_such_path_before_0521(release):
    for n in (1, 8, 40):
        assert verdict(doc(n, release)) == "legal", (release, n)


# ----------------------------------------------------------------------------------- heads per rank
@pytest.mark.parametrize("release", sorted(GATE))
@pytest.mark.parametrize("heads,tp", [(128, 8), (128, 4), (64, 4), (64, 8), (128, 2), (64, 2), (96, 4)])
def test_heads_per_rank(release, heads, tp):
    top, allowed = GATE[release]
    per_rank = heads // tp                             # 16, 32, 16, 8, 64, 32, 24
    want = "not_modelled" if per_rank in allowed else "legal"
    assert verdict(doc(min(top, 8), release, heads=heads, tp=tp)) == want, (release, heads, tp)


def test_heads_not_given_are_not_guessed():
    r = validate_batch.check(doc(8, "0.5.23", heads=None))
    assert r.verdict == "not_modelled" and "num_attention_heads not given" in r.not_modelled[0]["why"]
    assert verdict(doc(41, "0.5.23", heads=None)) == "legal"


# --------------------------------------------------------------------------- GPU, model, KV layout
@pytest.mark.parametrize("release", sorted(GATE))
def test_only_sm100_and_deepseek_v41(release):
    assert verdict(doc(8, release, gpu="GB200")) == "not_modelled"       # compute capability 10.0
    assert verdict(doc(8, release, gpu="H200")) == "legal"               # SM90: FlashMLA
    assert verdict(doc(8, release, model_type="deepseek_v4")) == "legal"


def test_the_kv_layout():
    # the kernel reads V4-layout caches (584 bytes a token); v41 puts V4.1 caches (528) on SM100
    assert verdict(doc(8, "0.5.23", env={"SGLANG_DSV4_KV_LAYOUT": "v4"})) == "not_modelled"
    assert verdict(doc(8, "0.5.23", env={"SGLANG_DSV4_KV_LAYOUT": "v41"})) == "legal"
    assert verdict(doc(8, "0.5.22", env={"SGLANG_DSV4_KV_LAYOUT": "auto"})) == "legal"     # auto: v41 on SM100
    # 0.5.21's auto gives V4 caches when the installed FlashMLA does not advertise V4.1: refused
    assert verdict(doc(8, "0.5.21", env={"SGLANG_DSV4_KV_LAYOUT": "auto"})) == "not_modelled"


# ------------------------------------------------------------------------------------------- modes
def test_verify_and_draft_extend_count_their_rows():
    sa = {"speculative_num_draft_tokens": 4}
    assert verdict(doc(10, "0.5.23", mode="target_verify", sa=sa)) == "not_modelled"       # 10 x 4 = 40 rows
    assert verdict(doc(11, "0.5.23", mode="target_verify", sa=sa)) == "legal"              # 44 rows
    assert verdict(doc(2, "0.5.22", mode="target_verify", sa=sa)) == "not_modelled"        # 8 rows
    assert verdict(doc(3, "0.5.22", mode="target_verify", sa=sa)) == "legal"               # 12 rows
    ext = {**doc(1, "0.5.23", mode="extend"), "requests": [{"id": "p", "extend_tokens": 8}]}
    assert verdict(ext) == "legal"                     # an extend never takes the small-batch kernel
    dr = {**doc(1, "0.5.23", mode="draft_extend"), "requests": [{"id": "p", "extend_tokens": 8}]}
    assert verdict(dr) == "not_modelled"               # DRAFT_EXTEND_V2 does, and the mode does not say which


# ------------------------------------------------------------------------------- the guard agrees
@pytest.mark.parametrize("release", sorted(GATE))
def test_the_checker_agrees_with_check(release):
    top, _ = GATE[release]
    g = validate_batch.Checker(engine=f"sglang-dsv4@{release}", gpu="B200",
                               model={"model_type": "deepseek_v41", "num_attention_heads": 128}, server_args={"tp_size": 8})
    for n in (1, top - 1, top, top + 1, 2 * top + 3):
        v = g.verdict("decode", seq_lens=[300] * n)
        want = verdict(doc(n, release))
        assert v.verdict == want and bool(v) is (want == "legal"), (release, n)
        if want == "not_modelled":
            assert v.not_modelled and v.findings == []
            with pytest.raises(NotModelled, match="swapab_attention") as e:
                g.assert_legal("decode", seq_lens=[300] * n)
            assert "deepseek_v4_backend.py" in e.value.source
    with pytest.raises(NotModelled):
        validate_batch.assert_legal(doc(top, release))


def test_headroom_does_not_count_a_step_not_modelled_as_legal():
    g = validate_batch.Checker(engine="sglang-dsv4@0.5.23", gpu="B200",
                               model={"model_type": "deepseek_v41", "num_attention_heads": 128}, server_args={"tp_size": 8})
    h = g.headroom("decode", seq_lens=[300] * 30)
    assert not h.legal_now and h.not_modelled_rows == 40
    assert not h.can_add(0) and not h.can_add(10) and h.can_add(11)
    h = g.headroom("decode", seq_lens=[300] * 41)
    assert h.legal_now and h.can_add(5)


def test_a_split_never_claims_a_step_not_modelled():
    # 0.5.22 on B200: the engine's schedule precompute fails at 2219 and 2220 rows (4*(5b+1+8*148) + 48
    # > 48 KiB while its guard, without the 48 static bytes, admits them); a split must not leave a
    # piece of 1..8 rows, which the small-batch kernel would run
    r = validate_batch.check(doc(2219, "0.5.22"))
    assert r.verdict == "illegal" and "SGL003" in r.codes
    sp = r.safe_split
    assert sp is not None and sp.possible
    sizes = [len(s) for s in sp.steps]
    assert sum(sizes) == 2219 and all(s > 8 for s in sizes), sizes
    for k in sizes:
        assert verdict(doc(k, "0.5.22")) == "legal"


# ----------------------------------------------------------------------------------------- the CLI
def test_the_cli_says_not_modelled_with_the_source(tmp_path):
    f = tmp_path / "b.json"
    f.write_text(json.dumps(doc(40, "0.5.23")), encoding="utf-8")
    res = runner.invoke(app, ["check", str(f), "--json"])
    assert res.exit_code == 2
    out = json.loads(res.stdout)
    assert out["legal"] is False and out["verdict"] == "not_modelled" and "safe_split" not in out
    assert "deepseek_v4_backend.py:4303-4333" in out["not_modelled"][0]["source"]
    assert "not modelled" in res.stderr and "decode_attention_sm100.py" in res.stderr
    f.write_text(json.dumps(doc(41, "0.5.23")), encoding="utf-8")
    assert runner.invoke(app, ["check", str(f)]).exit_code == 0
    f.write_text(json.dumps(doc(8, "0.5.22")), encoding="utf-8")
    res = runner.invoke(app, ["check", str(f)])
    assert res.exit_code == 2 and "NOT MODELLED" in res.stdout


def test_corpus_mode_lists_a_step_not_modelled_as_bad_input(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(doc(8, "0.5.23")), encoding="utf-8")
    (tmp_path / "b.json").write_text(json.dumps(doc(41, "0.5.23")), encoding="utf-8")
    res = runner.invoke(app, ["check", str(tmp_path), "--json"])
    assert res.exit_code == 2
    files = {f["file"].rsplit("/", 1)[-1]: f for f in json.loads(res.stdout)["files"]}
    assert files["a.json"]["status"] == "bad_input" and "not modelled" in files["a.json"]["error"]
    assert files["a.json"]["report"]["verdict"] == "not_modelled"
    assert files["b.json"]["status"] == "legal"


def test_the_pytest_helpers_do_not_take_not_modelled_for_illegal():
    from validate_batch.pytest_plugin import assert_batch_illegal, assert_batch_legal
    for helper in (assert_batch_legal, assert_batch_illegal):
        with pytest.raises(pytest.fail.Exception, match="NOT MODELLED"):
            helper(doc(8, "0.5.23"))


def test_every_chunk_step_of_a_context_parallel_extend_says_not_modelled():
    # 0.5.12 has no routing: a context-parallel extend is not modelled whatever its rows
    d = {"engine": "sglang-dsv4@0.5.12", "gpu": "H200", "forward_mode": "extend",
         "server_args": {"chunked_prefill_size": 4096, "enable_nsa_prefill_context_parallel": True},
         "requests": [{"id": "a", "extend_tokens": 9000}]}
    r = validate_batch.check(d)
    steps = r.context["engine_steps"]["steps"]
    assert len(steps) == 3 and all(st.get("verdict") == "not_modelled" for st in steps)
    assert r.verdict == "not_modelled"
