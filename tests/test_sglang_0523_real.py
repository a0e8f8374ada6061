"""The guard against SGLang 0.5.23's own classes, built from the real wheel on a CPU.

Real: ``ServerArgs`` (a msgspec Struct; resolved through its own pipeline with the ``dummy`` model),
``ForwardMode``, ``SpeculativeAlgorithm``, ``Req`` with its ``ReqKvInfo`` (``req.kv``), ``ScheduleBatch``,
``NextBatchPlan`` and ``BeamTail``. The scheduler and its model runner need a GPU, so the batches'
row columns are set here the way ``prepare_for_extend`` / ``prepare_for_decode`` leave them (a stand-in
for those two methods), and the README snippets run with a plain object standing in for the
``Scheduler`` (its loops are read from the wheel's source to check where the hook goes).

Skipped when the wheel (``pip install --no-deps sglang==0.5.23`` plus what its modules import; see
.ci/run) is not installed. Ground truth: arithmetic here (FlashMLA 9241ae3: 4*(5b+1) <= 232448 on an
H200, so b <= 11622).
"""
from __future__ import annotations

import inspect
import logging
import pickle
import re
import warnings
from array import array
from pathlib import Path
from types import SimpleNamespace

import pytest

import validate_batch
from validate_batch.errors import BatchIllegalError, InputError
from validate_batch.ingest.crash_dump import read_crash_dump


def _torchvision_stand_in() -> None:
    """A stand-in ``torchvision`` when none is installed: SGLang's config package imports a multimodal
    preprocessing module (``sglang/srt/multimodal/internvl_utils.py``) that imports ``torchvision.transforms``
    at module level, and the CPU build of torch here has no matching torchvision wheel. Nothing these
    tests build touches it; every SGLang class below is the real one."""
    import importlib.machinery
    import importlib.util
    import sys
    import types
    if importlib.util.find_spec("torchvision") is not None:
        return
    try:        # transformers decides once whether torchvision is there: before the stand-in exists
        from transformers.utils import is_torchvision_available
        is_torchvision_available()
    except ImportError:
        pass
    tv = types.ModuleType("torchvision")
    tv.__path__ = []
    transforms = types.ModuleType("torchvision.transforms")
    transforms.__path__ = []
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.InterpolationMode = types.SimpleNamespace(BICUBIC="bicubic", BILINEAR="bilinear", NEAREST="nearest")
    transforms.functional = functional
    transforms.InterpolationMode = functional.InterpolationMode
    tv.transforms = transforms
    for m in (tv, transforms, functional):
        m.__spec__ = importlib.machinery.ModuleSpec(m.__name__, None, is_package=hasattr(m, "__path__"))
    sys.modules.update({"torchvision": tv, "torchvision.transforms": transforms,
                        "torchvision.transforms.functional": functional})


try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _torchvision_stand_in()
        import msgspec
        import torch
        from sglang.srt.beam_search.batch_tail import BeamTail, BeamTailEntry
        from sglang.srt.disaggregation import decode as pd_decode
        from sglang.srt.managers import scheduler as sgl_scheduler
        from sglang.srt.managers.schedule_batch import NextBatchPlan, Req, ReqKvInfo, ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.version import __version__ as SGLANG_VERSION
except Exception as e:  # noqa: BLE001 - any import failure means the real classes are not available
    pytest.skip(f"the SGLang 0.5.23 wheel is not importable here ({type(e).__name__}: {e}); "
                "install it with pip install --no-deps sglang==0.5.23 and its imports (see .ci/run)",
                allow_module_level=True)

