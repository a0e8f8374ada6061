"""The pre-dispatch guard: a :class:`Checker` built once per engine configuration, run every step.

Everything that depends only on the configuration - the GPU, the engine profile's version, the
kernel plans' shapes, the request table and the sizes of slot-indexed buffers, and the
:class:`~validate_batch.legality.bounds.StepBounds` the rules put on a step - is resolved in the constructor. A
step then costs only what depends on the batch:

* :meth:`Checker.verdict` - the fast path. It takes an engine object or plain per-request lists,
  decides legality from row counts and slot bounds (no schedule, no report), and returns the shared
  :data:`LEGAL` verdict when the step is legal. Only an illegal step pays for the full report,
  built by the normal path (rules, findings, safe split). When a registered rule reads something
  the bounds do not cover, every step takes the full check.
* :meth:`Checker.check` - the full report, schedule included.
* :meth:`Checker.assert_legal` - the fast path, raising :class:`BatchIllegalError` when illegal.
* :meth:`Checker.headroom` - how many more rows (prefill tokens) or requests the step can take.

A checker holds no mutable state after construction and can be shared between threads. It never
imports torch: tensors are read through their ``tolist()``.
"""
from __future__ import annotations

import operator
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Mapping

from ..inputs import adapters
from ..inputs.batch import Batch, RequestColumns, batch_from_dict, default_profile, is_batch_document
from ..legality.bounds import derive_bounds
from ..engines.chunking import engine_steps
from ..errors import BatchIllegalError, InputError, NotModelled
from ..legality.evaluate import engine_setup
from ..facts.fields import (
    MAX_POSITION,
    MAX_REQUESTS,
    MAX_TOKENS,
    bad_element,
    column,
    count,
    int_arg,
    list_column,
    list_column_sum,
    list_column_top,
    min_max,
    short_int_list,
    total,
)
from ..flashmla.calls import MAX_ROWS
from ..flashmla.schedule import WalkMemo
from ..engines.forward import draft_tokens, query_rows
from .headroom import Headroom, headroom
from ..facts.limits import echo
from ..facts.names import BATCH_SETTINGS, FORWARD_MODES, SETTINGS, check_server_arg, normalize_setting, parse_mode
from ..legality.pipeline import chunk_would_apply, check_engine_batch, check_engine_steps, note_as_written
from ..engines import engine_family
from ..legality.report import Report
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


class Verdict:
    """The answer of :meth:`Checker.verdict`: truthy when the step is legal.

    A legal verdict is the shared constant :data:`LEGAL` (nothing is allocated per step). An illegal
    one carries the full :class:`~validate_batch.legality.report.Report` of the normal path: ``findings`` (its
    errors), ``safe_split`` and ``report``. A step that runs a path the profiles do not model is
    falsy too, but not illegal: ``not_modelled`` names the path (and ``verdict`` says
    ``not_modelled``); :meth:`raise_if_illegal` raises :class:`NotModelled` for it.
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
    def not_modelled(self) -> tuple:
        """The step's paths the profiles do not model (empty for a legal or an illegal step)."""
        return self.report.not_modelled if self.report is not None else ()

    @property
    def verdict(self) -> str:
        """``legal``, ``illegal`` or ``not_modelled``."""
        return "legal" if self.report is None else self.report.verdict

    @property
    def safe_split(self):
        return self.report.safe_split if self.report is not None else None

    def error(self) -> BatchIllegalError | NotModelled | None:
        """The exception :meth:`raise_if_illegal` would raise (None when legal): :class:`NotModelled`
        for a step on a path not modelled that breaks no modelled limit."""
        if self.legal:
            return None
        if self.report.verdict == "not_modelled":
            return self.report.refusal()
        return BatchIllegalError(self.report)

    def raise_if_illegal(self) -> None:
        if not self.legal:
            raise self.error()

    def __repr__(self) -> str:
        if self.legal:
            return "Verdict(legal=True)"
        if self.report.verdict == "not_modelled":
            return f"Verdict(legal=False, not_modelled={[r['path'] for r in self.report.not_modelled]})"
        return f"Verdict(legal=False, codes={self.report.codes})"


LEGAL = Verdict(True)


def engine_settings(server_args: Any) -> dict:
    """The engine flags the profiles read, from a mapping or an engine's settings object (an
    SGLang ``ServerArgs`` of any release): a plain dict, to merge other settings into."""
    return _server_args(server_args)


