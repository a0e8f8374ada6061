"""Engine batches: the requests of one forward step, the engine's settings, and the GPU.

A batch document (JSON or YAML)::

    engine: sglang-dsv4@pre-25418     # profile[@version]; a list of profiles is allowed
    gpu: H200
    server_args: {chunked_prefill_size: 8192, enable_mixed_chunk: false}
    forward_mode: extend              # extend | decode | mixed | target_verify | draft_extend
    requests:
      - {id: r1, extend_tokens: 4096, prefix_len: 0, req_pool_idx: 1}
    running:                          # optional: running requests not in this forward
      - {id: d1, seq_len: 2000, req_pool_idx: 2}

This module validates documents into :class:`Batch`; :mod:`validate_batch.legality.pipeline` checks them.
"""
from __future__ import annotations

from collections.abc import Sequence as _SequenceABC
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any, Mapping, Sequence

from .. import _accel
from ..errors import InputError
from ..facts.fields import MAX_POSITION, MAX_REQUESTS, MAX_TOKENS, int_array_within, int_field
from ..flashmla.calls import MAX_ROWS
from ..facts.knowledge import GPU, build_record, load, resolve_gpu
from ..facts.limits import echo
from ..facts.modes import Mode
from ..facts.names import (
    BATCH_SETTINGS,
    ENV_SETTINGS,
    FORWARD_MODES,
    SETTING_FALLBACKS,
    SETTINGS,
    check_server_arg,
    check_setting_value,
    env_value,
)
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


@dataclass(frozen=True)
class Request:
    """One request of the forward. ``rows`` are its query rows in this forward (set by the profile)."""

    id: str
    extend_tokens: int = 0       # new tokens computed in this forward (extend / draft extend)
    prefix_len: int = 0          # cached prefix (extend) - not query rows
    seq_len: int | None = None   # current sequence length (decode / verify)
    req_pool_idx: int | None = None
    dp_rank: int = 0
    is_decode: bool = False      # a decode-style entry (one row, or draft tokens when verifying)
    global_slot: int | None = None   # the slot numbered across all DP ranks (req_pool_idx is the rank's own)

    @property
    def context_len(self) -> int:
        """Tokens of KV this request attends to at its last row."""
        if self.is_decode:
            return self.seq_len or 1
        return self.prefix_len + self.extend_tokens


