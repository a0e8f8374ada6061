"""Adapters from live engine objects (stand-ins with SGLang's and vLLM's attribute names) and the
documented scheduler-loop snippets, run against them.

Expected numbers from first principles: the decode kernel takes b <= (232448 - 4) // 20 rows on an
H200; one query row per token.
"""
from __future__ import annotations

import enum
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import validate_batch
from validate_batch import LEGAL, BatchIllegalError, Checker, InputError
from validate_batch.inputs.adapters import sglang_forward_mode, step_lists

ROOT = Path(__file__).resolve().parents[1]
LIMIT = (232448 - 4) // 20
# vLLM 0.33's SM90 sparse decode (vllm-dsv4 on an H200): the current scheduler, 4*(4b+1) (measured:
# fixtures/measured/vllm033_h200_probes.jsonl)
VLLM_SPARSE_LIMIT = (232448 - 4) // 16
PRE = "sglang-dsv4@pre-25418"


class ForwardMode(enum.IntEnum):  # same member names as SGLang's enum
    EXTEND = 1
    DECODE = 2
    MIXED = 3
    IDLE = 4
    TARGET_VERIFY = 5
    DRAFT_EXTEND = 6
    SPLIT_PREFILL = 7
    PREBUILT = 8
    SOME_FUTURE_MODE = 9        # not a member of any SGLang release the project knows


class FakeTensor:
    """A device tensor: ``tolist()`` works, counting calls (a device sync in a real engine)."""

    def __init__(self, values):
        self.values = list(values)
        self.reads = 0

    def tolist(self):
        self.reads += 1
        return list(self.values)


class Spec:
    def __init__(self, name):
        self.name = name

    def is_none(self):
        return self.name == "NONE"


def req(rid, slot=None):
    return SimpleNamespace(rid=rid, req_pool_idx=slot)


def schedule_batch(mode, rids, extend=None, prefix=None, seq=None, slots=None, decoding=None, spec="NONE", cpu_seq=True):
    slots = slots or [None] * len(rids)
    b = SimpleNamespace(forward_mode=mode, reqs=[req(r, s) for r, s in zip(rids, slots)], spec_algorithm=Spec(spec),
                        decoding_reqs=decoding, req_pool_indices=FakeTensor(s if s is not None else 0 for s in slots))
    if extend is not None:
        b.extend_lens = list(extend)
        b.prefix_lens = list(prefix) if prefix is not None else [0] * len(extend)
    if seq is not None:
        b.seq_lens = FakeTensor(seq)
        if cpu_seq:
            b.seq_lens_cpu = FakeTensor(seq)
    return b


def seed_batch():
    """Prefill batch, #new-seq: 3, #new-token: 12288, #running-req: 1 (the running decode not merged)."""
    return schedule_batch(ForwardMode.EXTEND, ["p1", "p2", "p3"], extend=[4096] * 3, seq=[4096] * 3, slots=[1, 2, 3])


SEED_ARGS = {"chunked_prefill_size": 16384, "enable_mixed_chunk": False, "max_running_requests": 64, "tp_size": 8}


@pytest.fixture(scope="module")
def pre():
    return Checker(engine=PRE, gpu="H200", server_args=SEED_ARGS)


# ------------------------------------------------------------------ SGLang
def test_sglang_seed_batch_is_refused_with_the_split(pre):
    v = pre.verdict(seed_batch())
    assert not v and {"FMLA001", "SGL001"} <= set(v.report.codes)
    assert v.report.context["query_rows"] == 3 * 4096
    assert v.safe_split.steps == [["p1", "p2"], ["p3"]]
    with pytest.raises(BatchIllegalError):
        pre.assert_legal(seed_batch())


def test_sglang_report_equals_the_document_report(pre):
    a = pre.check(seed_batch())
    b = validate_batch.check({"engine": PRE, "gpu": "H200", "server_args": SEED_ARGS, "forward_mode": "extend",
                         "requests": [{"id": f"p{i}", "extend_tokens": 4096, "req_pool_idx": i} for i in (1, 2, 3)]})
    assert [f.to_dict() for f in a.findings] == [f.to_dict() for f in b.findings]
    assert a.safe_split.to_dict() == b.safe_split.to_dict()