def _server_args(server_args: Any) -> dict:
    """The engine flags the profiles read, from a mapping or an engine's settings object.

    Keys are normalized (``--chunked-prefill-size`` -> ``chunked_prefill_size``); ``None`` means
    unset (as in SGLang's ``ServerArgs``) and flags no profile reads are dropped, so
    ``vars(server_args)`` can be passed as it is. SGLang 0.5.23's ``ServerArgs`` is a msgspec
    Struct (``vars()`` is empty): a resolved one's values in effect (``resolved_dict()``) are read,
    an unresolved one's struct fields. An object from which no known engine flag can be read is an error, not an empty
    configuration.
    """
    if server_args is None:
        return {}
    if isinstance(server_args, Mapping):
        items = list(server_args.items())
        for k in server_args:
            if not isinstance(k, str):
                raise InputError("server_args", f"expected setting names as keys, got {echo(k)}")
            check_server_arg(k, f"server_args.{k}")
    else:
        items = _object_settings(server_args)
        if not any(normalize_setting(str(k)) in SETTINGS for k, _ in items):
            raise InputError("server_args", f"no engine flag could be read from a {type(server_args).__name__} "
                                            "(expected a mapping, an SGLang ServerArgs or an object with engine flags "
                                            "as attributes)")
    out = {}
    for k, v in items:
        key = normalize_setting(str(k))
        if key in BATCH_SETTINGS and v is not None:
            out[key] = v
    return out


def _object_settings(obj: Any) -> list:
    """``(name, value)`` pairs of a settings object: a ``resolved_dict()`` (SGLang 0.5.23's resolved
    values), the fields of a msgspec Struct (``__struct_fields__``), and ``vars()``."""
    resolved = getattr(obj, "resolved_dict", None)
    # only a resolved record's resolved_dict() holds the values in effect: before resolution it
    # reports the deprecated enable_dp_attention from an attention-DP width not yet derived
    if callable(resolved) and (getattr(obj, "__dict__", None) or {}).get("_resolution_finished"):
        try:
            d = resolved()
        except Exception as e:   # a record that cannot resolve: read its fields instead
            d = None
            note = f"{type(e).__name__}"
        else:
            note = ""
        if isinstance(d, Mapping):
            return list(d.items())
        if note and getattr(type(obj), "__struct_fields__", None) is None:
            raise InputError("server_args", f"resolved_dict() of the {type(obj).__name__} failed ({note})")
    items = list((getattr(obj, "__dict__", None) or {}).items())
    struct_fields = getattr(type(obj), "__struct_fields__", None)   # a msgspec Struct
    if struct_fields is not None:
        items += [(f, getattr(obj, f, None)) for f in struct_fields]
    return items


def _as_written(report: Report, b: Batch) -> Report:
    """``report`` of a dispatched step; noted (when its context is read) where the engine's chunked
    prefill would have cut a forward of that many new tokens."""
    return note_as_written(report, b) if chunk_would_apply(b) else report


# ----------------------------------------------------------------------------------- the checker
def _no_step() -> InputError:
    # None is no step: an idle step is said with the mode "idle" (or an engine object without requests)
    return InputError("step", "missing: a forward mode name (\"idle\" for an idle step), an engine object, "
                              "a Batch or a batch document; got None")


