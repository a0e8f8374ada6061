"""Query rows of a forward step, by forward mode: the one row counter.

SGLang flattens a forward into query rows: extend, one row per new token (plus merged running
decodes under mixed chunking); decode, one per request; target verify, ``batch x draft tokens``;
draft extend, each request's tokens (or the draft tokens when it has none); CUDA-graph padding
counts when it is more. The guard, the engine profiles, the split and the adapters all count
with :func:`query_rows` (lists) or :func:`forward_rows` / :func:`request_rows` (a Batch).
"""
from __future__ import annotations

from ..inputs.batch import Batch, request_arrays
from ..errors import InputError
from ..facts.fields import total
from ..facts.modes import Mode
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


def draft_tokens(batch: Batch) -> int:
    d = batch.arg("speculative_num_draft_tokens")
    return int(d) if d else 0


def _no_draft(what: str):
    return InputError("server_args.speculative_num_draft_tokens" if what == "verify" else "requests",
                      "missing: target_verify has batch size x draft tokens rows" if what == "verify" else
                      "draft_extend needs extend_tokens per request or server_args.speculative_num_draft_tokens")


_DECODE, _TARGET_VERIFY, _DRAFT_EXTEND = Mode.DECODE.value, Mode.TARGET_VERIFY.value, Mode.DRAFT_EXTEND.value


def query_rows(mode: Mode | str, n: int, extend, merged: int, padded_rows: int | None, draft: int) -> int:
    """Query rows ``T`` of one forward: the one row counter.

    ``n`` requests; ``extend``: new tokens per request (a list or an int64 array; None for decode and
    verify steps); ``merged``: the last ``merged`` entries of an extend step are running decodes
    merged into it (one row each, whatever ``extend`` says for them); ``draft``: speculative draft
    tokens. Extend: new tokens (+ merged decodes); decode: one row per request; target verify:
    ``n x draft``; draft extend: each request's tokens, or ``draft`` when it has none. Padding rows
    count when they are more. ``mode``: a :class:`Mode` (or its name: it compares equal).
    """
    # (compared with the modes' names: equal to the members, and a name is read faster than a member)
    if mode == _DECODE:
        rows = n
    elif mode == _TARGET_VERIFY:
        if draft <= 0:
            raise _no_draft("verify")
        rows = n * draft
    elif mode == _DRAFT_EXTEND:
        if extend is None:
            if draft <= 0:
                raise _no_draft("draft")
            rows = n * draft
        else:
            zeros = int((extend == 0).sum()) if isinstance(extend, np.ndarray) else extend.count(0)
            if zeros and draft <= 0:
                raise _no_draft("draft")
            rows = total(extend) + zeros * draft
    else:
        rows = total(extend)
        if merged:
            rows += merged - total(extend[n - merged:])
    if padded_rows is not None and padded_rows > rows:
        rows = padded_rows
    return rows


def request_rows(batch: Batch) -> list[int]:
    """Query rows of each request of the forward, in order (sums to :func:`query_rows` less merged
    running decodes and padding): what one request costs a step."""
    mode = batch.forward_mode
    d = draft_tokens(batch)
    ext, _, _, is_dec = request_arrays(batch.requests)
    if mode.is_target_verify():
        if d <= 0:
            raise _no_draft("verify")
        return [d] * len(batch.requests)
    if mode.is_decode():
        return [1] * len(batch.requests)
    per = np.where(is_dec, 1, np.where(ext > 0, ext, d) if mode.is_draft_extend() else ext)
    return per.tolist()


def forward_rows(batch: Batch) -> tuple[int, dict]:
    """Query rows ``T`` of the forward (:func:`query_rows`), with a breakdown per source."""
    mode = batch.forward_mode
    d = draft_tokens(batch)
    n = len(batch.requests)
    if mode.is_routable():
        ext_a, _, _, is_dec = request_arrays(batch.requests)
        merged = len(batch.running) if batch.mixed else 0
        if is_dec.any():
            ext, dec_in = int(ext_a[~is_dec].sum()), int(is_dec.sum())
            rows = query_rows(Mode.EXTEND, n, np.where(is_dec, 1, ext_a), 0, None, d) + merged
        else:                   # (no decode entry: every request's new tokens are its rows)
            dec_in = 0
            ext = query_rows(Mode.EXTEND, n, ext_a, 0, None, d)
            rows = ext + merged
        bd = {"extend_tokens": ext, "decode_rows_in_forward": dec_in, "merged_running_decodes": merged}
    elif mode.is_decode():
        rows = query_rows(mode, n, None, 0, None, d)
        bd = {"decode_requests": rows}
    elif mode.is_target_verify():
        rows = query_rows(mode, n, None, 0, None, d)
        bd = {"requests": n, "draft_tokens": d}
    else:  # draft_extend
        rows = query_rows(mode, n, request_arrays(batch.requests)[0], 0, None, d)
        bd = {"requests": n, "tokens": rows}
    if batch.padded_rows is not None and batch.padded_rows > rows:
        bd["padding_rows"] = batch.padded_rows - rows
        rows = batch.padded_rows
    return rows, bd
