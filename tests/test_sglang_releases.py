"""SGLang 0.5.12 .. 0.5.23 as they shipped: the release each batch is judged as, at every boundary
where a release changes what the DeepSeek-V4 backend does, and the release named in every verdict.

Ground truth, written here from the releases' wheels (the facts themselves are checked against the
wheels in tests/test_sglang_release_wheels.py) and arithmetic:

- PyPI has 0.5.12, 0.5.12.post1, 0.5.13, 0.5.13.post1, 0.5.14, 0.5.15, 0.5.15.post1, 0.5.16 .. 0.5.23.
- 0.5.12 and 0.5.12.post1: no sparse-prefill routing, upstream flash_mla (the seed crash ran 9241ae3).
- 0.5.13, 0.5.14: extends without speculation of more than 11673 rows go to flash_mla_sparse_fwd;
  SGLANG_OPT_FLASHMLA_SPARSE_PREFILL exists, default off.
- 0.5.15 on: the switch defaults to on: every such extend goes to sparse prefill.
- 0.5.16 on: SM120 GPUs never take sparse prefill.
- 0.5.15 .. 0.5.20: --enable-prefill-cp turns the switch off; 0.5.21 on: not for deepseek_v41 models;
  0.5.22 on: a context-parallel extend never takes sparse prefill.
- sglang-kernel pins: 0.5.13 0.4.3, 0.5.14/0.5.15 0.4.4, 0.5.16/0.5.17 0.4.5, 0.5.18/0.5.19 0.4.6.post1,
  0.5.20/0.5.21 0.4.7, 0.5.22 0.4.9; 0.5.23 takes FlashMLA from sgl-flash-mla 1.0.0. The combine
  kernel of 0.4.3 .. 0.4.6.post1 dispatches up to 160 splits, of 0.4.7 on up to 256 (template
  instantiations in flashmla_ops.abi3.so); from 0.4.3 its grid is (b*s_q, 1, ceil(h_q/8)).
- FlashMLA 9241ae3's scheduler needs 4*(5b+1) bytes of 232448 on an H200: b <= 11622.
"""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import validate_batch
from validate_batch.cli.main import app
from validate_batch.engines import release_key, resolve_version
from validate_batch.errors import InputError
from validate_batch.flashmla.calls import DecodeCall
from validate_batch.flashmla.plan import plan
from validate_batch.legality.evaluate import plan_batch
from validate_batch.inputs.batch import batch_from_dict as parse_batch

