"""Names and settings a user gives are never silently replaced by defaults, and the guard's cost on an
illegal step stays of the order of a legal one (the split is built only when read)."""
from __future__ import annotations

import pytest

import validate_batch
from validate_batch.errors import InputError

SEQ = {"engine": "sglang-dsv4@pre-25418", "forward_mode": "decode", "requests": [{"id": "a", "seq_len": 3}]}
CALL = {"kind": "sparse", "b": 1, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 64}


@pytest.mark.parametrize("make,field", [
    (lambda: validate_batch.Checker(engine=[]), "engine"),
    (lambda: validate_batch.check({**SEQ, "engine": []}), "engine"),
    (lambda: validate_batch.Checker(model=5), "model"),
    (lambda: validate_batch.Checker(buffers="x"), "buffers"),
    (lambda: validate_batch.Checker(kernel=[]), "kernel"),
    (lambda: validate_batch.Checker(kernel=""), "kernel"),
    (lambda: validate_batch.Checker(build="nope"), "kernel"),
    (lambda: validate_batch.check(CALL, build=[]), "kernel"),
    (lambda: validate_batch.check(CALL, build="nope"), "kernel"),
    (lambda: validate_batch.check({**SEQ, "kernel_build": "nope"}), "kernel"),
])
def test_bad_names_are_input_errors(make, field):
    with pytest.raises(InputError) as e:
        make()
    assert e.value.field == field


def test_an_illegal_verdict_builds_no_split_until_it_is_read(monkeypatch):
    import validate_batch.legality.pipeline as pipeline

    calls = []
    real = pipeline.safe_split
    monkeypatch.setattr(pipeline, "safe_split", lambda *a, **k: calls.append(1) or real(*a, **k))
    guard = validate_batch.Checker(engine="sglang-dsv4@pre-25418")
    limit = (232448 - 4) // 20                      # 4*(5b+1) <= 232448 on the H200
    v = guard.verdict("decode", seq_lens=[700] * 16384)
    assert not v and v.report.codes == ["FMLA001", "SGL001"] and calls == []
    with pytest.raises(validate_batch.BatchIllegalError):
        guard.assert_legal("decode", seq_lens=[700] * 16384)
    assert calls == []
    # read: 16384 rows in steps of at most 11622
    assert v.safe_split.num_steps == 2 and [len(s) for s in v.safe_split.steps] == [limit, 16384 - limit]
    assert calls == [1]
