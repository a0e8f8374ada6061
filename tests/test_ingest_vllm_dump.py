"""vLLM's crash-time SchedulerOutput dump -> per-request query rows and computed tokens."""
from __future__ import annotations

import pytest

from validate_batch.errors import InputError
from validate_batch.ingest.scan import scan_lines
from validate_batch.ingest.vllm_dump import parse_scheduler_output

NEW_STYLE = (
    "(EngineCore_DP1 pid=88) ERROR 06-01 10:00:00 [dump_input.py:79] Dumping scheduler output for model execution: "
    "SchedulerOutput(scheduled_new_reqs=[NewRequestData(req_id=req-a,prompt_token_ids_len=900,"
    "prefill_token_ids_len=None,mm_features=[],sampling_params=SamplingParams(n=1, stop=['x, y'], temperature=0.0),"
    "block_ids=([4, 5],),num_computed_tokens=256,lora_request=None,prompt_embeds_shape=None)], "
    "scheduled_cached_reqs=CachedRequestData(req_ids=['req-b', 'req-c'],resumed_req_ids=set(),new_token_ids_lens=[],"
    "all_token_ids_lens={},new_block_ids=[None, None],num_computed_tokens=[300, 41],num_output_tokens=[3, 1]), "
    "num_scheduled_tokens={req-a: 644, req-b: 3, req-c: 1}, total_num_scheduled_tokens=648, "
    "scheduled_spec_decode_tokens={req-b: [11, 12]}, scheduled_encoder_inputs={}, num_common_prefix_blocks=[0], "
    "finished_req_ids=[], free_encoder_mm_hashes=[], preempted_req_ids=[], has_structured_output_requests=false)"
)


def test_new_style_dump():
    st = parse_scheduler_output(NEW_STYLE, 3)
    by = {r.id: r for r in st.requests}
    assert st.total_rows == 644 + 3 + 1 == st.total_num_scheduled_tokens
    assert (by["req-a"].num_computed, by["req-a"].prompt_len, by["req-a"].is_decode) == (256, 900, False)
    assert (by["req-b"].num_spec, by["req-b"].is_decode) == (2, True)     # 1 + 2 speculative tokens
    assert by["req-c"].is_decode and by["req-c"].num_computed == 41
    assert st.notes == []


def test_old_style_dump_on_the_next_lines():
    lines = [
        "ERROR 01-02 03:04:05 [dump_input.py:60] Dumping scheduler output for model execution:",
        "ERROR 01-02 03:04:05 [dump_input.py:61] SchedulerOutput(scheduled_new_reqs=[NewRequestData(req_id=q1,"
        "prompt_token_ids=[1, 2, 3, 4, 5],mm_inputs=[],sampling_params=SamplingParams(n=1),block_ids=[[1]],",
        "num_computed_tokens=0,lora_request=None)], scheduled_cached_reqs=[], num_scheduled_tokens={q1: 5}, "
        "total_num_scheduled_tokens=5, scheduled_spec_decode_tokens={})",
        "after",
    ]
    ev = scan_lines(lines)
    assert len(ev.vllm_steps) == 1
    st = ev.vllm_steps[0]
    assert st.requests[0].prompt_len == 5 and st.total_rows == 5 and st.line_no == 2
    assert ev.counts["vllm_dump"] == 3 and ev.counts["other"] == 1


def test_cut_off_dump_is_partial_with_a_note():
    st = parse_scheduler_output(NEW_STYLE[: NEW_STYLE.index("scheduled_encoder_inputs")])
    assert not st.complete and st.total_rows == 648
    assert any("cut off" in n for n in st.notes)


@pytest.mark.parametrize("text,field", [
    ("SchedulerOutput(scheduled_new_reqs=[], total_num_scheduled_tokens=3)", "num_scheduled_tokens"),
    ("SchedulerOutput(num_scheduled_tokens={a: x})", "num_scheduled_tokens[a]"),
    ("SchedulerOutput(num_scheduled_tokens={a: -2})", "num_scheduled_tokens[a]"),
    ("no dump here", "SchedulerOutput"),
])
def test_bad_dumps_name_the_field(text, field):
    with pytest.raises(InputError) as ei:
        parse_scheduler_output(text, 12)
    assert field in str(ei.value) and "line 12" in str(ei.value)


def test_mismatched_total_is_reported():
    st = parse_scheduler_output("SchedulerOutput(num_scheduled_tokens={a: 2, b: 3}, total_num_scheduled_tokens=9)")
    assert any("sums to 5" in n for n in st.notes)