runner = CliRunner()
LIMIT = (232448 - 4) // 20          # 11622
THRESHOLD = 11673
RELEASES = ["0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16",
            "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
SWITCH_ON_FROM = "0.5.15"
SM120_OUT_FROM = "0.5.16"
PINS = {"0.5.12": "0.4.2.post2", "0.5.12.post1": "0.4.2.post2", "0.5.13": "0.4.3", "0.5.13.post1": "0.4.3",
        "0.5.14": "0.4.4", "0.5.15": "0.4.4", "0.5.15.post1": "0.4.4", "0.5.16": "0.4.5", "0.5.17": "0.4.5",
        "0.5.18": "0.4.6.post1", "0.5.19": "0.4.6.post1", "0.5.20": "0.4.7", "0.5.21": "0.4.7", "0.5.22": "0.4.9",
        "0.5.23": "0.4.10"}


def doc(tokens, version, gpu="H200", server_args=None, model=None, env=None):
    d = {"engine": f"sglang-dsv4@{version}" if version else "sglang-dsv4", "gpu": gpu, "forward_mode": "extend",
         "server_args": dict(server_args or {}), "requests": [{"id": f"p{i}", "extend_tokens": t} for i, t in enumerate(tokens)]}
    if model:
        d["model"] = model
    if env:
        d["env"] = env
    return d


def routed(d, build=None) -> bool:
    return plan_batch(parse_batch(d), build).routing["routed"]


def errors(rep) -> set:
    return {f.code for f in rep.errors}


# --------------------------------------------------------------------------- ordering and resolution
def test_release_order_is_pep440_like():
    order = ["0.5.12.dev1", "0.5.12rc1", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.23", "0.5.99"]
    keys = [release_key(v) for v in order]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert release_key("0.5.12") == release_key("0.5.12.0") == release_key("v0.5.12")
    assert release_key("nope") is None and release_key("0.5.x") is None


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_resolves_to_itself(release):
    v = resolve_version("sglang-dsv4", release)
    assert v["judged_as"]["release"] == release and not v["judged_as"]["warning"]
    assert v["judged_as"]["basis"] == f"release {release} (given)"


@pytest.mark.parametrize("release,entry", [("0.5.12", "pre-routing"), ("0.5.12.post1", "pre-routing"),
                                           ("0.5.13", "routing"), ("0.5.14", "routing"),
                                           ("0.5.15", "sparse-prefill-default"), ("0.5.22", "sparse-prefill-default"),
                                           ("0.5.23", "sgl-flash-mla")])
def test_each_boundary_release_has_its_entry(release, entry):
    assert resolve_version("sglang-dsv4", release)["name"] == entry


def test_no_version_is_judged_as_the_newest_and_says_so():
    v = resolve_version("sglang-dsv4", None)
    assert v["judged_as"]["release"] == RELEASES[-1]
    assert v["judged_as"]["basis"].startswith("no version given") and "0.5.23, the newest known release" in v["judged_as"]["basis"]


def test_a_name_is_judged_as_its_newest_release():
    assert resolve_version("sglang-dsv4", "routing")["judged_as"]["release"] == "0.5.14"
    assert resolve_version("sglang-dsv4", "pre-routing")["judged_as"]["release"] == "0.5.12.post1"
    assert resolve_version("sglang-dsv4", "latest")["judged_as"]["release"] == "0.5.23"


@pytest.mark.parametrize("spec", ["0.5.24", "0.5.99", "0.6.0", "1.0"])
def test_a_newer_release_is_judged_as_the_newest_with_a_warning(spec):
    v = resolve_version("sglang-dsv4", spec)
    assert v["judged_as"]["warning"] and v["judged_as"]["release"] == "0.5.23"
    assert f"{spec} is newer than every known release: judged as 0.5.23" in v["judged_as"]["basis"]


@pytest.mark.parametrize("spec", ["0.5.12.post2", "0.5.14.post1", "0.5.16.post1", "0.5.22.post1", "0.5.23rc1"])
def test_a_release_inside_the_known_span_that_does_not_exist_is_an_input_error(spec):
    with pytest.raises(InputError) as e:
        resolve_version("sglang-dsv4", spec)
    assert f"no release {spec}" in str(e.value) and "0.5.12.post1" in str(e.value) and "0.5.23" in str(e.value)


def test_an_older_release_is_judged_by_its_range_and_says_so():
    v = resolve_version("sglang-dsv4", "0.5.8")
    assert v["name"] == "pre-routing" and "older than the releases read" in v["judged_as"]["basis"]


@pytest.mark.parametrize("profile,spec,newest", [("vllm-dsv4", "0.35.0", "0.34.0"), ("sglang-slots", "0.5.30", "0.5.23")])
def test_other_profiles_warn_for_newer_releases_too(profile, spec, newest):
    v = resolve_version(profile, spec)
    assert v["judged_as"]["warning"] and v["judged_as"]["release"] == newest


def test_a_range_less_entry_is_never_chosen_by_a_number():
    from validate_batch.engines.versions import _in_range
    assert not _in_range(release_key("0.5.12"), {"name": "x"})
    assert _in_range(release_key("0.5.12"), {"name": "x", "max_release": "0.5.12"})
    assert not _in_range(release_key("0.5.12.post1"), {"name": "x", "max_release": "0.5.12"})


def test_slot_tails_by_release():
    # the plain DSA builder passes the request table's rows from 0.5.20 (kv_cache_configurator.py:1263)
    got = [resolve_version("sglang-slots", r)["draft_tail_sizing"] for r in ("0.5.12", "0.5.19", "0.5.20", "0.5.22", "0.5.23")]
    assert got == ["running_limit", "running_limit", "table_rows", "table_rows", "table_rows"]


# --------------------------------------------------------------------------- routing at each boundary
@pytest.mark.parametrize("release", ["0.5.12", "0.5.12.post1"])
def test_pre_routing_releases_send_every_extend_to_the_decode_kernel(release):
    for rows in (LIMIT, THRESHOLD + 1, 20000):
        assert not routed(doc([rows], release))
    rep = validate_batch.check(doc([LIMIT + 1], release))
    assert "FMLA001" in errors(rep) and rep.context["kernel_build"] == "flashmla-9241ae3"
    assert validate_batch.check(doc([LIMIT], release)).legal


@pytest.mark.parametrize("release", ["0.5.13", "0.5.13.post1", "0.5.14"])
def test_threshold_releases_route_only_above_11673(release):
    assert [routed(doc([r], release)) for r in (1, THRESHOLD - 1, THRESHOLD, THRESHOLD + 1)] == [False, False, False, True]
    # the routing gap: 11623..11673 rows still reach the scheduler (on 9241ae3 it fails)
    assert "FMLA001" in errors(validate_batch.check(doc([THRESHOLD], release), build="flashmla-9241ae3"))
    assert validate_batch.check(doc([THRESHOLD + 1], release), build="flashmla-9241ae3").legal
    # the switch set by hand routes them
    assert routed(doc([1], release, env={"SGLANG_OPT_FLASHMLA_SPARSE_PREFILL": "1"}))


@pytest.mark.parametrize("release", [r for r in RELEASES if release_key(r) >= release_key(SWITCH_ON_FROM)])
def test_from_0515_every_extend_takes_sparse_prefill(release):
    assert all(routed(doc([r], release)) for r in (1, LIMIT + 1, THRESHOLD, THRESHOLD + 1))
    assert validate_batch.check(doc([THRESHOLD], release), build="flashmla-9241ae3").legal
    off = {"SGLANG_OPT_FLASHMLA_SPARSE_PREFILL": "0"}
    assert [routed(doc([r], release, env=off)) for r in (THRESHOLD, THRESHOLD + 1)] == [False, True]


def test_the_switch_boundary_is_between_0514_and_0515():
    assert not routed(doc([100], "0.5.14")) and routed(doc([100], "0.5.15"))


def sm120():
    return {"name": "sm120-custom", "num_sms": 188, "cc": [12, 0], "smem_optin": 101376}


@pytest.mark.parametrize("release,out", [("0.5.15", False), ("0.5.15.post1", False), ("0.5.16", True),
                                         ("0.5.22", True), ("0.5.23", True)])
def test_sm120_is_left_out_of_sparse_prefill_from_0516(release, out):
    from validate_batch.engines.dsv4 import sparse_prefill_excluded
    b = parse_batch(doc([THRESHOLD + 1], release, gpu=sm120()))
    assert (sparse_prefill_excluded(b, resolve_version("sglang-dsv4", release)) is not None) == out
    # an H200 is never left out
    h = parse_batch(doc([THRESHOLD + 1], release))
    assert sparse_prefill_excluded(h, resolve_version("sglang-dsv4", release)) is None


CP = {"enable_prefill_cp": True}
V41 = {"model_type": "deepseek_v41"}


def switch(d) -> bool | None:
    """The sparse-prefill switch the release's data sets for this configuration (the engine's hook)."""
    from validate_batch.engines.dsv4 import sparse_prefill_switch
    b = parse_batch(d)
    return sparse_prefill_switch(b, resolve_version("sglang-dsv4", b.profiles[0][1]))


def excluded(d) -> str | None:
    from validate_batch.engines.dsv4 import sparse_prefill_excluded
    b = parse_batch(d)
    return sparse_prefill_excluded(b, resolve_version("sglang-dsv4", b.profiles[0][1]))


def cp_refused(d) -> bool:
    """The step is judged not modelled, naming context-parallel prefill (its rows per CP rank are not counted)."""
    r = validate_batch.check(d)
    return r.verdict == "not_modelled" and "context-parallel" in r.not_modelled[0]["path"]


# the setting that turns prefill context parallelism on, per release (each wheel's server-argument fields)
CP_SETTING = {"0.5.12": "enable_nsa_prefill_context_parallel", "0.5.13": "enable_dsa_prefill_context_parallel",
              "0.5.13.post1": "enable_dsa_prefill_context_parallel", "0.5.14": "enable_prefill_cp",
              "0.5.19": "enable_dsa_prefill_context_parallel", "0.5.20": "enable_prefill_cp", "0.5.23": "enable_prefill_cp"}
NOT_READ = {"0.5.12": "enable_prefill_cp", "0.5.13.post1": "enable_prefill_cp", "0.5.20": "enable_dsa_prefill_context_parallel"}


@pytest.mark.parametrize("release", sorted(CP_SETTING, key=release_key))
def test_a_context_parallel_extend_is_not_modelled(release):
    # every release's DeepSeek-V4 metadata keeps only this CP rank's rows (apply_cp_reindex): the
    # rows a rank runs are not the forward's
    on = {CP_SETTING[release]: True}
    for rows in (100, THRESHOLD, THRESHOLD + 1, 20000):
        assert cp_refused(doc([rows], release, server_args=on)), (release, rows)
        assert not cp_refused(doc([rows], release, server_args={**on, "attn_cp_size": 1})), (release, rows)
    assert not cp_refused(doc([100], release))
    # context parallelism is for prefill: a decode step is modelled as usual
    assert validate_batch.check({**doc([], release, server_args=on), "forward_mode": "decode",
                                 "requests": [{"id": "d", "seq_len": 300}]}).verdict == "legal"


@pytest.mark.parametrize("release", sorted(NOT_READ, key=release_key))
def test_a_setting_the_release_does_not_have_turns_nothing_on(release):
    d = doc([THRESHOLD + 1], release, server_args={NOT_READ[release]: True})
    assert not cp_refused(d) and validate_batch.check(d).verdict in ("legal", "illegal")


@pytest.mark.parametrize("release", ["0.5.15", "0.5.20"])
def test_context_parallelism_turns_the_switch_off_0515_to_0520(release):
    assert switch(doc([100], release)) is True and switch(doc([100], release, server_args=CP)) is False
    assert switch(doc([100], release, server_args=CP, model=V41)) is False
    assert excluded(doc([100], release, server_args=CP)) is None


def test_from_0521_the_switch_stays_on_for_v41_under_context_parallelism():
    assert switch(doc([100], "0.5.21", server_args=CP, model=V41)) is True
    assert switch(doc([100], "0.5.21", server_args=CP)) is False
    assert excluded(doc([THRESHOLD + 1], "0.5.21", server_args=CP)) is None


@pytest.mark.parametrize("release", ["0.5.22", "0.5.23"])
def test_from_0522_a_context_parallel_extend_never_takes_sparse_prefill(release):
    for model in (None, V41):
        assert "context-parallel" in excluded(doc([THRESHOLD + 1], release, server_args=CP, model=model))
    assert excluded(doc([100], release)) is None and routed(doc([100], release))


# --------------------------------------------------------------------------- kernel builds per release
@pytest.mark.parametrize("release", RELEASES)
def test_each_release_is_judged_on_the_build_it_ships(release):
    v = resolve_version("sglang-dsv4", release)
    if release.startswith("0.5.12"):
        assert v["kernel_build"] == "flashmla-9241ae3"
    elif release == "0.5.23":
        assert v["kernel_build"] == "sgl-flash-mla-1.0.0"
    else:
        assert v["kernel_build"] == f"sglang-kernel-{PINS[release]}"
        assert v["release_pins"] == [f"sglang-kernel=={PINS[release]}"]


@pytest.mark.parametrize("pin,limit", [("0.4.3", 160), ("0.4.4", 160), ("0.4.5", 160), ("0.4.6.post1", 160),
                                       ("0.4.7", 256), ("0.4.9", 256)])
def test_combine_splits_per_sglang_kernel(pin, limit):
    build = f"sglang-kernel-{pin}"
    for parts in (limit - 1, limit, limit + 1):
        gpu = {"name": "custom", "num_sms": parts, "cc": [9, 0], "smem_optin": 232448}
        rec = {"kind": "sparse", "b": 1, "s_q": 1, "h_q": 64, "d_qk": 576, "topk": 128}
        p = plan(rec, gpu, build)
        assert p.num_sm_parts == parts
        assert ("FMLA008" in {f.code for f in validate_batch.check(rec, gpu=gpu, build=build).errors}) == (parts > limit)


@pytest.mark.parametrize("build,grid", [("sgl-kernel-flashmla", (1, 4096, 8)), ("sglang-kernel-0.4.3", (4096, 1, 8)),
                                        ("sglang-kernel-0.4.7", (4096, 1, 8))])
def test_combine_grid_per_sglang_kernel(build, grid):
    # b = 1, s_q = 4096, h_q = 64: (b, s_q, ceil(h_q/8)) before PR #182, (b*s_q, 1, ceil(h_q/8)) after
    p = plan({"kind": "sparse", "b": 1, "s_q": 4096, "h_q": 64, "d_qk": 576, "topk": 128}, "H200", build)
    assert tuple(p.combine_grid) == grid


@pytest.mark.parametrize("s_q", [65535, 65536])
def test_the_grid_limit_of_y_applies_only_before_pr182(s_q):
    rec = {"kind": "sparse", "b": 1, "s_q": s_q, "h_q": 64, "d_qk": 576, "topk": 128}
    grid = [f for f in validate_batch.check(rec, gpu="H200", build="sgl-kernel-flashmla").errors
            if "combine grid" in f.message]
    assert bool(grid) == (s_q > 65535)
    assert not [f for f in validate_batch.check(rec, gpu="H200", build="sglang-kernel-0.4.3").errors
                if "combine grid" in f.message]


# --------------------------------------------------------------------------- every verdict names what it judged
@pytest.mark.parametrize("release", RELEASES)
def test_check_json_names_the_release_and_the_build(release):
    res = runner.invoke(app, ["check", "--engine", f"sglang-dsv4@{release}", "--extend", "100", "--json"])
    assert res.exit_code in (0, 1), res.output
    d = json.loads(res.stdout)
    (j,) = d["judged_as"]
    assert j["profile"] == "sglang-dsv4" and j["release"] == release and j["kernel_build"] == d["kernel_build"]
    assert j["basis"] == f"release {release} (given)" and release in j["kernel_build_basis"]
    human = runner.invoke(app, ["check", "--engine", f"sglang-dsv4@{release}", "--extend", "100"])
    assert f"judged as: sglang-dsv4 {release}" in human.stdout and f"kernel build {d['kernel_build']}" in human.stdout


def test_the_seed_crash_without_a_version_says_which_release_it_was_judged_as():
    res = runner.invoke(app, ["check", "--engine", "sglang-dsv4", "--extend", "12288", "--json"])
    d = json.loads(res.stdout)
    assert res.exit_code == 0 and d["legal"]
    assert d["judged_as"][0]["release"] == "0.5.23" and d["judged_as"][0]["basis"].startswith("no version given")
    human = runner.invoke(app, ["check", "--engine", "sglang-dsv4", "--extend", "12288"])
    assert "judged as: sglang-dsv4 0.5.23" in human.stdout and "no version given" in human.stdout
    old = runner.invoke(app, ["check", "--engine", "sglang-dsv4@0.5.12", "--extend", "12288", "--json"])
    assert old.exit_code == 1 and "FMLA001" in {f["code"] for f in json.loads(old.stdout)["findings"]}


def test_a_newer_release_is_a_warning_in_the_json_and_the_human_output():
    res = runner.invoke(app, ["check", "--engine", "sglang-dsv4@0.5.99", "--extend", "100", "--json"])
    d = json.loads(res.stdout)
    assert d["judged_as"][0]["warning"] and d["judged_as"][0]["release"] == "0.5.23"
    assert any("0.5.99 is newer than every known release: judged as 0.5.23" in n for n in d["notes"])
    human = runner.invoke(app, ["check", "--engine", "sglang-dsv4@0.5.99", "--extend", "100"])
    assert "note: sglang-dsv4: 0.5.99 is newer than every known release" in human.stdout


def test_an_unknown_release_in_the_span_exits_2_naming_the_known_ones():
    res = runner.invoke(app, ["check", "--engine", "sglang-dsv4@0.5.14.post1", "--extend", "100"])
    assert res.exit_code == 2 and "0.5.14.post1" in res.output and "0.5.15.post1" in res.output


@pytest.mark.parametrize("release,has", [("0.5.20", False), ("0.5.21", True), ("0.5.22", True)])
def test_late_layer_tails_exist_from_0521_and_are_off_by_default(release, has):
    # enable_decoder_swa_bounded_replay: a field of 0.5.21 / 0.5.22 (default False); each request's last
    # min(128, extend) tokens run the decode kernel, the rest of the forward sparse prefill
    on = plan_batch(parse_batch(doc([300, 50], release, server_args={"enable_decoder_swa_bounded_replay": True},
                                    model=V41)))
    off = plan_batch(parse_batch(doc([300, 50], release, model=V41)))
    assert "late_layer_tail_rows" not in off.routing
    assert on.routing.get("late_layer_tail_rows") == (128 + 50 if has else None)


@pytest.mark.parametrize("sms", [160, 161, 256, 257])
def test_the_split_limit_flips_a_decode_verdict_between_0519_and_0520(sms):
    # a decode forward's calls have s_q = 1 and 64 heads: num_sm_parts = SMs; sglang-kernel 0.4.6.post1
    # (0.5.19) combines up to 160 splits, 0.4.7 (0.5.20) up to 256
    gpu = {"name": f"custom-{sms}", "num_sms": sms, "cc": [9, 0], "smem_optin": 232448}
    d = {"engine": "sglang-dsv4@0.5.19", "gpu": gpu, "forward_mode": "decode",
         "requests": [{"id": f"r{i}", "seq_len": 300} for i in range(4)]}
    old = validate_batch.check(d)
    new = validate_batch.check({**d, "engine": "sglang-dsv4@0.5.20"})
    assert ("FMLA008" in errors(old)) == (sms > 160)
    assert ("FMLA008" in errors(new)) == (sms > 256)
    assert old.context["kernel_build"] == "sglang-kernel-0.4.6.post1" and new.context["kernel_build"] == "sglang-kernel-0.4.7"