if SGLANG_VERSION != "0.5.23":
    pytest.skip(f"these tests read SGLang 0.5.23's classes, found {SGLANG_VERSION}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
LIMIT = (232448 - 4) // 20                 # 11622
OLD = "sglang-dsv4@pre-25418"             # a release on upstream 9241ae3 (no routing, row limit 11622)


def server_args(**kw) -> ServerArgs:
    sa = ServerArgs(model_path="dummy", **kw)
    sa.resolve_once()
    return sa


def make_req(rid: str, slot: int, extend: int = 0, prefix: int = 0) -> Req:
    r = Req(rid, "", array("i", [1] * max(prefix + extend, 1)), SamplingParams())
    r.kv.req_pool_idx = slot
    r.prefix_len, r.extend_end = prefix, prefix + extend       # Req.extend_len is extend_end - prefix_len
    return r


def decode_batch(n: int, spec=None, seq: int = 100) -> ScheduleBatch:
    b = ScheduleBatch(reqs=[make_req(f"r{i}", i + 1) for i in range(n)])
    b.forward_mode = ForwardMode.DECODE
    b.spec_algorithm = spec if spec is not None else SpeculativeAlgorithm.NONE
    b.seq_lens_cpu = torch.full((n,), seq, dtype=torch.int64)          # what prepare_for_decode leaves
    b.req_pool_indices_cpu = torch.arange(1, n + 1, dtype=torch.int64)
    return b


def extend_batch(extend: list[int]) -> ScheduleBatch:
    reqs = [make_req(f"p{i}", i + 1, e) for i, e in enumerate(extend)]
    b = ScheduleBatch(reqs=reqs)
    b.forward_mode = ForwardMode.EXTEND
    b.spec_algorithm = SpeculativeAlgorithm.NONE
    b.extend_lens = [r.extend_len for r in reqs]                       # what prepare_for_extend leaves
    b.prefix_lens = [r.prefix_len for r in reqs]
    b.extend_num_tokens = sum(extend)
    b.seq_lens_cpu = torch.tensor(extend, dtype=torch.int64)
    b.req_pool_indices_cpu = torch.arange(1, len(reqs) + 1, dtype=torch.int64)
    return b


# ------------------------------------------------------------------------------ ServerArgs
def test_the_real_server_args_is_a_struct_without_vars():
    sa = server_args()
    assert isinstance(sa, msgspec.Struct) and vars(sa) == {k: v for k, v in vars(sa).items() if k.startswith("_")}


@pytest.mark.parametrize("requests,legal", [(LIMIT // 4 - 1, True), (LIMIT // 4, True), (LIMIT // 4 + 1, False),
                                            (3000, False)])
def test_eagle_verify_with_the_real_server_args(requests, legal):
    # 4 draft tokens: a verify forward of requests x 4 rows; 2905 x 4 = 11620 <= 11622 < 2906 x 4
    sa = server_args(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4)
    guard = validate_batch.Checker(engine=OLD, server_args=sa)
    as_dict = validate_batch.Checker(engine=OLD, server_args={"speculative_algorithm": "EAGLE",
                                                         "speculative_num_draft_tokens": 4})
    batch = decode_batch(requests, spec=SpeculativeAlgorithm.EAGLE)
    assert bool(guard.verdict(batch)) is legal
    assert bool(as_dict.verdict(batch)) is legal
    assert guard.check(batch).legal is legal
    if not legal:
        assert guard.check(batch).to_dict()["query_rows"] == requests * 4


def test_flags_of_the_real_server_args_are_read():
    sa = server_args(enable_mixed_chunk=True, max_running_requests=64, attn_dp_size=8, tp_size=8)
    guard = validate_batch.Checker(engine=[OLD, "sglang-slots@0.5.23"], server_args=sa)
    assert guard.mixed_chunk is True
    assert guard.table_rows == 64 // 8 + 1                   # R per attention-DP worker + 1
    # the deprecated spelling resolves to the same width
    old = validate_batch.Checker(engine="sglang-slots@0.5.23",
                            server_args=server_args(dp_size=8, enable_dp_attention=True, tp_size=8,
                                                    max_running_requests=64))
    assert old.table_rows == 64 // 8 + 1


def test_an_unresolved_server_args_is_read_by_its_fields():
    sa = ServerArgs(model_path="dummy", speculative_algorithm="EAGLE", speculative_num_draft_tokens=4)
    guard = validate_batch.Checker(engine=OLD, server_args=sa)
    assert guard.draft_tokens == 4


def test_a_struct_with_no_readable_flag_is_an_error():
    class Other(msgspec.Struct):
        colour: str = "red"

    with pytest.raises(InputError) as e:
        validate_batch.Checker(engine=OLD, server_args=Other())
    assert e.value.field == "server_args"


# ------------------------------------------------------------------------------ forward modes and names
def test_a_prebuilt_batch_is_legal():
    guard = validate_batch.Checker(engine=[OLD, "sglang-slots@0.5.23"], server_args=server_args(max_running_requests=8))
    b = decode_batch(20000)            # far past every limit, but a PREBUILT batch runs no forward
    b.forward_mode = ForwardMode.PREBUILT
    assert guard.verdict(b) and guard.check(b).legal


def test_dllm_extend_is_an_extend():
    guard = validate_batch.Checker(engine=OLD)
    b = extend_batch([LIMIT + 1])
    b.forward_mode = ForwardMode.DLLM_EXTEND
    assert not guard.verdict(b)
    b = extend_batch([LIMIT])
    b.forward_mode = ForwardMode.DLLM_EXTEND
    assert guard.verdict(b)


def test_req_kv_info_is_the_slot():
    assert isinstance(make_req("a", 5).kv, ReqKvInfo) and "req_pool_idx" not in dir(Req)
    guard = validate_batch.Checker(engine="sglang-slots@0.5.23", server_args=server_args(max_running_requests=8))
    b = decode_batch(2)
    b.req_pool_indices_cpu = None                  # only the requests' own slots: Req.kv.req_pool_idx
    b.reqs[1].kv.req_pool_idx = 9                  # the table has 8 + 1 rows
    assert not guard.verdict(b)
    b.reqs[1].kv.req_pool_idx = 8
    assert guard.verdict(b)


def test_extend_num_tokens_must_agree():
    guard = validate_batch.Checker(engine=OLD)
    b = extend_batch([100, 200])
    b.extend_num_tokens = 301
    with pytest.raises(InputError) as e:
        guard.verdict(b)
    assert e.value.field == "extend_num_tokens"


def test_global_num_tokens_pads_a_rank():
    guard = validate_batch.Checker(engine=OLD)
    b = decode_batch(10)
    b.global_num_tokens = [10, LIMIT]
    assert guard.verdict(b)
    b.global_num_tokens = [10, LIMIT + 1]
    assert not guard.verdict(b) and not guard.check(b).legal


def test_beam_members_are_rows_in_verdict_and_check():
    guard = validate_batch.Checker(engine=OLD)
    n, members = 4000, 3                            # 4000 requests + 3 members each = 16000 rows
    b = decode_batch(n)
    b.beam_tail = BeamTail(num_base_rows=n, entries=[BeamTailEntry(None, i, i * members, (i + 1) * members)
                                                     for i in range(n)])
    rows = n * (1 + members)
    b.seq_lens_cpu = torch.full((rows,), 100, dtype=torch.int64)      # what append_beam_tail leaves
    b.req_pool_indices_cpu = torch.arange(1, rows + 1, dtype=torch.int64)
    v = guard.verdict(b)
    r = guard.check(b)
    assert not v and not r.legal and r.to_dict()["query_rows"] == rows
    # 2905 requests with 3 members: 11620 rows, legal both ways
    k = LIMIT // 4
    b = decode_batch(k)
    b.beam_tail = BeamTail(num_base_rows=k, entries=[BeamTailEntry(None, i, i * 3, i * 3 + 3) for i in range(k)])
    b.seq_lens_cpu = torch.full((4 * k,), 100, dtype=torch.int64)
    b.req_pool_indices_cpu = torch.arange(1, 4 * k + 1, dtype=torch.int64)
    assert guard.verdict(b) and guard.check(b).legal


# ------------------------------------------------------------------------------ crash dump
def test_a_crash_dump_pickled_by_0523_gives_its_settings(tmp_path):
    sa = server_args(chunked_prefill_size=8192, attn_dp_size=4, tp_size=4, max_running_requests=64)
    dump = {"server_args": sa, "config_updates": [], "resolved_config": sa.resolved_dict(), "requests": []}
    p = tmp_path / "crash.pkl"
    p.write_bytes(pickle.dumps(dump))               # ServerArgs pickles through its own __reduce__
    d = read_crash_dump(str(p))                     # restricted: nothing from the dump is imported
    assert d.server_args["chunked_prefill_size"] == 8192 and d.server_args["attn_dp_size"] == 4
    dump.pop("resolved_config")
    p.write_bytes(pickle.dumps(dump))
    d = read_crash_dump(str(p))                     # the raw fields of the rebuild call
    assert d.server_args["chunked_prefill_size"] == 8192 and d.server_args["max_running_requests"] == 64
    assert read_crash_dump(str(p), trust=True).server_args["chunked_prefill_size"] == 8192


# ------------------------------------------------------------------------------ README snippets
def snippets() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return dict(re.findall(r"<!-- guard:([\w-]+) -->\s*```python\n(.*?)```", text, flags=re.S))


def _scope(sa, env=None, monkeypatch=None):
    log = logging.getLogger("sglang-0523-under-test")
    scheduler = SimpleNamespace()                   # stand-in: a real Scheduler needs a GPU model runner
    scope = {"self": scheduler, "server_args": sa, "logger": log}
    exec(snippets()["sglang-0523-init"], scope)
    return scope


def _after(src: str, first: str, then: str) -> bool:
    i = src.find(first)
    return i >= 0 and src.find(then, i) > i


def test_the_hook_points_are_where_the_real_loops_run_a_batch():
    for loop in (sgl_scheduler.Scheduler.event_loop_normal, sgl_scheduler.Scheduler.event_loop_overlap):
        src = inspect.getsource(loop)
        assert _after(src, "plan.batch_to_run", "self.run_batch(batch)"), loop.__name__
    for loop in (pd_decode.SchedulerDisaggregationDecodeMixin.event_loop_normal_disagg_decode,
                 pd_decode.SchedulerDisaggregationDecodeMixin.event_loop_overlap_disagg_decode):
        src = inspect.getsource(loop)
        assert _after(src, "prepare_for_forward(", "self.run_batch(batch)"), loop.__name__


def test_event_loop_snippet_with_the_real_plan(monkeypatch):
    monkeypatch.setenv("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", "0")
    scope = _scope(server_args(max_running_requests=64))
    code = snippets()["sglang-0523-loop"]
    guard = scope["self"].batch_guard
    assert guard.threshold == 11673                     # the switch, from the environment, is off
    running = decode_batch(1)
    scope["plan"] = NextBatchPlan(batch_to_run=extend_batch([4096, 4096]), running_batch=running)
    exec(code, scope)                                   # legal: the loop goes on to run_batch
    scope["plan"] = NextBatchPlan(batch_to_run=None, running_batch=running)
    exec(code, scope)                                   # nothing to run
    # sgl-flash-mla 1.0.0 (0.5.23's build) has no decode-kernel row limit: judge it on 9241ae3's
    scope["self"].batch_guard = validate_batch.Checker(engine=["sglang-dsv4@0.5.23", "sglang-slots@0.5.23"],
                                                  build="flashmla-9241ae3", server_args=guard.describe()["server_args"])
    scope["plan"] = NextBatchPlan(batch_to_run=extend_batch([LIMIT + 1]), running_batch=running)
    with pytest.raises(BatchIllegalError) as e:
        exec(code, scope)
    assert "FMLA001" in {f.code for f in e.value.findings}
    scope["plan"] = NextBatchPlan(batch_to_run=extend_batch([LIMIT]), running_batch=running)
    exec(code, scope)


def test_pd_decode_snippet_with_real_batches():
    scope = _scope(server_args(max_running_requests=32, disaggregation_mode="decode"))
    code = snippets()["sglang-0523-pd-decode"]
    guard = scope["self"].batch_guard
    R, E = 32, 64                                        # default extra slots 2 x 32
    assert guard.table_rows == R + E + 1
    b = decode_batch(3)
    b.forward_mode = ForwardMode.PREBUILT
    scope["batch"] = b
    exec(code, scope)                                    # PREBUILT: no forward
    b = decode_batch(2)
    for slot, legal in ((R + E - 1, True), (R + E, True), (R + E + 1, False)):   # live slots 1 .. R + E
        b.reqs[1].kv.req_pool_idx = slot
        b.req_pool_indices_cpu = torch.tensor([1, slot], dtype=torch.int64)
        scope["batch"] = b
        if legal:
            exec(code, scope)
    with pytest.raises(BatchIllegalError) as e:
        exec(code, scope)
    assert "SLOT001" in {f.code for f in e.value.findings}
    scope["batch"] = None
    exec(code, scope)
