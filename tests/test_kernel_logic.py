"""Kernel mode, pure parts: outcome classification, metadata diff, agreement, API detection, bisection.

No child processes here. Expected values come from the oracle's probe records (messages, exit codes)
or from first-principles arithmetic, never from the code under test.
"""
from __future__ import annotations

import signal

import numpy as np
import pytest

from validate_batch.kernel_mode.check import ModelView, agreement, diff_metadata, failure_class, failure_matches
from validate_batch.kernel_mode.outcome import (
    PARTIAL_PREFIX,
    RESULT_PREFIX,
    STAGE_PREFIX,
    classify,
    find_cuda_error,
    parse_child_stdout,
)
from validate_batch.kernel_mode.probe import (
    ModelScan,
    Probe,
    bisect,
    non_monotonic_pairs,
    scan_model,
    spaced_points,
    template_record,
)
from validate_batch.kernel_mode.providers import Param, api_from_source, classify_api

SCHED_LINE = ("CUDA error (/build/FlashMLA/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:111): "
              "invalid argument")
COMBINE_LINE = "CUDA error (/build/FlashMLA/csrc/smxx/decode/combine/combine.cu:197): an illegal memory access was encountered"


def ok_stdout(payload: str = '{"status":"ok","message":"OK 132 11688"}') -> str:
    return f"{STAGE_PREFIX}call\n{STAGE_PREFIX}sync\n{RESULT_PREFIX}{payload}\n"


# ----------------------------------------------------------------------------- classification

def test_ok_result_carries_payload_and_legal_verdict():
    r = classify(0, ok_stdout('{"status":"ok","message":"OK 132 11688","num_sm_parts":132}'), "")
    assert (r.outcome, r.verdict, r.oracle_outcome) == ("ok", "legal", "ok")
    assert r.payload["num_sm_parts"] == 132 and r.stage == "sync"


def test_library_exit_with_cuda_error_is_process_exit_with_site():
    # The oracle records b=11623 as process_exit, exit code 1, at get_decoding_sched_meta.cu:111.
    r = classify(1, f"{STAGE_PREFIX}call\n", SCHED_LINE + "\n")
    assert (r.outcome, r.exit_code, r.verdict, r.oracle_outcome) == ("process_exit", 1, "illegal", "process_exit")
    assert r.cuda_error.site == "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:111"
    assert r.cuda_error.text == "invalid argument"
    assert r.message == ("CUDA error (csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:111): "
                         "invalid argument")
    assert r.stage == "call"


def test_exit_with_illegal_access_is_its_own_class_but_oracle_process_exit():
    r = classify(1, "", "some noise\n" + COMBINE_LINE + "\n")
    assert r.outcome == "illegal_memory_access"
    assert r.oracle_outcome == "process_exit"   # how the probes file records it
    assert r.cuda_error.site == "csrc/smxx/decode/combine/combine.cu:197"
    assert r.kills_process


def test_signal_is_process_crash_with_assertion_message():
    err = ("python: splitkv_mla.cuh:689: Assertion `params.topk % TOPK_BLOCK_SIZE == 0` failed "
           "(csrc/sm90/decode/sparse_fp8/instantiations/../splitkv_mla.cuh:689):\n")
    r = classify(-signal.SIGSEGV, f"{STAGE_PREFIX}call\n", err)
    assert (r.outcome, r.signal, r.exit_code) == ("process_crash", "SIGSEGV", -11)
    assert r.message.startswith("Assertion `params.topk % TOPK_BLOCK_SIZE == 0` failed")
    assert r.verdict == "illegal"


def test_silent_crash_keeps_empty_message():
    r = classify(-11, "", "")
    assert (r.outcome, r.message) == ("process_crash", "")


def test_python_exception_reported_by_child():
    res = '{"status":"python_exception","error_type":"RuntimeError","message":"Only head_size_k == 576 or 512 is supported for sparse decoding"}'
    r = classify(0, f"{RESULT_PREFIX}{res}\n", "")
    assert (r.outcome, r.error_type, r.oracle_outcome) == ("python_exception", "RuntimeError", "python_exception")
    assert "head_size_k" in r.message