class Checker:
    """Pre-dispatch checks for one engine configuration (engine profile, GPU, server arguments).

    Build it once (it resolves and checks the configuration), then call :meth:`verdict` (or
    :meth:`assert_legal`) on every step; :meth:`check` gives the full report. Every method takes
    the step in one of three forms:

    * an engine object: an SGLang ``ScheduleBatch`` or a vLLM ``SchedulerOutput`` (duck-typed, see
      :mod:`validate_batch.inputs.adapters`);
    * a forward mode and per-request lists: ``extend_lens``, ``seq_lens``, ``prefix_lens``,
      ``req_pool_indices``, ``rids`` (lists, tuples, integer numpy arrays or CPU tensors);
    * a :class:`~validate_batch.inputs.batch.Batch` or a batch document (full path only; a document's missing
      fields are filled from the checker's configuration).

    Raises :class:`InputError` (naming the field) for malformed configuration or input.
    """

    def __init__(self, engine: Any = None, gpu: Any = None, server_args: Any = None, *,
                 model: Mapping | None = None, buffers: list | None = None, build: str | None = None,
                 split: bool = True, kernel_build: str | None = None, kernel: str | None = None):
        if model is not None and not isinstance(model, Mapping):
            raise InputError("model", f"expected a mapping of model fields, got {type(model).__name__}")
        if buffers is not None and not isinstance(buffers, (list, tuple)):
            raise InputError("buffers", f"expected a list of buffers, got {type(buffers).__name__}")
        if engine is not None and not isinstance(engine, (str, list, tuple)):
            raise InputError("engine", f"expected a profile name or a list of them, got {type(engine).__name__}")
        doc: dict = {"engine": default_profile() if engine is None else (list(engine) if isinstance(engine, tuple) else engine), "server_args": _server_args(server_args), "forward_mode": "decode",
                     "requests": [{"id": "probe", "seq_len": 1}]}
        if model:
            doc["model"] = dict(model)
        if buffers:
            doc["buffers"] = [dict(b) if isinstance(b, Mapping) else b for b in buffers]
        for name, value in (("build", build), ("kernel", kernel), ("kernel_build", kernel_build)):
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise InputError(name, f"expected a FlashMLA build name, got {value!r:.80}")
        named = {k: v for k, v in (("build", build), ("kernel", kernel), ("kernel_build", kernel_build)) if v is not None}
        if len(set(named.values())) > 1:
            raise InputError(sorted(named)[-1], "given twice: " + ", ".join(f"{k}={v!r}" for k, v in named.items())
                             + " (kernel and kernel_build are older names of build)")
        build = build or kernel or kernel_build
        if build is not None:
            doc["kernel_build"] = build
        tmpl = batch_from_dict(doc, gpu)
        self._template = replace(tmpl, server_args=MappingProxyType(dict(tmpl.server_args)),
                                 model=MappingProxyType(dict(tmpl.model)), label="", notes=())
        self.kernel = build
        self.schedule_memo = WalkMemo()  # this checker's reusable schedule walks (bounded, locked)
        self.split = split
        self.profiles = tmpl.profiles
        self.gpu = tmpl.gpu
        self.engine = [f"{n}@{v}" if v else n for n, v in tmpl.profiles]

        # Everything below depends on the configuration only.
        self._setup = engine_setup(self._template, build)
        b = self._bounds = derive_bounds(self._template, self._setup, build)
        self.versions = dict(self._setup.versions)
        self.kernel_build: str = self._setup.kernel_build     # the FlashMLA build steps are judged by
        self.static_findings = b.static_findings
        self.draft_tokens = draft_tokens(self._template)
        # the query rows of a step of one request, per mode without new-token counts (query_rows', once;
        # a mode it refuses here is absent, and such a step takes the general reading, which raises)
        self._one_request_rows = _one_request_rows(self.draft_tokens)
        # (the same table keyed by the mode members, for the engine-object reading: a member finds its
        # own key by identity, about 25 ns a step sooner than it finds its name's)
        self._one_request_rows_of = {parse_mode(m): r for m, r in self._one_request_rows.items()}
        # a vLLM profile splits a step as the backend does (engine objects are read for it)
        self.vllm_steps = any(engine_family(n) == "vllm" for n, _ in tmpl.profiles)
        # the order a vLLM profile's model runner runs the requests in (an engine object's requests are
        # listed as V1's reorder leaves them only where that runner runs)
        self.vllm_order = next((getattr(s, "order", None) for p, _, s in self._setup.parts
                                if engine_family(p.name) == "vllm"), None)
        self.mixed_chunk = bool(self._template.arg("enable_mixed_chunk", False))
        self.has_rows = b.has_rows
        self.max_rows: int | None = b.max_rows
        self.threshold: int | None = b.threshold
        self.slow_above: int | None = b.slow_above   # rows above which the build's scheduler falls back
        self.has_slots = b.has_slots
        self._decide = b.decide                       # the one bounds decision (bound once: read every step)
        self._low_slot = 1 if b.has_slots else 0     # row 0 of the request table is reserved where slots are checked
        self.max_slot: int | None = b.max_slot
        slots = self._setup.providing("slots")
        self.table_rows: int | None = slots.table_rows if slots is not None else None
        self.buffer_rows: dict = {buf.name: buf.rows for buf in slots.buffers} if slots is not None else {}
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
    def step_rows(self, mode: str, n: int, extend, num_merged_decodes: int, padded_rows) -> int:
        """Query rows of a step of ``n`` requests (:func:`validate_batch.engines.forward.query_rows`)."""
        return query_rows(mode, n, extend, num_merged_decodes, padded_rows, self.draft_tokens)

    def max_slot_of(self, slots) -> int | None:
        """The largest slot of a validated column (None when there are none), or -1 when a request
        holds the reserved row 0 under a profile that checks slots (only the full check can say
        what is wrong then)."""
        if slots is None or not count(slots):
            return None
        lo, t = min_max(slots) if isinstance(slots, np.ndarray) else (min(slots), max(slots))
        if self.has_slots and lo < 1:
            return -1
        return t

    @property
    def bounds(self):
        """The configuration's :class:`~validate_batch.legality.bounds.StepBounds` (what the fast path decides by)."""
        return self._bounds

    # ------------------------------------------------------------------------------ lists
    def _validate(self, forward_mode, extend_lens, seq_lens, req_pool_indices, prefix_lens, rids,
                  num_merged_decodes, padded_rows, as_array: bool = True):
        """The step's fields, validated (:class:`InputError` names the first bad one): ``(mode, n,
        ext, seq, pre, slots, k, pad, top)`` with ``top`` the largest slot (:meth:`max_slot_of`);
        all None for an idle step. The one reading of a step given as lists, for the verdict and
        the full check alike. ``as_array``: the columns come back as int64 arrays (what the full
        check's profiles read). Otherwise this is the verdict's reading, and it ends in the step's
        decision: the bounds' answer (:meth:`StepBounds.decide
        <validate_batch.legality.bounds.StepBounds.decide>`: True, False, or None when only the full
        check can tell) on the rows :func:`query_rows` counts and the largest slot, True for an
        idle step. It reads the columns as is fastest then: lists of plain ints stay lists, short
        integer arrays become lists, and the slot column's maximum comes from the pass that checks
        it. (A step of one request in a mode without new-token counts, the commonest small step, is
        read by :meth:`verdict` itself before this is called, with the rows this reading counts
        for it, :attr:`_one_request_rows`; what it cannot take comes here.)"""
        if forward_mode.__class__ is str and forward_mode in _CANONICAL_MODES:
            mode = forward_mode
        else:
            mode = parse_mode(forward_mode)
            if mode is None:
                return (None,) * 9 if as_array else True
        if mode == "extend" or mode == "mixed":
            if extend_lens is None:
                raise InputError("extend_lens", f"missing: {'an' if mode == 'extend' else 'a'} {mode} step needs the new "
                                                "tokens of every request")
        elif seq_lens is None and (mode != "draft_extend" or extend_lens is None):
            raise InputError("seq_lens", f"missing: a {mode} step needs every request's sequence length")
        n = None
        ext = seq = pre = slots = t = tokens = None
        # (a column of one request given as a list of one plain int is checked here when the verdict
        # reads it: a call costs more than the check)
        if extend_lens is not None:
            x = extend_lens[0] if not as_array and extend_lens.__class__ is list and len(extend_lens) == 1 else None
            if x.__class__ is int and 0 <= x <= MAX_TOKENS:
                ext, tokens = extend_lens, x
            elif as_array:
                ext = _array_column(extend_lens, "extend_lens", 0, MAX_TOKENS, None)
                tokens = total(ext)
            else:
                ext, tokens = list_column_sum(extend_lens, "extend_lens", 0, MAX_TOKENS, None)
            n = len(ext)
            if self.vllm_steps and n and (mode == "extend" or mode == "mixed") and min(ext) <= 0:
                # every request of a vLLM step has a scheduled token (the full check refuses it too)
                i = next(i for i, v in enumerate(ext) if v <= 0)
                raise InputError(f"extend_lens[{i}]", "0: every request of a vLLM step has at least one scheduled token")
        if seq_lens is not None:
            x = seq_lens[0] if not as_array and seq_lens.__class__ is list and len(seq_lens) == 1 else None
            if x.__class__ is int and 1 <= x <= MAX_POSITION and (n is None or n == 1):
                seq, n = seq_lens, 1
            else:
                seq = (_array_column if as_array else list_column)(seq_lens, "seq_lens", 1, MAX_POSITION, n)
                n = len(seq)
        if prefix_lens is not None:
            x = prefix_lens[0] if not as_array and prefix_lens.__class__ is list and n == 1 == len(prefix_lens) else None
            if x.__class__ is int and 0 <= x <= MAX_POSITION:
                pre = prefix_lens
            else:
                pre = (_array_column if as_array else list_column)(prefix_lens, "prefix_lens", 0, MAX_POSITION, n)
        if req_pool_indices is not None:
            low = self._low_slot
            x = req_pool_indices[0] if not as_array and req_pool_indices.__class__ is list and n == 1 == len(
                req_pool_indices) else None
            if x.__class__ is int and low <= x <= MAX_POSITION:
                slots, t = req_pool_indices, x
            elif as_array:
                slots = _array_column(req_pool_indices, "req_pool_indices", 0, MAX_POSITION, n)
                t = self.max_slot_of(slots)
            else:
                slots, t = list_column_top(req_pool_indices, "req_pool_indices", 0, MAX_POSITION, n, low)
        if not 0 < n <= MAX_REQUESTS:
            if not n:
                raise InputError("requests", "expected a non-empty step (an empty one is idle: pass forward_mode='idle')")
            raise InputError("requests", f"{n} requests is absurd (expected <= {MAX_REQUESTS})")
        if ext is not None:
            if n > 1 and tokens > MAX_ROWS:
                raise InputError("extend_lens", f"total extend tokens {tokens} is absurd (expected <= {MAX_ROWS})")
            if seq is not None and pre is None and (
                    bool((np.asarray(seq) < np.asarray(ext)).any()) if isinstance(seq, np.ndarray) or isinstance(ext, np.ndarray)
                    else any(map(operator.lt, seq, ext))):
                i = next(i for i, (a, e) in enumerate(zip(seq, ext)) if a < e)
                raise InputError(f"seq_lens[{i}]", "shorter than extend_lens: expected seq_len = prefix + extend tokens")
        if rids is not None:
            rids = self._rids(rids, n)
        k = num_merged_decodes
        if k.__class__ is not int or k:
            k = int_arg(k, "num_merged_decodes", 0, n)
            if k and mode != "extend" and mode != "mixed":
                raise InputError("num_merged_decodes", f"only extend / mixed steps merge running decodes, got a {mode} step")
        pad = int_arg(padded_rows, "padded_rows", 0, MAX_ROWS) if padded_rows is not None else None
        if not as_array:
            return self._decide(mode, query_rows(mode, n, ext, k, pad, self.draft_tokens), t)
        return mode, n, ext, seq, pre, slots, k, pad, t

    @staticmethod
    def _rids(rids, n: int) -> list:
        if rids.__class__ is adapters.RequestIds and len(rids) == n:
            return rids     # an engine step's own ids: read and checked when the report first names a request
        if isinstance(rids, (str, bytes)) or not hasattr(rids, "__len__") or len(rids) != n:
            raise InputError("rids", f"expected {n} request ids (one per request)")
        rids = list(rids)
        try:
            "".join(rids)               # C speed: every id is a string
            types = {str}
        except TypeError:
            types = set(map(type, rids))
        if types - {str, int}:
            i = bad_element(rids, lambda x: type(x) in (str, int))
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
        return self._template.for_step("mixed" if num_merged else mode, cols, pad)

    # ------------------------------------------------------------------------------ public API
    def verdict(self, step: Any = None, extend_lens: Any = None, seq_lens: Any = None, req_pool_indices: Any = None,
                *, forward_mode: Any = None, prefix_lens: Any = None, rids: Any = None, num_merged_decodes: int = 0,
                padded_rows: int | None = None, as_written: bool | None = None) -> Verdict:
        """Is this step legal? The fast path: no schedule, no report when it is.

        ``step`` is a forward mode name (then the lists describe the step), an engine object, a
        Batch or a batch document. Lists are per request, in row order; ``num_merged_decodes``
        says that the last N entries of an extend step are running decodes merged into it (SGLang
        mixed chunking: one row each). Returns :data:`LEGAL`, or an illegal :class:`Verdict` that
        carries the full report and safe split.
        """
        if step.__class__ is str:
            rows = self._one_request_rows.get(step)
            if (rows is not None and forward_mode is extend_lens is prefix_lens is rids is padded_rows is None
                    and num_merged_decodes.__class__ is int and not num_merged_decodes):
                # the verdict's commonest small step: one request of a mode without new-token counts,
                # its columns lists of one plain int or short integer arrays read as such (what the
                # general reading, :meth:`_validate`, accepts and returns for it)
                v = seq_lens if seq_lens.__class__ is list else short_int_list(seq_lens)
                x = v[0] if v is not None and len(v) == 1 else None
                if x.__class__ is int and 1 <= x <= MAX_POSITION:
                    if req_pool_indices is None:
                        if self._decide(step, rows, None):
                            return LEGAL
                    else:
                        v = req_pool_indices if req_pool_indices.__class__ is list else short_int_list(req_pool_indices)
                        x = v[0] if v is not None and len(v) == 1 else None
                        if x.__class__ is int and self._low_slot <= x <= MAX_POSITION and self._decide(step, rows, x):
                            return LEGAL
        elif forward_mode is None:
            decided = _sglang_decision(step, self)       # an SGLang ScheduleBatch
            if decided is _NOT_SGLANG:
                if step is None:
                    raise _no_step()
                if isinstance(step, Batch) or (not hasattr(step, "forward_mode") and is_batch_document(step)):
                    report = self.check(step, as_written=as_written)
                    return LEGAL if report.legal else Verdict(False, report)
                decided = adapters.fast_decision(step, self)
            if decided:     # legal, or idle
                return LEGAL
            report = self.check(step)
            return LEGAL if report.legal else Verdict(False, report)
        # a forward mode (the step, or named) and per-request lists: read, counted and decided
        if self._validate(step if forward_mode is None else forward_mode, extend_lens, seq_lens, req_pool_indices,
                          prefix_lens, rids, num_merged_decodes, padded_rows, False):
            return LEGAL
        # the full check reads the columns as arrays
        mode, n, ext, seq, pre, slots, k, pad, _ = self._validate(
            step if forward_mode is None else forward_mode, extend_lens, seq_lens, req_pool_indices, prefix_lens, rids,
            num_merged_decodes, padded_rows)
        report = self._check_lists(mode, n, ext, seq, pre, slots, k, pad, rids)
        return LEGAL if report.legal else Verdict(False, report)

    def _check_lists(self, mode, n, ext, seq, pre, slots, k, pad, rids) -> Report:
        cols = self._columns(mode, n, ext, seq, pre, slots, k, rids)
        b = self._batch(mode, cols, pad, k)
        return _as_written(check_engine_batch(b, build=self.kernel, split=self.split, memo=self.schedule_memo,
                                              setup=self._setup, bounds=self._bounds), b)

    def check(self, step: Any = None, extend_lens: Any = None, seq_lens: Any = None, req_pool_indices: Any = None,
              *, forward_mode: Any = None, prefix_lens: Any = None, rids: Any = None, num_merged_decodes: int = 0,
              padded_rows: int | None = None, as_written: bool | None = None) -> Report:
        """The full report of one step (schedule, every rule, safe split when illegal).

        A step given as lists, an engine object or a :class:`Batch` is what the engine dispatches:
        it is judged as written (where the engine's chunked prefill would have cut a forward of that
        many new tokens, the report's notes say so). A batch document describes a forward: one the
        engine would chunk is judged as the engine's steps (``engine_steps`` in the report, with the
        forward's own verdict under ``as_written``), unless ``as_written=True`` or the document says
        ``as_written: true``."""
        if forward_mode is None and type(step) is str:
            forward_mode = step
        elif forward_mode is None and step is None:
            raise _no_step()
        if forward_mode is not None:
            mode, n, ext, seq, pre, slots, k, pad, _ = self._validate(
                forward_mode, extend_lens, seq_lens, req_pool_indices, prefix_lens, rids, num_merged_decodes, padded_rows)
            if mode is None:
                return _idle_report()
            self.step_rows(mode, n, ext, k, pad)  # same input errors as the fast path
            return self._check_lists(mode, n, ext, seq, pre, slots, k, pad, rids)
        if isinstance(step, Batch):
            return _as_written(check_engine_batch(step, build=self.kernel, split=self.split, memo=self.schedule_memo), step)
        if is_batch_document(step):
            b = batch_from_dict(self._complete(step))
            steps = engine_steps(b)
            if as_written is None:
                as_written = step.get("as_written") is True
            if steps is not None and not as_written:    # more new tokens than one chunk: the engine's steps
                return check_engine_steps(b, steps, self.kernel, self.split)
            report = check_engine_batch(b, build=self.kernel, split=self.split, memo=self.schedule_memo)
            return note_as_written(report, b, steps) if steps is not None else report
        lists = adapters.step_lists(step, self)
        if lists is None:
            return _idle_report()
        report = self.check(lists.pop("forward_mode"), **lists)
        rids = lists.get("rids")
        if not report.legal and rids.__class__ is adapters.RequestIds:
            rids.ids()      # an illegal step's report names its requests: they are read (and checked) now
        return report

    def batch(self, forward_mode: Any, extend_lens: Any = None, seq_lens: Any = None, req_pool_indices: Any = None,
              *, prefix_lens: Any = None, rids: Any = None, num_merged_decodes: int = 0,
              padded_rows: int | None = None) -> Batch | None:
        """The :class:`~validate_batch.inputs.batch.Batch` the full path checks for these lists (None when idle)."""
        mode, n, ext, seq, pre, slots, k, pad, _ = self._validate(
            forward_mode, extend_lens, seq_lens, req_pool_indices, prefix_lens, rids, num_merged_decodes, padded_rows)
        if mode is None:
            return None
        return self._batch(mode, self._columns(mode, n, ext, seq, pre, slots, k, rids), pad, k)

    def full_legal(self, forward_mode: Any, extend_lens: Any = None, seq_lens: Any = None, req_pool_indices: Any = None,
                   *, prefix_lens: Any = None, rids: Any = None, num_merged_decodes: int = 0,
                   padded_rows: int | None = None) -> bool:
        """Whether the step is legal by the full check (every rule, schedule included; no split)."""
        if forward_mode is None:
            raise _no_step()
        b = self.batch(forward_mode, extend_lens, seq_lens, req_pool_indices, prefix_lens=prefix_lens, rids=rids,
                       num_merged_decodes=num_merged_decodes, padded_rows=padded_rows)
        if b is None:
            return True
        return check_engine_batch(b, build=self.kernel, split=False, memo=self.schedule_memo, setup=self._setup).legal

    def assert_legal(self, step: Any = None, extend_lens: Any = None, seq_lens: Any = None, req_pool_indices: Any = None,
                     **kwargs) -> Verdict:
        """The fast verdict; raises :class:`BatchIllegalError` (findings, safe split, report) when illegal."""
        v = self.verdict(step, extend_lens, seq_lens, req_pool_indices, **kwargs)
        if not v.legal:
            raise v.error()
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
                 padded_rows: int | None = None, prefix_lens: Any = None, req_pool_indices: Any = None) -> Headroom:
        """How many more query rows (prefill tokens) or requests this step can take (see
        :func:`validate_batch.guard.headroom.headroom`)."""
        return headroom(self, step, extend_lens, seq_lens, num_requests=num_requests,
                        num_running_decodes=num_running_decodes, padded_rows=padded_rows,
                        prefix_lens=prefix_lens, req_pool_indices=req_pool_indices)


_sglang_decision, _NOT_SGLANG = adapters.sglang_decision, adapters.NOT_SGLANG     # (read every step)

#: the canonical forward-mode names, each its own parse (:func:`~validate_batch.facts.names.parse_mode`)
_CANONICAL_MODES = frozenset(FORWARD_MODES)


def _one_request_rows(draft: int) -> dict:
    """``{mode name: query rows}`` of a step of one request in each mode that has no new-token counts
    (:func:`query_rows` with ``draft`` speculative tokens; a mode it refuses for them is left out)."""
    out = {}
    for mode in _CANONICAL_MODES:
        if mode != "extend" and mode != "mixed":
            try:
                out[mode.value] = query_rows(mode.value, 1, None, 0, None, draft)
            except InputError:
                pass
    return out


def _array_column(v, name: str, lo: int, hi: int, n: int | None):
    """A validated column as the full check reads it: a 1-D int64 array (:func:`column`)."""
    return column(v, name, lo, hi, n, True)


def _idle_report() -> Report:
    r = Report([])
    r.context = {"kind": "batch", "forward_mode": "idle"}
    return r


__all__ = ["Checker", "Verdict", "Headroom", "LEGAL", "engine_settings"]