class RequestColumns(_SequenceABC):
    """The requests of one forward held as columns, standing in for a tuple of :class:`Request`.

    A scheduler step of thousands of requests arrives as a few per-request lists; building one
    frozen object per request would cost more than checking the step. This sequence keeps the lists
    and makes a :class:`Request` only when one is asked for (indexing, iteration, equality), so it
    behaves exactly like the tuple it stands for, while the engine profiles read :meth:`arrays`.

    ``ids``: request ids (``None``: ``r0, r1, ...``); ``extend`` / ``prefix``: extend tokens and
    cached prefix per request (``prefix`` may be ``None``: all zero); ``seq``: sequence lengths
    (read by decode entries only; ``None`` when there are none); ``slot``: ``req_pool_idx`` per
    request or ``None``; requests at index ``decode_from`` and later are decode entries. The values
    are trusted: callers validate them first.
    """

    __slots__ = ("ids", "extend", "prefix", "seq", "slot", "decode_from", "_n", "_arrays")

    def __init__(self, n: int, ids=None, extend=None, prefix=None, seq=None, slot=None, decode_from: int | None = None):
        self._n = n
        self.ids = ids
        self.extend = extend
        self.prefix = prefix
        self.seq = seq
        self.slot = slot
        self.decode_from = n if decode_from is None else decode_from
        self._arrays = None

    def __len__(self) -> int:
        return self._n

    def _make(self, i: int) -> Request:
        rid = str(self.ids[i]) if self.ids is not None else f"r{i}"
        slot = int(self.slot[i]) if self.slot is not None else None
        if i >= self.decode_from:
            return Request(rid, 0, 0, int(self.seq[i]), slot, 0, True)
        return Request(rid, int(self.extend[i]), int(self.prefix[i]) if self.prefix is not None else 0, None, slot, 0, False)

    def __getitem__(self, i):
        if isinstance(i, slice):
            lo, hi, step = i.indices(self._n)
            if step == 1:
                return self.columns(lo, max(hi, lo))
            return tuple(self._make(k) for k in range(lo, hi, step))
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("request index out of range")
        return self._make(i)

    def columns(self, lo: int, hi: int) -> "RequestColumns":
        """Requests ``lo .. hi-1`` as columns again (the lists sliced, no request objects built)."""
        def cut(col):
            return None if col is None else col[lo:hi]

        ids = self.ids[lo:hi] if self.ids is not None else [f"r{k}" for k in range(lo, hi)]
        return RequestColumns(hi - lo, ids, cut(self.extend), cut(self.prefix), cut(self.seq), cut(self.slot),
                              min(max(self.decode_from - lo, 0), hi - lo))

    def total_extend(self) -> int:
        """The extend tokens of the extend entries, summed."""
        k = self.decode_from
        if not k or self.extend is None:
            return 0
        return int(np.asarray(self.extend[:k], dtype=np.int64).sum())

    def id_list(self) -> list[str]:
        """The request ids, in order."""
        return [str(x) for x in self.ids] if self.ids is not None else [f"r{k}" for k in range(self._n)]

    def __iter__(self):
        return (self._make(i) for i in range(self._n))

    def __eq__(self, other) -> bool:
        if isinstance(other, (tuple, list, RequestColumns)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"RequestColumns({self._n} requests, decode entries from {self.decode_from})"

    def contexts(self) -> np.ndarray:
        """The ``context`` column of :meth:`arrays` (decode entries only: the validated sequence
        lengths as they are, with no other column built)."""
        if self.decode_from == 0 and self._arrays is None:
            return np.asarray(self.seq, dtype=np.int64)
        return self.arrays()[2]

    def arrays(self) -> tuple:
        """``(extend, prefix, context, is_decode)`` as numpy arrays, one entry per request.

        ``context`` is :attr:`Request.context_len`: the sequence length (at least 1) of a decode
        entry, prefix + extend tokens otherwise.
        """
        if self._arrays is None:
            n, k = self._n, self.decode_from
            if k == 0:                            # decode entries only: no extend or prefix
                # (sequence lengths are validated >= 1, so they are the contexts as they are)
                zeros = np.zeros(n, dtype=np.int64)
                zeros.flags.writeable = False     # shared by extend and prefix
                self._arrays = (zeros, zeros, np.asarray(self.seq, dtype=np.int64), zeros == 0)
                return self._arrays
            ext = np.zeros(n, dtype=np.int64)
            pre = np.zeros(n, dtype=np.int64)
            if k:
                ext[:k] = self.extend[:k]
                if self.prefix is not None:
                    pre[:k] = self.prefix[:k]
            ctx = ext + pre
            is_dec = np.zeros(n, dtype=bool)
            if k < n:
                ctx[k:] = np.maximum(np.asarray(self.seq[k:], dtype=np.int64), 1)
                is_dec[k:] = True
            self._arrays = (ext, pre, ctx, is_dec)
        return self._arrays


def request_contexts(reqs) -> np.ndarray:
    """The ``context`` column of :func:`request_arrays` alone."""
    contexts = getattr(reqs, "contexts", None)
    return contexts() if contexts is not None else request_arrays(reqs)[2]


def request_arrays(reqs) -> tuple:
    """``(extend, prefix, context, is_decode)`` numpy arrays of a request sequence (see RequestColumns)."""
    arrays = getattr(reqs, "arrays", None)
    if arrays is not None:
        return arrays()
    n = len(reqs)
    ext = np.fromiter((r.extend_tokens for r in reqs), dtype=np.int64, count=n)
    pre = np.fromiter((r.prefix_len for r in reqs), dtype=np.int64, count=n)
    ctx = np.fromiter((r.context_len for r in reqs), dtype=np.int64, count=n)
    is_dec = np.fromiter((r.is_decode for r in reqs), dtype=bool, count=n)
    return ext, pre, ctx, is_dec


@dataclass(frozen=True)
class Batch:
    profiles: tuple[tuple[str, str | None], ...]   # (profile name, version or None)
    gpu: GPU
    server_args: Mapping[str, Any]
    forward_mode: Mode
    requests: tuple[Request, ...]
    running: tuple[Request, ...] = ()
    padded_rows: int | None = None
    model: Mapping[str, Any] = field(default_factory=dict)
    buffers: tuple = ()
    label: str = ""
    kernel_build: str | None = None    # the FlashMLA build it runs on (None: the engine version's)
    cuda_graph: Mapping[str, int] | None = None   # a replayed CUDA graph: captured_rows, metadata_rows
    notes: tuple = ()                  # how the input was read as the engine runs it

    def __post_init__(self):
        if self.forward_mode.__class__ is not Mode:    # a mode's name: the one type from here on
            object.__setattr__(self, "forward_mode", Mode.parse(self.forward_mode))

    def arg(self, name: str, default: Any = None) -> Any:
        v = self.server_args.get(name)
        return default if v is None else v

    def attn_dp_size(self) -> int:
        """The attention data-parallel width: ``attn_dp_size`` (SGLang 0.5.23), or, as older releases
        spell it, ``dp_size`` under ``enable_dp_attention``; 1 without attention DP."""
        width = int(self.arg("attn_dp_size", 1) or 1)
        if width > 1:
            return width
        return int(self.arg("dp_size", 1) or 1) if self.arg("enable_dp_attention", False) else 1

    @property
    def mixed(self) -> bool:
        """Running decodes are merged into this extend forward (``--enable-mixed-chunk``)."""
        if self.forward_mode.is_mixed():
            return True
        return self.forward_mode is Mode.EXTEND and bool(self.arg("enable_mixed_chunk", False)) and bool(self.running)

    def with_requests(self, reqs: Sequence[Request]) -> "Batch":
        return replace(self, requests=reqs if isinstance(reqs, RequestColumns) else tuple(reqs))

    def for_step(self, forward_mode: Mode | str, requests: Sequence[Request], padded_rows: int | None) -> "Batch":
        """This configuration with another step's mode (a :class:`Mode` or its name), requests and
        padding. The configuration was validated when this batch was made, so the copy skips the
        constructor (a guard makes one per step)."""
        if forward_mode.__class__ is not Mode:
            forward_mode = Mode.parse(forward_mode)
        b = object.__new__(Batch)
        fields = self.__dict__.copy()       # (one sized copy: an update grows an empty dict step by step)
        fields["forward_mode"], fields["requests"], fields["padded_rows"] = forward_mode, requests, padded_rows
        object.__setattr__(b, "__dict__", fields)
        return b

    def to_doc(self) -> dict:
        eng = [f"{n}@{v}" if v else n for n, v in self.profiles]
        d: dict = {"engine": eng[0] if len(eng) == 1 else eng, "gpu": self.gpu.name,
                   "server_args": dict(self.server_args), "forward_mode": self.forward_mode.value,
                   "requests": [_req_doc(r) for r in self.requests]}
        if self.running:
            d["running"] = [_req_doc(r) for r in self.running]
        if self.padded_rows is not None:
            d["padded_rows"] = self.padded_rows
        if self.model:
            d["model"] = dict(self.model)
        if self.kernel_build:
            d["kernel_build"] = self.kernel_build
        if self.cuda_graph:
            d["cuda_graph"] = dict(self.cuda_graph)
        return d


def _req_doc(r: Request) -> dict:
    d: dict = {"id": r.id}
    if r.is_decode:
        d["seq_len"] = r.seq_len
    else:
        d["extend_tokens"] = r.extend_tokens
        if r.prefix_len:
            d["prefix_len"] = r.prefix_len
    if r.req_pool_idx is not None:
        d["req_pool_idx"] = r.req_pool_idx
    if r.dp_rank:
        d["dp_rank"] = r.dp_rank
    if r.global_slot is not None:
        d["global_slot"] = r.global_slot
    return d


# ----------------------------------------------------------------------------------- parsing
MODEL_KEYS: dict[str, tuple[type, int]] = {
    "h_q": (int, 1), "num_attention_heads": (int, 1), "context_length": (int, 1), "index_kpool": (int, 0),
    "tail_extra_slots": (int, 0), "dsa_tails": (bool, 0), "model_type": (str, 0),
}
BUFFER_KEYS = {"name", "rows", "rows_from", "plus", "scope", "indexed_by"}
#: a replayed CUDA graph: the query rows it was captured with, and the rows its FlashMLA metadata
#: was computed for (default: the captured rows)
CUDA_GRAPH_KEYS = ("captured_rows", "metadata_rows")

REQUEST_KEYS = {"id", "rid", "extend_tokens", "extend_len", "new_tokens", "prefix_len", "cached_tokens",
                "seq_len", "req_pool_idx", "slot", "global_slot", "dp_rank", "kind", "output_len"}


# The common shapes of a request entry, read as columns (see request_columns): keys in column order.
_DECODE_SHAPES = {frozenset(k): k for k in (("id", "seq_len"), ("id", "seq_len", "req_pool_idx"))}
_EXTEND_SHAPES = {frozenset(k): k for k in (("id", "extend_tokens"), ("id", "extend_tokens", "prefix_len"),
                                            ("id", "extend_tokens", "req_pool_idx"),
                                            ("id", "extend_tokens", "prefix_len", "req_pool_idx"))}
_LIMITS = {"seq_len": (1, MAX_POSITION), "extend_tokens": (0, MAX_TOKENS), "prefix_len": (0, MAX_POSITION),
           "req_pool_idx": (0, MAX_POSITION)}


def request_columns(raw: list) -> RequestColumns | None:
    """The requests of a document as columns, when every entry is a plain object of one common
    shape (all ``{id, seq_len[, req_pool_idx]}`` or all ``{id, extend_tokens[, prefix_len][,
    req_pool_idx]}``, string ids, integer values in range): the same requests
    :func:`parse_request` makes, read with a few C-speed passes instead of one object each. None
    for anything else (the caller then parses entry by entry, which names any problem)."""
    first = raw[0]
    if first.__class__ is not dict:
        return None
    keys = frozenset(first)
    shape = _DECODE_SHAPES.get(keys) or _EXTEND_SHAPES.get(keys)
    if shape is None:
        return None
    n = len(raw)
    c = _accel.compiled
    if c is not None:
        got = c.dict_columns(raw, shape)
        if got is None:
            return None
        cols = dict(zip(shape, got))
    else:
        if set(map(type, raw)) != _DICT_TYPES or sum(map(len, raw)) != len(shape) * n:
            return None
        try:     # every entry holds each key of the shape and no other (the lengths add up)
            cols = {k: list(map(itemgetter(k), raw)) for k in shape}
        except KeyError:
            return None
    ids = cols["id"]
    if set(map(type, ids)) != _STR_TYPES:
        return None
    arrays = {}
    for k in shape[1:]:
        a = int_array_within(cols[k], *_LIMITS[k])
        if a is None:
            return None
        arrays[k] = a
    slots = arrays.get("req_pool_idx")
    if "seq_len" in arrays:
        return RequestColumns(n, ids, None, None, arrays["seq_len"], slots, 0)
    return RequestColumns(n, ids, arrays["extend_tokens"], arrays.get("prefix_len"), None, slots, n)


_DICT_TYPES, _STR_TYPES = frozenset({dict}), frozenset({str})


def parse_request(d: Any, where: str, default_decode: bool, index: int) -> Request:
    if not isinstance(d, Mapping):
        raise InputError(where, f"expected an object with id / extend_tokens / seq_len / req_pool_idx, got {echo(d)}")
    for k in d:
        if k not in REQUEST_KEYS:
            raise InputError(f"{where}.{k}", f"unknown field (known: {', '.join(sorted(REQUEST_KEYS))})")
    rid = d.get("id", d.get("rid", f"r{index}"))
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise InputError(f"{where}.id", f"expected a string, got {echo(rid)}")
    ext_key = next((k for k in ("extend_tokens", "extend_len", "new_tokens") if k in d), "extend_tokens")
    kind = d.get("kind")
    if kind not in (None, "extend", "decode"):
        raise InputError(f"{where}.kind", f"expected \"extend\" or \"decode\", got {echo(kind)}")
    is_decode = kind == "decode" or (kind is None and default_decode and ext_key not in d) or (
        kind is None and "seq_len" in d and ext_key not in d)
    extend = int_field(d, ext_key, where, 0, MAX_TOKENS, 0 if is_decode else ...)
    prefix = int_field(d, "prefix_len" if "prefix_len" in d else "cached_tokens", where, 0, MAX_POSITION, 0)
    seq_len = int_field(d, "seq_len", where, 1, MAX_POSITION, None)
    if is_decode and seq_len is None:
        seq_len = prefix + 1 if prefix else None
        if seq_len is None:
            raise InputError(f"{where}.seq_len", "missing (a decode entry needs its current sequence length)")
    slot = int_field(d, "req_pool_idx" if "req_pool_idx" in d else "slot", where, 0, MAX_POSITION, None)
    dp_rank = int_field(d, "dp_rank", where, 0, 4096, 0)
    gslot = int_field(d, "global_slot", where, 0, MAX_POSITION, None)
    return Request(str(rid), extend, prefix, seq_len, slot, dp_rank, is_decode, gslot)


def default_profile() -> str:
    """The engine profile used when none is named (``rules/engines.json``)."""
    return load("engines")["default_profile"]


def parse_engine(spec: Any) -> tuple[tuple[str, str | None], ...]:
    data = load("engines")
    specs = spec if isinstance(spec, list) else [spec]
    if not specs:
        raise InputError("engine", "expected at least one engine profile, got an empty list")
    out = []
    for i, s in enumerate(specs):
        where = "engine" if not isinstance(spec, list) else f"engine[{i}]"
        if not isinstance(s, str) or not s.strip():
            raise InputError(where, f"expected a profile name like 'sglang-dsv4@0.5.12', got {echo(s)}")
        name, at, version = s.strip().partition("@")
        if at and not version.strip():
            raise InputError(where, f"{echo(s)} names no version after '@' (write {name}@latest, a release, or "
                                    f"{name} alone)")
        name = data["aliases"].get(name, name)
        if name not in data["profiles"]:
            raise InputError(where, f"unknown engine profile {echo(name)}; known: {', '.join(data['profiles'])}")
        out.append((name, version or None))
    return tuple(out)


def default_gpu(profiles: Sequence[tuple[str, str | None]]) -> str:
    """The GPU a batch without one runs on: the first profile's ``default_gpu`` (a backend that runs
    only on one architecture), else H200."""
    entries = load("engines")["profiles"]
    return next((entries[n]["default_gpu"] for n, _ in profiles if "default_gpu" in entries[n]), "H200")


def batch_from_dict(doc: Any, gpu: Any = None) -> Batch:
    """Validate a batch document. Raises :class:`InputError` naming the bad field."""
    if not isinstance(doc, Mapping):
        raise InputError("batch", f"expected an object, got {type(doc).__name__}")
    allowed = {"engine", "profile", "gpu", "server_args", "env", "forward_mode", "requests", "running",
               "padded_rows", "model", "buffers", "label", "name", "expected", "kernel_build", "cuda_graph",
               "as_written"}
    for k in doc:
        if k not in allowed:
            raise InputError(str(k), f"unknown field (known: {', '.join(sorted(allowed))})")
    if "engine" not in doc and "profile" not in doc:
        raise InputError("engine", "missing (an engine profile such as sglang-dsv4 or sglang-slots)")
    if "as_written" in doc and not isinstance(doc["as_written"], bool):
        raise InputError("as_written", f"expected true or false, got {echo(doc['as_written'])}")
    profiles = parse_engine(doc.get("engine", doc.get("profile")))
    g = resolve_gpu(gpu if gpu is not None else doc.get("gpu", default_gpu(profiles)))
    sa_raw = doc.get("server_args") or {}
    if not isinstance(sa_raw, Mapping):
        raise InputError("server_args", f"expected an object of engine flags, got {echo(sa_raw)}")
    sa: dict[str, Any] = {}
    for k, v in sa_raw.items():
        if not isinstance(k, str):
            raise InputError("server_args", f"expected setting names as keys, got {echo(k)}")
        key = check_server_arg(k, f"server_args.{k}")
        typ = BATCH_SETTINGS.get(key)
        if key in ENV_SETTINGS and isinstance(v, (str, int)) and not isinstance(v, bool):
            v = env_value(key, v, f"server_args.{key}")     # as set in the environment: "0", "1", "v41"
        if typ is not None:
            types = typ if isinstance(typ, tuple) else (typ,)
            ok = isinstance(v, types) and not (bool not in types and isinstance(v, bool))
            if not ok:
                names = "/".join("null" if t is type(None) else t.__name__ for t in types)
                raise InputError(f"server_args.{key}", f"expected {names}, got {echo(v)}")
            if isinstance(v, int) and not isinstance(v, bool) and v < 0 and "min" not in SETTINGS.get(key, {}):
                raise InputError(f"server_args.{key}", f"expected >= 0, got {echo(v)}")
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1 << 63:
            raise InputError(f"server_args.{key}", f"{echo(v)} is absurd (expected < 2**63)")
        check_setting_value(key, v, f"server_args.{key}")
        sa[key] = v
    for key, old in SETTING_FALLBACKS.items():       # a release's new name, from the older spelling
        if sa.get(key) is None and sa.get(old) is not None:
            sa[key] = sa[old]
    env_raw = doc.get("env") or {}
    if not isinstance(env_raw, Mapping):
        raise InputError("env", f"expected an object of environment switches, got {echo(env_raw)}")
    for k, v in env_raw.items():
        if k not in ENV_SETTINGS:
            raise InputError(f"env.{k}", f"unknown environment switch (known: {', '.join(sorted(ENV_SETTINGS))})")
        sa[k] = env_value(k, v, f"env.{k}")
    mode = doc.get("forward_mode")
    if mode is None:
        raise InputError("forward_mode", f"missing (one of {', '.join(FORWARD_MODES)})")
    mode = Mode.parse(mode, "forward_mode")
    notes: tuple = ()
    spec = speculative_algorithm(sa)
    if mode.is_decode() and spec is not None:
        mode = Mode.TARGET_VERIFY
        notes = (f"forward_mode decode runs as target_verify: with speculative_algorithm {spec} the engine verifies "
                 f"every decode step on the target model (batch size x speculative_num_draft_tokens rows)",)
    reqs_raw = doc.get("requests")
    if not isinstance(reqs_raw, list) or not reqs_raw:
        raise InputError("requests", "expected a non-empty list of requests in this forward")
    if len(reqs_raw) > MAX_REQUESTS:
        raise InputError("requests", f"{len(reqs_raw)} requests is absurd (expected <= {MAX_REQUESTS})")
    default_decode = mode.is_decode_or_verify()
    reqs = request_columns(reqs_raw)
    if reqs is None:
        reqs = tuple(parse_request(r, f"requests[{i}]", default_decode, i) for i, r in enumerate(reqs_raw))
    if default_decode:
        # each request of a decode or verify forward decodes (or verifies) on top of its sequence: a
        # new-token count there contradicts the forward instead of being read
        first = (0 if reqs.decode_from > 0 else None) if isinstance(reqs, RequestColumns) else \
            next((i for i, r in enumerate(reqs) if not r.is_decode), None)
        if first is not None:
            raise InputError(f"requests[{first}].extend_tokens", f"a request with new tokens in a {mode.value} forward, "
                                                                 "whose requests each take their seq_len (use forward_mode "
                                                                 "extend or mixed for new tokens)")
    ids = reqs.ids if isinstance(reqs, RequestColumns) else [r.id for r in reqs]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise InputError("requests", f"duplicate request id {echo(dup)}")
    if (reqs.total_extend() if isinstance(reqs, RequestColumns) else sum(r.extend_tokens for r in reqs)) > MAX_ROWS:
        raise InputError("requests", f"total extend tokens {sum(r.extend_tokens for r in reqs)} is absurd (expected <= {MAX_ROWS})")
    running_raw = doc.get("running") or []
    if not isinstance(running_raw, list):
        raise InputError("running", "expected a list of running requests")
    if len(running_raw) > MAX_REQUESTS:
        raise InputError("running", f"{len(running_raw)} running requests is absurd (expected <= {MAX_REQUESTS})")
    running = (request_columns(running_raw) if running_raw else None) or \
        tuple(parse_request(r, f"running[{i}]", True, i) for i, r in enumerate(running_raw))
    padded = int_field(doc, "padded_rows", "batch", 0, MAX_ROWS, None) if "padded_rows" in doc else None
    model = doc.get("model") or {}
    if not isinstance(model, Mapping):
        raise InputError("model", f"expected an object, got {echo(model)}")
    for k, v in model.items():
        rule = MODEL_KEYS.get(k)
        if rule is None:
            raise InputError(f"model.{k}", f"unknown field (known: {', '.join(sorted(MODEL_KEYS))})")
        typ, lo = rule
        if typ is bool:
            if not isinstance(v, bool):
                raise InputError(f"model.{k}", f"expected true or false, got {echo(v)}")
        elif typ is str:
            if not isinstance(v, str) or not v.strip():
                raise InputError(f"model.{k}", f"expected a name such as deepseek_v41, got {echo(v)}")
        else:
            int_field(model, k, "model", lo, MAX_TOKENS * 64)
    buffers = doc.get("buffers") or []
    if not isinstance(buffers, list):
        raise InputError("buffers", "expected a list of {name, rows | rows_from, plus, scope, indexed_by}")
    for i, ub in enumerate(buffers):
        where = f"buffers[{i}]"
        if not isinstance(ub, Mapping) or not isinstance(ub.get("name"), str):
            raise InputError(where, "expected {name, rows | rows_from, plus, scope, indexed_by} with a string name")
        for k, v in ub.items():
            if k not in BUFFER_KEYS:
                raise InputError(f"{where}.{k}", f"unknown field (known: {', '.join(sorted(BUFFER_KEYS))})")
            if k in ("rows", "plus"):
                int_field(ub, k, where, 0, MAX_TOKENS * 64)
            elif k != "name" and not isinstance(v, str):
                raise InputError(f"{where}.{k}", f"expected a string, got {echo(v)}")
    label = doc.get("label") or doc.get("name") or ""
    kb = doc.get("kernel_build")
    if kb is not None:
        if not isinstance(kb, str):
            raise InputError("kernel_build", f"expected a FlashMLA build name, got {echo(kb)}")
        kb = build_record(kb)["name"]
    graph = parse_cuda_graph(doc.get("cuda_graph"))
    if graph is not None and padded is None:
        padded = graph["captured_rows"]     # a replayed graph runs its captured rows (padding up to them)
    return Batch(profiles, g, sa, mode, reqs, running, padded, dict(model), tuple(buffers), str(label), kb, graph, notes)


def parse_cuda_graph(v: Any) -> dict | None:
    """``cuda_graph: {captured_rows, metadata_rows}`` validated (None when absent)."""
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise InputError("cuda_graph", f"expected an object with {', '.join(CUDA_GRAPH_KEYS)}, got {echo(v)}")
    for k in v:
        if k not in CUDA_GRAPH_KEYS:
            raise InputError(f"cuda_graph.{k}", f"unknown field (known: {', '.join(CUDA_GRAPH_KEYS)})")
    captured = int_field(v, "captured_rows", "cuda_graph", 1, MAX_ROWS)
    return {"captured_rows": captured, "metadata_rows": int_field(v, "metadata_rows", "cuda_graph", 0, MAX_ROWS, captured)}


def speculative_algorithm(server_args: Mapping[str, Any]) -> str | None:
    """The speculative-decoding algorithm the settings turn on (None: off). SGLang's scheduler keeps
    a speculative decode step's forward mode DECODE; its speculative worker runs the target model's
    verify forward over every draft token."""
    alg = server_args.get("speculative_algorithm")
    if alg is None or not isinstance(alg, str) or alg.strip().upper() in ("", "NONE", "NULL"):
        return None
    return alg.strip()


def is_batch_document(doc: Any) -> bool:
    return isinstance(doc, Mapping) and ("requests" in doc or "engine" in doc or "forward_mode" in doc)


def is_batch_like(obj: Any) -> bool:
    return isinstance(obj, Batch) or is_batch_document(obj)
