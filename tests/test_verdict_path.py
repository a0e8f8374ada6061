"""The verdict and the full check share one path: one reading of the step's lists, one row counter,
one bounds decision; the verdict agrees with itself across input representations (lists, tuples,
numpy arrays of any integer dtype, objects with ``tolist``) and with the full check; the one
pure-Python schedule walk reads lists and memoryviews alike and equals the reference loop; the
command line's direct path reads only options its commands declare."""
from __future__ import annotations

import enum
import inspect
import random
from types import SimpleNamespace

import numpy as np
import pytest

from validate_batch import LEGAL, Checker, InputError
from validate_batch.cli import main as cli
from validate_batch.guard import checker as guard
from validate_batch.legality.bounds import StepBounds
from validate_batch.flashmla.schedule import _walk_prefix, schedule_reference

PRE = "sglang-dsv4@pre-25418"
SETTINGS = {"chunked_prefill_size": 8192, "max_running_requests": 64, "speculative_num_draft_tokens": 4}
ENGINES = [[PRE], [PRE, "sglang-slots@pre-fix"]]


class Tensor:
    """Stands in for a CPU tensor: only ``tolist()`` is read."""

    def __init__(self, values):
        self._values = list(values)

    def tolist(self):
        return list(self._values)


def _counting(monkeypatch, owner, name):
    calls = []
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def test_the_verdict_takes_the_full_checks_reading_row_counter_and_decision(monkeypatch):
    assert not hasattr(Checker, "_lean"), "no second reading of the lists"
    decided = _counting(monkeypatch, StepBounds, "decide")
    counted = _counting(monkeypatch, guard, "query_rows")
    chk = Checker(PRE, "H200", SETTINGS)        # binds the (wrapped) decision once
    # the rows of a one-request step in each mode without new-token counts are the row counter's,
    # counted once when the checker is built (SETTINGS has 4 draft tokens)
    assert counted == ["query_rows"] * 3 and chk._one_request_rows == {"decode": 1, "target_verify": 4,
                                                                         "draft_extend": 4}
    read = _counting(monkeypatch, Checker, "_validate")
    decided.clear()
    counted.clear()
    # one request: read in place by the verdict, its rows the counter's from the table above, and
    # decided by the one decision
    assert chk.verdict("decode", seq_lens=[100], req_pool_indices=[1])
    assert (read, counted, decided) == ([], [], ["decide"])
    read.clear()
    decided.clear()
    # one the first branch cannot take (an id to read) goes the general reading
    assert chk.verdict("decode", seq_lens=[100], req_pool_indices=[1], rids=["a"])
    assert (read, counted, decided) == (["_validate"], ["query_rows"], ["decide"])
    read.clear()
    counted.clear()
    decided.clear()
    assert chk.verdict("decode", seq_lens=[100, 200], req_pool_indices=[1, 2])
    assert (read, counted, decided) == (["_validate"], ["query_rows"], ["decide"])
    read.clear()
    assert chk.check("decode", seq_lens=[100], req_pool_indices=[1]).legal
    assert read == ["_validate"]
    # an illegal step: the verdict's report is the full check's
    v = chk.verdict("extend", extend_lens=[4096] * 3)
    assert not v and v.report.codes == chk.check("extend", extend_lens=[4096] * 3).codes


def test_the_bounds_shortcut_is_the_rest_of_the_decision():
    """decide's first test (1..sure_rows rows, slots in range) answers as its general branches do."""
    for engine in ENGINES:
        b = Checker(engine, "H200", SETTINGS).bounds
        slow = StepBounds(**{f: getattr(b, f) for f in StepBounds.__dataclass_fields__})
        object.__setattr__(slow, "_sure", 0)        # the shortcut never taken
        slots = [None, -1, 0, 1, 63] + ([b.max_slot, b.max_slot + 1] if b.max_slot is not None else [])
        rows = {0, 1, 2, 255, 256, b.sure_rows - 1, b.sure_rows, b.sure_rows + 1, 11623, 20000}
        for mode in ("decode", "extend", "mixed", "target_verify", "draft_extend"):
            for r in rows:
                for s in slots:
                    assert b.decide(mode, r, s) == slow.decide(mode, r, s), (engine, mode, r, s)


