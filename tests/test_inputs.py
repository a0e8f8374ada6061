"""Input parsing and validation at the library level: call records, documents, GPU descriptions.

Every malformed input raises :class:`InputError` whose ``field`` names the offending field.
"""
from __future__ import annotations

import numpy as np
import pytest

from validate_batch.errors import InputError
from validate_batch.flashmla.calls import DecodeCall, SparsePrefillCall, call_from_record, calls_from_records, int_vector
from validate_batch.inputs.documents import is_device_header, parse_documents
from validate_batch.facts.knowledge import gpu_from_fields, resolve_gpu

SPARSE = {"kind": "sparse", "b": 3, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}


def field_of(exc_info) -> str:
    return exc_info.value.field


# ------------------------------------------------------------------------------------------------
# call records
# ------------------------------------------------------------------------------------------------
def test_sparse_record_round_trip():
    rec = {**SPARSE, "topk_length": [0, 5, 128], "extra_topk": 64, "extra_topk_length": [1, 2, 64], "extra_page": 64}
    c = call_from_record(rec)
    assert isinstance(c, DecodeCall) and c.kind == "sparse" and c.is_sparse and c.has_extra
    assert c.topk_length.dtype == np.int64 and c.topk_length.tolist() == [0, 5, 128]
    back = c.to_record()
    for k in ("kind", "b", "s_q", "h_q", "d_qk", "topk", "topk_length", "extra_topk", "extra_topk_length"):
        assert back[k] == rec[k]


def test_kind_is_inferred_and_defaults_apply():
    c = call_from_record({"b": 2, "s_q": 1, "h_q": 64, "topk": 64})
    assert c.kind == "sparse" and c.d_qk == 576 and c.is_fp8 and not c.causal and c.h_k == 1 and c.page == 64
    d = call_from_record({"b": 2, "s_q": 1, "h_q": 64, "seqlens": [1, 2]})
    assert d.kind == "dense" and not d.is_fp8 and d.seqlens.tolist() == [1, 2]


def test_output_fields_of_oracle_records_are_ignored():
    rec = {**SPARSE, "i": 7, "tile_scheduler_metadata": [[0] * 8], "num_splits": [0, 1, 2, 3], "verdict": "legal",
           "outcome": "ok", "message": "OK 1 3", "exit_code": 0, "note": "x"}
    assert call_from_record(rec).b == 3


def test_prefill_record():
    c = call_from_record({"kind": "prefill", "s_q": 0, "h_q": 64, "d_qk": 512, "topk": 512})
    assert isinstance(c, SparsePrefillCall) and c.s_q == 0
    with pytest.raises(InputError) as e:
        call_from_record({"kind": "prefill", "s_q": 1, "h_q": 64, "b": 3})
    assert field_of(e) == "b"                       # prefill calls have no b
    with pytest.raises(InputError) as e:
        call_from_record({"kind": "prefill", "s_q": -1, "h_q": 64})
    assert field_of(e) == "s_q"


@pytest.mark.parametrize("change, field", [
    ({"b": None}, "b"),
    ({"b": "3"}, "b"),
    ({"b": 3.0}, "b"),
    ({"b": True}, "b"),
    ({"b": 0}, "b"),
    ({"b": -5}, "b"),
    ({"b": 10**9}, "b"),
    ({"b": 2**24 + 1}, "b"),
    ({"s_q": 0}, "s_q"),
    ({"s_q": 2**16 + 1}, "s_q"),
    ({"h_q": False}, "h_q"),
    ({"h_q": 2**12 + 1}, "h_q"),
    ({"topk": 0}, "topk"),
    ({"topk": [128]}, "topk"),
    ({"d_qk": 10**6}, "d_qk"),
    ({"page": 0}, "page"),
    ({"is_fp8": 1}, "is_fp8"),
    ({"causal": "no"}, "causal"),
    ({"kind": "decode"}, "kind"),
    ({"kind": None, "topk": None}, "kind"),
    ({"topk_length": [1, 2]}, "topk_length"),
    ({"topk_length": [1, 2, 3, 4]}, "topk_length"),
    ({"topk_length": [1, None, 3]}, "topk_length[1]"),
    ({"topk_length": [1, 2, True]}, "topk_length[2]"),
    ({"topk_length": [1, 2, 2**31]}, "topk_length[2]"),
    ({"topk_length": [1, 2, -2**31 - 1]}, "topk_length[2]"),
    ({"topk_length": {"0": 1}}, "topk_length"),
    ({"topk_length": 5}, "topk_length"),
    ({"extra_topk_length": [1, 2, 3]}, "extra_topk_length"),
    ({"extra_topk": 64, "extra_topk_length": [1, 2]}, "extra_topk_length"),
    ({"seqlens": [1, 2, 3]}, "seqlens"),
    ({"unknown": 1}, "unknown"),
])
def test_bad_sparse_fields(change, field):
    rec = {**SPARSE, **change}
    with pytest.raises(InputError) as e:
        call_from_record(rec)
    assert field_of(e) == field
    assert str(e.value).startswith(field + ":")