def test_sglang_legal_prefill_and_decode(pre):
    assert pre.verdict(schedule_batch(ForwardMode.EXTEND, ["p1"], extend=[4096])) is LEGAL
    dec = schedule_batch(ForwardMode.DECODE, [f"r{i}" for i in range(LIMIT)], seq=[900] * LIMIT)
    assert pre.verdict(dec) is LEGAL
    assert dec.seq_lens.reads == 0 and dec.seq_lens_cpu.reads == 0   # the fast path needs only the count
    big = schedule_batch(ForwardMode.DECODE, [f"r{i}" for i in range(LIMIT + 1)], seq=[900] * (LIMIT + 1))
    assert not Checker(engine=PRE, split=False).verdict(big)


def test_sglang_prefers_cpu_sequence_lengths(pre):
    b = schedule_batch(ForwardMode.DECODE, ["a", "b"], seq=[10, 20])
    lists = step_lists(b, pre)
    assert lists["seq_lens"] == [10, 20] and b.seq_lens.reads == 0 and b.seq_lens_cpu.reads == 1
    nocpu = schedule_batch(ForwardMode.DECODE, ["a", "b"], seq=[10, 20], cpu_seq=False)
    assert step_lists(nocpu, pre)["seq_lens"] == [10, 20] and nocpu.seq_lens.reads == 1


def test_sglang_mixed_batch_counts_merged_decodes_once():
    c = Checker(engine=PRE, server_args={"enable_mixed_chunk": True})
    running = [req("d1", 9), req("d2", 10)]
    ext = [5810, 5810, 1, 1]                       # SGLang appends the running decodes with length 1
    b = schedule_batch(ForwardMode.MIXED, ["p1", "p2", "d1", "d2"], extend=ext, prefix=[0, 0, 1799, 50],
                       decoding=running)
    rep = c.check(b)
    assert rep.context["query_rows"] == 5810 * 2 + 2 == LIMIT
    assert rep.context["row_breakdown"]["decode_rows_in_forward"] == 2 and rep.legal
    b.extend_lens = [5811, 5810, 1, 1]
    v = c.verdict(b)
    assert not v and v.report.context["query_rows"] == LIMIT + 1