def _forms(values: list, rng: random.Random):
    """The same column as a list, a tuple, numpy arrays of several integer dtypes and a tensor stand-in."""
    out = [list(values), tuple(values), Tensor(values)]
    if all(0 <= x < 1 << 31 for x in values):
        out += [np.array(values, dtype=rng.choice([np.int64, np.int32, np.uint32])),
                np.array(values, dtype=np.int64)[::-1][::-1]]       # a view, not a fresh array
    return out


def _outcome(fn):
    try:
        v = fn()
    except InputError as e:
        return ("error", e.field)
    return ("legal", bool(v))


@pytest.mark.parametrize("engine", ENGINES, ids=["dsv4", "dsv4+slots"])
def test_every_representation_gets_the_same_verdict_and_the_full_check_agrees(impl, engine):
    chk = Checker(engine, "H200", SETTINGS)
    rng = random.Random(2026)
    for _ in range(250):
        mode = rng.choice(["decode", "target_verify", "extend", "mixed"])
        n = rng.choice([1, 2, 8, 9, rng.randint(1, 700), rng.choice([2900, 11622, 11700])])
        cols: dict = {}
        if mode in ("decode", "target_verify"):
            cols["seq_lens"] = [rng.randint(1, 9000) for _ in range(n)]
        else:
            cols["extend_lens"] = [rng.randint(0, rng.choice([3, 40, 4096])) for _ in range(n)]
            if rng.random() < 0.5:
                cols["prefix_lens"] = [rng.randint(0, 4096) for _ in range(n)]
        if rng.random() < 0.7:
            cols["req_pool_indices"] = [rng.randint(rng.choice([0, 1]), rng.choice([63, 64, 300])) for _ in range(n)]
        if rng.random() < 0.2:                  # one bad value somewhere
            name = rng.choice(sorted(cols))
            cols[name][rng.randrange(n)] = rng.choice([-1, 1 << 40, 0])
        want = _outcome(lambda: chk.verdict(mode, **cols))
        for _ in range(3):                      # mixed representations, one per column
            kw = {k: rng.choice(_forms(v, rng)) for k, v in cols.items()}
            assert _outcome(lambda: chk.verdict(mode, **kw)) == want, (mode, n, {k: type(v) for k, v in kw.items()})
        if want[0] == "legal":
            assert chk.full_legal(mode, **cols) == want[1], (mode, n)


