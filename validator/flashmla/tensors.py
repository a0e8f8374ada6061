"""Checks of the tensors an engine hands to FlashMLA (kernel mode, engine tests): schedule reuse and
decode indices. Each check is a small plan-like subject that the ``FMLA018`` / ``FMLA019`` rules read.

* :func:`check_sched_meta_reuse`: a ``FlashMLASchedMeta`` (or metadata tensors) planned for one call
  and reused for another. The library compares some shape fields (a Python assertion); the per-row
  lengths are never compared, so a schedule planned for other lengths runs silently stale.
* :func:`check_decode_indices`: sparse decode indices. The kernels skip exactly ``-1``; any other value
  outside the KV cache is turned into an address and read.

Both take numpy arrays, lists or (CPU or GPU) tensors and return a :class:`~validate_batch.legality.report.Report`.
Records for ``validate-batch check``: ``{"kind": "sched_meta_reuse", "planned": CALL, "reused": CALL}``
and ``{"kind": "decode_indices", "indices": [[...]], "num_kv_tokens": N, "topk_length": [...]}``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InputError
from ..facts.fields import field_name, int_field
from ..facts.knowledge import GPU, resolve_gpu
from ..facts.limits import echo
from .calls import INT32_MAX, DecodeCall, call_from_record
from .plan import Plan, plan
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())

from . import INDICES_KIND, REUSE_KIND, SUBJECT_KINDS  # noqa: F401  (the package names them; read here too)
REUSE_KEYS = frozenset({"kind", "planned", "reused", "label"})
INDICES_KEYS = frozenset({"kind", "indices", "num_kv_tokens", "topk_length", "label"})
#: the most index values one record may hold (a forward's indices: rows x topk)
MAX_INDEX_VALUES = 1 << 26


def as_array(v: Any, where: str) -> np.ndarray:
    """An integer numpy array from a list, a numpy array or a tensor (copied to the CPU)."""
    if hasattr(v, "detach") and hasattr(v, "cpu"):
        v = v.detach().cpu().numpy()
    if isinstance(v, (list, tuple)):
        try:
            v = np.asarray(v)
        except ValueError:
            raise InputError(where, "expected a rectangular list of integers") from None
    if not isinstance(v, np.ndarray) or not (np.issubdtype(v.dtype, np.integer) or v.size == 0):
        raise InputError(where, f"expected integers, got {echo(v) if not isinstance(v, np.ndarray) else v.dtype}")
    if v.size > MAX_INDEX_VALUES:
        raise InputError(where, f"{v.size} values is absurd (expected <= {MAX_INDEX_VALUES})")
    return v.astype(np.int64, copy=False)


@dataclass(frozen=True, eq=False)
class ReuseCheck:
    """A schedule planned for ``planned`` and reused for ``reused`` (the same build and GPU)."""

    planned: Plan
    reused: Plan
    label: str = ""
    rule_kind: str = REUSE_KIND

    @property
    def gpu(self) -> GPU:
        return self.planned.gpu

    @property
    def gen(self) -> dict:
        return self.reused.gen

    @property
    def call(self) -> "ReuseCheck":
        return self

    implementation = None
    num_sm_parts = None

    def summary(self) -> str:
        return f"FlashMLASchedMeta planned for [{self.planned.call.summary()}] reused for [{self.reused.call.summary()}]"

    def to_record(self) -> dict:
        return {"kind": "sched_meta_reuse", "planned": self.planned.call.to_record(), "reused": self.reused.call.to_record()}

    def to_dict(self, with_schedule: bool = True) -> dict:
        return {"call": self.to_record(), "implementation": None, "num_sm_parts": None}

    def changed_fields(self) -> list[tuple[str, Any, Any]]:
        """``(field, planned, reused)`` for each field the library compares on reuse that differs."""
        out = []
        for name in self.gen.get("sched_meta_checks", {}).get("fields", ()):
            a, b = getattr(self.planned.call, name), getattr(self.reused.call, name)
            if a != b:
                out.append((name, a, b))
        return out

    def schedules_differ(self) -> bool:
        """The reused call needs another schedule than the one planned (the scheduler's output for
        both, as the kernel computes it)."""
        a, b = self.planned.schedule, self.reused.schedule
        if (a is None) != (b is None):
            return True
        if a is None:
            return False
        return (a.metadata.shape != b.metadata.shape or not np.array_equal(a.metadata[:, :7], b.metadata[:, :7])
                or not np.array_equal(a.num_splits, b.num_splits))


@dataclass(frozen=True, eq=False)
class IndicesCheck:
    """Sparse decode indices ``[rows, topk]`` (any leading shape) against a KV cache of
    ``num_kv_tokens`` token slots (``num_blocks * page_size``)."""

    indices: np.ndarray
    num_kv_tokens: int
    topk_length: np.ndarray | None
    gpu: GPU
    label: str = ""
    rule_kind: str = INDICES_KIND
    implementation = None
    num_sm_parts = None
    gen = {"build": ""}

    @property
    def call(self) -> "IndicesCheck":
        return self

    def summary(self) -> str:
        tl = ", topk_length given" if self.topk_length is not None else ""
        return f"decode indices {list(self.indices.shape)} over {self.num_kv_tokens} KV token slots{tl}"

    def to_record(self) -> dict:
        return {"kind": "decode_indices", "shape": list(self.indices.shape), "num_kv_tokens": self.num_kv_tokens}

    def to_dict(self, with_schedule: bool = True) -> dict:
        return {"call": self.to_record(), "implementation": None, "num_sm_parts": None}

    def bad(self) -> np.ndarray:
        """Mask (rows x topk) of the entries the kernel reads that fall outside the cache: neither -1
        nor in ``[0, num_kv_tokens)``; positions at or past a row's ``topk_length`` are not read."""
        idx = self.indices.reshape(-1, self.indices.shape[-1]) if self.indices.ndim else self.indices.reshape(1, 1)
        out = (idx != -1) & ((idx < 0) | (idx >= self.num_kv_tokens))
        if self.topk_length is not None:
            pos = np.arange(idx.shape[1], dtype=np.int64)
            out &= pos[None, :] < self.topk_length.reshape(-1)[:, None]
        return out


