"""The pre-dispatch guard: a :class:`Checker` built once per engine configuration, run every step.

Everything that depends only on the configuration - the GPU, the engine profile's version, the
decode kernel's row limit, the routing threshold, the request table's rows and the sizes of
slot-indexed buffers, and whether the configuration itself breaks a rule - is resolved in the
constructor. A step then costs only what depends on the batch:

* :meth:`Checker.verdict` - the fast path. It takes an engine object or plain per-request lists,
  decides legality from row counts and slot bounds (no schedule, no report), and returns the shared
  :data:`LEGAL` verdict when the step is legal. Only an illegal step pays for the full report,
  built by the normal path (rules, findings, safe split).
* :meth:`Checker.check` - the full report, schedule included.
* :meth:`Checker.assert_legal` - the fast path, raising :class:`BatchIllegalError` when illegal.
* :meth:`Checker.headroom` - how many more rows (prefill tokens) or requests the step can take.

A checker holds no mutable state after construction and can be shared between threads. It never
imports torch: tensors are read through their ``tolist()``.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from . import _accel
from .batch import (FORWARD_MODES, KNOWN_ARGS, MAX_REQUESTS, MAX_TOKENS, MODE_ALIASES, Batch, RequestColumns,
                    batch_from_dict, is_batch_document, normalize_arg_name)
from .calls import INT32_MAX, MAX_ROWS, min_max
from .engine import check_engine_batch, draft_tokens, engine_setup
from .errors import BatchIllegalError, InputError
from .report import Report
from .schedule import WalkMemo

ROUTABLE_MODES = ("extend", "mixed")
MAX_POSITION = 1 << 31
_MODES: dict[str, str | None] = {**{m: m for m in FORWARD_MODES}, **MODE_ALIASES, "idle": None}


class Verdict:
    """The answer of :meth:`Checker.verdict`: truthy when the step is legal.

    A legal verdict is the shared constant :data:`LEGAL` (nothing is allocated per step). An illegal
    one carries the full :class:`~validator.report.Report` of the normal path: ``findings`` (its
    errors), ``safe_split`` and ``report``.
    """

    __slots__ = ("legal", "report")

    def __init__(self, legal: bool, report: Report | None = None):
        object.__setattr__(self, "legal", legal)
        object.__setattr__(self, "report", report)

    def __setattr__(self, name, value):
        raise AttributeError("a Verdict is immutable")

    def __bool__(self) -> bool:
        return self.legal

    def __eq__(self, other) -> bool:
        """``x == LEGAL`` reads "x is legal" (for a Verdict or a Report)."""
        if self is other:
            return True
        if self.legal and self.report is None and isinstance(other, (Verdict, Report)):
            return other.legal
        if isinstance(other, Verdict) and other.legal and other.report is None:
            return self.legal
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.legal)

    @property
    def findings(self) -> list:
        return self.report.errors if self.report is not None else []

    @property
    def safe_split(self):
        return self.report.safe_split if self.report is not None else None

    def error(self) -> BatchIllegalError | None:
        """The exception :meth:`raise_if_illegal` would raise (None when legal)."""
        return None if self.legal else BatchIllegalError(self.report)

    def raise_if_illegal(self) -> None:
        if not self.legal:
            raise BatchIllegalError(self.report)

    def __repr__(self) -> str:
        if self.legal:
            return "Verdict(legal=True)"
        return f"Verdict(legal=False, codes={self.report.codes})"


LEGAL = Verdict(True)


def explain(report: Report, what: str = "batch") -> str:
    """Plain-text account of a report: verdict, every finding with its code, numbers and fix, the split."""
    ctx = report.context or {}
    head = []
    if ctx.get("forward_mode"):
        head.append(f"{ctx['forward_mode']} forward")
    b = ctx.get("batch") or {}
    if "requests" in b:
        head.append(f"{b['requests']} request(s)")
    if ctx.get("query_rows") is not None:
        head.append(f"{ctx['query_rows']} query rows")
    if ctx.get("versions"):
        head.append(", ".join(f"{k} {v}" for k, v in ctx["versions"].items()))
    if b.get("gpu"):
        head.append(f"on {b['gpu']['name']}")
    verdict = "legal" if report.legal else f"ILLEGAL ({len(report.errors)} limit(s) broken)"
    lines = [f"{what} is {verdict}" + (f": {', '.join(head)}" if head else "")]
    for f in report.findings:
        subj = f" [{f.subject}]" if f.subject else ""
        lines.append(f"  {f.code} {f.severity}{subj}: {f.message}")
        if f.fix:
            lines.append(f"      fix: {f.fix}")
        if f.failure and f.is_error:
            lines.append(f"      on the GPU: {f.failure}")
    sp = report.safe_split
    if sp is not None:
        if not sp.possible:
            lines.append(f"safe split: none - {sp.reason}")
        else:
            if sp.steps is not None:
                lines.append(f"safe split: {len(sp.steps)} step(s), whole requests in order:")
                lines.extend(f"  step {i}: {', '.join(st)}" for i, st in enumerate(sp.steps, 1))
            elif sp.unchunked_reason:
                lines.append(f"safe split: {sp.unchunked_reason}")
            if sp.chunked_steps is not None and sp.steps is None:
                lines.append(f"chunked: {len(sp.chunked_steps)} step(s):")
                for i, st in enumerate(sp.chunked_steps, 1):
                    parts = [f"{c['id']}[{c['start']}:{c['start'] + c['tokens']}]" for c in st]
                    lines.append(f"  step {i}: {', '.join(parts)}")
        for st in sp.settings:
            lines.append(f"  prevent: {st['flag']} {st['value']} - {st['why']}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Headroom:
    """What one step can still take before it breaks the decode kernel's row limit.

    ``more_rows`` and ``more_requests`` are ``None`` when nothing bounds them (the step is routed to
    the sparse prefill kernel, or the configuration has no row limit). With routing, an extend step
    that cannot take ``more_rows + 1`` rows may take ``rows_to_route`` or more again: ``gap`` is the
    closed range of additions that are illegal.
    """

    forward_mode: str
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

    def can_add(self, rows: int) -> bool:
        """Whether the step is legal (row-wise) with ``rows`` more query rows."""
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise InputError("rows", f"expected an integer >= 0, got {rows!r}")
        if rows == 0 or self.routed or self.max_rows is None:   # adding nothing leaves the step as it is
            return self.legal_now
        if self.config_ok and rows <= self.more_rows and self.rows + rows >= 1:
            return True
        return self.rows_to_route is not None and rows >= self.rows_to_route

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# ----------------------------------------------------------------------------------- input checks
def _bad_element(v, ok) -> int:
    return next(i for i, x in enumerate(v) if not ok(x))


def _is_int(x) -> bool:
    return (type(x) is int) or (isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)))


_INT_TYPES = frozenset({int})


def _column(v: Any, name: str, lo: int, hi: int, n: int | None, as_array: bool = False):
    """Validate one per-request integer column; return it as a list or a 1-D int64 array.

    Runs at C speed for lists of ints and integer arrays (type set, min, max); anything else that
    has ``tolist()`` (a torch tensor) is converted first. ``as_array``: a list of plain ints comes
    back as an int64 array instead (the compiled list check reads it once; without it numpy reads it
    and its min and max decide the range, and as ``True``/``False`` would read as 1/0 the element
    types are looked at only when the minimum is 0 or 1).
    """
    if type(v) is list:
        if n is not None and len(v) != n:
            raise InputError(name, f"expected {n} values (one per request), got {len(v)}")
        if not v:
            return v
        if as_array:
            c = _accel.compiled
            if c is not None:           # one pass in C: exact ints in range, copied into the array
                a = np.empty(len(v), dtype=np.int64)
                return a if c.int_column(v, lo, hi, a) < 0 else _column_slow(v, name, lo, hi)
            try:
                a = np.array(v)
            except (ValueError, TypeError, OverflowError):  # ragged nesting and the like: named below
                return _column_slow(v, name, lo, hi)
            if a.dtype == np.int64 and a.ndim == 1:
                mn, mx = min_max(a)
                if lo <= mn and mx <= hi and (mn > 1 or set(map(type, v)) == _INT_TYPES):
                    return a
            return _column_slow(v, name, lo, hi)
        if set(map(type, v)) != _INT_TYPES or min(v) < lo or max(v) > hi:
            return _column_slow(v, name, lo, hi)
        return v
    if type(v) is tuple:
        return _column(list(v), name, lo, hi, n, as_array)
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype.kind not in "iu":
            raise InputError(name, f"expected a 1-D integer array, got dtype {v.dtype} shape {v.shape}")
        if n is not None and v.shape[0] != n:
            raise InputError(name, f"expected {n} values (one per request), got {v.shape[0]}")
        if v.shape[0]:
            mn, mx = min_max(v)
            if mn < lo or mx > hi:
                i = int(np.argmax((v < lo) | (v > hi)))
                raise InputError(f"{name}[{i}]", f"expected {lo}..{hi}, got {int(v[i])}")
        return v.astype(np.int64, copy=False)
    tolist = getattr(v, "tolist", None)
    if tolist is None or isinstance(v, (str, bytes, Mapping)):
        raise InputError(name, f"expected a list of integers, got {type(v).__name__}")
    v = tolist()
    if not isinstance(v, list):
        raise InputError(name, f"expected a 1-D sequence of integers, got {type(v).__name__}")
    return _column(v, name, lo, hi, n, as_array)


def _top_within(v: list, lo: int, hi: int) -> int:
    """The largest value of a non-empty list of plain ints all in [lo, hi] (lo >= 0), or -1 when it
    is not one: :func:`_ints_within` that also gives the maximum, in the same pass for short lists."""
    if len(v) <= 8:
        top = -1
        for x in v:
            if x.__class__ is not int or x < lo or x > hi:
                return -1
            if x > top:
                top = x
        return top
    if set(map(type, v)) != _INT_TYPES or min(v) < lo:
        return -1
    top = max(v)
    return top if top <= hi else -1


def _ints_within(v: list, lo: int, hi: int) -> bool:
    """A list of plain ints, all in [lo, hi] (an element loop for short lists, C builtins otherwise).

    The same pass as :func:`_top_within` without the maximum, kept as its own loop: calling that one
    costs about 0.1 us more per list, a measurable part of the verdict on one-request steps."""
    if len(v) <= 8:
        for x in v:
            if x.__class__ is not int or x < lo or x > hi:
                return False
        return True
    return set(map(type, v)) == _INT_TYPES and min(v) >= lo and max(v) <= hi


def _column_slow(v: list, name: str, lo: int, hi: int) -> list:
    if not all(map(_is_int, v)):
        i = _bad_element(v, _is_int)
        raise InputError(f"{name}[{i}]", f"expected an integer, got {v[i]!r}")
    v = [int(x) for x in v]
    if min(v) < lo or max(v) > hi:
        i = _bad_element(v, lambda x: lo <= x <= hi)
        raise InputError(f"{name}[{i}]", f"expected {lo}..{hi}, got {v[i]}")
    return v


def _total(v) -> int:
    return int(v.sum()) if isinstance(v, np.ndarray) else sum(v)


def _count(v) -> int:
    return int(v.shape[0]) if isinstance(v, np.ndarray) else len(v)


def _int_arg(v: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InputError(name, f"expected an integer, got {v!r}")
    v = int(v)
    if not lo <= v <= hi:
        raise InputError(name, f"expected {lo}..{hi}, got {v}")
    return v


def _mode(forward_mode: Any) -> str | None:
    """Normalize a forward mode name; ``None`` means idle (nothing runs)."""
    m = _MODES.get(forward_mode, "?") if type(forward_mode) is str else "?"
    if m != "?":
        return m
    if type(forward_mode) is str:
        low = forward_mode.lower()
        if low == "idle":
            return None
        m = _MODES.get(low, "?")
        if m != "?":
            return m
    raise InputError("forward_mode", f"expected one of {', '.join(FORWARD_MODES)} or idle, got {forward_mode!r}")


def _server_args(server_args: Any) -> dict:
    """The engine flags the profiles read, from a mapping or an engine's settings object.

    Keys are normalized (``--chunked-prefill-size`` -> ``chunked_prefill_size``); ``None`` means
    unset (as in SGLang's ``ServerArgs``) and flags no profile reads are dropped, so
    ``vars(server_args)`` can be passed as it is.
    """
    if server_args is None:
        return {}
    if isinstance(server_args, Mapping):
        items = server_args.items()
    else:
        fields = getattr(server_args, "__dict__", None)
        if fields is None:
            raise InputError("server_args", f"expected a mapping of engine flags, got {type(server_args).__name__}")
        items = fields.items()
    out = {}
    for k, v in items:
        key = normalize_arg_name(str(k))
        if key in KNOWN_ARGS and v is not None:
            out[key] = v
    return out


# ----------------------------------------------------------------------------------- the checker
class Checker:
    """Pre-dispatch checks for one engine configuration (engine profile, GPU, server arguments).

    Build it once (it resolves and checks the configuration), then call :meth:`verdict` (or
    :meth:`assert_legal`) on every step; :meth:`check` gives the full report. Every method takes
    the step in one of three forms:

    * an engine object: an SGLang ``ScheduleBatch`` or a vLLM ``SchedulerOutput`` (duck-typed, see
      :mod:`validator.adapters`);
    * a forward mode and per-request lists: ``extend_lens``, ``seq_lens``, ``prefix_lens``,
      ``req_pool_indices``, ``rids`` (lists, tuples, integer numpy arrays or CPU tensors);
    * a :class:`~validator.batch.Batch` or a batch document (full path only; a document's missing
      fields are filled from the checker's configuration).

    Raises :class:`InputError` (naming the field) for malformed configuration or input.
    """

    def __init__(self, engine: Any = "sglang-dsv4", gpu: Any = "H200", server_args: Any = None, *,
                 model: Mapping | None = None, buffers: list | None = None, kernel: str | None = None,
                 split: bool = True):
        doc: dict = {"engine": engine, "server_args": _server_args(server_args), "forward_mode": "decode",
                     "requests": [{"id": "probe", "seq_len": 1}]}
        if model:
            doc["model"] = dict(model)
        if buffers:
            doc["buffers"] = [dict(b) if isinstance(b, Mapping) else b for b in buffers]
        tmpl = batch_from_dict(doc, gpu)
        self._template = replace(tmpl, server_args=MappingProxyType(dict(tmpl.server_args)),
                                 model=MappingProxyType(dict(tmpl.model)), label="")
        self.kernel = kernel
        self.schedule_memo = WalkMemo()  # this checker's reusable schedule walks (bounded, locked)
        self.split = split
        self.profiles = tmpl.profiles
        self.gpu = tmpl.gpu
        self.engine = [f"{n}@{v}" if v else n for n, v in tmpl.profiles]
        names = {n for n, _ in tmpl.profiles}

        # Everything below depends on the configuration only.
        self._setup = engine_setup(self._template, kernel)
        probe = check_engine_batch(self._template, kernel=kernel, split=False, setup=self._setup)
        bp = probe.batch_plan
        self.versions = dict(bp.versions)
        errs = probe.errors
        self._slots_static_ok = not any(f.code.startswith("SLOT") for f in errs)
        self._decode_static_ok = not any(not f.code.startswith("SLOT") for f in errs)
        self.static_findings = tuple(errs)
        self.draft_tokens = draft_tokens(self._template)
        self.mixed_chunk = bool(self._template.arg("enable_mixed_chunk", False))

        self.has_rows = "sglang-dsv4" in names
        self.max_rows: int | None = None
        self.threshold: int | None = None
        self._sched_free_rows = 0
        self._routed_static_ok = True
        if self.has_rows:
            self.max_rows = bp.max_decode_rows
            self.threshold = bp.routing.get("threshold")
            # FMLA002 needs the schedule, except when it provably cannot fire: a split request's last
            # partial-result row is at most (b - 1) + P, so rows with (b - 1 + P) * stride < 2^31 are safe.
            bound = self.max_rows
            for dc in bp.calls:
                p = dc.plan
                if p.num_sm_parts is None:
                    continue
                stride = dc.call.s_q * dc.call.h_q * p.gen["oaccum"]["d_v"]
                bound = min(bound, INT32_MAX // stride - p.num_sm_parts + 1)
            self._sched_free_rows = max(bound, 0)
            if self.threshold is not None:
                routed = replace(self._template, forward_mode="extend",
                                 requests=RequestColumns(1, ["probe"], [self.threshold + 1], [0]))
                rep = check_engine_batch(routed, kernel=kernel, split=False, setup=self._setup)
                self._routed_static_ok = not any(not f.code.startswith("SLOT") for f in rep.errors)

        self.has_slots = bp.slots is not None
        self.table_rows: int | None = None
        self.max_slot: int | None = None
        self.buffer_rows: dict = {}
        if self.has_slots:
            s = bp.slots
            self.table_rows = s.table_rows
            self.buffer_rows = {b.name: b.rows for b in s.buffers}
            lim = s.table_rows
            for b in s.buffers[1:]:
                lim = min(lim, b.rows)  # SLOT002 (req_pool_idx) and SLOT004 (global_slot) alike
            self.max_slot = lim - 1
        # 1.._sure_rows query rows are legal in any mode, given slots within range (what _decide
        # says, without the per-mode branches; above it, _decide is asked)
        if not self._slots_static_ok or (self.has_rows and not self._decode_static_ok):
            self._sure_rows = 0
        elif not self.has_rows:
            self._sure_rows = MAX_ROWS
        else:
            self._sure_rows = min(self.max_rows, self._sched_free_rows,
                                  self.threshold if self.threshold is not None else self.max_rows)
        self._frozen = True

    def __setattr__(self, name, value):
        if self.__dict__.get("_frozen"):
            raise AttributeError(f"a Checker is immutable once built (build another for {name}={value!r})")
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------------------------ description
    def __repr__(self) -> str:
        parts = [f"engine={self.engine if len(self.engine) > 1 else self.engine[0]!r}", f"gpu={self.gpu.name!r}"]
        if self.has_rows:
            parts.append(f"max_rows={self.max_rows}")
            parts.append(f"threshold={self.threshold}")
        if self.has_slots:
            parts.append(f"table_rows={self.table_rows}, max_slot={self.max_slot}")
        return f"Checker({', '.join(parts)})"

    def describe(self) -> dict:
        """The resolved configuration (what the per-step checks compare against)."""
        return {"engine": self.engine, "versions": self.versions, "gpu": self.gpu.to_dict(),
                "server_args": dict(self._template.server_args), "max_decode_kernel_rows": self.max_rows,
                "routing_threshold": self.threshold, "draft_tokens": self.draft_tokens,
                "mixed_chunk": self.mixed_chunk, "table_rows": self.table_rows, "max_legal_slot": self.max_slot,
                "buffer_rows": dict(self.buffer_rows),
                "static_errors": [f.code for f in self.static_findings]}

    # ------------------------------------------------------------------------------ fast decision
    def _decide(self, mode: str, rows: int, max_slot_seen: int | None) -> bool | None:
        """Legality from the row count and the largest slot; None when only the schedule can tell."""
        if not self._slots_static_ok:
            return False
        if max_slot_seen is not None and self.max_slot is not None and max_slot_seen > self.max_slot:
            return False
        if self.has_rows:
            if rows <= 0:
                return False
            thr = self.threshold
            if thr is not None and rows > thr and (mode == "extend" or mode == "mixed"):
                return self._routed_static_ok
            if rows > self.max_rows or not self._decode_static_ok:
                return False
            if rows > self._sched_free_rows:
                return None
        return True

    def _rows(self, mode: str, n: int, extend, num_merged_decodes: int, padded_rows) -> int:
        if mode == "decode":
            rows = n
        elif mode == "target_verify":
            d = self.draft_tokens
            if d <= 0:
                raise InputError("server_args.speculative_num_draft_tokens",
                                 "missing: target_verify has batch size x draft tokens rows")
            rows = n * d
        elif mode == "draft_extend":
            d = self.draft_tokens
            if extend is None:
                if d <= 0:
                    raise InputError("requests", "draft_extend needs extend_lens or server_args.speculative_num_draft_tokens")
                rows = n * d
            else:
                zeros = int((extend == 0).sum()) if isinstance(extend, np.ndarray) else extend.count(0)
                if zeros and d <= 0:
                    raise InputError("requests", "draft_extend needs extend_lens or server_args.speculative_num_draft_tokens")
                rows = _total(extend) + zeros * d
        else:
            rows = _total(extend)
            if num_merged_decodes:
                rows += num_merged_decodes - _total(extend[n - num_merged_decodes:])
        if padded_rows is not None and padded_rows > rows:
            rows = padded_rows
        return rows

    # ------------------------------------------------------------------------------ lists
    def _validate(self, forward_mode, extend_lens, seq_lens, req_pool_indices, prefix_lens, rids,
                  num_merged_decodes, padded_rows) -> tuple:
        mode = _mode(forward_mode)
        if mode is None:
            return (None,) * 8
        if mode == "extend" or mode == "mixed":
            if extend_lens is None:
                raise InputError("extend_lens", f"missing: an {mode} step needs the new tokens of every request")
        elif seq_lens is None and (mode != "draft_extend" or extend_lens is None):
            raise InputError("seq_lens", f"missing: a {mode} step needs every request's sequence length")
        n = None
        ext = seq = pre = slots = None
        if extend_lens is not None:
            ext = _column(extend_lens, "extend_lens", 0, MAX_TOKENS, None, True)
            n = len(ext)
        if seq_lens is not None:
            seq = _column(seq_lens, "seq_lens", 1, MAX_POSITION, n, True)
            n = len(seq)
        if prefix_lens is not None:
            pre = _column(prefix_lens, "prefix_lens", 0, MAX_POSITION, n, True)
        if req_pool_indices is not None:
            slots = _column(req_pool_indices, "req_pool_indices", 0, MAX_POSITION, n, True)
        if not n:
            raise InputError("requests", "expected a non-empty step (an empty one is idle: pass forward_mode='idle')")
        if n > MAX_REQUESTS:
            raise InputError("requests", f"{n} requests is absurd (expected <= {MAX_REQUESTS})")
        if ext is not None and n > 1 and _total(ext) > MAX_ROWS:
            raise InputError("extend_lens", f"total extend tokens {_total(ext)} is absurd (expected <= {MAX_ROWS})")
        if ext is not None and seq is not None and pre is None and (
                bool((np.asarray(seq) < np.asarray(ext)).any()) if isinstance(seq, np.ndarray) or isinstance(ext, np.ndarray)
                else any(map(operator.lt, seq, ext))):
            i = next(i for i, (a, e) in enumerate(zip(seq, ext)) if a < e)
            raise InputError(f"seq_lens[{i}]", "shorter than extend_lens: expected seq_len = prefix + extend tokens")
        if rids is not None:
            rids = self._rids(rids, n)
        k = num_merged_decodes
        if k.__class__ is not int or k:
            k = _int_arg(k, "num_merged_decodes", 0, n)
            if k and mode != "extend" and mode != "mixed":
                raise InputError("num_merged_decodes", f"only extend / mixed steps merge running decodes, got a {mode} step")
        pad = _int_arg(padded_rows, "padded_rows", 0, MAX_ROWS) if padded_rows is not None else None
        return mode, n, ext, seq, pre, slots, k, pad

    @staticmethod
    def _rids(rids, n: int) -> list:
        if isinstance(rids, (str, bytes)) or not hasattr(rids, "__len__") or len(rids) != n:
            raise InputError("rids", f"expected {n} request ids (one per request)")
        rids = list(rids)
        try:
            "".join(rids)               # C speed: every id is a string
            types = {str}
        except TypeError:
            types = set(map(type, rids))
        if types - {str, int}:
            i = _bad_element(rids, lambda x: type(x) in (str, int))
            raise InputError(f"rids[{i}]", f"expected a string, got {rids[i]!r}")
        if len(set(rids) if types == {str} else set(map(str, rids))) != n:
            seen: set = set()
            dup = next(str(x) for x in rids if str(x) in seen or seen.add(str(x)))
            raise InputError("rids", f"duplicate request id {dup!r}")
        return rids

    def _columns(self, mode, n, ext, seq, pre, slots, k, rids) -> RequestColumns:
        """The step's requests for the full path (see RequestColumns for the field meanings)."""
        if mode in ("decode", "target_verify") or (mode == "draft_extend" and ext is None):
            return RequestColumns(n, rids, None, None, seq, slots, 0)
        if pre is None and seq is not None:
            pre = np.asarray(seq, dtype=np.int64) - np.asarray(ext, dtype=np.int64)
            if pre.shape[0] and int(pre.min()) < 0:
                i = int(np.argmax(pre < 0))
                raise InputError(f"seq_lens[{i}]", "shorter than extend_lens: expected seq_len = prefix + extend tokens")
        dec_seq = None
        if k:
            # merged running decodes (SGLang MIXED): one row each, attending to prefix + 1 tokens
            p = np.asarray(pre, dtype=np.int64) if pre is not None else np.zeros(n, dtype=np.int64)
            dec_seq = np.zeros(n, dtype=np.int64)
            dec_seq[n - k:] = p[n - k:] + 1
        return RequestColumns(n, rids, ext, pre, dec_seq, slots, n - k)

    def _batch(self, mode, cols, pad, num_merged: int) -> Batch:
        if num_merged:
            mode = "mixed"
        # the template with this step's fields (what dataclasses.replace does, without re-running
        # the frozen __init__ field by field: the template is already valid)
        b = object.__new__(Batch)
        b.__dict__.update(self._template.__dict__)
        b.__dict__.update(forward_mode=mode, requests=cols, padded_rows=pad)
        return b

    @staticmethod
    def _max_slot(slots) -> int | None:
        if slots is None or not _count(slots):
            return None
        return int(slots.max()) if isinstance(slots, np.ndarray) else max(slots)

    # ------------------------------------------------------------------------------ public API
    def verdict(self, step: Any = None, extend_lens: Any = None, seq_lens: Any = None, req_pool_indices: Any = None,
                *, forward_mode: Any = None, prefix_lens: Any = None, rids: Any = None, num_merged_decodes: int = 0,
                padded_rows: int | None = None) -> Verdict:
        """Is this step legal? The fast path: no schedule, no report when it is.

        ``step`` is a forward mode name (then the lists describe the step), an engine object, a
        Batch or a batch document. Lists are per request, in row order; ``num_merged_decodes``
        says that the last N entries of an extend step are running decodes merged into it (SGLang
        mixed chunking: one row each). Returns :data:`LEGAL`, or an illegal :class:`Verdict` that
        carries the full report and safe split.
        """
        if forward_mode is None and type(step) is str:
            forward_mode = step
        if forward_mode is not None:
            if (padded_rows is None and num_merged_decodes.__class__ is int and not num_merged_decodes
                    and self._lean(forward_mode, extend_lens, seq_lens, req_pool_indices, prefix_lens, rids)):
                return LEGAL
            mode, n, ext, seq, pre, slots, k, pad = self._validate(
                forward_mode, extend_lens, seq_lens, req_pool_indices, prefix_lens, rids, num_merged_decodes, padded_rows)
            if mode is None:
                return LEGAL
            rows = self._rows(mode, n, ext, k, pad)
            if self._decide(mode, rows, self._max_slot(slots)):
                return LEGAL
            report = self._check_lists(mode, n, ext, seq, pre, slots, k, pad, rids)
            return LEGAL if report.legal else Verdict(False, report)
        if isinstance(step, Batch) or (not hasattr(step, "forward_mode") and is_batch_document(step)):
            report = self.check(step)
            return LEGAL if report.legal else Verdict(False, report)
        fs = _adapters().fast_step(step, self)
        if fs is None:  # idle
            return LEGAL
        mode, rows, max_slot = fs
        if self._decide(mode, rows, max_slot):
            return LEGAL
        report = self.check(step)
        return LEGAL if report.legal else Verdict(False, report)

    def _lean(self, mode, ext, seq, slots, pre, rids) -> bool:
        """True when plain int lists are provably a legal step; False means "take the general path".

        The same checks as ``_validate`` + ``_rows`` + ``_decide`` for the common shapes (canonical
        mode name, lists of ints, no padding or merged decodes), with no intermediate objects. It
        never raises and never says "legal" for input the general path would reject.
        """
        if mode == "extend" or mode == "mixed":
            if ext.__class__ is not list or seq is not None or not _ints_within(ext, 0, MAX_TOKENS):
                return False
            n = len(ext)
            rows = sum(ext)
            if rows > MAX_ROWS:
                return False
        elif mode == "decode" or mode == "target_verify":
            if seq.__class__ is not list or ext is not None or not _ints_within(seq, 1, MAX_POSITION):
                return False
            n = len(seq)
            if mode == "decode":
                rows = n
            elif self.draft_tokens > 0:
                rows = n * self.draft_tokens
            else:
                return False
        else:
            return False
        if not n or n > MAX_REQUESTS:
            return False
        if pre is not None and (pre.__class__ is not list or len(pre) != n or not _ints_within(pre, 0, MAX_POSITION)):
            return False
        top = None
        if slots is not None:
            if slots.__class__ is not list or len(slots) != n:
                return False
            top = _top_within(slots, 0, MAX_POSITION)
            if top < 0:
                return False
        if rids is not None:
            try:
                self._rids(rids, n)
            except InputError:
                return False
        if 0 < rows <= self._sure_rows and (top is None or self.max_slot is None or top <= self.max_slot):
            return True
        return self._decide(mode, rows, top) is True

    def _check_lists(self, mode, n, ext, seq, pre, slots, k, pad, rids) -> Report:
        cols = self._columns(mode, n, ext, seq, pre, slots, k, rids)
        return check_engine_batch(self._batch(mode, cols, pad, k), kernel=self.kernel, split=self.split,
                                  memo=self.schedule_memo, setup=self._setup)

    def check(self, step: Any = None, extend_lens: Any = None, seq_lens: Any = None, req_pool_indices: Any = None,
              *, forward_mode: Any = None, prefix_lens: Any = None, rids: Any = None, num_merged_decodes: int = 0,
              padded_rows: int | None = None) -> Report:
        """The full report of one step (schedule, every rule, safe split when illegal)."""
        if forward_mode is None and type(step) is str:
            forward_mode = step
        if forward_mode is not None:
            mode, n, ext, seq, pre, slots, k, pad = self._validate(
                forward_mode, extend_lens, seq_lens, req_pool_indices, prefix_lens, rids, num_merged_decodes, padded_rows)
            if mode is None:
                return _idle_report()
            self._rows(mode, n, ext, k, pad)  # same input errors as the fast path
            return self._check_lists(mode, n, ext, seq, pre, slots, k, pad, rids)
        if isinstance(step, Batch):
            return check_engine_batch(step, kernel=self.kernel, split=self.split, memo=self.schedule_memo)
        if is_batch_document(step):
            return check_engine_batch(batch_from_dict(self._complete(step)), kernel=self.kernel, split=self.split, memo=self.schedule_memo)
        lists = _adapters().step_lists(step, self)
        if lists is None:
            return _idle_report()
        return self.check(lists.pop("forward_mode"), **lists)

    def batch(self, forward_mode: Any, extend_lens: Any = None, seq_lens: Any = None, req_pool_indices: Any = None,
              *, prefix_lens: Any = None, rids: Any = None, num_merged_decodes: int = 0,
              padded_rows: int | None = None) -> Batch | None:
        """The :class:`~validator.batch.Batch` the full path checks for these lists (None when idle)."""
        mode, n, ext, seq, pre, slots, k, pad = self._validate(
            forward_mode, extend_lens, seq_lens, req_pool_indices, prefix_lens, rids, num_merged_decodes, padded_rows)
        if mode is None:
            return None
        return self._batch(mode, self._columns(mode, n, ext, seq, pre, slots, k, rids), pad, k)

    def assert_legal(self, step: Any = None, extend_lens: Any = None, seq_lens: Any = None, req_pool_indices: Any = None,
                     **kwargs) -> Verdict:
        """The fast verdict; raises :class:`BatchIllegalError` (findings, safe split, report) when illegal."""
        v = self.verdict(step, extend_lens, seq_lens, req_pool_indices, **kwargs)
        if not v.legal:
            raise BatchIllegalError(v.report)
        return v

    def _complete(self, doc: Mapping) -> dict:
        out = dict(doc)
        out.setdefault("engine", self.engine[0] if len(self.engine) == 1 else list(self.engine))
        if "gpu" not in doc:
            out["gpu"] = self.gpu
        sa = doc.get("server_args")
        if sa is not None and not isinstance(sa, Mapping):
            raise InputError("server_args", f"expected an object of engine flags, got {sa!r}")
        out["server_args"] = {**self._template.server_args, **(sa or {})}
        if self._template.model and "model" not in doc:
            out["model"] = dict(self._template.model)
        if self._template.buffers and "buffers" not in doc:
            out["buffers"] = [dict(b) for b in self._template.buffers]
        return out

    # ------------------------------------------------------------------------------ headroom
    def headroom(self, step: Any = "extend", extend_lens: Any = None, seq_lens: Any = None, *,
                 num_requests: int | None = None, num_running_decodes: int = 0,
                 padded_rows: int | None = None) -> Headroom:
        """How many more query rows (prefill tokens) or requests this step can take.

        ``step``: a forward mode (then ``extend_lens`` / ``seq_lens`` / ``num_requests`` describe the
        step so far; none of them means an empty step being formed) or an engine object.
        ``num_running_decodes``: running decodes that join an extend step under mixed chunking
        (counted only when ``enable_mixed_chunk`` is set). Slots are not considered here.
        """
        if type(step) is not str:
            lists = _adapters().step_lists(step, self)
            if lists is None:
                step, extend_lens, seq_lens = "extend", None, None
            else:
                step = lists["forward_mode"]
                extend_lens, seq_lens = lists.get("extend_lens"), lists.get("seq_lens")
                padded_rows = lists.get("padded_rows")
        mode = _mode(step) or "extend"
        if extend_lens is not None:
            extend_lens = _column(extend_lens, "extend_lens", 0, MAX_TOKENS, None)
        if seq_lens is not None:
            seq_lens = _column(seq_lens, "seq_lens", 1, MAX_POSITION, None)
        if num_requests is not None:
            n = _int_arg(num_requests, "num_requests", 0, MAX_REQUESTS)
        else:
            n = _count(extend_lens) if extend_lens is not None else (_count(seq_lens) if seq_lens is not None else 0)
        running = _int_arg(num_running_decodes, "num_running_decodes", 0, MAX_REQUESTS)
        d = self.draft_tokens
        if mode in ("extend", "mixed"):
            rows = _total(extend_lens) if extend_lens is not None else 0
            merged = running if (mode == "mixed" or self.mixed_chunk) else 0
            rows += merged
            per = 1
        elif mode == "decode":
            rows, per = n, 1
        elif mode == "target_verify":
            if d <= 0:
                raise InputError("server_args.speculative_num_draft_tokens",
                                 "missing: target_verify has batch size x draft tokens rows")
            rows, per = n * d, d
        else:
            per = d if d > 0 else 1
            rows = self._rows("draft_extend", n, extend_lens, 0, None) if (extend_lens is not None or d > 0) else 0
        if padded_rows is not None:
            rows = max(rows, _int_arg(padded_rows, "padded_rows", 0, MAX_ROWS))
        notes = []
        if mode in ("extend", "mixed") and running and not merged:
            notes.append(f"{running} running decode(s) run in their own forward (mixed chunking is off)")
        if not self.has_rows:
            return Headroom(mode, rows, None, None, False, self._slots_static_ok, None, None, None, None, per,
                            self._slots_static_ok, "no row limit in this engine profile; slots are checked per request")
        L = min(self.max_rows, self._sched_free_rows)
        thr = self.threshold if mode in ROUTABLE_MODES else None
        routed_ok = self._slots_static_ok and self._routed_static_ok
        decode_ok = self._slots_static_ok and self._decode_static_ok
        if thr is not None and rows > thr:
            notes.append(f"{rows} rows > routing threshold {thr}: the step goes to flash_mla_sparse_fwd, which has "
                         f"no row limit")
            return Headroom(mode, rows, self.max_rows, thr, True, routed_ok, None if routed_ok else 0,
                            None if routed_ok else 0, None, None, per, routed_ok, "; ".join(notes))
        if not decode_ok:
            codes = ", ".join(sorted({f.code for f in self.static_findings}))
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
        elif mode not in ROUTABLE_MODES and self.threshold is not None:
            notes.append(f"{mode} forwards are never routed: the decode kernel's {L} rows is a hard limit")
        if rows > L:
            notes.append(f"{rows} rows already exceed the decode kernel's {L}: split the step")
        if rows == 0 and mode in ROUTABLE_MODES:
            notes.append("an empty step is not launched")
        return Headroom(mode, rows, self.max_rows, thr, False, legal, more, more // per, to_route, gap, per,
                        decode_ok, "; ".join(notes))


def _adapters():
    """The adapters module (imported on first use: it imports this one)."""
    from . import adapters

    return adapters


def _idle_report() -> Report:
    r = Report([])
    r.context = {"kind": "batch", "forward_mode": "idle"}
    return r


__all__ = ["Checker", "Verdict", "Headroom", "LEGAL", "explain"]
