"""Kernel calls: one FlashMLA invocation each, validated field by field.

The input format is the oracle record format (see the README): ``kind`` ("sparse" | "dense" |
"prefill"), ``b``, ``s_q``, ``h_q``, ``d_qk``, ``topk``, optional per-request ``topk_length``,
``extra_topk`` / ``extra_topk_length``, ``page`` / ``extra_page``, and ``seqlens`` for dense calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import InputError
from ..facts.fields import bool_field, field_name, int_array_within, int_field, min_max
from ..facts.limits import echo
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())

INT32_MAX = 2**31 - 1
# Sizes beyond these are not batches any GPU could hold; they are rejected as input errors before
# anything is allocated or looped over.
MAX_ROWS = 1 << 24          # query rows (b); 16.7 M rows of q would already be >= 16 GiB
MAX_S_Q = 1 << 16
MAX_HEADS = 1 << 12
MAX_TOPK = 1 << 24
MAX_PAGE = 1 << 20

# Keys that may appear in a record but are outputs or bookkeeping, not inputs.
IGNORED_KEYS = frozenset({
    "i", "id", "name", "label", "tile_scheduler_metadata", "num_splits", "error", "outcome",
    "exit_code", "message", "verdict", "note", "expected",
})
DECODE_KEYS = frozenset({
    "kind", "b", "s_q", "h_q", "h_k", "d_qk", "d_v", "topk", "topk_length", "extra_topk",
    "extra_topk_length", "page", "extra_page", "seqlens", "is_fp8", "causal", "bytes_per_token",
    "kv_stride", "kv_base_align", "use_legacy", "entry", "enable_batch_invariant", "block_table", "num_blocks",
})
#: the largest block table a record may carry (b x width entries)
MAX_BLOCK_TABLE = 1 << 24
PREFILL_KEYS = frozenset({"kind", "s_q", "h_q", "h_kv", "d_qk", "d_v", "topk", "s_kv", "use_legacy"})
#: decode entry points a record may name: the call itself (scheduler run inside it), the hoisted
#: metadata op of the builds that have one, and the dense fp8 attention kernel (scheduled by that op)
ENTRIES = ("flash_mla_with_kvcache", "get_mla_decoding_metadata", "fwd_kvcache_mla_fp8")
DENSE_FP8_ENTRIES = ("get_mla_decoding_metadata", "fwd_kvcache_mla_fp8")
KINDS = ("sparse", "dense", "dense_fp8", "prefill")


def block_table_field(rec: Mapping[str, Any], b: int, prefix: str) -> np.ndarray | None:
    """A dense call's ``block_table``: ``b`` rows of one width, int32 page numbers (-1 allowed: the
    padding engines write), as an int64 ``[b, width]`` array; None when absent."""
    v = rec.get("block_table")
    if v is None:
        return None
    where = field_name(prefix, "block_table")
    if not isinstance(v, (list, tuple, np.ndarray)) or len(v) != b:
        raise InputError(where, f"expected b={b} rows of page numbers, got "
                         f"{len(v) if isinstance(v, (list, tuple, np.ndarray)) else type(v).__name__}")
    rows = [int_vector(r, len(r) if isinstance(r, (list, tuple, np.ndarray)) else -1, f"{where}[{i}]")
            for i, r in enumerate(v)]
    widths = {r.shape[0] for r in rows}
    if len(widths) != 1 or 0 in widths:
        raise InputError(where, f"expected rows of one non-zero width, got widths {sorted(widths)[:4]}")
    if b * widths.pop() > MAX_BLOCK_TABLE:
        raise InputError(where, f"expected at most {MAX_BLOCK_TABLE} entries, got {b} rows of {rows[0].shape[0]}")
    return np.stack(rows)


def int_vector(v: Any, n: int, where: str, lo: int = -INT32_MAX - 1, hi: int = INT32_MAX) -> np.ndarray:
    """Validate a per-request integer list of length ``n`` and return it as int64 numpy."""
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or not np.issubdtype(v.dtype, np.integer):
            raise InputError(where, f"expected a 1-D integer array, got dtype {v.dtype} shape {v.shape}")
        arr = v.astype(np.int64, copy=False)
    elif isinstance(v, (list, tuple)):
        if len(v) != n:
            raise InputError(where, f"expected a list of length b={n}, got length {len(v)}")
        fast = int_array_within(v if v.__class__ is list else list(v), lo, hi)   # the common case, in one pass
        if fast is not None:
            return fast
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
                raise InputError(f"{where}[{i}]", f"expected an integer, got {echo(x)}")
        try:
            arr = np.array(v, dtype=np.int64)
        except OverflowError:
            raise InputError(where, "values must fit in int32") from None
    else:
        raise InputError(where, f"expected a list of integers, got {type(v).__name__}")
    if arr.shape[0] != n:
        raise InputError(where, f"expected a list of length b={n}, got length {arr.shape[0]}")
    if n:
        mn, mx = min_max(arr)
        if mn < lo or mx > hi:
            bad = int(np.argmax((arr < lo) | (arr > hi)))
            raise InputError(f"{where}[{bad}]", f"expected {lo}..{hi}, got {int(arr[bad])}")
    return arr


LENGTH_FIELDS = ("topk_length", "extra_topk_length")


class cached:
    """A property computed on first use and kept in the instance's ``__dict__`` (where later
    lookups find it before this descriptor). What ``functools.cached_property`` does, without
    its per-access lock on Python < 3.12; a value computed twice by racing threads is the same
    value (the functions are pure)."""

    def __init__(self, func):
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value


@dataclass(frozen=True, eq=False)
class DecodeCall:
    """One ``flash_mla_with_kvcache`` call: ``q`` is ``[b, s_q, h_q, d_qk]``.

    ``topk_length``/``extra_topk_length``/``seqlens`` are int64 numpy arrays of length ``b`` or None.
    """

    kind: str                      # "sparse" or "dense"
    b: int
    s_q: int
    h_q: int
    d_qk: int = 576
    h_k: int = 1
    d_v: int = 512
    topk: int | None = None
    topk_length: np.ndarray | None = None
    extra_topk: int | None = None
    extra_topk_length: np.ndarray | None = None
    page: int = 64
    extra_page: int | None = None
    seqlens: np.ndarray | None = None
    is_fp8: bool = True
    causal: bool = False
    bytes_per_token: int | None = None
    kv_stride: int | None = None
    kv_base_align: int | None = None
    label: str = ""
    meta: dict = field(default_factory=dict)
    use_legacy: bool | None = None       # builds with two kernel halves: which one (None: the build's default)
    entry: str = "flash_mla_with_kvcache"
    enable_batch_invariant: bool = False  # the current kernels then never split the KV
    block_table: np.ndarray | None = None  # dense calls, optional: [b, width] int64, the pages of each request
    num_blocks: int | None = None          # dense calls, optional: pages in the KV pool (valid pages: 0 .. num_blocks-1)

    @property
    def is_sparse(self) -> bool:
        return self.kind == "sparse"

    @cached
    def length_ranges(self) -> dict[str, tuple[int, int]]:
        """``{field: (min, max)}`` of the per-request length arrays that are present and non-empty.

        Exact, read off the arrays on first use; code that builds a call from values whose range it
        already knows (an engine profile deriving the lengths from sequence lengths by monotone
        maps) fills it in with :func:`with_length_ranges` instead. The rules and the effective
        lengths read it: a constant array behaves as a scalar, and a range inside the cache width
        needs no per-element check.
        """
        out = {}
        for name in LENGTH_FIELDS:
            a = getattr(self, name)
            if a is not None and a.shape[0]:
                out[name] = min_max(a)
        return out

    @property
    def has_extra(self) -> bool:
        return self.extra_topk is not None

    def to_record(self) -> dict:
        """The call in the oracle record format (lists as plain ints)."""
        rec: dict[str, Any] = {"kind": self.kind, "b": self.b, "s_q": self.s_q, "h_q": self.h_q}
        if self.kind == "sparse":
            rec["d_qk"] = self.d_qk
            rec["topk"] = self.topk
            if self.topk_length is not None:
                rec["topk_length"] = self.topk_length.tolist()
            if self.extra_topk is not None:
                rec["extra_topk"] = self.extra_topk
                if self.extra_topk_length is not None:
                    rec["extra_topk_length"] = self.extra_topk_length.tolist()
                if self.extra_page is not None:
                    rec["extra_page"] = self.extra_page
        else:
            rec["seqlens"] = self.seqlens.tolist() if self.seqlens is not None else None
            if self.block_table is not None:
                rec["block_table"] = self.block_table.tolist()
            if self.num_blocks is not None:
                rec["num_blocks"] = self.num_blocks
        if self.use_legacy is not None:
            rec["use_legacy"] = self.use_legacy
        if self.entry != "flash_mla_with_kvcache":
            rec["entry"] = self.entry
        if self.enable_batch_invariant:
            rec["enable_batch_invariant"] = True
        rec["page"] = self.page
        if self.h_k != 1:
            rec["h_k"] = self.h_k
        if self.label:
            rec["label"] = self.label
        return rec

    def with_rows(self, b: int, topk_length, extra_topk_length, ranges: dict | None = None) -> "DecodeCall":
        """This call with ``b`` rows and these per-row lengths, every other field the same.

        The fields were validated when this call was made, so the copy skips the constructor;
        ``ranges``: the exact ``(min, max)`` of the length arrays when the caller knows them
        (see :attr:`length_ranges`)."""
        call = object.__new__(DecodeCall)
        fields = self.__dict__.copy()       # (one sized copy: an update grows an empty dict step by step)
        fields.pop("length_ranges", None)
        fields["b"] = b
        fields["topk_length"] = topk_length
        fields["extra_topk_length"] = extra_topk_length
        fields["meta"] = {}
        if ranges is not None:
            fields["length_ranges"] = ranges
        object.__setattr__(call, "__dict__", fields)
        return call

    def light(self) -> "DecodeCall":
        """A copy whose per-row arrays are replaced by their counts (for summaries of large calls)."""
        call = object.__new__(DecodeCall)
        call.__dict__.update(self.__dict__)
        for k in LENGTH_FIELDS:
            v = call.__dict__[k]
            if v is not None:
                call.__dict__[k] = RowCount(len(v))
        return call

    def summary(self) -> str:
        if self.kind != "sparse":
            return f"{self.kind} b={self.b} s_q={self.s_q} h_q={self.h_q}"
        extra = f" extra_topk={self.extra_topk}" if self.extra_topk is not None else ""
        tl = " topk_length=[..]" if self.topk_length is not None else ""
        return f"sparse b={self.b} s_q={self.s_q} h_q={self.h_q} d_qk={self.d_qk} topk={self.topk}{tl}{extra}"


class RowCount:
    """Stands in for a per-row array in a call record: its ``tolist()`` is the summary text."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = n

    def tolist(self) -> str:
        return f"[{self.n} per-row values]"


