"""SGL003 per release, and the paths no profile models.

SGLang's DeepSeek-V4 backend computes FlashMLA's schedule itself for DeepSeek-V4.1 on Blackwell with
64 heads per rank (a JIT kernel, from 0.5.21): ``4*(5b+1+8P)`` bytes of dynamic shared memory with
P = SMs (s_q = 1), and static shared memory the kernel declares (three ints and an int[8]: 40 bytes,
48 once ptxas aligns them). Each release ships it differently:

- 0.5.21: no guard; the kernel refuses more than 48 KiB dynamic and launches without an opt-in,
  so dynamic + static must fit 48 KiB: every b from the first that does not fit fails.
- 0.5.22: a guard skips the precompute above 48 KiB dynamic, but forgets the static bytes.
- 0.5.23: the same guard, and an opt-in to 48 KiB dynamic: nothing the guard admits fails.

Ground truth: CUDA's rule (without the opt-in static + dynamic <= 48 KiB; with it, dynamic <= the
opt-in) written here; the releases' own guards and kernel sources read from their wheels (set
``VALIDATE_BATCH_SGLANG_WHEELS`` to a folder holding ``sglang-0.5.2x-*.whl``; the tests that need them
skip without); and the H200 launch probe's record in
``fixtures/measured/h200_smem_launch_probe.json``.
"""
from __future__ import annotations

import ast
import json
import os
import re
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import validate_batch
from validate_batch.cli.main import app
from validate_batch.errors import InputError, NotModelled

runner = CliRunner()
KIB48 = 48 * 1024
B200_SMS = 148
STATIC = 48          # 40 declared bytes, aligned to 16 (ptxas -v: 48 bytes smem)
PROBE = Path(__file__).resolve().parents[1] / "fixtures" / "measured" / "h200_smem_launch_probe.json"
SM120 = {"name": "RTX PRO 6000 Blackwell", "num_sms": 188, "cc": [12, 0], "smem_optin": 101376}


def dynamic(b, parts=B200_SMS):
    return 4 * (5 * b + 1 + 8 * parts)


def launches(dyn, static=STATIC, opt_in=None):
    """CUDA's rule for a one-block launch's shared memory."""
    return dyn <= opt_in if opt_in else dyn + static <= KIB48


def fails(release, b, parts=B200_SMS):
    """Whether release's precompute fails for b rows: its guard, its size check, its launch."""
    dyn = dynamic(b, parts)
    if release in ("0.5.22", "0.5.23") and dyn > KIB48:
        return False                                  # the guard skips it: FlashMLA schedules itself
    if dyn > KIB48:
        return True                                   # 0.5.21: the kernel's size check raises
    return not launches(dyn, opt_in=KIB48 if release == "0.5.23" else None)


def first_not_fitting(parts=B200_SMS):
    return next(b for b in range(1, 100000) if dynamic(b, parts) + STATIC > KIB48)


def last_admitted(parts=B200_SMS):
    return max(b for b in range(1, 100000) if dynamic(b, parts) <= KIB48)


def doc(n, version, gpu="B200", model_type="deepseek_v41", sa=None, env=None):
    d = {"engine": f"sglang-dsv4@{version}", "gpu": gpu, "forward_mode": "decode",
         "model": {"model_type": model_type},
         # attention TP 8: the flashmla backend (0.5.23's auto picks MegaAttention without attention TP)
         "server_args": {"tp_size": 8, **(sa or {})},
         "requests": [{"id": f"r{i}", "seq_len": 300} for i in range(n)]}
    if env:
        d["env"] = env
    return d


def codes(report):
    return {f.code for f in report.errors}


# --------------------------------------------------------------------------------- the arithmetic
def test_the_b200_edges():
    first, last = first_not_fitting(), last_admitted()
    assert (first, last) == (2219, 2220)
    assert dynamic(first - 1) + STATIC == 49148 <= KIB48 < dynamic(first) + STATIC == 49168
    assert dynamic(last) == 49140 <= KIB48 < dynamic(last + 1) == 49160


