"""The fast paths of the per-step guard, the call-record parser and the batch-document parser
against the general paths they stand in for, on random input, with the compiled helpers and in
pure Python. Ground truth is arithmetic written here (plain loops) or the general path itself
(the verdict of a step given as tuples, which the fast path never takes; a document parsed entry
by entry)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from validate_batch import Checker, InputError, _accel
from validate_batch.facts import fields
from validate_batch.inputs import batch as batch_mod
from validate_batch.flashmla import calls

COMPILED = _accel.compiled
IMPLS = ["pure"] + (["compiled"] if COMPILED is not None else [])


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch):
    monkeypatch.setattr(_accel, "compiled", COMPILED if request.param == "compiled" else None)
    return request.param


def _ok(x, lo, hi) -> bool:
    return type(x) is int and lo <= x <= hi


def _values(rng: random.Random, n: int, lo: int, hi: int) -> list:
    v = [rng.randint(lo, hi) for _ in range(n)]
    if v and rng.random() < 0.5:          # one value at, below or above an edge, or of another type
        i = rng.randrange(n)
        v[i] = rng.choice([lo - 1, lo, hi, hi + 1, True, False, 2.0, np.int64(lo), "7", None, 1 << 70])
    return v


def test_int_stats_and_dict_columns_by_hand():
    if COMPILED is None:
        pytest.skip(f"compiled helpers {_accel.reason}")
    c = COMPILED
    assert c.int_stats([3, 9, 1], 1, 9) == (9, 13)
    for bad in ([0], [10], [True], [1.0], [np.int64(3)], [1 << 64], []):
        assert c.int_stats(bad, 1, 9) is None, bad
    assert c.int_stats([1, 9], 1, 9) == (9, 10)                   # both edges are in range
    assert c.int_stats([2 ** 62, 2 ** 61], 0, 2 ** 62) == (2 ** 62, 3 * 2 ** 61)
    assert c.int_stats([2 ** 62, 2 ** 62], 0, 2 ** 62) is None   # the sum (2**63) would not fit in int64
    assert c.dict_columns([{"a": 1, "b": "x"}, {"b": "y", "a": 2}], ("a", "b")) == ([1, 2], ["x", "y"])
    for bad in ([{"a": 1}], [{"a": 1, "c": 2}], [{"a": 1, "b": 2, "c": 3}], [[1, 2]], [None]):
        assert c.dict_columns(bad, ("a", "b")) is None, bad
    assert c.dict_columns([], ("a",)) == ([],)


def test_list_checks_equal_plain_loops(impl):
    rng = random.Random(3)
    for _ in range(3000):
        n = rng.choice([1, 2, 8, 9, rng.randint(1, 40), rng.randint(40, 3000)])
        lo, hi = rng.choice([(0, 1 << 24), (1, 1 << 31), (0, 5)])
        v = _values(rng, n, lo, hi)
        good = all(_ok(x, lo, hi) for x in v)
        assert fields.ints_within(v, lo, hi) is good
        assert fields.top_within(v, lo, hi) == (max(v) if good else -1)
        assert fields.sum_within(v, lo, hi) == (sum(v) if good else -1)
        a = fields.int_array_within(v, lo, hi)
        if good:
            assert a.dtype == np.int64 and a.tolist() == v
        elif a is not None:     # numpy integers in range may be taken too (the field checks accept them)
            assert all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and lo <= x <= hi
                       for x in v)
            assert a.dtype == np.int64 and a.tolist() == [int(x) for x in v]


def _outcome(fn):
    try:
        v = fn()
    except InputError as e:
        return ("error", e.field)
    return ("legal", v.legal)


@pytest.mark.parametrize("engine", [["sglang-dsv4@pre-25418"], ["sglang-dsv4@pre-25418", "sglang-slots@pre-fix"]])
def test_verdict_fast_path_equals_the_general_path(impl, engine):
    chk = Checker(engine=engine, gpu="H200", server_args={"max_running_requests": 64, "chunked_prefill_size": 8192,
                                                          "speculative_num_draft_tokens": 4})
    rng = random.Random(11)
    for _ in range(700):
        mode = rng.choice(["decode", "target_verify", "extend", "mixed"])
        n = rng.choice([1, 2, 9, rng.randint(1, 600), rng.choice([3000, 11622, 16384])])
        kw: dict = {}
        if mode in ("decode", "target_verify"):
            kw["seq_lens"] = _values(rng, n, 1, rng.choice([8000, 1 << 31]))
        else:
            kw["extend_lens"] = _values(rng, n, 0, rng.choice([2, 512, 9000]))
            if rng.random() < 0.5:
                kw["prefix_lens"] = _values(rng, n, 0, 4096)
        if rng.random() < 0.7:
            kw["req_pool_indices"] = _values(rng, n if rng.random() < 0.95 else n + 1, 0, rng.choice([63, 200]))
        if rng.random() < 0.2:
            kw["rids"] = [f"q{i}" for i in range(n)]
        as_array = rng.random() < 0.3
        fast = {k: (np.array(v) if as_array and k != "rids" and all(type(x) is int and abs(x) < 1 << 62 for x in v)
                    else v) for k, v in kw.items()}
        # the general path: tuples (never the fast path), or the same arrays, as the fast path skips arrays
        # over SHORT_ARRAY values
        general = {k: (tuple(v) if isinstance(v, list) else v) for k, v in fast.items()}
        if any(isinstance(v, np.ndarray) for v in fast.values()):
            with pytest.MonkeyPatch.context() as m:
                m.setattr(fields, "SHORT_ARRAY", -1)
                want = _outcome(lambda: chk.verdict(mode, **general))
        else:
            want = _outcome(lambda: chk.verdict(mode, **general))
        assert _outcome(lambda: chk.verdict(mode, **fast)) == want, (mode, n, as_array)


def _doc(rng: random.Random, n: int) -> dict:
    decode = rng.random() < 0.5
    slots = rng.random() < 0.5
    reqs = []
    for i in range(n):
        r: dict = {"id": f"r{i}"}
        if decode:
            r["seq_len"] = rng.randint(1, 20000)
        else:
            r["extend_tokens"] = rng.randint(0, 300)
            if rng.random() < 0.5:
                r["prefix_len"] = rng.randint(0, 3000)
        if slots:
            r["req_pool_idx"] = rng.randint(0, 500)
        reqs.append(r)
    if not decode and rng.random() < 0.7:       # one shape for all, or the general path
        for r in reqs:
            r.setdefault("prefix_len", 0)
    if rng.random() < 0.5:                       # something unusual somewhere
        r = reqs[rng.randrange(n)]
        k = rng.choice(["id", "seq_len", "extend_tokens", "prefix_len", "req_pool_idx", "extra"])
        r[k] = rng.choice([-1, 0, 1, True, 2.5, "x", None, 1 << 40, 7, f"r{rng.randrange(n)}"])
    return {"engine": "sglang-dsv4@pre-25418", "gpu": "H200", "forward_mode": "decode" if decode else "extend",
            "requests": reqs}


def _parsed(doc):
    try:
        return ("ok", tuple(batch_mod.batch_from_dict(doc).requests))
    except InputError as e:
        return ("error", e.field, str(e))


def test_document_columns_equal_entry_by_entry_parsing(impl, monkeypatch):
    rng = random.Random(7)
    for _ in range(800):
        doc = _doc(rng, rng.choice([1, 2, rng.randint(1, 50), rng.randint(50, 400)]))
        fast = _parsed(doc)
        with monkeypatch.context() as m:
            m.setattr(batch_mod, "request_columns", lambda raw: None)
            assert _parsed(doc) == fast


def test_int_vector_fast_path_equals_the_element_loop(impl, monkeypatch):
    rng = random.Random(5)
    cases = []
    for _ in range(1500):
        n = rng.choice([1, 3, rng.randint(1, 2000)])
        lo, hi = rng.choice([(-(2 ** 31), 2 ** 31 - 1), (0, 2 ** 31 - 1)])
        cases.append((_values(rng, n, max(lo, -5), min(hi, 5000)) if rng.random() < 0.8 else _values(rng, n, lo, hi),
                      n, lo, hi))

    def run():
        out = []
        for v, n, lo, hi in cases:
            try:
                out.append(("ok", calls.int_vector(v, n, "topk_length", lo, hi).tolist()))
            except InputError as e:
                out.append(("error", e.field, str(e)))
        return out

    fast = run()
    monkeypatch.setattr(calls, "int_array_within", lambda v, lo, hi: None)
    assert fast == run()
    for (v, n, lo, hi), got in zip(cases, fast):   # and from first principles
        assert (got[0] == "ok") == all((type(x) is int or isinstance(x, np.integer)) and type(x) is not bool
                                       and lo <= int(x) <= hi for x in v)


def _tree(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 4 or r < 0.3:
        return rng.choice([0, -1, 7, 2 ** 63, -(2 ** 63) - 1, 2 ** 64, 1.5, "s", "x" * 30, True, None])
    if r < 0.55:      # a column of numbers (sometimes with something else in it)
        col = [rng.choice([1, -5, 2 ** 63 - 1, 2 ** 64, -(2 ** 63), 0.25]) for _ in range(rng.randint(0, 9))]
        if col and rng.random() < 0.2:
            col[rng.randrange(len(col))] = rng.choice(["a", [1], None, True])
        return col
    if r < 0.8:       # a table: rows of numbers
        rows = [[rng.randint(-9, 9) for _ in range(rng.randint(0, 8))] for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.3:
            rows.append(rows[0])                  # a shared row
        if rng.random() < 0.2:
            rows[rng.randrange(len(rows))] = rng.choice([(1, 2), "row", [[1]], [2.5, 1]])
        return rows
    return {f"k{i}": _tree(rng, depth + 1) for i in range(rng.randint(0, 4))} if rng.random() < 0.5 else \
        [_tree(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def test_tree_limits_fast_paths_equal_the_value_by_value_walk(monkeypatch):
    from validate_batch.facts import limits
    rng = random.Random(13)

    def outcome(tree, nodes, depth):
        try:
            limits.check_tree(tree, "FILE", max_depth=depth, max_nodes=nodes, max_string=20)
        except InputError as e:
            return str(e)
        return None

    for _ in range(1500):
        tree = _tree(rng)
        nodes, depth = rng.choice([1, 5, 20, 60, 10 ** 6]), rng.choice([1, 2, 3, 4, 64])
        fast = outcome(tree, nodes, depth)
        with monkeypatch.context() as m:       # every value pushed and looked at alone
            m.setattr(limits, "_plain_numbers", lambda x: False)
            m.setattr(limits, "_number_rows", lambda x: False)
            assert outcome(tree, nodes, depth) == fast, (tree, nodes, depth)


def test_json_without_the_integer_hook_reads_the_same(monkeypatch):
    import json

    from validate_batch.inputs import documents as inputs
    from validate_batch.facts import limits
    rng = random.Random(17)
    digits = limits.MAX_DOCUMENT_INT_DIGITS
    for _ in range(300):
        n = rng.choice([1, 19, 20, 21, digits - 1, digits, digits + 1, digits + 5])
        num = rng.choice(["", "-"]) + str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(n - 1))
        text = json.dumps({"a": [1, 2, -3], "s": "9" * rng.choice([5, digits + 1])})[:-1] + f', "n": {num}}}'
        def read():
            try:
                return ("ok", inputs._loads(text))
            except InputError as e:
                return ("error", str(e))
        fast = read()
        with monkeypatch.context() as m:       # the hook on every integer
            m.setattr(inputs, "_LONG_DIGITS", type("Always", (), {"search": staticmethod(lambda t: True)}))
            assert read() == fast
        assert (fast[0] == "ok") == (n <= digits)


def test_first_snap_equals_the_residue_walk():
    """The period's first snapping partition by jumps (one per wrap) against the walk k = 1, 2, ...
    over the residues k * step mod w, written here."""
    from validate_batch.flashmla.schedule import _first_snap

    def walk(step, w, lo, kmax):
        for k in range(1, kmax + 1):
            r = k * step % w
            if r == 0 or r >= lo:
                return k
        return 0

    rng = random.Random(19)
    for _ in range(100000):
        w = rng.randint(1, rng.choice([4, 60, 5000]))
        step, lo, kmax = rng.randrange(w), rng.randint(1, w), rng.randint(1, 300)
        assert _first_snap(step, w, lo, kmax) == walk(step, w, lo, kmax), (step, w, lo, kmax)


def test_min_max_of_short_and_long_arrays():
    rng = random.Random(23)
    for _ in range(2000):
        n = rng.choice([1, 2, 15, 16, 17, rng.randint(1, 500)])
        v = [rng.randint(-(2 ** 62), 2 ** 62) for _ in range(n)]
        dtype = rng.choice([np.int64, np.int32, np.uint32]) if max(map(abs, v)) < 2 ** 31 else np.int64
        a = np.array([abs(x) % 2 ** 31 for x in v] if dtype != np.int64 else v, dtype=dtype)
        got = fields.min_max(a)
        assert got == (min(a.tolist()), max(a.tolist())) and all(type(x) is int for x in got)


def test_xml_escaping_equals_the_standard_library():
    from xml.sax.saxutils import escape, quoteattr

    from validate_batch.output import formats
    rng = random.Random(29)
    for _ in range(5000):
        s = "".join(rng.choice("ab&<>\"'\n\r\t é") for _ in range(rng.randint(0, 14)))
        assert formats.xml_escape(s) == escape(s)
        assert formats.quoteattr(s) == quoteattr(s)


def test_long_digit_runs_are_found_wherever_they_are():
    from validate_batch.inputs import documents as inputs
    from validate_batch.facts import limits
    d = limits.MAX_DOCUMENT_INT_DIGITS
    for before, after in (("", ""), ("[", "]"), ("x", ","), ("-", ""), ("1.", "e5")):
        assert inputs._LONG_DIGITS.search(before + "7" * (d + 1) + after) is not None
        assert inputs._LONG_DIGITS.search(before + "7" * d + after) is None
    many = "[" + ",".join(["9" * d] * 200) + "," + "9" * (d + 1) + "]"
    assert inputs._LONG_DIGITS.search(many) is not None