def test_exception_with_illegal_access_text_poisons_context():
    res = '{"status":"python_exception","error_type":"AcceleratorError","message":"CUDA error: an illegal memory access was encountered"}'
    r = classify(0, f"{RESULT_PREFIX}{res}\n", "")
    assert r.outcome == "illegal_memory_access" and r.oracle_outcome == "python_exception"


def test_device_side_assert_names_the_assertion():
    res = ('{"status":"python_exception","error_type":"AcceleratorError","message":"CUDA error: device-side assert '
           'triggered\\nCUDA kernel errors might be asynchronously reported at some other API call"}')
    err = ("/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0], thread: [0,0,0] "
           "Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.\n")
    r = classify(0, f"{RESULT_PREFIX}{res}\n", err)
    assert r.outcome == "device_assert"
    assert r.message.startswith("CUDA error: device-side assert triggered [Assertion `-sizes[i]")
    assert "asynchronously" not in r.message


def test_timeout_unavailable_unsupported_are_inconclusive():
    assert classify(None, "", "", timed_out=True, elapsed_s=2.0).verdict == "inconclusive"
    u = classify(0, f'{RESULT_PREFIX}{{"status":"unavailable","message":"torch sees no CUDA GPU"}}\n', "")
    assert (u.outcome, u.verdict, u.message) == ("unavailable", "inconclusive", "torch sees no CUDA GPU")
    s = classify(0, f'{RESULT_PREFIX}{{"status":"unsupported","message":"no topk_length"}}\n', "")
    assert (s.outcome, s.verdict) == ("unsupported", "inconclusive")


def test_exit_zero_without_result_is_not_ok():
    r = classify(0, f"{STAGE_PREFIX}call\n", "")
    assert r.outcome == "process_exit" and not r.is_ok


def test_partial_results_survive_a_crash():
    out = f'{PARTIAL_PREFIX}{{"num_sm_parts":8,"num_splits":[0,1]}}\n{STAGE_PREFIX}call\n'
    r = classify(1, out, COMBINE_LINE)
    assert r.partial == {"num_sm_parts": 8, "num_splits": [0, 1]}


def test_marker_lines_never_become_messages():
    rep = parse_child_stdout(f"{STAGE_PREFIX}a\nnoise\n{RESULT_PREFIX}not json\n")
    assert rep.stages == ("a",) and rep.result is None
    assert find_cuda_error("x CUDA error (a/csrc/f.cu:7): boom\n").site == "csrc/f.cu:7"


# ----------------------------------------------------------------------------- metadata diff

def _md(rows):
    out = np.zeros((len(rows), 8), dtype=np.int32)
    out[:, :7] = rows
    return out


def test_diff_identical_ignores_column_7():
    a = _md([[0, 1, 0, 9, 0, 0, 0], [2, 3, 0, 9, 0, 0, 0]])
    b = a.copy()
    b[:, 7] = [12345, -7]               # column 7 is never written by the kernel: garbage
    d = diff_metadata(a, [0, 1, 2, 3, 4], b, [0, 1, 2, 3, 4])
    assert d.identical and d.rows_differing == 0


def test_diff_reports_first_row_and_split():
    a = _md([[0, 1, 0, 9, 0, 0, 0], [2, 3, 0, 9, 0, 0, 0], [4, 4, 0, 9, 0, 0, 0]])
    b = a.copy()
    b[1, 3] = 8
    b[2, 3] = 8
    d = diff_metadata(a, [0, 1, 2, 3, 4, 5], b, [0, 1, 2, 4, 5, 6])
    assert not d.identical
    assert (d.rows_differing, d.first_row, d.model_row[3], d.kernel_row[3]) == (2, 1, 9, 8)
    assert (d.splits_differing, d.first_split, d.model_split, d.kernel_split) == (3, 3, 3, 4)
    assert "expected" in d.describe() and "got" in d.describe()


def test_diff_partition_count_and_layout_width():
    a = _md([[0, 1, 0, 9, 0, 0, 0]])
    b = _md([[0, 1, 0, 9, 0, 7, 7], [1, 1, 0, 0, 0, 0, 0]])
    d = diff_metadata(a, [0, 1], b, [0, 1], columns=5)   # old layout: columns 5..7 unwritten
    assert d.rows_differing == 0 and (d.model_parts, d.kernel_parts) == (1, 2) and not d.identical


