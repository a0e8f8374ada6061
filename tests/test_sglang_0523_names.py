"""SGLang 0.5.23's names, read from the engine's own classes where they can be built on a CPU.

The ScheduleBatch and Req below are stand-ins (building the real ones needs a GPU model runner):
they carry exactly the 0.5.23 attribute names (``Req.kv.req_pool_idx``, ``Req.extend_len``,
``ScheduleBatch.req_pool_indices_cpu``). ServerArgs is a real ``msgspec.Struct`` when msgspec is
installed (0.5.23's ServerArgs is one: ``vars()`` of it is empty).
"""
from __future__ import annotations

import enum

import pytest

import validate_batch
from validate_batch.inputs.adapters import sglang_forward_mode, step_lists

LIMIT = (232448 - 4) // 20        # 11622 on an H200 (upstream 9241ae3)


class ForwardMode(enum.IntEnum):       # the members of SGLang 0.5.23's ForwardMode, by name
    EXTEND = enum.auto()
    DECODE = enum.auto()
    MIXED = enum.auto()
    IDLE = enum.auto()
    TARGET_VERIFY = enum.auto()
    DRAFT_EXTEND_V2 = enum.auto()
    PREBUILT = enum.auto()
    SPLIT_PREFILL = enum.auto()
    DLLM_EXTEND = enum.auto()


class Kv:
    def __init__(self, slot):
        self.req_pool_idx = slot


class Req:
    def __init__(self, rid, extend, slot):
        self.rid, self.extend_len, self.kv = rid, extend, Kv(slot)


class Batch:
    def __init__(self, mode, reqs, cpu_slots=None):
        self.forward_mode, self.reqs = mode, reqs
        self.prefix_lens = [0] * len(reqs)
        self.seq_lens_cpu = [r.extend_len for r in reqs]
        self.req_pool_indices_cpu = cpu_slots
        self.spec_algorithm = None


@pytest.mark.parametrize("mode,want", [(ForwardMode.PREBUILT, None), (ForwardMode.DLLM_EXTEND, "extend"),
                                       (ForwardMode.DRAFT_EXTEND_V2, "draft_extend"), (ForwardMode.IDLE, None)])
def test_every_0523_forward_mode_has_a_meaning(mode, want):
    assert sglang_forward_mode(Batch(mode, [Req("a", 3, 1)])) == want


def test_a_prebuilt_batch_of_a_pd_decode_worker_is_not_an_error():
    guard = validate_batch.Checker(engine="sglang-dsv4@pre-25418")
    assert guard.verdict(Batch(ForwardMode.PREBUILT, [Req("a", 5, 1)] * 20000))   # no forward runs


def test_req_kv_slot_and_extend_len():
    guard = validate_batch.Checker(engine=["sglang-dsv4@pre-25418", "sglang-slots@post-fix"],
                              server_args={"max_running_requests": 32})
    batch = Batch(ForwardMode.EXTEND, [Req("a", LIMIT - 1, 1), Req("b", 1, 2)])
    lists = step_lists(batch, guard)
    assert lists["extend_lens"] == [LIMIT - 1, 1] and lists["req_pool_indices"] == [1, 2]
    assert guard.verdict(batch)
    assert not guard.verdict(Batch(ForwardMode.EXTEND, [Req("a", LIMIT, 1), Req("b", 1, 2)]))
    # a slot past the 33-row table (R + 1 = 32 + 1), read from the request's kv record
    assert not guard.verdict(Batch(ForwardMode.EXTEND, [Req("a", 5, 1), Req("b", 1, 40)]))


def test_the_host_copy_of_the_slots_is_read():
    guard = validate_batch.Checker(engine=["sglang-dsv4@pre-25418", "sglang-slots@post-fix"],
                              server_args={"max_running_requests": 32})
    reqs = [Req("a", 5, None), Req("b", 1, None)]
    assert step_lists(Batch(ForwardMode.EXTEND, reqs, cpu_slots=[3, 40]), guard)["req_pool_indices"] == [3, 40]


def test_a_msgspec_server_args_is_read():
    msgspec = pytest.importorskip("msgspec")

    class ServerArgs(msgspec.Struct):
        speculative_num_draft_tokens: int = 4
        enable_mixed_chunk: bool = True
        max_running_requests: int = 3000

    sa = ServerArgs()
    assert getattr(sa, "__dict__", {}) == {}       # no instance dict to read: what made the flags vanish before
    guard = validate_batch.Checker(engine="sglang-dsv4@pre-25418", server_args=sa)
    assert guard.draft_tokens == 4 and guard.mixed_chunk
    # 3000 requests x 4 draft tokens = 12000 verify rows > 11622
    assert not guard.verdict("target_verify", seq_lens=[100] * 3000)


def test_a_struct_like_object_with_struct_fields_is_read():
    class StructLike:                  # what msgspec exposes: the field names on the type, no __dict__
        __slots__ = ("speculative_num_draft_tokens",)
        __struct_fields__ = ("speculative_num_draft_tokens",)

        def __init__(self):
            self.speculative_num_draft_tokens = 4

    guard = validate_batch.Checker(engine="sglang-dsv4@pre-25418", server_args=StructLike())
    assert guard.draft_tokens == 4
    assert not guard.verdict("target_verify", seq_lens=[100] * 3000)


class NextBatchPlan:                # 0.5.23's get_next_batch_to_run() result (a msgspec Struct there)
    def __init__(self, batch_to_run, running_batch):
        self.batch_to_run, self.running_batch = batch_to_run, running_batch


def test_a_next_batch_plan_is_checked_by_the_batch_it_runs():
    guard = validate_batch.Checker(engine="sglang-dsv4@pre-25418")
    running = Batch(ForwardMode.DECODE, [Req("d", 1, 1)])
    ok = NextBatchPlan(Batch(ForwardMode.EXTEND, [Req("a", LIMIT, 1)]), running)
    bad = NextBatchPlan(Batch(ForwardMode.EXTEND, [Req("a", LIMIT + 1, 1)]), running)
    assert guard.verdict(ok) and not guard.verdict(bad)
    assert not guard.check(bad).legal and guard.check(ok).legal
    assert guard.verdict(NextBatchPlan(None, running))          # nothing to run this step