@dataclass(frozen=True)
class SparsePrefillCall:
    """One ``flash_mla_sparse_fwd`` call: q ``[s_q, h_q, d_qk]``, indices ``[s_q, h_kv, topk]``."""

    s_q: int
    h_q: int
    d_qk: int = 512
    topk: int = 512
    h_kv: int = 1
    d_v: int = 512
    s_kv: int | None = None
    label: str = ""
    kind: str = "prefill"
    use_legacy: bool | None = None

    def to_record(self) -> dict:
        rec = {"kind": "prefill", "s_q": self.s_q, "h_q": self.h_q, "d_qk": self.d_qk, "topk": self.topk}
        if self.use_legacy is not None:
            rec["use_legacy"] = self.use_legacy
        if self.label:
            rec["label"] = self.label
        return rec

    def summary(self) -> str:
        return f"sparse prefill s_q={self.s_q} h_q={self.h_q} d_qk={self.d_qk} topk={self.topk}"

    def with_rows(self, b: int, topk_length=None, extra_topk_length=None, ranges: dict | None = None) -> "SparsePrefillCall":
        """This call with ``b`` query rows (``s_q``), every other field the same (the same interface as
        :meth:`DecodeCall.with_rows`; a prefill call has no per-row length arrays, so none may be given).
        The fields were validated when this call was made, so the copy skips the constructor."""
        if topk_length is not None or extra_topk_length is not None or ranges is not None:
            raise ValueError("a sparse prefill call has no per-row length arrays")
        call = object.__new__(SparsePrefillCall)
        fields = self.__dict__.copy()
        fields["s_q"] = b
        object.__setattr__(call, "__dict__", fields)
        return call