@pytest.mark.parametrize("release", ["0.5.20", "0.5.21", "0.5.22", "0.5.23"])
@pytest.mark.parametrize("edge", ["first", "last"])
def test_each_release_at_the_window_edges(release, edge):
    first, last = first_not_fitting(), last_admitted()
    at = first if edge == "first" else last
    for b in (at - 1, at, at + 1):
        want = release != "0.5.20" and fails(release, b)
        r = validate_batch.check(doc(b, release))
        assert r.legal is (not want), (release, b, r.codes)
        assert ("SGL003" in codes(r)) is want, (release, b)


def test_the_windows_per_release():
    first, last = first_not_fitting(), last_admitted()
    assert [b for b in range(first - 2, last + 4) if fails("0.5.22", b)] == [first, last]
    assert all(fails("0.5.21", b) for b in range(first, last + 200))
    assert not any(fails("0.5.23", b) for b in range(1, last + 200))


def test_0521_above_48_kib_is_the_size_check_not_the_launch():
    b = last_admitted() + 1
    r = validate_batch.check(doc(b, "0.5.21"))
    f = next(f for f in r.errors if f.code == "SGL003")
    assert f.numbers["dynamic_bytes"] == dynamic(b) > KIB48 and "size check" in f.message
    f = next(f for f in validate_batch.check(doc(first_not_fitting(), "0.5.21")).errors if f.code == "SGL003")
    assert f.numbers["dynamic_bytes"] + f.numbers["static_bytes"] == dynamic(first_not_fitting()) + STATIC
    assert "without an opt-in" in f.message and "guard" not in f.message.split(";")[1]


def test_the_checker_fast_path_agrees_per_release():
    first, last = first_not_fitting(), last_admitted()
    for release in ("0.5.21", "0.5.22", "0.5.23"):
        g = validate_batch.Checker(engine=f"sglang-dsv4@{release}", gpu="B200", model={"model_type": "deepseek_v41"},
                                   server_args={"tp_size": 8})
        for b in (first - 1, first, last, last + 1, last + 50):
            assert bool(g.verdict("decode", seq_lens=[300] * b)) is (not fails(release, b)), (release, b)


def test_the_precompute_needs_blackwell_64_heads_and_v41():
    b = first_not_fitting()
    assert "SGL003" in codes(validate_batch.check(doc(b, "0.5.22", gpu="GB200")))
    assert validate_batch.check(doc(b, "0.5.22", gpu="H200")).legal
    assert validate_batch.check(doc(b, "0.5.22", model_type="deepseek_v4")).legal
    d = doc(b, "0.5.22")
    d["model"]["h_q"] = 128
    assert "SGL003" not in codes(validate_batch.check(d))


def test_a_name_spanning_releases_is_judged_as_its_newest_and_says_so():
    # sparse-prefill-default covers 0.5.15 .. 0.5.22, whose precomputes differ (none, then 0.5.21's, then
    # 0.5.22's): a name is judged as its entry's newest release, 0.5.22, and the report says so
    rep = validate_batch.check(doc(first_not_fitting(), "sparse-prefill-default"))
    (judged,) = rep.context["judged_as"]
    assert judged["release"] == "0.5.22" and "0.5.22" in judged["basis"]
    assert codes(rep) == codes(validate_batch.check(doc(first_not_fitting(), "0.5.22")))
    assert "SGL003" in codes(rep)
    # routing (0.5.13, 0.5.14): no precompute in either
    assert validate_batch.check(doc(first_not_fitting(), "routing")).legal
    assert validate_batch.check(doc(first_not_fitting(), "latest")).legal             # 0.5.23 on


# ------------------------------------------------------------------------------ from the wheels
def _wheel(version: str) -> Path | None:
    folder = os.environ.get("VALIDATE_BATCH_SGLANG_WHEELS")
    if not folder:
        return None
    hits = sorted(Path(folder).glob(f"sglang-{version}-*.whl"))
    return hits[0] if hits else None


def _read(version: str, name: str) -> str:
    w = _wheel(version)
    if w is None:
        pytest.skip(f"no sglang {version} wheel: set VALIDATE_BATCH_SGLANG_WHEELS to a folder holding "
                    f"pip download --no-deps sglang=={version}")
    with zipfile.ZipFile(w) as zf:
        try:
            return zf.read(name).decode("utf-8")
        except KeyError:
            return ""