@pytest.mark.parametrize("seqlens, field", [
    (None, "seqlens"),
    ([1, 2], "seqlens"),
    ([1, -1, 2], "seqlens[1]"),
    ([1, 2, 2**31], "seqlens[2]"),
    ([1, 2, "3"], "seqlens[2]"),
])
def test_bad_dense_fields(seqlens, field):
    rec = {"kind": "dense", "b": 3, "s_q": 1, "h_q": 64, "seqlens": seqlens}
    with pytest.raises(InputError) as e:
        call_from_record(rec)
    assert field_of(e) == field


def test_dense_rejects_sparse_only_fields():
    for key, val in (("topk", 64), ("topk_length", [1]), ("extra_topk", 64)):
        with pytest.raises(InputError) as e:
            call_from_record({"kind": "dense", "b": 1, "s_q": 1, "h_q": 64, "seqlens": [1], key: val})
        assert field_of(e) == key


def test_boundaries_of_accepted_values():
    """The largest accepted values are accepted (b = 2^24, s_q = 2^16, lengths = int32 max)."""
    assert call_from_record({**SPARSE, "b": 2**24}).b == 2**24
    assert call_from_record({**SPARSE, "s_q": 2**16}).s_q == 2**16
    c = call_from_record({**SPARSE, "topk_length": [2**31 - 1, -2**31, 0]})
    assert c.topk_length.tolist() == [2**31 - 1, -2**31, 0]
    d = call_from_record({"kind": "dense", "b": 2, "s_q": 1, "h_q": 64, "seqlens": [0, 2**31 - 1]})
    assert d.seqlens.tolist() == [0, 2**31 - 1]


def test_record_prefix_names_the_call():
    with pytest.raises(InputError) as e:
        calls_from_records([SPARSE, {**SPARSE, "h_q": "x"}])
    assert field_of(e) == "calls[1].h_q"
    with pytest.raises(InputError) as e:
        calls_from_records([SPARSE, [1, 2]])
    assert field_of(e) == "calls[1]"


def test_numpy_inputs():
    arr = np.array([1, 2, 3], dtype=np.int32)
    assert int_vector(arr, 3, "x").dtype == np.int64
    assert call_from_record({**SPARSE, "b": np.int64(3), "topk_length": arr}).topk_length.tolist() == [1, 2, 3]
    with pytest.raises(InputError) as e:
        int_vector(np.array([1.0, 2.0, 3.0]), 3, "x")
    assert e.value.field == "x"
    with pytest.raises(InputError):
        int_vector(np.zeros((3, 1), dtype=np.int64), 3, "x")
    with pytest.raises(InputError):
        int_vector(np.array([1, 2], dtype=np.int64), 3, "x")
    with pytest.raises(InputError) as e:
        int_vector(np.array([0, 5, -1]), 3, "x", lo=0)
    assert e.value.field == "x[2]"


# ------------------------------------------------------------------------------------------------
# documents
# ------------------------------------------------------------------------------------------------
def test_parse_json_object_array_jsonl_and_yaml():
    assert parse_documents('{"a": 1}') == [{"a": 1}]
    assert parse_documents('[{"a": 1}, {"b": 2}]') == [{"a": 1}, {"b": 2}]
    assert parse_documents('{"a": 1}\n\n{"b": 2}\n') == [{"a": 1}, {"b": 2}]
    assert parse_documents("kind: sparse\nb: 3\n") == [{"kind": "sparse", "b": 3}]
    assert parse_documents("---\na: 1\n---\nb: 2\n") == [{"a": 1}, {"b": 2}]
    assert parse_documents("- a: 1\n- b: 2\n") == [{"a": 1}, {"b": 2}]