# ----------------------------------------------------------------------------- agreement

def _run(outcome_rc, stderr=""):
    return classify(outcome_rc, ok_stdout() if outcome_rc == 0 else "", stderr)


@pytest.mark.parametrize("model,rc,stderr,expected", [
    (ModelView("legal"), 0, "", "agree"),
    (ModelView("illegal", ("FMLA001",), expected_failure="process_exit"), 1, SCHED_LINE, "agree"),
    (ModelView("legal"), 1, SCHED_LINE, "disagree"),
    (ModelView("illegal", ("FMLA001",), expected_failure="process_exit"), 0, "", "disagree"),
    (ModelView("illegal", ("FMLA003",), expected_failure="undefined_behaviour", undefined_only=True), 0, "", "agree_ub"),
])
def test_agreement_table(model, rc, stderr, expected):
    assert agreement(model, _run(rc, stderr)) == expected


def test_timeout_is_inconclusive_for_agreement():
    assert agreement(ModelView("legal"), classify(None, "", "", timed_out=True)) == "inconclusive"


def test_failure_class_from_catalog_text_and_matching():
    assert failure_class("process_exit: cudaFuncSetAttribute fails") == "process_exit"
    assert failure_class("process_crash for h_q outside {64, 128}") == "process_crash"
    ima = _run(1, COMBINE_LINE)
    assert failure_matches("illegal_memory_access", ima) is True
    assert failure_matches("process_exit", ima) is True          # exit(1) after the error
    assert failure_matches("process_crash", ima) is False
    assert failure_matches("process_exit", _run(0)) is None       # nothing failed


# ----------------------------------------------------------------------------- API detection

CURRENT_SRC = '''
class FlashMLASchedMeta:
    pass
def get_mla_metadata(*args, **kwargs):
    return FlashMLASchedMeta(), None
def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    pass
'''
OCT2025_SRC = '''
def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
                     is_fp8_kvcache=False, topk=None):
    pass
def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None):
    pass
'''
DENSE_ONLY_SRC = '''
def get_mla_metadata(cache_seqlens, num_heads_per_head_k, num_heads_k):
    pass
def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits, softmax_scale=None, causal=False):
    pass
'''


def test_current_api_from_source():
    s = api_from_source([CURRENT_SRC])
    assert s.api == "sched_meta"
    assert {"indices", "topk_length", "extra_k_cache", "extra_topk_length"} <= s.features


def test_oct2025_api_from_source():
    s = api_from_source([OCT2025_SRC])
    assert s.api == "tensors" and s.supports_sparse
    assert s.missing_features(["topk_length", "extra_k_cache"]) == ["topk_length", "extra_k_cache"]


def test_dense_only_copy_has_no_sparse():
    s = api_from_source([DENSE_ONLY_SRC])
    assert s.api == "tensors" and not s.supports_sparse and "dense only" in s.reason


def test_unrecognised_or_missing_functions():
    assert api_from_source(["def unrelated(): pass"]).api is None
    weird = classify_api([Param("x")], False, [Param("q")])
    assert weird.api is None and "unrecognised" in weird.reason
    # A sched-meta object without the class is not the current API.
    assert classify_api([Param("args", "VAR_POSITIONAL", True)], False, [Param("q")]).api is None


# ----------------------------------------------------------------------------- bisection

def test_spaced_points_are_strictly_inside():
    assert spaced_points(0, 10, 1) == [5]
    assert spaced_points(0, 10, 4) == [2, 4, 6, 8]
    assert spaced_points(5, 6, 3) == []
    assert spaced_points(5, 8, 9) == [6, 7]


@pytest.mark.parametrize("parallel", [1, 3, 7])
def test_bisect_finds_scheduler_limit(parallel):
    limit = (232448 - 4) // 20          # 4*(5b+1) <= 232448  ->  b <= 11622
    calls = []

    def measure(values, reason):
        calls.append(list(values))
        assert len(values) <= max(parallel, 2)
        return {v: "legal" if v <= limit else "illegal" for v in values}

    res = bisect(1, 16384, measure, parallel)
    assert (res.status, res.last_legal, res.first_illegal) == ("found", 11622, 11623)
    rounds = len(calls) - 1
    if parallel == 1:
        assert rounds <= 15              # ceil(log2(16383)) = 14
    else:
        assert rounds < 14


