"""The sglang-trtllm-mla profile: SGLang 0.5.23's trtllm_mla backend through FlashInfer's trtllm-gen MLA decode.

Ground truth, written here rather than read from the code under test:
* the trtllm-gen decode kernels put the batch on gridDim.z, whose CUDA limit is 2**16 - 1 = 65535
  (flashinfer fb28d72 include/flashinfer/trtllm/fmha/fmhaKernels.cuh:579, :476);
* SGLang 0.5.23 passes the forward's batch size as that batch (srt/layers/attention/trtllm_mla_backend.py:821);
  decode: a query of [bs, 1, heads, 576] (:1323-1324); target verify: [bs, draft tokens, heads, 576]
  (:1551), so the limit is on requests, not on query rows; extend forwards run the ragged prefill
  (:1058-1100), not the decode kernel;
* CUDA-graph padding replays the captured batch size (srt/model_executor/runner/base_cuda_graph_runner.py:166-180).
No real engine class is used: the steps are batch documents and per-request lists as the guard takes them.
"""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import validate_batch
from validate_batch.bisect.engine_choice import choose_profile
from validate_batch.cli.main import app
from validate_batch.errors import InputError
from validate_batch.ingest.launch import EngineConfig, parse_launch

Z_MAX = 2**16 - 1          # CUDA's largest gridDim.z
ENGINE = "sglang-trtllm-mla"


def doc(mode: str, n: int, **extra) -> dict:
    d = {"engine": ENGINE, "forward_mode": mode, "requests": [{"id": f"r{i}", "seq_len": 100} for i in range(n)]}
    d.update(extra)
    return d


@pytest.mark.parametrize("n,legal", [(Z_MAX - 1, True), (Z_MAX, True), (Z_MAX + 1, False)])
def test_cli_decode_at_the_grid_limit(n, legal):
    r = CliRunner().invoke(app, ["check", "--engine", ENGINE, "--mode", "decode", "--decode", str(n), "--json"])
    d = json.loads(r.stdout)
    codes = {f["code"] for f in d["findings"] if f["severity"] == "error"}
    assert r.exit_code == (0 if legal else 1)
    assert codes == (set() if legal else {"FI001"})
    if not legal:
        f = next(f for f in d["findings"] if f["code"] == "FI001")
        assert f"expected <= {Z_MAX}, got {n}" in f["message"] and f["numbers"]["batch"] == n


def test_cli_decode_human_output_names_the_flashinfer_call():
    r = CliRunner().invoke(app, ["check", "--engine", ENGINE, "--mode", "decode", "--decode", str(Z_MAX + 1)])
    assert r.exit_code == 1 and "ILLEGAL" in r.stdout and "FI001" in r.stdout
    assert "trtllm_batch_decode_with_kv_cache_mla" in r.stdout and "B200" in r.stdout


@pytest.mark.parametrize("n,legal", [(Z_MAX - 1, True), (Z_MAX, True), (Z_MAX + 1, False)])
def test_target_verify_limit_is_on_requests_not_rows(n, legal):
    # 4 draft tokens: the query rows are 4n (far above 65535 at every n here); the kernel batch is n
    rep = validate_batch.check(doc("target_verify", n, server_args={"speculative_num_draft_tokens": 4}))
    assert rep.legal is legal and (("FI001" in rep.codes) is not legal)
    call = rep.batch_plan.calls[0].call
    assert (call.batch, call.q_len_per_request) == (n, 4)


@pytest.mark.parametrize("padded,legal", [(Z_MAX - 1, True), (Z_MAX, True), (Z_MAX + 1, False)])
def test_cuda_graph_padding_is_the_kernel_batch(padded, legal):
    rep = validate_batch.check(doc("decode", 8, padded_rows=padded))
    assert rep.legal is legal and rep.batch_plan.calls[0].call.batch == padded


def test_padded_verify_rows_over_draft_tokens():
    # 3 draft tokens; padding to 3 * 65536 rows is a captured batch of 65536 requests
    rep = validate_batch.check(doc("target_verify", 10, padded_rows=3 * (Z_MAX + 1),
                              server_args={"speculative_num_draft_tokens": 3}))
    assert rep.batch_plan.calls[0].call.batch == Z_MAX + 1 and "FI001" in rep.codes