BACKEND = "sglang/srt/layers/attention/deepseek_v4_backend.py"
KERNEL = "sglang/kernels/jit/csrc/deepseek_v4/flashmla_sched_meta.cuh"


def _engine_guard(version: str):
    """The release's own guard, compiled from its source: ``skip(b, num_sm_parts)`` (None: no guard)."""
    tree = ast.parse(_read(version, BACKEND))
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
              and n.name == "_maybe_precompute_flashmla_sched_meta")
    tests = [n.test for n in ast.walk(fn) if isinstance(n, ast.If) and "num_sm_parts" in ast.unparse(n.test)]
    if not tests:
        return None
    expr = compile(ast.Expression(tests[0]), f"{version}:{BACKEND}", "eval")
    return lambda b, parts: eval(expr, {"META_INTS": 8}, {"b": b, "num_sm_parts": parts})


def _kernel(version: str) -> dict:
    """What the release's JIT kernel does with its shared memory: its size check, its opt-in, its
    dynamic size and its static arrays, read from the .cuh."""
    src = _read(version, KERNEL)
    check = re.search(r"RuntimeCheck\(smem <= (\d+) \* 1024", src)
    opt = re.search(r"set_max_dynamic_smem_per_device<flashmla_sched_meta_kernel>\([^,]+,\s*(\d+) \* 1024\)", src)
    size = re.search(r"sizeof\(int\) \* static_cast<std::size_t>\(b \* 5 \+ 1 \+ num_sm_parts \* kMetaInts\)", src)
    meta = int(re.search(r"constexpr int kMetaInts = (\d+);", src).group(1))
    block = int(re.search(r"constexpr int kBlockSize = (\d+);", src).group(1))
    words = 0
    for m in re.finditer(r"__shared__ int (\w+)(?:\[([^\]]+)\])?;", src):
        n = m.group(2)
        words += 1 if n is None else eval(n.replace("kBlockSize", str(block)))
    return {"check": int(check.group(1)) * 1024 if check else None, "opt_in": int(opt.group(1)) * 1024 if opt else None,
            "size_is_model": bool(size) and meta == 8, "declared_static": 4 * words}


@pytest.mark.parametrize("version,guarded,opt_in", [("0.5.21", False, False), ("0.5.22", True, False),
                                                    ("0.5.23", True, True)])
