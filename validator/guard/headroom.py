"""How much more a step can take before it breaks a limit: the rows (prefill tokens) or requests.

Read off the configuration's :class:`~validate_batch.legality.bounds.StepBounds` (the same bounds the guard
decides by). When a registered rule reads something those bounds do not cover, the numbers come
from full checks of the step with rows added instead (a bisection, assuming that a rule which
breaks at some number of added rows also breaks at more, below the routing threshold).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..inputs.adapters import step_lists
from ..errors import InputError
from ..facts.fields import MAX_POSITION, MAX_REQUESTS, MAX_TOKENS, column, count, int_arg
from ..flashmla.calls import MAX_ROWS
from ..facts.modes import Mode
from ..facts.names import parse_mode
from ..legality.search import largest_legal


@dataclass(frozen=True)
class Headroom:
    """What one step can still take before it breaks the decode kernel's row limit.

    ``more_rows`` and ``more_requests`` are ``None`` when nothing bounds them (the step is routed to
    the sparse prefill kernel, or the configuration has no row limit). With routing, an extend step
    that cannot take ``more_rows + 1`` rows may take ``rows_to_route`` or more again: ``gap`` is the
    closed range of additions that are illegal.
    """

    forward_mode: Mode
    rows: int                          # query rows of the step now
    max_rows: int | None               # rows the decode kernel takes (None: no row limit)
    threshold: int | None              # routing threshold for this forward (None: never routed)
    routed: bool                       # the step as it is goes to the sparse prefill kernel
    legal_now: bool                    # the step's rows as they are are legal
    more_rows: int | None              # rows that can be added while staying on the decode kernel
    more_requests: int | None          # requests of this kind that can be added
    rows_to_route: int | None          # adding at least this many rows routes the step (legal again)
    gap: tuple[int, int] | None        # additions in [gap[0], gap[1]] rows are illegal
    rows_per_request: int = 1
    config_ok: bool = True             # the configuration itself breaks no rule on this path
    note: str = ""
    slow_above: int | None = None      # more rows than this run the build's slow fallback scheduler (legal)
    # steps of this mode with up to this many rows run a path not modelled (-1: any rows; None: none)
    not_modelled_rows: int | None = None

    def can_add(self, rows: int) -> bool:
        """Whether the step is legal (row-wise) with ``rows`` more query rows."""
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise InputError("rows", f"expected an integer >= 0, got {rows!r}")
        nm = self.not_modelled_rows
        if nm is not None and (nm < 0 or self.rows + rows <= nm):
            return False            # not modelled: not known to be legal
        if rows == 0 or self.routed or self.max_rows is None:   # adding nothing leaves the step as it is
            return self.legal_now
        if self.config_ok and rows <= self.more_rows and self.rows + rows >= 1:
            return True
        return self.rows_to_route is not None and rows >= self.rows_to_route

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def headroom(checker, step: Any = "extend", extend_lens: Any = None, seq_lens: Any = None, *,
             num_requests: int | None = None, num_running_decodes: int = 0, padded_rows: int | None = None,
             prefix_lens: Any = None, req_pool_indices: Any = None) -> Headroom:
    """How many more query rows (prefill tokens) or requests this step can take (see :func:`_headroom`).
    Where some steps of the mode run a path the profiles do not model, such a step is not legal
    now, and adding rows is legal only once the step leaves that path (``not_modelled_rows``)."""
    h = _headroom(checker, step, extend_lens, seq_lens, num_requests=num_requests,
                  num_running_decodes=num_running_decodes, padded_rows=padded_rows, prefix_lens=prefix_lens,
                  req_pool_indices=req_pool_indices)
    b = checker.bounds
    spans = [top for modes, top in b.unmodelled if h.forward_mode in modes]
    if not spans:
        return h
    top = -1 if None in spans else max(spans)
    what = "every step of this mode" if top < 0 else f"a {h.forward_mode} step of 1..{top} rows"
    note = f"{what} runs a path this profile does not model: not modelled, neither legal nor illegal"
    inside = top < 0 or 0 < h.rows <= top
    if inside and top >= 0:
        note += f"; from {top + 1} rows ({top + 1 - h.rows} more) the step is judged on the modelled path"
    changes = {"not_modelled_rows": top, "note": "; ".join(x for x in (h.note, note) if x)}
    if inside:
        changes.update(legal_now=False)
        if top < 0:
            changes.update(more_rows=0, more_requests=0, rows_to_route=None, gap=None)
    return replace(h, **changes)


def _headroom(checker, step: Any = "extend", extend_lens: Any = None, seq_lens: Any = None, *,
              num_requests: int | None = None, num_running_decodes: int = 0, padded_rows: int | None = None,
              prefix_lens: Any = None, req_pool_indices: Any = None) -> Headroom:
    """How many more query rows (prefill tokens) or requests this step can take.

    ``step``: a forward mode (then ``extend_lens`` / ``seq_lens`` / ``num_requests`` describe the
    step so far; none of them means an empty step being formed) or an engine object.
    ``num_running_decodes``: running decodes that join an extend step under mixed chunking
    (counted only when ``enable_mixed_chunk`` is set). Slots are not considered here, unless a rule
    the bounds do not cover needs the full check (then ``prefix_lens`` and ``req_pool_indices``
    are part of the step checked).
    """
    b = checker.bounds
    if not isinstance(step, str):       # an engine object (a Mode is a str)
        lists = step_lists(step, checker)
        if lists is None:
            step, extend_lens, seq_lens = "extend", None, None
        else:
            step = lists["forward_mode"]
            extend_lens, seq_lens = lists.get("extend_lens"), lists.get("seq_lens")
            padded_rows = lists.get("padded_rows")
    mode = parse_mode(step) or Mode.EXTEND
    if extend_lens is not None:
        extend_lens = column(extend_lens, "extend_lens", 0, MAX_TOKENS, None)
    if seq_lens is not None:
        seq_lens = column(seq_lens, "seq_lens", 1, MAX_POSITION, None)
    if num_requests is not None:
        n = int_arg(num_requests, "num_requests", 0, MAX_REQUESTS)
    else:
        n = count(extend_lens) if extend_lens is not None else (count(seq_lens) if seq_lens is not None else 0)
    running = int_arg(num_running_decodes, "num_running_decodes", 0, MAX_REQUESTS)
    d = checker.draft_tokens
    merged = 0
    if mode.is_routable():
        rows = checker.step_rows(Mode.EXTEND, n, extend_lens, 0, None) if extend_lens is not None else 0
        merged = running if (mode.is_mixed() or checker.mixed_chunk) else 0
        rows += merged
        per = 1
    elif mode.is_draft_extend():
        per = d if d > 0 else 1
        rows = checker.step_rows(mode, n, extend_lens, 0, None) if (extend_lens is not None or d > 0) else 0
    else:
        rows = checker.step_rows(mode, n, None, 0, None)
        per = rows // n if n else (d if mode.is_target_verify() else 1)
    if padded_rows is not None:
        rows = max(rows, int_arg(padded_rows, "padded_rows", 0, MAX_ROWS))
    notes = []
    if mode.is_routable() and running and not merged:
        notes.append(f"{running} running decode(s) run in their own forward (mixed chunking is off)")
    if not b.complete or (b.routed_full and mode.is_routable()):   # late-layer tails: rows do not decide
        return _by_full_checks(checker, mode, rows, per, n, extend_lens, seq_lens, prefix_lens, req_pool_indices,
                               padded_rows, merged, notes)
    if not b.has_rows:
        return Headroom(mode, rows, None, None, False, b.decode_ok, None, None, None, None, per,
                        b.decode_ok, "no row limit in this engine profile; slots are checked per request")
    if b.slow_above is not None and b.threshold is None:
        notes.append(f"above {b.slow_above} rows {checker.kernel_build}'s scheduler falls back to its low-shared-memory "
                     f"kernel: legal, about 7-8x slower per call")
    L = min(b.max_rows, b.sched_free_rows)
    thr = b.threshold if mode.is_routable() else None
    routed_ok = b.routed_ok
    decode_ok = b.decode_ok
    if thr is not None and rows > thr:
        notes.append(f"{rows} rows > routing threshold {thr}: the step goes to flash_mla_sparse_fwd, which has "
                     f"no row limit" if thr else "every extend step goes to flash_mla_sparse_fwd (the engine's "
                     "sparse-prefill switch is on), which has no row limit")
        return Headroom(mode, rows, b.max_rows, thr, True, routed_ok, None if routed_ok else 0,
                        None if routed_ok else 0, None, None, per, routed_ok, "; ".join(notes))
    if not decode_ok:
        codes = ", ".join(sorted({f.code for f in checker.static_findings}))
        notes.append(f"the configuration itself is illegal ({codes}): no step is legal on the decode kernel")
    more = max(L - rows, 0) if decode_ok else 0
    legal = decode_ok and 1 <= rows <= L
    gap = to_route = None
    if thr is not None and routed_ok:
        to_route = thr + 1 - rows
        lo = more + 1 if (decode_ok and rows <= L) else 1
        gap = (lo, to_route - 1) if lo <= to_route - 1 else None
        notes.append(f"with routing, adding {to_route} or more rows sends the step to flash_mla_sparse_fwd "
                     f"(legal again); adding " + (f"{gap[0]}..{gap[1]} rows" if gap else "no number of rows")
                     + f" lands in {L + 1}..{thr} rows, which still reach the decode kernel and crash")
    elif not mode.is_routable() and b.threshold is not None:
        notes.append(f"{mode} forwards are never routed: the decode kernel's {L} rows is a hard limit")
    if rows > L:
        notes.append(f"{rows} rows already exceed the decode kernel's {L}: split the step")
    if rows == 0 and mode.is_routable():
        notes.append("an empty step is not launched")
    return Headroom(mode, rows, b.max_rows, thr, False, legal, more, more // per, to_route, gap, per,
                    decode_ok, "; ".join(notes), b.slow_above)




def _by_full_checks(checker, mode, rows, per, n, ext, seq, pre, slots, pad, merged, notes) -> Headroom:
    """Headroom when a rule the bounds do not cover is registered: each candidate is the step with
    rows added (one more extend request of that many new tokens, or more decode requests), checked
    in full."""
    b = checker.bounds
    if b.routed_full and b.complete:
        notes = notes + ["from full checks: a routed step's late-layer tail (its decode-kernel rows) depends on how "
                         "its tokens are spread over requests"]
    else:
        codes = ", ".join(b.undecided) or "a rule registered after this checker"
        notes = notes + [f"from full checks: {codes} read(s) more than the bounds cover"]
    ext = list(ext) if ext is not None else None
    seq = list(seq) if seq is not None else None

    def legal(x: int) -> bool:
        if mode.is_routable() or (mode.is_draft_extend() and ext is not None):
            e = (ext or []) + ([x] if x else [])
            if not e or (rows + x - merged) <= 0:
                return False
            p = (list(pre) + [0] * (len(e) - len(pre))) if pre is not None else None
            s_ = (list(slots) + [1] * (len(e) - len(slots))) if slots is not None else None
            return checker.full_legal(mode, extend_lens=e, prefix_lens=p, req_pool_indices=s_, padded_rows=pad)
        k = x // per
        q = (seq or [1] * n) + [1] * k
        if not q:
            return False
        s_ = (list(slots) + [1] * k) if slots is not None else None
        return checker.full_legal(mode, seq_lens=q, req_pool_indices=s_, padded_rows=pad)

    legal_now = rows >= 1 and legal(0)
    cap = (b.max_rows if b.max_rows is not None else MAX_ROWS) - rows
    more = 0
    if legal_now and cap > 0:
        more = largest_legal(legal, 0, cap, cap)[0] or 0
    thr = b.threshold if mode.is_routable() else None
    to_route = gap = None
    if thr is not None and rows <= thr and legal(thr + 1 - rows):
        to_route = thr + 1 - rows
        lo = more + 1 if legal_now else 1
        gap = (lo, to_route - 1) if lo <= to_route - 1 else None
    if thr is not None and rows > thr:
        return Headroom(mode, rows, b.max_rows, thr, True, legal_now, None if legal_now else 0,
                        None if legal_now else 0, None, None, per, legal_now, "; ".join(notes))
    return Headroom(mode, rows, b.max_rows, thr, False, legal_now, more, more // per, to_route, gap, per,
                    True, "; ".join(notes))
