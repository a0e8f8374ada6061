"""Engine settings from launch commands, ServerArgs lines and user flags, with their provenance."""
from __future__ import annotations

import pytest

from validate_batch.errors import InputError
from validate_batch.ingest import build_config
from validate_batch.ingest.launch import EngineConfig, parse_launch, parse_server_arg_overrides, server_args_from_line
from validate_batch.ingest.scan import scan_lines


def test_launch_server_flags():
    v = parse_launch("python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V4-Flash --tp 8 --dp 4 "
                     "--enable-dp-attention --chunked-prefill-size=32768 --enable-mixed-chunk --cuda-graph-bs 1 2 4 "
                     "--max-running-requests 128 2>&1 | tee out.log")
    assert v["model_path"] == "deepseek-ai/DeepSeek-V4-Flash"
    assert (v["tp_size"], v["dp_size"], v["chunked_prefill_size"], v["max_running_requests"]) == (8, 4, 32768, 128)
    assert v["enable_dp_attention"] is True and v["enable_mixed_chunk"] is True
    assert v["cuda_graph_bs"] == [1, 2, 4]
    assert "tee" not in str(v)


def test_sglang_serve_positional_model_and_bool_values():
    v = parse_launch("sglang serve zai-org/GLM-5 --disaggregation-mode decode --trust-remote-code "
                     "--speculative-num-draft-tokens 4 --chunked-prefill-size -1")
    assert v["model_path"] == "zai-org/GLM-5" and v["disaggregation_mode"] == "decode"
    assert v["trust_remote_code"] is True and v["speculative_num_draft_tokens"] == 4
    assert v["chunked_prefill_size"] == -1


def test_server_args_line_and_cut_off_line():
    vals, complete = server_args_from_line(
        "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='m', chunked_prefill_size=8192, "
        "disaggregation_mode=<DisaggregationMode.DECODE: 'decode'>, cuda_graph_bs=[1, 2], json_model_override_args='{}', "
        "speculative_algorithm=None)")
    assert complete and vals["chunked_prefill_size"] == 8192 and vals["disaggregation_mode"] == "decode"
    assert vals["cuda_graph_bs"] == [1, 2] and vals["speculative_algorithm"] is None
    vals, complete = server_args_from_line("server_args=ServerArgs(model_path='m', tp_size=8, dp_size=2, chunked_pre")
    assert not complete and vals == {"model_path": "m", "tp_size": 8, "dp_size": 2}


def test_dp_attention_divides_the_command_line_chunk_but_not_the_resolved_one():
    cfg = EngineConfig()
    cfg.update({"chunked_prefill_size": 65536, "dp_size": 8, "enable_dp_attention": True}, "launch", per_rank_chunk=False)
    assert cfg.chunk_per_rank() == 65536 // 8
    cfg.update({"chunked_prefill_size": 8192}, "ServerArgs", per_rank_chunk=True)
    assert cfg.chunk_per_rank() == 8192
    cfg2 = EngineConfig()
    cfg2.update({"chunked_prefill_size": 8192, "dp_size": 8}, "launch", per_rank_chunk=False)  # no DP attention
    assert cfg2.chunk_per_rank() == 8192
    assert cfg2.running_limit_per_rank() is None


def test_precedence_log_then_user():
    ev = scan_lines([
        "python -m sglang.launch_server --model-path m --chunked-prefill-size 4096 --max-running-requests 10",
        "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='m', chunked_prefill_size=2048, max_running_requests=10)",
    ])
    assert ev.config.values["chunked_prefill_size"] == 2048      # resolved ServerArgs beat the command line
    cfg = build_config(ev, None, "sglang serve m --max-running-requests 20", ["chunked_prefill_size=1024"])
    assert cfg.values["max_running_requests"] == 20 and cfg.sources["max_running_requests"] == "--launch"
    assert cfg.values["chunked_prefill_size"] == 1024 and cfg.sources["chunked_prefill_size"] == "--server-arg"


def test_multiline_launch_command_in_a_log():
    ev = scan_lines(["python3 -m sglang.launch_server \\", "    --model-path m --tp 4 \\", "    --dp 2 --enable-dp-attention",
                     "[2026-01-01 00:00:00] something else"])
    assert ev.config.values["tp_size"] == 4 and ev.config.values["dp_size"] == 2
    assert ev.counts["config"] == 3 and ev.counts["other"] == 1


@pytest.mark.parametrize("item", ["chunked_prefill_size", "=5", ""])
def test_bad_server_arg_names_the_flag(item):
    with pytest.raises(InputError, match="--server-arg"):
        parse_server_arg_overrides([item])


def test_server_arg_values_are_typed():
    assert parse_server_arg_overrides(["--max-running-requests=32", "enable_mixed_chunk=true", "disaggregation_mode=decode"]) == {
        "max_running_requests": 32, "enable_mixed_chunk": True, "disaggregation_mode": "decode"}