def test_bisect_endpoints_and_inconclusive():
    assert bisect(1, 100, lambda v, r: {x: "illegal" for x in v}).status == "lo_illegal"
    assert bisect(1, 100, lambda v, r: {x: "legal" for x in v}).status == "hi_legal"

    def flaky(values, reason):
        return {v: ("legal" if v == 1 else "illegal" if v == 100 else "inconclusive") for v in values}

    assert bisect(1, 100, flaky).status == "inconclusive"


def test_bisect_seeded_with_the_model_boundary_finds_the_first_transition():
    # Like the o_accum limit at s_q=8, h_q=128, topk=2048: illegal runs of 4 every 8 values from 4675,
    # and legal again at the top of the range (8192 measured ok on the H200).
    illegal = {b for b in range(4675, 6000) if (b - 4675) % 8 < 4}

    def measure(values, reasons):
        return {v: "illegal" if v in illegal else "legal" for v in values}

    assert bisect(1, 8192, measure, 4).status == "hi_legal"          # unseeded: nothing to bisect
    res = bisect(1, 8192, measure, 4, seeds={4674: "model", 4675: "model", 4679: "model"})
    assert (res.status, res.last_legal, res.first_illegal) == ("found", 4674, 4675)
    res = bisect(1, 8192, measure, 1, seeds={4995: "a guess"})     # a seed inside a later illegal run
    assert res.status == "found" and res.first_illegal in illegal and res.last_legal not in illegal


def test_bisect_on_non_monotonic_still_ends_on_a_transition():
    illegal = {b for b in range(4675, 6000) if (b - 4675) % 8 < 4}   # islands of legality

    def measure(values, reason):
        return {v: "illegal" if v in illegal or v >= 6000 else "legal" for v in values}

    res = bisect(1, 8192, measure, 1)
    assert res.status == "found"
    assert res.first_illegal in illegal or res.first_illegal >= 6000
    assert res.last_legal not in illegal and res.first_illegal - res.last_legal == 1


def test_scan_model_reports_legal_again():
    def verdict(v):
        return ("illegal", ("FMLA002",)) if v in (10, 11, 14) else ("legal", ())

    s = scan_model(verdict, 1, 20)
    assert (s.first_illegal, s.last_legal, s.legal_again[:2], s.monotonic) == (10, 9, (12, 13), False)
    assert s.codes_at_first_illegal == ("FMLA002",)
    mono = scan_model(lambda v: ("illegal", ()) if v > 5 else ("legal", ()), 1, 9)
    assert mono.monotonic and mono.first_illegal == 6


def test_non_monotonic_pairs_from_probes():
    ps = [Probe(4674, "legal", "ok"), Probe(4675, "illegal", "process_exit"), Probe(4679, "legal", "ok")]
    assert non_monotonic_pairs(ps) == [(4675, 4679)]
    assert non_monotonic_pairs(ps[:2]) == []


def test_model_scan_of_oaccum_template_matches_probe_records():
    """The oracle measured b=4675 (s_q=8, h_q=128, topk=2048) failing at combine.cu:197."""
    from validate_batch.kernel_mode.probe import model_verdicts

    tmpl = template_record('{"kind":"sparse","s_q":8,"h_q":128,"d_qk":512,"topk":2048}', "b")
    v = model_verdicts(tmpl, "b", [4675, 11622, 11623], "H200", None)
    assert v[4675] == ("illegal", ("FMLA002",))
    assert "FMLA001" in v[11623][1] and "FMLA001" not in v[11622][1]


def test_template_rejects_lists_and_unknown_fields():
    from validate_batch.errors import InputError

    with pytest.raises(InputError) as e:
        template_record('{"kind":"sparse","s_q":1,"h_q":64,"topk":128,"topk_length":[1]}', "b")
    assert e.value.field == "--template.topk_length"
    with pytest.raises(InputError):
        template_record('{"kind":"sparse","s_q":1,"h_q":64,"topk":128,"bogus":1}', "b")
    with pytest.raises(InputError):
        template_record("[1, 2]", "b")
    assert isinstance(ModelScan(1, 2, None).to_dict(), dict)