@pytest.mark.parametrize("text, where", [
    ("", "empty"),
    (" \n\t\n", "empty"),
    ('{"a": 1}\n{"a": 2,}\n', "<input>:2:"),
    ('{"a": 1}\n{"a": 2}\n{"a" 3}\n', "<input>:3:"),
    ('[{"a": 1},', "<input>:1:"),
    ("a: [1, 2\nb: 3\n", "<input>:"),
])
def test_parse_errors_name_the_line(text, where):
    with pytest.raises(InputError) as e:
        parse_documents(text)
    assert e.value.field == "FILE"
    assert where in str(e.value)


def test_parse_error_in_pretty_printed_json_names_the_real_line():
    with pytest.raises(InputError) as e:
        parse_documents('{\n  "kind": "sparse",\n  "b": 2,,\n  "s_q": 1\n}\n')
    assert "<input>:3:" in str(e.value)


def test_yaml_is_loaded_safely():
    """No object construction from YAML tags (crash artefacts are untrusted)."""
    with pytest.raises(InputError) as e:
        parse_documents("!!python/object/apply:os.system ['echo pwned']\n")
    assert e.value.field == "FILE"


def test_device_header_detection():
    assert is_device_header({"device": "NVIDIA H200", "num_sms": 132, "cc": [9, 0], "smem_optin": 232448})
    assert not is_device_header({"num_sms": 132, "b": 3})
    assert not is_device_header({"device": "H200"})
    assert not is_device_header([])


# ------------------------------------------------------------------------------------------------
# GPUs
# ------------------------------------------------------------------------------------------------
def test_gpu_from_fields_forms_of_cc():
    assert gpu_from_fields({"num_sms": 78, "cc": "9.0", "smem_optin": 232448}).cc == (9, 0)
    g = gpu_from_fields({"num_sms": 148, "cc": [10, 0], "smem_optin": 232448, "name": "mine", "memory_bytes": 10})
    assert (g.name, g.arch, g.memory_bytes) == ("mine", 10, 10)
    g = resolve_gpu("num_sms=100,cc=9.0,smem_optin=50000")
    assert (g.num_sms, g.cc, g.smem_optin) == (100, (9, 0), 50000)


@pytest.mark.parametrize("fields, field", [
    ({"cc": [9, 0], "smem_optin": 1}, "gpu.num_sms"),
    ({"num_sms": 0, "cc": [9, 0], "smem_optin": 1}, "gpu.num_sms"),
    ({"num_sms": True, "cc": [9, 0], "smem_optin": 1}, "gpu.num_sms"),
    ({"num_sms": 132, "cc": [9, 0]}, "gpu.smem_optin"),
    ({"num_sms": 132, "smem_optin": 1}, "gpu.cc"),
    ({"num_sms": 132, "cc": "9", "smem_optin": 1}, "gpu.cc"),
    ({"num_sms": 132, "cc": "nine.0", "smem_optin": 1}, "gpu.cc"),
    ({"num_sms": 132, "cc": [9], "smem_optin": 1}, "gpu.cc"),
    ({"num_sms": 132, "cc": [9, True], "smem_optin": 1}, "gpu.cc"),
    ({"num_sms": 132, "cc": [9, 0], "smem_optin": 1, "memory_bytes": -1}, "gpu.memory_bytes"),
    ({"num_sms": 132, "cc": [9, 0], "smem_optin": 1, "name": 5}, "gpu.name"),
])
def test_bad_gpu_fields(fields, field):
    with pytest.raises(InputError) as e:
        gpu_from_fields(fields)
    assert e.value.field == field


def test_gpu_names_and_aliases():
    assert resolve_gpu("nvidia h200").name == "H200"
    assert resolve_gpu("H100 SXM").num_sms == 132
    assert resolve_gpu("H20").num_sms == 78
    assert resolve_gpu({"name": "B200"}).cc == (10, 0)
    with pytest.raises(InputError) as e:
        resolve_gpu("RTX-9999")
    assert e.value.field == "gpu"
    with pytest.raises(InputError) as e:
        resolve_gpu("num_sms=x,cc=9.0,smem_optin=1")
    assert e.value.field == "gpu.num_sms"
    with pytest.raises(InputError):
        resolve_gpu(42)
