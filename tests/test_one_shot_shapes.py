"""A one-shot check of a sparse decode call reuses its shape's plan and skips the shape-only rules
silent for the shape; it finds exactly what the call's own plan, built from scratch, finds.

``validate_batch.check(record)`` plans a sparse FlashMLA decode call from the plan of its shape
(every field but the rows and the per-row lengths, on one GPU and build: made once,
``validate_batch.engines.shapes.call_plan``) and skips the shape-only rules that find nothing for that
shape. Held here to the reference of no reuse and no skipping, ``run_rules("call", plan(call))`` on
a plan built from scratch, with the same findings (codes, severities, messages, numbers, subjects)
and the same plan (implementation, partitions, shared memory, workspace, and the whole schedule):

* on every sparse decode record the H200 kernels were run on (FlashMLA 9241ae3's cases and probes,
  sgl-flash-mla 1.0.0's, vLLM 0.33's bundled build's), on every build and GPU;
* on variants of them that change one shape field at a time to values on both sides of the limits
  the shape-only rules hold (head counts 32 / 64 / 96 / 128, key sizes 448 / 512 / 576, top-k
  widths off and on the kernel's block, strides at 2^31 - 1 and 2^31, the scheduling op, the legacy
  kernels), each checked right after its base record and before it (each meeting the other's
  shape in the memo), then all in one shuffled sequence through one memo;
* the public ``validate_batch.plan(record)``, which plans the call the same way, on all of the above;
* a bad build name, refused as ``plan()`` refuses it and kept nowhere. (A shape-only rule added
  after a shape was planned runs on it: ``tests/test_rule_extension.py``.) (Facts changed after a shape was planned are seen by the next check:
  ``tests/test_flashmla_data.py`` changes the knowledge file's facts between checks of one shape.)
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import validate_batch
from conftest import oracle_path
from validate_batch.api import check_plan
from validate_batch.engines import shapes
from validate_batch.facts.knowledge import build_names, gpu_names, resolve_gpu
from validate_batch.flashmla.calls import DECODE_KEYS, call_from_record
from validate_batch.flashmla.plan import plan
from validate_batch.legality.registry import run_rules

MEASURED = Path(__file__).resolve().parent.parent / "fixtures" / "measured"
ORACLE = ("flashmla_h200_cases.jsonl", "flashmla_h200_probes.jsonl", "sglfm_h200_legacy_cases.jsonl",
          "sglfm_h200_probes.jsonl")
MEASURED_FILES = ("sglfm_h200_sparse_cases.jsonl", "vllm033_h200_sparse_cases.jsonl", "vllm033_h200_probes.jsonl",
                  "sglfm_h200_hoisted_cases.jsonl", "h200_gap_probes.jsonl")


def _sparse_records() -> list[dict]:
    out = []
    paths = [oracle_path(n) for n in ORACLE] + [MEASURED / n for n in MEASURED_FILES]
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line) if line.strip() else {}
            if rec.get("kind") == "sparse":
                out.append({k: v for k, v in rec.items() if k in DECODE_KEYS})
    assert len(out) > 600
    return out


RECORDS = _sparse_records()


def _findings(findings) -> list:
    return sorted((f.code, f.severity, f.message, f.subject, json.dumps(f.numbers, sort_keys=True, default=str))
                  for f in findings)


def _reference(rec: dict, gpu: str, build):
    """The call's own plan, built from scratch, and every call rule on it (nothing skipped)."""
    p = plan(call_from_record(rec, "calls[0]"), resolve_gpu(gpu), build)
    assert not p.quiet_rules
    return p, _findings(run_rules("call", p))


def _plan_facts(p, with_schedule: bool) -> dict:
    return {"implementation": p.implementation, "parts": p.num_sm_parts, "gen": p.gen["name"],
            "dict": p.to_dict(with_schedule=with_schedule)}


def _assert_same(rec: dict, gpu: str, build, with_schedule: bool = False) -> bool:
    """The one-shot check of ``rec`` against the reference; True when its plan skipped some rule."""
    try:
        ref_plan, ref = _reference(rec, gpu, build)
    except validate_batch.InputError as e:           # (a record this build or GPU refuses: refused alike)
        with pytest.raises(validate_batch.InputError) as got:
            validate_batch.check(rec, gpu=gpu, build=build)
        assert got.value.field == e.field
        with pytest.raises(validate_batch.InputError) as want:
            plan(rec, gpu, build)               # the record planned from scratch
        with pytest.raises(validate_batch.InputError) as got:
            validate_batch.plan(rec, gpu=gpu, build=build)
        assert (got.value.field, str(got.value)) == (want.value.field, str(want.value))
        return False
    report = validate_batch.check(rec, gpu=gpu, build=build)
    assert _findings(report.findings) == ref, (rec, gpu, build)
    assert report.legal == (not any(f[1] == "error" for f in ref))
    (p,) = report.plans
    assert _plan_facts(p, with_schedule) == _plan_facts(ref_plan, with_schedule), (rec, gpu, build)
    # the public plan() plans the call as the one-shot check does: the same plan as from scratch
    pub = validate_batch.plan(rec, gpu=gpu, build=build)
    assert _plan_facts(pub, with_schedule) == _plan_facts(ref_plan, with_schedule), (rec, gpu, build)
    assert _findings(check_plan(pub)) == ref, (rec, gpu, build)
    return bool(p.quiet_rules)