@pytest.mark.parametrize("bs,legal", [(LIMIT // 4, True), (LIMIT // 4 + 1, False)])
def test_sglang_speculative_decode_is_checked_as_the_verify_forward(bs, legal):
    c = Checker(engine=PRE, server_args={"speculative_num_draft_tokens": 4}, split=False)
    b = schedule_batch(ForwardMode.DECODE, [f"r{i}" for i in range(bs)], seq=[500] * bs, spec="EAGLE")
    assert sglang_forward_mode(b, 4) == "target_verify"
    assert c.verdict(b).legal is legal
    plain = schedule_batch(ForwardMode.DECODE, [f"r{i}" for i in range(bs)], seq=[500] * bs, spec="NONE")
    assert c.verdict(plain) is LEGAL                  # bs <= LIMIT rows without speculation


def test_sglang_mode_names_and_methods():
    ns = lambda **kw: SimpleNamespace(forward_mode=kw.pop("fm"), reqs=[], **kw)  # noqa: E731
    assert sglang_forward_mode(ns(fm=ForwardMode.SPLIT_PREFILL)) == "extend"
    assert sglang_forward_mode(ns(fm=ForwardMode.IDLE)) is None
    assert sglang_forward_mode(ns(fm="draft_extend")) == "draft_extend"

    class MethodsOnly:
        def is_idle(self):
            return False

        def is_target_verify(self):
            return False

        def is_draft_extend(self):
            return False

        def is_mixed(self):
            return True

        def is_decode(self):
            return False

        def is_extend(self):
            return True
    assert sglang_forward_mode(ns(fm=MethodsOnly())) == "mixed"
    # a PD decode worker's PREBUILT batch never enters a model forward (SGLang 0.5.23)
    assert sglang_forward_mode(ns(fm=ForwardMode.PREBUILT)) is None
    with pytest.raises(InputError) as ei:
        sglang_forward_mode(ns(fm=ForwardMode.SOME_FUTURE_MODE))
    assert ei.value.field == "forward_mode"


def test_sglang_idle_and_empty_batches_are_legal(pre):
    assert pre.verdict(schedule_batch(ForwardMode.IDLE, [])) is LEGAL
    assert pre.verdict(schedule_batch(ForwardMode.DECODE, [], seq=[])) is LEGAL
    assert pre.check(schedule_batch(ForwardMode.IDLE, [])).legal


def test_sglang_slots_read_from_requests_or_the_tensor():
    c = Checker(engine="sglang-slots@pre-fix", server_args={
        "max_running_requests": 32, "disaggregation_mode": "decode", "disaggregation_decode_extra_slots": 64,
        "speculative_algorithm": "NEXTN", "speculative_num_draft_tokens": 4})
    b = schedule_batch(ForwardMode.DRAFT_EXTEND, ["a", "b"], seq=[5000, 7000], slots=[3, 96])
    v = c.verdict(b)
    assert not v and "SLOT002" in v.report.codes and b.req_pool_indices.reads == 0
    b2 = schedule_batch(ForwardMode.DECODE, ["a", "b"], seq=[5000, 7000])
    b2.req_pool_indices = FakeTensor([3, 33])        # requests without req_pool_idx: read the tensor
    assert not c.verdict(b2)
    b2.req_pool_indices = FakeTensor([3, 32])
    assert c.verdict(b2) is LEGAL


def test_sglang_bad_lists_raise_input_error(pre):
    b = schedule_batch(ForwardMode.EXTEND, ["a", "b"], extend=[10, -1])
    with pytest.raises(InputError) as ei:
        pre.verdict(b)
    assert ei.value.field == "extend_lens[1]"
    b = schedule_batch(ForwardMode.EXTEND, ["a", "b"], extend=[10])
    with pytest.raises(InputError):
        pre.verdict(b)


def test_real_torch_tensors_if_available(pre):
    torch = pytest.importorskip("torch")
    b = schedule_batch(ForwardMode.DECODE, ["a", "b"], seq=[10, 20])
    b.seq_lens_cpu = torch.tensor([10, 20], dtype=torch.int64)
    rep = pre.check(b)
    assert rep.legal and rep.context["query_rows"] == 2
    assert pre.verdict("decode", seq_lens=torch.tensor([5, 6, 7])) is LEGAL


class HostTensor(FakeTensor):
    """A tensor in host memory: ``numpy()`` is a view (no per-element conversion)."""

    device = SimpleNamespace(type="cpu")

    def numpy(self):
        return np.asarray(self.values, dtype=np.int32)


class DeviceTensor(FakeTensor):
    device = SimpleNamespace(type="cuda")

    def numpy(self):
        raise TypeError("can't convert cuda tensor to numpy")


def test_host_tensors_are_read_as_arrays_and_device_tensors_as_lists(pre):
    from validate_batch.inputs.adapters import step_lists

    seq = [4096, 70, 1, 9000]
    want = pre.check("decode", seq_lens=seq, rids=["a", "b", "c", "d"])
    for cls, kind in ((HostTensor, np.ndarray), (DeviceTensor, list)):
        b = schedule_batch(ForwardMode.DECODE, ["a", "b", "c", "d"], seq=seq)
        b.seq_lens_cpu = cls(seq)
        lists = step_lists(b, pre)
        assert isinstance(lists["seq_lens"], kind) and list(lists["seq_lens"]) == seq
        assert (b.seq_lens_cpu.reads == 0) == (cls is HostTensor)
        rep = pre.check(b)
        assert rep.legal == want.legal and rep.to_dict() == want.to_dict()
    b = schedule_batch(ForwardMode.DECODE, ["a", "b"], seq=[5, 6])
    b.seq_lens_cpu = HostTensor([5, 0])
    with pytest.raises(InputError) as ei:
        pre.check(b)
    assert ei.value.field == "seq_lens[1]"


# ------------------------------------------------------------------ vLLM
def scheduler_output(tokens: dict, computed: dict, new=(), old_cached_form=False, total=None):
    new_reqs = [SimpleNamespace(req_id=r, num_computed_tokens=computed[r]) for r in new]
    cached_ids = [r for r in tokens if r not in new]
    if old_cached_form:
        cached = [SimpleNamespace(req_id=r, num_computed_tokens=computed[r]) for r in cached_ids]
    else:
        cached = SimpleNamespace(req_ids=cached_ids, num_computed_tokens=[computed[r] for r in cached_ids])
    return SimpleNamespace(num_scheduled_tokens=dict(tokens), scheduled_new_reqs=new_reqs,
                           scheduled_cached_reqs=cached,
                           total_num_scheduled_tokens=sum(tokens.values()) if total is None else total)


@pytest.mark.parametrize("old_form", [False, True])
def test_vllm_step_rows_are_scheduled_tokens(pre, old_form):
    toks = {"p1": 4096, "p2": 4096, "p3": 4096}
    out = scheduler_output(toks, {"p1": 0, "p2": 0, "p3": 0}, new=("p1", "p2", "p3"), old_cached_form=old_form)
    v = pre.verdict(out)
    assert not v and v.report.context["query_rows"] == 12288
    assert v.safe_split.steps == [["p1", "p2"], ["p3"]]
    mixed = scheduler_output({"d1": 1, "d2": 1, "p1": 8000}, {"d1": 700, "d2": 90, "p1": 0}, new=("p1",),
                             old_cached_form=old_form)
    lists = step_lists(mixed, pre)
    assert lists["forward_mode"] == "extend" and lists["prefix_lens"] == [700, 90, 0]
    assert pre.verdict(mixed) is LEGAL


def test_vllm_pure_decode_step(pre):
    out = scheduler_output({"a": 1, "b": 1}, {"a": 10, "b": 20})
    lists = step_lists(out, pre)
    assert lists == {"forward_mode": "decode", "rids": ["a", "b"], "seq_lens": [11, 21]}
    assert pre.verdict(out) is LEGAL


def test_vllm_empty_and_inconsistent_outputs(pre):
    assert pre.verdict(scheduler_output({}, {})) is LEGAL
    with pytest.raises(InputError) as ei:
        pre.verdict(scheduler_output({"a": 3}, {"a": 0}, new=("a",), total=4))
    assert ei.value.field == "total_num_scheduled_tokens"
    bad = scheduler_output({"a": 3}, {"a": 0}, new=("a",))
    bad.scheduled_new_reqs = []
    with pytest.raises(InputError):
        pre.check(bad)


def test_unknown_objects_are_input_errors(pre):
    with pytest.raises(InputError) as ei:
        pre.verdict(object())
    assert ei.value.field == "batch"


# ------------------------------------------------------------------ the documented snippets, run
def snippets() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = dict(re.findall(r"<!-- guard:([\w-]+) -->\s*```python\n(.*?)```", text, flags=re.S))
    assert {"sglang-init", "sglang-step", "sglang-prevent", "vllm-init", "vllm-hook", "vllm-prevent"} <= set(found)
    return found


class Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _logger():
    log = logging.getLogger("engine-under-test")
    cap = Capture()
    log.addHandler(cap)
    return log, cap


def test_documented_sglang_snippet_refuses_the_seed_batch_with_the_split():
    code = snippets()
    server_args = SimpleNamespace(**SEED_ARGS, attention_backend="dsv4")   # an engine settings object
    scheduler = SimpleNamespace(max_running_requests=64, chunked_prefill_size=16384, max_prefill_tokens=16384)
    log, cap = _logger()
    scope = {"self": scheduler, "server_args": server_args, "logger": log}
    exec(code["sglang-init"], scope)                                       # Scheduler.__init__
    # The documented configuration for the seed crash: the build before sparse-prefill routing, H200.
    assert scheduler.batch_guard.max_rows == LIMIT and scheduler.batch_guard.threshold is None

    scope["batch"] = seed_batch()                                          # get_next_batch_to_run()
    with pytest.raises(BatchIllegalError) as ei:
        exec(code["sglang-step"], scope)
    err = ei.value
    assert {"FMLA001", "SGL001"} <= {f.code for f in err.findings}
    assert err.safe_split.steps == [["p1", "p2"], ["p3"]]
    assert cap.messages and "FMLA001" in cap.messages[-1] and "step 1: p1, p2" in cap.messages[-1]

    scope["batch"] = schedule_batch(ForwardMode.EXTEND, ["p1"], extend=[4096], slots=[1])
    exec(code["sglang-step"], scope)                                       # legal: run_batch goes ahead
    scope["batch"] = None
    exec(code["sglang-step"], scope)

    exec(code["sglang-prevent"], scope)                                    # mixed chunking off: the full limit
    assert scheduler.chunked_prefill_size == LIMIT and scheduler.max_prefill_tokens == LIMIT
    # each prefill the scheduler can now form is legal
    assert scheduler.batch_guard.verdict("extend", extend_lens=[4096, 4096, LIMIT - 8192]) is LEGAL


def test_documented_sglang_prevention_with_mixed_chunking():
    code = snippets()
    server_args = SimpleNamespace(**{**SEED_ARGS, "enable_mixed_chunk": True})
    scheduler = SimpleNamespace(max_running_requests=64, chunked_prefill_size=-1, max_prefill_tokens=16384)
    scope = {"self": scheduler, "server_args": server_args, "logger": logging.getLogger("x")}
    exec(code["sglang-init"], scope)
    exec(code["sglang-prevent"], scope)
    assert scheduler.chunked_prefill_size == LIMIT - 64 and scheduler.max_prefill_tokens == LIMIT - 64


def test_documented_vllm_hook_refuses_an_oversized_step():
    # duck-typed scheduler and outputs (the release's own classes: tests/test_vllm_033.py)
    code = snippets()
    log, cap = _logger()
    steps = [scheduler_output({f"r{i}": 1 for i in range(n)}, {f"r{i}": 9 for i in range(n)}) for n in (8, 2906)]
    scheduler = SimpleNamespace(schedule=lambda throttle: steps.pop(0))
    scope = {"logger": log, "engine_core": SimpleNamespace(scheduler=scheduler), "max_num_seqs": 8192}
    exec(code["vllm-init"], scope)
    exec(code["vllm-hook"], scope)
    assert scope["engine_core"].scheduler.schedule(False).total_num_scheduled_tokens == 8
    # 2906 decode requests with 3 speculative tokens configured: a plain decode step of 2906 rows is legal
    assert scope["engine_core"].scheduler.schedule(False).total_num_scheduled_tokens == 2906
    exec(code["vllm-prevent"], scope)
    assert scope["max_num_seqs"] == VLLM_SPARSE_LIMIT // 4 and not cap.messages


def test_headroom_of_an_engine_object():
    c = Checker(engine="sglang-dsv4@post-25418", build="flashmla-9241ae3")
    h = c.headroom(schedule_batch(ForwardMode.EXTEND, ["p1", "p2"], extend=[4096, 4096]))
    assert h.rows == 8192 and h.more_rows == LIMIT - 8192 and h.rows_to_route == 11673 + 1 - 8192
    d = c.headroom(schedule_batch(ForwardMode.DECODE, ["a", "b", "c"], seq=[5, 6, 7]))
    assert d.forward_mode == "decode" and d.more_requests == LIMIT - 3


@pytest.mark.parametrize("layout", ["own", "kv", "mixed", "one missing", "one"])
def test_sglang_slots_read_from_either_place_a_release_keeps_them(layout):
    """SGLang 0.5.23's ``Req`` keeps its slot as ``req.kv.req_pool_idx``, earlier releases as
    ``req.req_pool_idx`` (stand-ins with those attribute names): a step mixing both is read request by
    request, and a request with neither sends the reading to the batch's own slot tensor."""
    from validate_batch.inputs.adapters import _slots

    want = [3, 7, 96, 5]
    if layout == "own":
        reqs = [SimpleNamespace(rid=str(i), req_pool_idx=s) for i, s in enumerate(want)]
    elif layout == "kv":
        reqs = [SimpleNamespace(rid=str(i), kv=SimpleNamespace(req_pool_idx=s)) for i, s in enumerate(want)]
    elif layout == "mixed":         # the first request decides nothing: each one is read where it keeps it
        reqs = [SimpleNamespace(rid="0", req_pool_idx=3), SimpleNamespace(rid="1", kv=SimpleNamespace(req_pool_idx=7)),
                SimpleNamespace(rid="2", req_pool_idx=None, kv=SimpleNamespace(req_pool_idx=96)),
                SimpleNamespace(rid="3", req_pool_idx=5)]
    elif layout == "one":
        want = [41]
        reqs = [SimpleNamespace(rid="0", kv=SimpleNamespace(req_pool_idx=41))]
    else:                           # one request names no slot: the tensor is read, all of it
        reqs = [SimpleNamespace(rid=str(i), req_pool_idx=s) for i, s in enumerate(want)]
        reqs[2] = SimpleNamespace(rid="2")
        want = [30, 31, 32, 33]
    batch = SimpleNamespace(reqs=reqs, req_pool_indices=FakeTensor([30, 31, 32, 33]))
    assert _slots(batch) == want
    c = Checker(engine="sglang-slots@pre-fix", server_args={
        "max_running_requests": 32, "disaggregation_mode": "decode", "disaggregation_decode_extra_slots": 64,
        "speculative_algorithm": "NEXTN", "speculative_num_draft_tokens": 4})
    b = SimpleNamespace(forward_mode=ForwardMode.DRAFT_EXTEND, reqs=reqs, spec_algorithm=Spec("NEXTN"), decoding_reqs=None,
                        seq_lens=FakeTensor([100] * len(reqs)), seq_lens_cpu=FakeTensor([100] * len(reqs)),
                        req_pool_indices=FakeTensor([30, 31, 32, 33]))
    # the draft step's per-request buffers hold 32 + 1 rows: slot 33, 41 or 96 is past them
    assert bool(c.verdict(b)) == (max(want) <= 32) == c.check(b).legal


class CountingReq:
    """A stand-in SGLang ``Req`` (the attribute names of releases before 0.5.23) that counts reads
    of its ``rid``."""

    reads = 0

    def __init__(self, rid, slot):
        self._rid, self.req_pool_idx = rid, slot

    @property
    def rid(self):
        CountingReq.reads += 1
        return self._rid


def test_sglang_request_ids_are_read_when_the_report_names_a_request():
    """A checked step's request ids come from the requests only when the report needs them: a legal
    step's check never reads them, an illegal one's reads each once, and two requests with one id are
    an input error naming the id (stand-in ``Req`` objects: SGLang's attribute names)."""
    c = Checker(engine="sglang-slots@pre-fix", server_args={
        "max_running_requests": 32, "disaggregation_mode": "decode", "disaggregation_decode_extra_slots": 64,
        "speculative_algorithm": "NEXTN", "speculative_num_draft_tokens": 4})

    def step(rids, slots):
        return SimpleNamespace(forward_mode=ForwardMode.DRAFT_EXTEND, reqs=[CountingReq(r, s) for r, s in zip(rids, slots)],
                               spec_algorithm=Spec("NEXTN"), decoding_reqs=None, seq_lens_cpu=[100] * len(rids))

    CountingReq.reads = 0
    legal = c.check(step(["a", "b", "c"], [1, 2, 32]))      # 32 + 1 rows per request buffer: slot 32 fits
    assert legal.legal and CountingReq.reads == 0
    legal.to_dict()
    assert CountingReq.reads == 0
    assert c.check(step(["a", "a"], [1, 2])).legal           # a legal step's ids are not read, so not checked
    CountingReq.reads = 0
    bad = c.check(step(["a", "b", "c"], [1, 96, 2]))
    assert not bad.legal and CountingReq.reads == 3
    assert [f.message.split(" holds")[0] for f in bad.errors if f.code == "SLOT002"] == ["request b"]
    assert CountingReq.reads == 3                            # read once, kept
    with pytest.raises(InputError) as e:
        c.check(step(["a", "b", "a"], [1, 96, 2]))
    assert e.value.field == "rids" and "'a'" in str(e.value)
    # an illegal step whose findings name no request (too many rows) still reads them: its split does
    pre = Checker(engine=PRE, gpu="H200", server_args=SEED_ARGS)
    seed = schedule_batch(ForwardMode.EXTEND, ["p1", "p2", "p1"], extend=[4096] * 3, seq=[4096] * 3, slots=[1, 2, 3])
    with pytest.raises(InputError) as e:
        pre.check(seed)
    assert e.value.field == "rids" and "'p1'" in str(e.value)
    seed.reqs[2].rid = "p3"
    assert pre.check(seed).safe_split.steps == [["p1", "p2"], ["p3"]]
    no_id = step(["a", "b"], [1, 96])
    del no_id.reqs[1]._rid
    with pytest.raises(InputError) as e:
        c.check(no_id)
    assert e.value.field == "reqs[1].rid"
    # the verdict's illegal answer carries the same report
    v = c.verdict(step(["x", "y"], [96, 3]))
    assert not v and [f.message.split(" holds")[0] for f in v.findings if f.code == "SLOT002"] == ["request x"]
