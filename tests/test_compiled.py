"""The compiled helpers (``validator/_walk.c``): built where a C compiler is, equal to the
pure-Python paths and the reference loop, and strict about what they are given."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from validate_batch import _accel
from validate_batch.flashmla.schedule import _walk_prefix, block_counts, schedule_reference

compiled = _accel.compiled
needs_compiled = pytest.mark.skipif(compiled is None, reason=f"compiled helpers {_accel.reason}")


def _has_c_compiler() -> bool:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None


def test_built_wherever_a_c_compiler_is():
    """An install on a machine with a C compiler must have built the helpers: a silent fallback
    there would be a packaging bug, not a missing compiler."""
    if os.environ.get("VALIDATE_BATCH_PURE_PYTHON"):
        pytest.skip("VALIDATE_BATCH_PURE_PYTHON is set")
    if not _has_c_compiler():
        pytest.skip("no C compiler here: the pure-Python paths are the only ones")
    assert compiled is not None, _accel.reason
    assert "compiled" in _accel.status()


def test_environment_variable_turns_them_off():
    code = "from validate_batch import _accel; print(_accel.compiled is None, _accel.status())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "VALIDATE_BATCH_PURE_PYTHON": "1"}).stdout
    assert out.startswith("True pure Python (turned off by VALIDATE_BATCH_PURE_PYTHON)")


def _walk(lengths, block, P, F):
    starts, events, total = compiled.walk(np.asarray(lengths, dtype=np.int64), block, P, F)
    return np.frombuffer(starts, dtype=np.int64).tolist(), np.frombuffer(events, dtype=np.int64).tolist(), total


@needs_compiled
def test_walk_equals_the_python_walk_and_the_reference_loop():
    rng = random.Random(5)
    for it in range(3000):
        b = rng.choice([1, 2, 3, rng.randint(1, 40), rng.randint(40, 600), rng.randint(600, 5000)])
        kind = rng.random()
        if kind < 0.3:          # every length class: empty, one token, block edges, long
            s = [rng.choice([0, 1, 63, 64, 65, 128, 129, 4096, 70000]) for _ in range(b)]
        elif kind < 0.6:        # narrow range (few distinct widths)
            lo = rng.randint(0, 3000)
            s = [rng.randint(lo, lo + 200) for _ in range(b)]
        else:
            s = [rng.randint(-5, 20000) for _ in range(b)]
        P = rng.choice([1, 2, 7, 33, 66, 132, 160, rng.randint(1, 300)])
        F = rng.choice([0, 3, 5, rng.randint(0, 40)])
        block = rng.choice([64, 64, 16, 128])
        # first principles: n_i = max(ceil(s_i / block), 1) blocks, each request n_i + F units
        widths = [max(-(-x // block), 1) + F for x in s]
        C = [0]
        for w in widths:
            C.append(C[-1] + w)
        starts, events, total = _walk(s, block, P, F)
        assert total == C[-1], it
        assert (starts, events) == _walk_prefix(C, P, F, total), f"case {it}: b={b} P={P} F={F} block={block}"
        if it % 4 == 0 or b <= 8:
            # the scheduler's output itself: the compiled rows against the reference loop (which
            # reads a negative length as one token, as the kernel's max(s - 1, 0) does)
            ref = schedule_reference(np.asarray(s), P, F, block)
            assert events == ref.split_requests, it
            md, ns = _rows(s, block, P, F)
            assert md.tolist() == ref.metadata.tolist(), f"case {it}: metadata b={b} P={P} F={F} block={block}"
            assert ns.tolist() == ref.num_splits.tolist(), f"case {it}: num_splits"


def _rows(lengths, block, P, F):
    s = np.asarray(lengths, dtype=np.int64)
    md = np.full((P, 8), -7, dtype=np.int32)
    ns = np.full(s.shape[0] + 1, -7, dtype=np.int32)
    assert compiled.rows(s, block, P, F, md, ns) is None
    return md, ns


@needs_compiled
def test_rows_by_hand():
    # 64 tokens (1 block), 65 (2 blocks), an empty request (1 block) over 2 partitions, F = 5:
    # total 4 + 3 * 5 = 19, payload 10 + 5 = 15; P0 takes requests 0 and 1 whole (6 + 7 = 13 units),
    # then 2 units are left, too few for request 2 (6 units) and not more than F: no split; P1 takes
    # request 2, empty, so its end block is 0
    md, ns = _rows([64, 65, 0], 64, 2, 5)
    assert md.tolist() == [[0, 1, 0, 2, 0, 0, 0, 0], [2, 2, 0, 0, 0, 0, 0, 0]]
    assert ns.tolist() == [0, 1, 2, 3]
    # one request of 10 blocks over 3 partitions, F = 5: P0 takes 5 blocks (split), P1 the other 5,
    # P2 nothing: begin_req = b = 1, begin_block = the last block of request 0 (9), end_req = 0
    md, ns = _rows([640], 64, 3, 5)
    assert md.tolist() == [[0, 0, 0, 5, 0, 1, 1, 0], [0, 0, 5, 10, 1, 1, 1, 0], [1, 0, 9, 10, 0, 0, 0, 0]]
    assert ns.tolist() == [0, 2]


@needs_compiled
def test_rows_rejects_bad_outputs():
    s = np.array([100, 200, 300], dtype=np.int64)
    good_md, good_ns = np.empty((4, 8), dtype=np.int32), np.empty(4, dtype=np.int32)
    for md, ns in ((np.empty((4, 8), dtype=np.int64), good_ns),     # wrong type
                   (np.empty((3, 8), dtype=np.int32), good_ns),     # too few rows for P = 4
                   (good_md, np.empty(3, dtype=np.int32)),          # b + 1 = 4 needed
                   (good_md[:, ::2], good_ns)):                     # not contiguous
        with pytest.raises(TypeError):
            compiled.rows(s, 64, 4, 5, md, ns)
    ro = np.empty(4, dtype=np.int32)
    ro.flags.writeable = False
    with pytest.raises(TypeError):
        compiled.rows(s, 64, 4, 5, good_md, ro)
    with pytest.raises(ValueError):
        compiled.rows(s, 64, 0, 5, good_md, good_ns)


@needs_compiled
def test_walk_edges():
    # one request of 10 blocks over 3 partitions, F = 5: total 15, payload 10; P0 ends at 10 with
    # no boundary in its last F units, so it splits request 0 and P1 starts at 10 - 5 = 5 (paying
    # the overhead again); P1's end 15 is the end of the stream; P2 gets nothing
    assert _walk([640], 64, 3, 5) == ([0, 5], [0], 15)
    # one partition takes everything
    assert _walk([100, 7000, 3], 64, 1, 5) == ([0], [], 2 + 110 + 1 + 15)
    # lengths <= 1 are one block, as block_counts says
    assert _walk([-3, 0, 1], 64, 2, 0)[2] == int(block_counts(np.array([0, 0, 1])).sum())


@needs_compiled
@pytest.mark.parametrize("args,err", [
    ((np.array([1, 2], dtype=np.int32), 64, 2, 5), TypeError),          # not int64
    ((np.array([[1, 2]], dtype=np.int64), 64, 2, 5), TypeError),        # not one-dimensional
    ((np.arange(10, dtype=np.int64)[::2], 64, 2, 5), TypeError),       # not contiguous
    ((np.array([], dtype=np.int64), 64, 2, 5), ValueError),             # no request
    ((np.array([1], dtype=np.int64), 64, 0, 5), ValueError),            # P < 1
    ((np.array([1], dtype=np.int64), 64, 2**25, 5), ValueError),        # P absurd
    ((np.array([1], dtype=np.int64), 64, 2, -1), ValueError),           # F < 0
    ((np.array([1], dtype=np.int64), 0, 2, 5), ValueError),             # block < 1
    ((np.array([2**62, 2**62], dtype=np.int64), 64, 2, 5), ValueError),  # total overflows
    (([1, 2], 64, 2, 5), TypeError),                                     # a list is no buffer
])
def test_walk_rejects_bad_arguments(args, err):
    with pytest.raises(err):
        compiled.walk(*args)


@needs_compiled
def test_walk_reads_but_never_writes_its_lengths():
    s = np.array([100, 200, 5000], dtype=np.int64)
    s.flags.writeable = False           # a read-only array is accepted and left as it was
    assert _walk(s, 64, 2, 5) == _walk([100, 200, 5000], 64, 2, 5)
    assert s.tolist() == [100, 200, 5000]


@needs_compiled
@pytest.mark.parametrize("values,bad", [
    ([], -1),
    ([0, 5, 10], -1),
    ([3, True, 4], 1),                  # a bool is not an int here
    ([3, 4.0], 1),
    ([np.int64(3)], 0),                 # numpy scalars take the general path
    ([3, 11], 1),                       # above hi
    ([-1, 3], 0),                       # below lo
    ([2**70], 0),                       # does not fit in int64
    ([1, "2"], 1),
    ([1, None], 1),
])
def test_int_column(values, bad):
    out = np.full(max(len(values), 1), -9, dtype=np.int64)
    assert compiled.int_column(values, 0, 10, out) == bad
    good = len(values) if bad < 0 else bad
    assert out[:good].tolist() == [int(v) for v in values[:good]]   # copied up to the first bad value


@needs_compiled
def test_int_column_arguments():
    with pytest.raises(ValueError):
        compiled.int_column([1, 2, 3], 0, 10, np.empty(2, dtype=np.int64))
    with pytest.raises(TypeError):
        compiled.int_column((1, 2), 0, 10, np.empty(2, dtype=np.int64))     # lists only
    with pytest.raises(TypeError):
        compiled.int_column([1, 2], 0, 10, np.empty(2, dtype=np.float64))
    # the extremes of int64
    out = np.empty(2, dtype=np.int64)
    assert compiled.int_column([-2**63, 2**63 - 1], -2**63, 2**63 - 1, out) == -1
    assert out.tolist() == [-2**63, 2**63 - 1]


@needs_compiled
def test_schedules_from_any_integer_input_equal_the_reference():
    from validate_batch.flashmla.schedule import schedule_fast

    s = np.arange(0, 4000, 7, dtype=np.int64)
    ref = schedule_reference(s, 33, 5)
    for form in (s, s.astype(np.int32), np.repeat(s, 2)[::2], s.tolist(), tuple(s.tolist())):
        sch = schedule_fast(form, 33, 5)
        assert isinstance(sch.lengths, np.ndarray) and sch.lengths.dtype == np.int64, type(form)
        assert sch.metadata.tolist() == ref.metadata.tolist(), type(form)
        assert sch.num_splits.tolist() == ref.num_splits.tolist(), type(form)
        assert sch.split_requests == ref.split_requests, type(form)
