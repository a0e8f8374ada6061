"""Forwards as the engine forms them: chunked prefill.

A batch document may describe an extend forward whose new tokens exceed the configured
``chunked_prefill_size``. The engine never runs that forward: its prefill adder gives every step a
budget of ``chunked_prefill_size`` tokens (less one per running decode merged under mixed chunking),
takes requests in order, cuts the one that does not fit at the budget (rounded down to a page
boundary of its position) and continues it first in the next step. :func:`engine_steps` rebuilds
those steps so each is checked as the engine would run it. The profile's ``chunked_prefill`` entry
in ``rules/engines.json`` says which setting holds the budget and cites the engine source.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..inputs.batch import Batch, Request
from ..errors import InputError
from ..facts.knowledge import load


@dataclass(frozen=True)
class EngineStep:
    """One forward the engine runs for a chunked batch: its batch and the pieces it holds
    (``{id, start, tokens}`` per extend piece, ``{id, decode: True}`` per merged decode)."""

    batch: Batch
    pieces: tuple


def chunk_spec(batch: Batch) -> dict | None:
    """The first profile's chunked-prefill data, or None when its engine does not chunk."""
    profiles = load("engines")["profiles"]
    for name, _ in batch.profiles:
        spec = profiles.get(name, {}).get("chunked_prefill")
        if spec is not None:
            return spec
    return None


def chunk_budget(batch: Batch) -> tuple[int, int, dict] | None:
    """``(chunk size, page size, spec)`` when chunked prefill is configured for this batch's engine."""
    if not batch.forward_mode.is_routable():
        return None
    spec = chunk_spec(batch)
    if spec is None:
        return None
    size = batch.arg(spec["setting"])
    if size is None or isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        return None         # unset or disabled (SGLang: a non-positive size turns chunking off)
    page = batch.arg(spec["page_setting"], spec["default_page"])
    if isinstance(page, bool) or not isinstance(page, int) or page <= 0:
        raise InputError(f"server_args.{spec['page_setting']}", f"expected a positive integer, got {page!r}")
    return size, page, spec


def engine_steps(batch: Batch) -> list[EngineStep] | None:
    """The steps the engine runs for this forward, or None when it runs the forward as given
    (no chunked prefill configured, or the new tokens fit one chunk)."""
    got = chunk_budget(batch)
    if got is None:
        return None
    size, page, spec = got
    decodes = [r for r in batch.requests if r.is_decode]
    merged_running = list(batch.running) if batch.mixed else []
    charged = len(decodes) + len(merged_running) if spec.get("mixed_decodes_charged") else 0
    budget = size - charged
    extends = [r for r in batch.requests if not r.is_decode]
    total = sum(r.extend_tokens for r in extends)
    if total <= budget:
        return None
    if budget <= 0:
        raise InputError(f"server_args.{spec['setting']}",
                         f"expected more than the {charged} merged decodes, got {size}: no prefill token fits a step")
    left = [[r, r.extend_tokens, 0] for r in extends if r.extend_tokens > 0]
    steps: list[EngineStep] = []
    while left:
        room = budget
        reqs: list[Request] = []
        pieces: list[dict] = []
        while left and room > 0:
            r, rem, done = left[0]
            take = rem
            if rem > room:
                start = r.prefix_len + done
                end = (start + room // page * page) // page * page
                take = end - start
                if take <= 0:
                    break
            reqs.append(Request(r.id, take, r.prefix_len + done, None, r.req_pool_idx, r.dp_rank, False, r.global_slot))
            pieces.append({"id": r.id, "start": done, "tokens": take})
            room -= take
            if take == rem:
                left.pop(0)
            else:
                left[0][1] -= take
                left[0][2] += take
        if not reqs:
            raise InputError(f"server_args.{spec['setting']}",
                             f"a budget of {room} tokens holds no whole page of {page} tokens: no step can be formed")
        step_no = len(steps)
        for d in decodes:       # merged decodes join every step, one token further along each time
            reqs.append(Request(d.id, 0, d.prefix_len, (d.seq_len or 1) + step_no, d.req_pool_idx, d.dp_rank, True, d.global_slot))
            pieces.append({"id": d.id, "decode": True})
        running = tuple(Request(d.id, 0, d.prefix_len, (d.seq_len or 1) + step_no, d.req_pool_idx, d.dp_rank, True, d.global_slot)
                        for d in batch.running) if step_no else batch.running
        b = batch.for_step(batch.forward_mode, tuple(reqs), None)
        if running is not batch.running:
            b.__dict__["running"] = running
        steps.append(EngineStep(b, tuple(pieces)))
    return steps
