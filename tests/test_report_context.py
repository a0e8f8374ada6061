"""A batch report's context is built when first read, and reads the same as one built at once."""
from __future__ import annotations

import json

import validate_batch
from validate_batch.legality.report import Finding, Report


def test_deferred_context_is_built_once_on_first_read():
    calls = []

    def build():
        calls.append(1)
        return {"kind": "batch", "query_rows": 3}

    r = Report([Finding("X001", "warning", "m")])
    r.defer_context(build)
    assert calls == []
    assert r.legal and r.codes == ["X001"]            # answering "legal?" does not build it
    assert calls == []
    assert r.context == {"kind": "batch", "query_rows": 3}
    assert r.context["query_rows"] == 3
    assert calls == [1]
    d = r.to_dict()
    assert d.pop("provenance")["status"] == "none"          # no plan: no fact behind it
    assert d == {"legal": True, "findings": [{"code": "X001", "severity": "warning", "message": "m"}],
                           "kind": "batch", "query_rows": 3}
    r.context = {"kind": "other"}
    assert r.context == {"kind": "other"} and calls == [1]


def test_report_defaults_and_equality():
    a, b = Report([]), Report([])
    assert a.plans == [] and a.context == {} and a.safe_split is None and a.batch_plan is None
    assert a == b and a.plans is not b.plans
    b.context = {"kind": "batch"}
    assert a != b


def test_checker_report_context_matches_its_batch_plan():
    chk = validate_batch.Checker(engine="sglang-dsv4@pre-25418", gpu="H200",
                            server_args={"chunked_prefill_size": 8192, "max_running_requests": 64})
    seq = [100 + 37 * i for i in range(40)]
    rep = chk.check("decode", seq_lens=seq, req_pool_indices=list(range(1, 41)))
    bp = rep.batch_plan
    expected = {"kind": "batch", "batch": {"label": "", "gpu": bp.batch.gpu.to_dict(), "requests": 40, "running": 0},
                "kernel_build": "flashmla-9241ae3", **bp.to_dict()}   # the build spring-2026 DSv4 builds ran
    ctx = dict(rep.context)
    (judged,) = ctx.pop("judged_as")
    assert ctx == expected
    # pre-25418 is an alias of the pre-routing entry, whose newest release is 0.5.12.post1
    assert {k: judged[k] for k in ("profile", "version", "release", "asked", "warning", "kernel_build")} == {
        "profile": "sglang-dsv4", "version": "pre-routing", "release": "0.5.12.post1", "asked": "pre-25418",
        "warning": False, "kernel_build": "flashmla-9241ae3"}
    assert "pre-25418" in judged["basis"] and "0.5.12.post1" in judged["basis"]
    assert rep.context["query_rows"] == 40 and rep.context["forward_mode"] == "decode"
    doc = json.loads(json.dumps(rep.to_dict()))
    assert doc["legal"] is True and doc["query_rows"] == 40 and len(doc["kernel_calls"]) == 3


def test_report_deferred_is_the_constructor_with_a_deferred_context():
    # Report.deferred (an evaluation's one-step build) against the constructor and defer_context it stands for
    def build():
        return {"kind": "batch"}

    f = [Finding("X001", "warning", "m")]
    plans, bp = [object()], object()
    want = Report(f, plans, batch_plan=bp)
    want.defer_context(build)
    got = Report.deferred(f, plans, bp, build)
    assert got.__dict__ == want.__dict__
    assert got.context == {"kind": "batch"} and got.plans is plans and got.batch_plan is bp
    # a second one (the constructor's defaults are taken once): still the constructor's
    empty = Report([])
    empty.defer_context(build)
    assert Report.deferred([], [], None, build).__dict__ == empty.__dict__
