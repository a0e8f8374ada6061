"""The whole path for one engine batch: plan, rules, and the safe split when it is illegal.

``input -> Batch -> engine profiles -> kernel plans -> rules -> Report (+ safe split)``; the
split reads the configuration's bounds (:mod:`validate_batch.legality.bounds`) and re-checks each step here.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..errors import InputError
from ..inputs.batch import Batch, RequestColumns, batch_from_dict
from .bounds import StepBounds, derive_bounds
from ..engines.chunking import chunk_budget, engine_steps
from .evaluate import EngineSetup, engine_setup, evaluate
from ..facts.knowledge import resolve_gpu
from .report import BatchContext, Report
from .ruleset import revision
from .split import safe_split


def check_engine_batch(batch: Batch, build: str | None = None, split: bool = True, memo=None,
                       setup: EngineSetup | None = None, bounds: StepBounds | None = None) -> Report:
    """Every rule over one forward; with ``split``, the minimal safe split of an illegal one.
    ``setup`` / ``bounds``: the configuration's, when the caller keeps them (a Checker)."""
    if setup is None:
        setup = engine_setup(batch, build)
    report = evaluate(batch, build, memo, setup)
    # a step on a path not modelled gets no split: nothing says which of its pieces would be legal
    if split and not report.legal and not report.not_modelled:
        def legal(reqs) -> bool:
            return evaluate(batch.with_requests(reqs), build, None, setup).legal

        def split_now():
            b = bounds
            if b is None or b.rules_revision != revision():
                b = derive_bounds(batch, setup, build)
            return safe_split(batch, report, legal, b)

        # built on first read: a guard that only asks "legal?" does not pay for the split
        report.defer_split(split_now)
    return report


def check_batch(obj: Any, gpu: Any = None, build: str | None = None, split: bool = True,
                chunk: bool | None = None) -> Report:
    """Check an engine batch (a :class:`Batch` or a batch document) and return a Report.

    A forward the engine would chunk (more new tokens than its ``chunked_prefill_size``) is checked
    as the steps the engine runs (:func:`validate_batch.engines.chunking.engine_steps`): the report is the first
    illegal step's (else the one with the most query rows), and its ``engine_steps`` context lists
    every step with its verdict and, under ``as_written``, the verdict of the forward as one step.
    ``chunk=False`` (or ``as_written: true`` in the document): the forward is a step as the engine
    dispatches it (a logged step, a step a guard sees), checked as it is; its report then notes that
    the engine would chunk it. The default (None) is the document's ``as_written``, else chunking."""
    if chunk is None:
        chunk = not (isinstance(obj, Mapping) and obj.get("as_written") is True)
    b = obj if isinstance(obj, Batch) else batch_from_dict(obj, gpu)
    if gpu is not None and isinstance(obj, Batch):
        b = replace(b, gpu=resolve_gpu(gpu))
    steps = engine_steps(b)
    if steps is None:
        return check_engine_batch(b, build=build, split=split)
    if not chunk:
        return note_as_written(check_engine_batch(b, build=build, split=split), b, steps)
    return check_engine_steps(b, steps, build, split)


def note_as_written(report: Report, b: Batch, steps: list | None = None) -> Report:
    """A report of a step judged as written although the engine would chunk it: its notes say so,
    and how to have it judged as the engine's steps. The note is added when the report's context is
    first read (a guard that only asks "legal?" does not pay for it); ``steps``: the engine's steps
    when the caller has them."""
    def with_note(ctx):
        if not isinstance(ctx, BatchContext):
            return ctx
        try:
            n = str(len(steps if steps is not None else engine_steps(b) or ()))
        except InputError:        # a budget no prefill token fits: the engine forms no step at all
            n = "no"
        size, _, spec = chunk_budget(b)
        tokens = sum(r.extend_tokens for r in b.requests if not r.is_decode)
        note = (f"judged as one step, as written: {tokens} new tokens are more than {spec['setting']} {size}, so "
                f"the engine cuts such a forward into {n} steps; as a batch document without "
                f"as_written: true (or without --as-written) it is judged as those steps")
        return replace(ctx, notes=tuple(ctx.notes) + (note,))

    pending = report._context_fn
    if pending is not None:
        report.defer_context(lambda: with_note(pending()))
    else:
        report.context = with_note(report.checked)
    return report


def chunk_would_apply(b: Batch) -> bool:
    """Whether the engine's chunked prefill would cut this forward (more new tokens than a step's
    budget), without building its steps."""
    got = chunk_budget(b)
    if got is None:
        return False
    size, _, spec = got
    reqs = b.requests
    if isinstance(reqs, RequestColumns):          # a guard's step: read the columns, build no requests
        tokens, decodes = reqs.total_extend(), len(reqs) - reqs.decode_from
    else:
        tokens = sum(r.extend_tokens for r in reqs if not r.is_decode)
        decodes = sum(1 for r in reqs if r.is_decode)
    charged = decodes + (len(b.running) if b.mixed else 0) if spec.get("mixed_decodes_charged") else 0
    return tokens > size - charged


def check_engine_steps(b: Batch, steps: list, build: str | None = None, split: bool = True) -> Report:
    """Each of the engine's steps for ``b`` (:func:`validate_batch.engines.chunking.engine_steps`) checked; the
    report is the first illegal step's (else the one with the most query rows), with every step's
    verdict in its ``engine_steps`` context, and the forward's own verdict as one step (``as_written``)."""
    setup = engine_setup(b, build)
    reports = [check_engine_batch(st.batch, build=build, split=split, setup=setup) for st in steps]
    rows = [r.context.get("query_rows") for r in reports]
    shown = next((i for i, r in enumerate(reports) if r.errors), None)       # an illegal step first,
    if shown is None:
        shown = next((i for i, r in enumerate(reports) if not r.legal), None)  # else one not modelled
    if shown is None:
        shown = max(range(len(reports)), key=lambda i: rows[i] or 0)
    whole = check_engine_batch(b, build=build, split=False, setup=setup)
    size, page, spec = chunk_budget(b)
    return reports[shown].with_engine_steps({
        "setting": spec["setting"], "chunk_size": size, "page_size": page, "shown_step": shown + 1,
        "requested_extend_tokens": sum(r.extend_tokens for r in b.requests if not r.is_decode),
        "source": spec["source"],
        "steps": [{"step": i + 1, "pieces": list(st.pieces), "query_rows": rows[i], "legal": r.legal,
                   "codes": r.codes, **({"verdict": r.verdict} if r.not_modelled else {})}
                  for i, (st, r) in enumerate(zip(steps, reports))],
        "as_written": {"legal": whole.legal, "codes": sorted({f.code for f in whole.errors}),
                       "query_rows": whole.context.get("query_rows"),
                       **({"verdict": whole.verdict} if whole.not_modelled else {})}})


def check_batch_document(doc: Any, gpu: Any = None, build: str | None = None) -> tuple[Report, dict]:
    report = check_batch(doc, gpu=gpu, build=build)
    return report, {"kind": "batch", **report.context}
