"""Row 0 of SGLang's request table is the reserved padding row (the allocator hands out 1 ..
T_rows-1; CUDA-graph padding rows use 0): a real request holding it is an error every path of the
guard reports, lists, numpy arrays, engine objects and documents alike.

The ScheduleBatch here is a stand-in (SimpleNamespace with the attribute names the adapter reads):
the real class needs a GPU-initialised SGLang runtime to build.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from validate_batch import Checker, check

R = 32
SA = {"max_running_requests": R}
ENGINE = "sglang-slots@post-fix"


@pytest.fixture(scope="module")
def checker():
    return Checker(ENGINE, server_args=SA)


@pytest.mark.parametrize("slots,legal", [([0], False), ([1], True), ([3, 0, 5], False), ([R], True), ([R + 1], False)])
def test_lists(checker, slots, legal):
    v = checker.verdict("decode", seq_lens=[100] * len(slots), req_pool_indices=slots)
    assert v.legal is legal
    if not legal:
        assert "SLOT001" in v.report.codes
    assert checker.check("decode", seq_lens=[100] * len(slots), req_pool_indices=slots).legal is legal


def test_numpy_arrays(checker):
    many = np.arange(1, R + 1, dtype=np.int64)
    assert checker.verdict("decode", seq_lens=np.full(R, 50), req_pool_indices=many).legal
    many[7] = 0
    v = checker.verdict("decode", seq_lens=np.full(R, 50), req_pool_indices=many)
    assert not v.legal
    f = next(f for f in v.report.findings if f.code == "SLOT001")
    assert f.severity == "error" and f.numbers["slot"] == 0 and f.numbers["request"] == "r7"


class _Mode:
    name = "DECODE"


def test_engine_object(checker):
    def batch(slots):
        return SimpleNamespace(forward_mode=_Mode(), reqs=[SimpleNamespace(rid=f"q{i}", req_pool_idx=s) for i, s in enumerate(slots)],
                               seq_lens_cpu=[10] * len(slots), spec_algorithm=None)
    assert checker.verdict(batch([1, 2])).legal
    v = checker.verdict(batch([1, 0]))
    assert not v.legal and "SLOT001" in v.report.codes


def test_document():
    doc = {"engine": ENGINE, "server_args": SA, "forward_mode": "decode",
           "requests": [{"id": "a", "seq_len": 9, "req_pool_idx": 0}]}
    rep = check(doc)
    assert not rep.legal and rep.errors[0].code == "SLOT001" and "got 0" in rep.errors[0].message


def test_without_the_slots_profile_slots_are_not_judged():
    c = Checker("sglang-dsv4@pre-25418")
    assert c.verdict("decode", seq_lens=[10], req_pool_indices=[0]).legal