@pytest.mark.parametrize("build", [None, *build_names()])
def test_every_measured_sparse_record_on_every_build_and_gpu(build):
    shapes._CALL_SHAPES.clear()
    skipped = 0
    for gpu in gpu_names():
        for rec in RECORDS:
            skipped += _assert_same(rec, gpu, build)
    assert skipped > 0                # the reuse ran (else this test would hold the reference to itself)


def test_the_schedule_and_metadata_are_the_reference_plans():
    """Small calls, with their whole schedule (the metadata rows, num_splits) compared."""
    shapes._CALL_SHAPES.clear()
    small = [r for r in RECORDS if r["b"] <= 2048]
    assert len(small) > 300
    for build in (None, "sgl-flash-mla-1.0.0", "vllm-0.33"):
        for rec in small:
            _assert_same(rec, "H200", build, with_schedule=True)


def _variants(base: dict) -> list[dict]:
    """``base`` with one shape field changed, to values on both sides of the shape-only rules' limits."""
    out = []
    for h_q in (32, 63, 64, 65, 96, 128, 129):
        out.append({**base, "h_q": h_q})
    for d_qk in (448, 511, 512, 576, 577):
        out.append({**base, "d_qk": d_qk})
    for topk in (63, 64, 65, 100, 127, 128, 129, 2048):
        out.append({**base, "topk": topk, "topk_length": [min(topk, 50)] * base["b"]})
    for extra in (None, 63, 64, 65, 512):
        v = {**base, "extra_topk": extra, "extra_topk_length": None if extra is None else [extra] * base["b"]}
        out.append({k: x for k, x in v.items() if x is not None})
    # q.stride(0) = s_q * h_q * d_qk against 2^31 - 1: 2^31 - 1 fits, 2^31 does not
    for s_q, h_q, d_qk in ((1, 64, 512), (65536, 64, 512), (65535, 64, 512)):
        out.append({**base, "s_q": s_q, "h_q": h_q, "d_qk": d_qk})
    # the page size, and the KV block stride page * bytes_per_token against 2^31 - 1 (2^20 * 2047 fits, * 2048 does not)
    for page in (1, 32, 63, 64, 65, 1 << 20):
        out.append({**base, "page": page})
    for bpt in (583, 584, 585, 2047, 2048):
        out.append({**base, "bytes_per_token": bpt})
        out.append({**base, "page": 1 << 20, "bytes_per_token": bpt})
    out.append({**base, "h_k": 2})
    out.append({**base, "d_v": 256})
    out.append({**base, "is_fp8": False})
    out.append({**base, "causal": True})
    out.append({**base, "use_legacy": True})
    out.append({**base, "use_legacy": False})
    out.append({**base, "entry": "get_mla_decoding_metadata", "topk_length": None})
    for topk in (128, 2048):             # (a build that gates the KV split stops splitting a wide call)
        out.append({**base, "enable_batch_invariant": True, "topk": topk})
        out.append({**base, "enable_batch_invariant": False, "topk": topk})
    for stride in (583, 584, 1168, (1 << 31) - 1, 1 << 31):
        out.append({**base, "kv_stride": stride})
    for align in (1, 8, 15, 16, 17, 32):     # (SM100 wants a 16-byte KV base)
        out.append({**base, "kv_base_align": align})
    return [{k: v for k, v in r.items() if v is not None} for r in out]


@pytest.mark.parametrize("gpu,build", [("H200", None), ("H200", "sgl-flash-mla-1.0.0"), ("H200", "vllm-0.33"),
                                       ("H100-SXM", "flashmla-1408756"), ("B200", None), ("GB200", "flashmla-2026.09.30")])
def test_shape_fields_one_at_a_time_through_one_memo(gpu, build):
    rng = random.Random(20261204)
    bases = [{"kind": "sparse", "b": b, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128,
              "topk_length": [rng.randint(0, 128) for _ in range(b)]} for b in (1, 3, 64)]
    bases.append({**bases[0], "bytes_per_token": 2048})     # (its page 2^20 variant breaks the KV block stride)
    skipped = fired = 0
    for base in bases:
        for v in _variants(base):
            for first, then in ((base, v), (v, base)):     # each one meeting the other's shape in the memo
                shapes._CALL_SHAPES.clear()
                skipped += _assert_same(first, gpu, build, with_schedule=True)
                skipped += _assert_same(then, gpu, build, with_schedule=True)
            try:
                fired += not validate_batch.check(v, gpu=gpu, build=build).legal
            except validate_batch.InputError:
                pass
    cases = [v for base in bases for v in _variants(base)]
    rng.shuffle(cases)
    shapes._CALL_SHAPES.clear()
    for rec in cases * 2:            # (the second pass meets every shape in the memo)
        skipped += _assert_same(rec, gpu, build)
    assert skipped > 0 and fired > 0


@pytest.mark.parametrize("build", ["no-such-build", ["vllm-0.33"], 3])
def test_a_bad_build_name_is_refused_as_plan_refuses_it_and_kept_nowhere(build):
    rec = {"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
    shapes._CALL_SHAPES.clear()
    validate_batch.check(rec)
    kept = dict(shapes._CALL_SHAPES)
    with pytest.raises(validate_batch.InputError) as want:
        plan(call_from_record(rec), resolve_gpu("H200"), build)
    for _ in range(2):
        with pytest.raises(validate_batch.InputError) as got:
            validate_batch.check(rec, build=build)
        assert (got.value.field, str(got.value)) == (want.value.field, str(want.value))
        with pytest.raises(validate_batch.InputError) as got:
            validate_batch.plan(rec, build=build)
        assert (got.value.field, str(got.value)) == (want.value.field, str(want.value))
    assert shapes._CALL_SHAPES == kept