@pytest.mark.parametrize("n,legal", [(Z_MAX, True), (Z_MAX + 1, False)])
def test_draft_extend_pads_to_the_longest_request(n, legal):
    reqs = [{"id": f"r{i}", "extend_tokens": 1 + (i % 3), "prefix_len": 50} for i in range(n)]
    rep = validate_batch.check({"engine": ENGINE, "forward_mode": "draft_extend", "requests": reqs})
    call = rep.batch_plan.calls[0].call
    assert (call.batch, call.q_len_per_request) == (n, 3) and rep.legal is legal


def test_extend_runs_no_decode_kernel():
    # 70000 prefill tokens over 70000 requests: the ragged prefill, which FI001 does not judge
    reqs = [{"id": f"p{i}", "extend_tokens": 1, "prefix_len": 0} for i in range(Z_MAX + 1)]
    rep = validate_batch.check({"engine": ENGINE, "forward_mode": "extend", "requests": reqs})
    assert rep.legal and rep.batch_plan.calls == []


def test_heads_per_rank_from_tp():
    rep = validate_batch.check(doc("decode", 2, server_args={"tp_size": 8}))
    assert rep.batch_plan.calls[0].call.h_q == 128 // 8


def test_only_blackwell():
    with pytest.raises(InputError) as e:
        validate_batch.check(doc("decode", 1, gpu="H200"))
    assert e.value.field == "gpu" and "10.x or 12.x" in e.value.message


@pytest.mark.parametrize("n,legal", [(Z_MAX - 1, True), (Z_MAX, True), (Z_MAX + 1, False)])
def test_guard_verdict_and_check(n, legal):
    guard = validate_batch.Checker(engine=ENGINE)
    assert guard.gpu.name == "B200" and guard.max_rows == Z_MAX
    v = guard.verdict("decode", seq_lens=[100] * n)
    assert v.legal is legal
    if not legal:
        assert "FI001" in v.report.codes
        steps = v.report.safe_split.steps
        assert [len(s) for s in steps] == [Z_MAX, 1]
    assert guard.check("decode", seq_lens=[100] * n).legal is legal


def test_guard_keeps_its_fast_path_and_falls_back_for_verify_rows():
    guard = validate_batch.Checker(engine=ENGINE, server_args={"speculative_num_draft_tokens": 4})
    # FI002 / FI003 judge plan() calls, which this profile never derives: every rule is decided by the bounds
    assert guard._bounds.complete
    # 20000 requests x 4 draft tokens = 80000 query rows > 65535, yet the kernel batch is 20000: legal
    assert guard.verdict("target_verify", seq_lens=[100] * 20000).legal
    assert not guard.verdict("target_verify", seq_lens=[100] * (Z_MAX + 1)).legal


def test_bisect_picks_the_profile_from_the_decode_backend():
    def cfg(cmd: str) -> EngineConfig:
        c = EngineConfig()
        c.update(parse_launch(cmd), "launch")
        return c
    base = "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-R1 "
    for flags in ("--attention-backend trtllm_mla", "--decode-attention-backend TRTLLM_MLA"):
        prof, why = choose_profile(cfg(base + flags), None, None, None)
        assert prof == [ENGINE] and "trtllm_mla" in why
    prof, _ = choose_profile(cfg(base + "--attention-backend flashinfer"), None, None, None)
    assert prof != [ENGINE]


def test_verify_split_is_minimal_in_requests():
    # 70000 requests x 4 draft tokens: the limit is 65535 requests per call, so two steps of whole requests
    n = 70000
    rep = validate_batch.check(doc("target_verify", n, server_args={"speculative_num_draft_tokens": 4}))
    assert [len(s) for s in rep.safe_split.steps] == [Z_MAX, n - Z_MAX]


def test_report_names_the_flashinfer_facts_not_a_flashmla_build():
    r = CliRunner().invoke(app, ["check", "--engine", ENGINE, "--mode", "decode", "--decode", "3", "--json"])
    d = json.loads(r.stdout)
    assert d["kernel_build"].startswith("flashinfer-")
    assert d["kernel_calls"][0]["kernel"] == "trtllm_batch_decode_with_kv_cache_mla"