def test_the_release_source_has_the_guard_and_opt_in_the_model_says(version, guarded, opt_in):
    guard = _engine_guard(version)
    k = _kernel(version)
    assert (guard is not None) is guarded
    assert (k["opt_in"] is not None) is opt_in
    assert k["check"] == KIB48 and k["size_is_model"]
    assert k["declared_static"] == 40 and -(-k["declared_static"] // 16) * 16 == STATIC
    if guard is not None:
        last = last_admitted()
        assert (guard(last - 1, B200_SMS), guard(last, B200_SMS), guard(last + 1, B200_SMS)) == (False, False, True)


@pytest.mark.parametrize("version", ["0.5.21", "0.5.22", "0.5.23"])
def test_the_verdicts_follow_the_release_source_at_the_edges(version):
    """The engine's own guard (compiled from the wheel) and the kernel's check and opt-in decide;
    CUDA's launch rule decides the rest."""
    guard, k = _engine_guard(version), _kernel(version)
    first, last = first_not_fitting(), last_admitted()
    for b in (first - 1, first, first + 1, last - 1, last, last + 1, last + 2):
        dyn = dynamic(b)
        if guard is not None and guard(b, B200_SMS):
            want = False
        elif dyn > k["check"]:
            want = True
        else:
            want = not launches(dyn, opt_in=k["opt_in"])
        r = validate_batch.check(doc(b, version))
        assert ("SGL003" in codes(r)) is want, (version, b)


def test_0520_has_no_precompute():
    src = _read("0.5.20", BACKEND)
    assert src and "_maybe_precompute_flashmla_sched_meta" not in src
    assert validate_batch.check(doc(first_not_fitting() + 100, "0.5.20")).legal


@pytest.mark.parametrize("version,mega", [("0.5.21", False), ("0.5.22", False), ("0.5.23", True)])
def test_the_mega_backend_exists_from_0523(version, mega):
    exec_ = _read(version, "sglang/srt/arg_groups/fields/exec_.py")
    choices = re.search(r"dsv4_attn_backend.*?choices=\[([^\]]*)\]", exec_, re.S).group(1)
    assert ('"flashmla_mega"' in choices) is mega and '"trtllm"' in choices
    d = doc(10, version, sa={"tp_size": 1})
    if mega:
        with pytest.raises(NotModelled, match="flashmla_mega"):
            validate_batch.check(d)
    else:
        assert validate_batch.check(d).legal


# ----------------------------------------------------------------------- the measured mechanism
def _probe() -> dict:
    assert PROBE.is_file(), f"fixtures/measured/{PROBE.name}: the H200 record is part of the repository"
    return json.loads(PROBE.read_text(encoding="utf-8"))


def _launch(rec, kernel, mode, dyn):
    hits = [x for x in rec["launches"] if x["kernel"] == kernel and x["mode"] == mode and x["dynamic_bytes"] == dyn]
    assert hits, (kernel, mode, dyn)
    return hits[0]["ok"]


@pytest.mark.parametrize("kernel,static", [("static48", 48), ("static64", 64)])
def test_the_probe_measures_the_default_and_opt_in_limits(kernel, static):
    rec = _probe()
    k = next(x for x in rec["kernels"] if x["kernel"] == kernel)
    assert k["static_bytes"] == static
    optin = rec["device"]["shared_mem_per_block_optin"]
    assert rec["device"]["shared_mem_per_block"] == KIB48
    for d in (-4, 0, 4):                      # no opt-in: static + dynamic <= 48 KiB
        assert _launch(rec, kernel, "default", KIB48 - static + d) is (d <= 0)
        assert _launch(rec, kernel, "opt_in_48KiB", KIB48 + d) is (d <= 0)     # opt-in: dynamic <= 48 KiB
        assert _launch(rec, kernel, "opt_in_max", optin - static + d) is (d <= 0)
    assert _launch(rec, kernel, "default", KIB48 - 64) is (static <= 64)
    over = next(a for a in rec["attributes"] if a["kernel"] == kernel and a["mode"] == "opt_in_over_max")
    assert over["ok"] is False


@pytest.mark.parametrize("parts", [B200_SMS, 132])
def test_the_probe_at_the_precompute_sizes_matches_the_releases(parts):
    """The probe's static48 kernel at 4*(5b+1+8P): without the opt-in (0.5.21 / 0.5.22) and with
    it (0.5.23); the model's verdicts for the b the guard admits follow the launches."""
    rec = _probe()
    rows = [x for x in rec["launches"] if x["kernel"] == "static48" and x["why"] == "precompute"
            and x["num_sm_parts"] == parts]
    assert rows
    for x in rows:
        b = x["rows"]
        assert x["dynamic_bytes"] == dynamic(b, parts)
        if x["mode"] == "default":
            assert x["ok"] is launches(x["dynamic_bytes"]), b
            if x["dynamic_bytes"] <= KIB48:
                assert fails("0.5.22", b, parts) is (not x["ok"]), b
        elif x["mode"] == "opt_in_48KiB":
            assert x["ok"] is (x["dynamic_bytes"] <= KIB48), b
            assert not fails("0.5.23", b, parts)


# -------------------------------------------------------------------------- paths not modelled
@pytest.mark.parametrize("sa,env,mega", [
    ({"tp_size": 1}, None, True),                                   # attention TP 1
    ({"tp_size": 8, "attn_dp_size": 8}, None, True),                # DP attention: attention TP 1
    ({"tp_size": 8, "attn_dp_size": 4}, None, False),               # attention TP 2
    ({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}, None, True),
    ({"tp_size": 8, "disaggregation_mode": "decode"}, None, True),  # PD: attention TP does not matter
    ({"tp_size": 8, "disaggregation_mode": "prefill"}, None, True),
    ({"tp_size": 8}, None, False),
    ({"tp_size": 1, "kv_cache_dtype": "bfloat16"}, None, False),
    ({"tp_size": 1, "kv_cache_dtype": "fp8_e4m3"}, None, True),
    ({"tp_size": 1}, {"SGLANG_DSV4_KV_LAYOUT": "v4"}, False),
    ({"tp_size": 1}, {"SGLANG_DSV4_KV_LAYOUT": "v41"}, True),
    ({"tp_size": 1, "dsv4_attn_backend": "flashmla"}, None, False),
    ({"tp_size": 8, "dsv4_attn_backend": "flashmla_mega"}, None, True),
])
def test_0523_auto_backend_resolution_edges(sa, env, mega):
    # 41 rows: above the 40 of the engine's small-batch decode kernel, so the flashmla backend's
    # step runs FlashMLA (tests/test_sglang_unmodelled_steps.py has the steps below)
    d = doc(41, "0.5.23", sa=sa, env=env)
    d["server_args"] = sa                               # exactly these settings
    if mega:
        with pytest.raises(NotModelled, match="MegaAttention"):
            validate_batch.check(d)
    else:
        assert validate_batch.check(d).legal


def test_mega_needs_v41_and_sm100():
    assert validate_batch.check({**doc(10, "0.5.23", model_type="deepseek_v4"), "server_args": {"tp_size": 1}}).legal
    assert validate_batch.check({**doc(10, "0.5.23", gpu="H200"), "server_args": {"tp_size": 1}}).legal


def test_trtllm_and_sm120_are_not_modelled_in_every_release():
    for version in ("0.5.12", "0.5.22", "0.5.23"):
        with pytest.raises(NotModelled, match="trtllm"):
            validate_batch.check(doc(10, version, sa={"dsv4_attn_backend": "trtllm"}))
        with pytest.raises(NotModelled, match="sm120"):
            validate_batch.check(doc(10, version, gpu=SM120))
        assert validate_batch.check(doc(41, version)).legal            # B200 (SM100), flashmla, 41 rows: modelled
    assert validate_batch.check(doc(10, "0.5.22", gpu={**SM120, "cc": [10, 0], "num_sms": 148})).legal


def test_the_cli_says_not_modelled_and_exits_2(tmp_path):
    f = tmp_path / "batch.json"
    f.write_text(json.dumps({**doc(8, "0.5.23"), "server_args": {"tp_size": 1}}), encoding="utf-8")
    res = runner.invoke(app, ["check", str(f)])
    assert res.exit_code == 2, res.output
    assert "not modelled" in res.output and "flashmla_mega" in res.output
    f.write_text(json.dumps(doc(41, "0.5.23")), encoding="utf-8")           # attention TP 8: flashmla
    assert runner.invoke(app, ["check", str(f)]).exit_code == 0


def _vllm(model_type=None, gpu="B200", sa=None):
    return {"engine": "vllm-dsv4@0.33", "gpu": gpu, "forward_mode": "decode",
            "model": {"model_type": model_type} if model_type else {}, "server_args": sa or {},
            "requests": [{"id": "a", "seq_len": 100}]}


def test_vllm_deepseek_v41_is_not_modelled():
    with pytest.raises(NotModelled, match="deepseek_v41"):
        validate_batch.check(_vllm("deepseek_v41"))
    assert validate_batch.check(_vllm("deepseek_v4")).legal
    assert validate_batch.check(_vllm()).legal


@pytest.mark.parametrize("gpu,backend,outcome", [
    ("B200", None, "legal"), ("H200", None, "legal"), (SM120, None, "not_modelled"),
    ("B200", "FLASHINFER_MLA_SPARSE_DSV4", "not_modelled"), (SM120, "FLASHINFER_MLA_SPARSE_DSV4", "not_modelled"),
    ("B200", "FLASHMLA_SPARSE_DSV4", "legal"), ("B200", "flashmla_sparse", "legal"),
    ("B200", "FLASHINFER_MLA_SPARSE", "refused"), ("H200", "FLASHINFER_MLA_SPARSE_SM120", "refused"),
])
def test_vllm_attention_class_selection(gpu, backend, outcome):
    d = _vllm(gpu=gpu, sa={"attention_backend": backend} if backend else None)
    if outcome == "legal":
        assert validate_batch.check(d).legal
    elif outcome == "not_modelled":
        with pytest.raises(NotModelled, match="FlashInfer"):
            validate_batch.check(d)
    else:
        with pytest.raises(InputError) as e:
            validate_batch.check(d)
        assert not isinstance(e.value, NotModelled) and "refuses" in str(e.value)