def reuse_check(planned: Any, reused: Any, gpu: Any = "H200", build: str | None = None, label: str = "") -> ReuseCheck:
    """The subject of FMLA018 from two calls (records or :class:`DecodeCall`)."""
    g = resolve_gpu(gpu)
    calls = []
    for name, c in (("planned", planned), ("reused", reused)):
        if isinstance(c, Mapping):
            c = call_from_record(c, name)
        if not isinstance(c, DecodeCall):
            raise InputError(name, "expected a decode call record (sparse or dense)")
        calls.append(c)
    return ReuseCheck(plan(calls[0], g, build), plan(calls[1], g, build), label)


def indices_check(indices: Any, num_kv_tokens: int, topk_length: Any = None, gpu: Any = "H200",
                  label: str = "") -> IndicesCheck:
    """The subject of FMLA019 from the tensors (numpy, lists or torch)."""
    idx = as_array(indices, "indices")
    if idx.ndim == 0:
        raise InputError("indices", "expected an array [rows, topk] (or [b, s_q, topk])")
    n = int_field({"num_kv_tokens": num_kv_tokens}, "num_kv_tokens", "", 1, INT32_MAX)
    tl = None
    if topk_length is not None:
        tl = as_array(topk_length, "topk_length").reshape(-1)
        rows = int(np.prod(idx.shape[:-1])) if idx.ndim > 1 else 1
        if tl.shape[0] != rows:
            raise InputError("topk_length", f"expected one length per index row ({rows}), got {tl.shape[0]}")
    return IndicesCheck(idx if idx.ndim > 1 else idx.reshape(1, -1), n, tl, resolve_gpu(gpu), label)


def subject_from_record(rec: Mapping, prefix: str, gpu: GPU, build: str | None):
    """A ``sched_meta_reuse`` or ``decode_indices`` record as its subject."""
    kind = rec.get("kind")
    keys = REUSE_KEYS if kind == "sched_meta_reuse" else INDICES_KEYS
    for k in rec:
        if k not in keys:
            raise InputError(field_name(prefix, str(k)), f"unknown field (known: {', '.join(sorted(keys))})")
    label = str(rec.get("label") or "")
    if kind == "sched_meta_reuse":
        for k in ("planned", "reused"):
            if not isinstance(rec.get(k), Mapping):
                raise InputError(field_name(prefix, k), "expected a decode call record")
        return ReuseCheck(plan(call_from_record(rec["planned"], field_name(prefix, "planned")), gpu, build),
                          plan(call_from_record(rec["reused"], field_name(prefix, "reused")), gpu, build), label)
    if "indices" not in rec:
        raise InputError(field_name(prefix, "indices"), "missing")
    try:
        return indices_check(rec["indices"], rec.get("num_kv_tokens"), rec.get("topk_length"), gpu, label)
    except InputError as e:
        raise InputError(field_name(prefix, e.field), e.message) from None