def test_the_one_walk_reads_lists_and_memoryviews_and_equals_the_reference_loop():
    rng = np.random.default_rng(17)
    for P, top in ((132, 640), (66, 2048), (7, 100), (1, 50)):
        for b in (1, 2, 3 * P, 3 * P + 1, 16 * P, 16 * P + 1, 40 * P):
            for F in (0, 5):
                s = rng.integers(0, top + 1, b)
                widths = np.maximum((s - 1) // 64 + 1, 1) + F
                C = [0] + np.cumsum(widths).tolist()
                total = C[-1]
                starts, events = _walk_prefix(C, P, F, total)
                assert _walk_prefix(memoryview(np.array(C, dtype=np.int64)), P, F, total) == (starts, events)
                ref = schedule_reference(s, P, F)
                assert events == ref.split_requests, (P, b, F)
                # every active partition starts where the reference loop's begins: request and block
                for x, row in zip(starts, ref.rows):
                    r = int(np.searchsorted(C, x, "right")) - 1
                    assert (r, x - C[r]) == (row[0], row[2]), (P, b, F)


@pytest.mark.parametrize("command", sorted(cli.DIRECT_COMMANDS))
def test_the_direct_paths_table_reads_only_options_the_command_declares(command):
    # the direct path runs the command's body (validate_batch.cli.commands) with the defaults of its own
    # signature; typer's declaration of the same command (validate_batch.cli.app) must name the same
    # parameters with the same defaults, and every word the table reads must be one of its flags
    from validate_batch.cli import app as typer_app

    fn, options = cli.DIRECT_COMMANDS[command]
    declared = {c.name or c.callback.__name__: c.callback for c in typer_app.app.registered_commands}
    params = inspect.signature(fn).parameters
    typer_params = inspect.signature(declared[command]).parameters
    assert fn is getattr(cli, fn.__name__)
    assert command in cli.DIRECT            # the console script's own list of direct commands
    assert ("file" in params) == (command != "rules")     # rules takes no FILE
    assert list(params) == list(typer_params), command
    for name, param in params.items():
        info = typer_params[name].default
        want = info.default if info.default is not ... else inspect.Parameter.empty
        got = list(param.default) if isinstance(param.default, tuple) else param.default
        assert got == want, (command, name)
    for word, (name, takes_value) in options.items():
        info = typer_params[name].default
        assert word in info.param_decls, (command, word)
        assert takes_value == (not isinstance(info.default, bool)), (command, word)


def test_the_console_script_knows_exactly_the_direct_commands():
    assert cli.DIRECT == frozenset(cli.DIRECT_COMMANDS)


def _general(values):
    """The same column in a form the verdict's one-request reading does not take (a tuple): the
    general reading then reads it."""
    return tuple(values) if isinstance(values, list) else values


@pytest.mark.parametrize("engine", ENGINES, ids=["dsv4", "dsv4+slots"])
def test_a_one_request_step_reads_and_decides_as_the_general_reading(engine):
    """Steps of one request given as lists of one plain int (and short integer arrays) are read by the
    verdict's first branch; every answer and every input error is the one the general reading gives
    for the same values as tuples, and a legal verdict is the full check's."""
    chk = Checker(engine, "H200", SETTINGS)
    top = chk.max_slot if chk.max_slot is not None else 64
    seqs = [0, 1, 2, 4096, (1 << 31) - 1, 1 << 31, -1, True, 3.0, None]
    slots = [None, 0, 1, 2, top, top + 1, (1 << 31) - 1, 1 << 31, -1, False, "1"]
    for mode in ("decode", "target_verify", "draft_extend"):
        for s in seqs:
            for slot in slots:
                kw = {"seq_lens": [s] if s is not None else None}
                if slot is not None:
                    kw["req_pool_indices"] = [slot]
                want = _outcome(lambda: chk.verdict(mode, **{k: _general(v) for k, v in kw.items()}))
                assert _outcome(lambda: chk.verdict(mode, **kw)) == want, (mode, s, slot)
                if isinstance(s, int) and isinstance(slot, (int, type(None))) and not isinstance(s, bool) \
                        and not isinstance(slot, bool) and 0 <= s < 1 << 31 and (slot is None or 0 <= slot < 1 << 31):
                    arrays = {k: np.array(v, dtype=np.int64) for k, v in kw.items()}
                    assert _outcome(lambda: chk.verdict(mode, **arrays)) == want, (mode, s, slot, "arrays")
                if want == ("legal", True):
                    assert chk.full_legal(mode, **kw), (mode, s, slot)
    # the branch never takes a step with more to read: the same one-request step with padding, merged
    # decodes or request ids is read in full (a padded decode of 11623 rows is over the kernel's limit)
    assert chk.verdict("decode", seq_lens=[100], req_pool_indices=[1], rids=["a"]) is LEGAL
    assert not chk.verdict("decode", seq_lens=[100], req_pool_indices=[1], padded_rows=(232448 - 4) // 20 + 1)
    with pytest.raises(InputError) as ei:
        chk.verdict("decode", seq_lens=[100], num_merged_decodes=1)
    assert ei.value.field == "num_merged_decodes"
    # without draft tokens a verify or draft step of one request is an input error, as in general
    plain = Checker(engine, "H200", {"chunked_prefill_size": 8192, "max_running_requests": 64})
    for mode in ("target_verify", "draft_extend"):
        want = _outcome(lambda: plain.verdict(mode, seq_lens=(100,), req_pool_indices=(1,)))
        assert want[0] == "error" and _outcome(lambda: plain.verdict(mode, seq_lens=[100], req_pool_indices=[1])) == want
    assert plain.verdict("decode", seq_lens=[100], req_pool_indices=[1]) is LEGAL


class _SGLangMode(enum.IntEnum):
    """Stands in for SGLang's ``ForwardMode`` (its member names; the values are not read)."""

    EXTEND = 1
    DECODE = 2
    IDLE = 4
    TARGET_VERIFY = 5
    DRAFT_EXTEND = 6


class _Spec:
    def __init__(self, on):
        self.on = on

    def is_none(self):
        return not self.on


def _schedule_batch(mode, slot, *, spec=False, kv=False, **extra):
    """Stands in for SGLang's ``ScheduleBatch`` of one request (the attribute names the adapters read;
    ``kv``: the request holds its slot as 0.5.23's ``Req.kv.req_pool_idx``, else as ``req_pool_idx``)."""
    r = SimpleNamespace(rid="r0", kv=SimpleNamespace(req_pool_idx=slot)) if kv else SimpleNamespace(rid="r0",
                                                                                                  req_pool_idx=slot)
    b = SimpleNamespace(forward_mode=mode, reqs=[r], spec_algorithm=_Spec(spec), decoding_reqs=None,
                        seq_lens_cpu=Tensor([100]), req_pool_indices_cpu=Tensor([slot if isinstance(slot, int) else 0]),
                        global_num_tokens=None, beam_tail=None)
    for k, v in extra.items():
        setattr(b, k, v)
    return b


@pytest.mark.parametrize("engine", ENGINES, ids=["dsv4", "dsv4+slots"])
def test_a_one_request_engine_step_is_decided_as_the_full_check_decides_it(engine, monkeypatch):
    """An SGLang step of one request (decode, verify, draft extend; the slot where either release
    keeps it) is read by the verdict's one-request branch when it holds a plain int slot: the bounds
    decision gets the mode, rows and largest slot the general reading of the same step as lists
    gives it (-1 for the reserved row 0), the answer is the full check's, and where slots are
    checked a slot is legal iff 1 <= slot <= the buffers' last row (SETTINGS's 64 running requests
    give rows 0..64)."""
    asked = []
    real = StepBounds.decide

    def decide(self, mode, rows, max_slot):
        asked.append((str(mode), rows, max_slot))
        return real(self, mode, rows, max_slot)

    monkeypatch.setattr(StepBounds, "decide", decide)
    chk = Checker(engine, "H200", SETTINGS)       # binds the recording decision
    names = {(_SGLangMode.DECODE, False): "decode", (_SGLangMode.DECODE, True): "target_verify",
             (_SGLangMode.TARGET_VERIFY, True): "target_verify", (_SGLangMode.DRAFT_EXTEND, True): "draft_extend"}
    top = chk.max_slot
    slots = [0, 1, 2, 63, 64, 65, (1 << 31) - 1, -1, np.int64(3), np.int64(65), True]
    for mode, spec in names:
        for slot in slots:
            for kv in (False, True):
                step = _schedule_batch(mode, slot, spec=spec, kv=kv)
                asked.clear()
                got, want = _outcome(lambda: chk.verdict(step)), _outcome(lambda: chk.check(step).legal)
                by_engine = asked[:1]
                asked.clear()
                slots_kw = {"req_pool_indices": (slot,)} if chk.has_slots else {}
                general = _outcome(lambda: chk.verdict(names[mode, spec], seq_lens=(100,), **slots_kw))
                if got[0] == "legal" and general[0] == "legal":
                    assert by_engine == asked[:1] and by_engine, (mode, spec, slot, kv)
                assert got == want, (mode, spec, slot, kv)
                if top is not None and type(slot) is int:
                    legal = ("legal", 1 <= slot <= 64) if slot >= 0 else ("error", "req_pool_indices[0]")
                    assert top == 64 and got == legal, (mode, slot, kv)
                elif top is None:
                    assert got == ("legal", True), (mode, slot, kv)
    # the branch never takes a step with more to read: data-parallel padding past the kernel's limit
    # ((232448 - 4) // 20 + 1 rows on an H200) is read and refused
    padded = _schedule_batch(_SGLangMode.DECODE, 1, global_num_tokens=[1, (232448 - 4) // 20 + 1], dp_rank=0,
                             tp_rank=0, attn_dp_size=2)
    assert _outcome(lambda: chk.verdict(padded)) == _outcome(lambda: chk.check(padded).legal)
    # idle steps and empty ones are legal; what is not a ScheduleBatch goes the other ways
    assert chk.verdict(_schedule_batch(_SGLangMode.IDLE, 1)) is LEGAL
    assert chk.verdict(_schedule_batch(_SGLangMode.DECODE, 1, reqs=[])) is LEGAL
    with pytest.raises(InputError) as e:
        chk.verdict(object())
    assert e.value.field == "batch"