# ----------------------------------------------------------------------------- not about the batch; fallback

def _raised(error_type: str, message: str):
    return classify(0, f'{STAGE_PREFIX}call\n{RESULT_PREFIX}{{"status":"python_exception","error_type":"{error_type}",'
                       f'"message":"{message}"}}\n', "")


@pytest.mark.parametrize("error_type,message", [
    ("RuntimeError", "sparse_decode_fwd is only supported on SM100f architectures"),
    ("RuntimeError", "CUDA error: no kernel image is available for execution on the device"),
    ("ModuleNotFoundError", "No module named 'flash_mla.cuda'"),
    ("AttributeError", "module 'flash_mla' has no attribute 'get_mla_decoding_metadata'"),
    ("TypeError", "flash_mla_with_kvcache() got an unexpected keyword argument 'use_legacy'"),
])
def test_exceptions_about_the_environment_are_inconclusive(error_type, message):
    r = _raised(error_type, message)
    assert (r.outcome, r.verdict, r.is_conclusive) == ("unsupported", "inconclusive", False)
    assert r.inconclusive_reason.startswith("not about the batch")
    model = ModelView("illegal", ("FMLA001",), expected_failure="process_exit")
    assert agreement(model, r) == "inconclusive" and agreement(ModelView("legal"), r) == "inconclusive"


def test_exception_about_the_batch_stays_a_python_exception():
    # sgl-flash-mla: topk % 64 != 0 is a RuntimeError from a host check (recoverable), about the call
    r = _raised("RuntimeError", "Assertion failed (splitkv_mla.cuh:691): params.topk % 64 == 0")
    assert r.outcome == "python_exception" and r.is_conclusive


def test_failure_class_must_match_for_agreement():
    exc = _raised("RuntimeError", "params.topk % 64 == 0")
    crash_predicted = ModelView("illegal", ("FMLA004",), expected_failure="process_crash")
    assert agreement(crash_predicted, exc) == "disagree"
    either = ModelView("illegal", ("FMLA005",), expected_failure="process_crash",
                       expected_failures=("process_crash", "python_exception"))
    assert agreement(either, exc) == "agree"


def test_failure_classes_named_in_catalog_text():
    from validate_batch.kernel_mode.check import failure_classes

    assert failure_classes("process_crash for h_q outside {64, 128} (SIGSEGV); python_exception for d_qk") == \
        ("process_crash", "python_exception")
    assert failure_classes("python_exception or host assertion") == ("python_exception", "process_crash")
    assert failure_classes("process_exit: exit(1)") == ("process_exit",)


def test_fallback_warning_is_read_from_either_stream():
    line = ("[WARNING] batch_size=19371 requires 232456B shared memory (max=232448B), using low-smem fallback "
            "kernel.")
    for out, err in ((f"{line}\n" + ok_stdout(), ""), (ok_stdout(), line + "\n")):
        r = classify(0, out, err)
        assert r.outcome == "ok" and r.fallback == {"batch_size": 19371, "smem_bytes": 232456, "smem_max": 232448,
                                                    "text": line}
    assert classify(0, ok_stdout(), "").fallback is None


def test_kernel_check_without_torch_exits_3(monkeypatch):
    from typer.testing import CliRunner

    import validate_batch.kernel_mode.providers as prov
    from validate_batch.cli.main import app

    monkeypatch.setattr(prov, "torch_installed", lambda: False)
    r = CliRunner().invoke(app, ["kernel-check", "-"], input='{"kind":"sparse","b":8,"s_q":1,"h_q":64,"d_qk":512,"topk":128}')
    assert r.exit_code == 3 and "unavailable" in r.stdout and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["check", "--kernel", "-"], input='{"kind":"sparse","b":8,"s_q":1,"h_q":64,"d_qk":512,"topk":128}')
    assert r.exit_code == 3, r.output           # legal, but the kernel could not confirm it