KernelCall = DecodeCall | SparsePrefillCall


def with_length_ranges(call: DecodeCall, ranges: dict[str, tuple[int, int]]) -> DecodeCall:
    """Record the known exact ``(min, max)`` of the call's length arrays (see
    :attr:`DecodeCall.length_ranges`); returns the call."""
    call.__dict__["length_ranges"] = ranges
    return call


def _check_keys(rec: Mapping[str, Any], allowed: frozenset, prefix: str) -> None:
    for key in rec:
        if key not in allowed and key not in IGNORED_KEYS:
            raise InputError(field_name(prefix, str(key)), f"unknown field (known: {', '.join(sorted(allowed))})")


def call_from_record(rec: Any, prefix: str = "") -> KernelCall:
    """Parse and validate one call record. Raises :class:`InputError` naming the bad field."""
    if not isinstance(rec, Mapping):
        raise InputError(prefix or "call", f"expected a JSON object, got {type(rec).__name__}")
    kind = rec.get("kind", "sparse" if "topk" in rec else ("dense" if "seqlens" in rec else None))
    if kind not in KINDS:
        raise InputError(field_name(prefix, "kind"), f"expected one of {', '.join(KINDS)}, got {echo(kind)}")
    use_legacy = rec.get("use_legacy")
    if use_legacy is not None and not isinstance(use_legacy, bool):
        raise InputError(field_name(prefix, "use_legacy"), f"expected true or false, got {echo(use_legacy)}")
    if kind == "prefill":
        _check_keys(rec, PREFILL_KEYS, prefix)
        return SparsePrefillCall(
            s_q=int_field(rec, "s_q", prefix, 0, MAX_ROWS),
            h_q=int_field(rec, "h_q", prefix, 1, MAX_HEADS),
            d_qk=int_field(rec, "d_qk", prefix, 1, 4096, 512),
            topk=int_field(rec, "topk", prefix, 1, MAX_TOPK, 512),
            h_kv=int_field(rec, "h_kv", prefix, 1, MAX_HEADS, 1),
            d_v=int_field(rec, "d_v", prefix, 1, 4096, 512),
            s_kv=int_field(rec, "s_kv", prefix, 1, INT32_MAX, None),
            label=str(rec.get("label", rec.get("name", "")) or ""),
            use_legacy=use_legacy,
        )
    _check_keys(rec, DECODE_KEYS, prefix)
    b = int_field(rec, "b", prefix, 1, MAX_ROWS)
    s_q = int_field(rec, "s_q", prefix, 1, MAX_S_Q)
    h_q = int_field(rec, "h_q", prefix, 1, MAX_HEADS)
    h_k = int_field(rec, "h_k", prefix, 1, MAX_HEADS, 1)
    common = dict(
        b=b, s_q=s_q, h_q=h_q, h_k=h_k,
        d_v=int_field(rec, "d_v", prefix, 1, 4096, 512),
        page=int_field(rec, "page", prefix, 1, MAX_PAGE, 64),
        bytes_per_token=int_field(rec, "bytes_per_token", prefix, 1, 1 << 16, None),
        kv_stride=int_field(rec, "kv_stride", prefix, 1, 1 << 62, None),
        kv_base_align=int_field(rec, "kv_base_align", prefix, 1, 1 << 20, None),
        causal=bool_field(rec, "causal", prefix, False),
        label=str(rec.get("label", rec.get("name", "")) or ""),
        use_legacy=use_legacy,
        entry=_entry(rec, prefix, kind),
        enable_batch_invariant=bool_field(rec, "enable_batch_invariant", prefix, False),
    )
    if kind in ("dense", "dense_fp8"):
        for key in ("topk", "topk_length", "extra_topk", "extra_topk_length"):
            if rec.get(key) is not None:
                raise InputError(field_name(prefix, key), "only sparse calls take this field (dense calls use seqlens)")
        if rec.get("seqlens") is None:
            raise InputError(field_name(prefix, "seqlens"), "missing (dense calls need cache_seqlens, one per request)")
        seqlens = int_vector(rec["seqlens"], b, field_name(prefix, "seqlens"), 0, INT32_MAX)
        return DecodeCall(kind=kind, d_qk=int_field(rec, "d_qk", prefix, 1, 4096, 576), seqlens=seqlens,
                          is_fp8=bool_field(rec, "is_fp8", prefix, kind == "dense_fp8"),
                          block_table=block_table_field(rec, b, prefix),
                          num_blocks=int_field(rec, "num_blocks", prefix, 1, INT32_MAX, None), **common)
    for key in ("block_table", "num_blocks"):
        if rec.get(key) is not None:
            raise InputError(field_name(prefix, key), "only dense calls take this field (sparse calls use indices)")
    if rec.get("seqlens") is not None:
        if common["entry"] != "get_mla_decoding_metadata":
            raise InputError(field_name(prefix, "seqlens"), "only dense calls take seqlens (sparse calls use topk/topk_length)")
        int_vector(rec["seqlens"], b, field_name(prefix, "seqlens"), 0, INT32_MAX)  # the op's cache_seqlens: checked, not scheduled
    topk = int_field(rec, "topk", prefix, 1, MAX_TOPK)
    tl = rec.get("topk_length")
    topk_length = None if tl is None else int_vector(tl, b, field_name(prefix, "topk_length"))
    extra_topk = int_field(rec, "extra_topk", prefix, 1, MAX_TOPK, None)
    etl = rec.get("extra_topk_length")
    if etl is not None and extra_topk is None:
        raise InputError(field_name(prefix, "extra_topk_length"), "given without extra_topk")
    extra_topk_length = None if etl is None else int_vector(etl, b, field_name(prefix, "extra_topk_length"))
    extra_page = int_field(rec, "extra_page", prefix, 1, MAX_PAGE, None)
    if common["entry"] == "get_mla_decoding_metadata" and (tl is not None or extra_topk is not None):
        raise InputError(field_name(prefix, "entry"), "get_mla_decoding_metadata schedules sparse calls by the "
                         "constant topk: it takes no topk_length and no extra cache")
    return DecodeCall(kind="sparse", d_qk=int_field(rec, "d_qk", prefix, 1, 4096, 576), topk=topk,
                      topk_length=topk_length, extra_topk=extra_topk, extra_topk_length=extra_topk_length,
                      extra_page=extra_page, is_fp8=bool_field(rec, "is_fp8", prefix, True), **common)


def _entry(rec: Mapping[str, Any], prefix: str, kind: str) -> str:
    entry = rec.get("entry", ENTRIES[0])
    if entry not in ENTRIES:
        raise InputError(field_name(prefix, "entry"), f"expected one of {', '.join(ENTRIES)}, got {echo(entry)}")
    if kind == "dense_fp8":
        if "entry" in rec and entry not in DENSE_FP8_ENTRIES:
            raise InputError(field_name(prefix, "entry"), "dense_fp8 calls are scheduled by get_mla_decoding_metadata "
                             "and run by fwd_kvcache_mla_fp8")
        return entry if "entry" in rec else DENSE_FP8_ENTRIES[0]
    if entry == "fwd_kvcache_mla_fp8":
        raise InputError(field_name(prefix, "entry"), "fwd_kvcache_mla_fp8 runs dense_fp8 calls only")
    return entry


def calls_from_records(records: Sequence[Any], prefix: str = "calls") -> list[KernelCall]:
    return [call_from_record(r, f"{prefix}[{i}]") for i, r in enumerate(records)]
