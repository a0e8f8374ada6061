"""FlashInfer calls, validated field by field, and their plans (what the ``FI0xx`` rules read).

Records (``validate-batch check``):

* ``{"kind": "trtllm_gen_mla", "batch": B, "q_len_per_request": 1, "h_q": 128}`` -
  ``trtllm_batch_decode_with_kv_cache_mla``; ``trtllm_gen_fmha`` for ``trtllm_batch_decode_with_kv_cache``.
* ``{"kind": "mla_plan", "qo_indptr": [...], "kv_indptr": [...], "kv_len": [...]}`` -
  ``BatchMLAPagedAttentionWrapper.plan()`` (``kv_len`` optional: one per request); ``"entry": "module"``
  for the JIT module's plan called directly (SGLang's CUDA-graph replay path), which skips the
  checks newer wrappers make in Python.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InputError
from ..facts.fields import bool_field, field_name, int_field
from ..facts.knowledge import GPU, load, resolve_gpu
from ..facts.limits import echo
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())

from . import KINDS, PLAN_RULE_KIND, TRTLLM_RULE_KIND  # noqa: F401  (the package names them; read here too)
INT32_MAX = 2**31 - 1
MAX_BATCH = 1 << 24
MAX_INDPTR = 1 << 22          # entries of an indptr (requests + 1)
TRTLLM_KEYS = frozenset({"kind", "batch", "q_len_per_request", "h_q", "label", "version"})
PLAN_KEYS = frozenset({"kind", "qo_indptr", "kv_indptr", "kv_len", "h_q", "label", "version", "entry", "causal",
                       "page_size"})
MAX_PAGE_SIZE = 1 << 12
#: how an MLA plan is called: through the wrapper's ``plan()``, or the JIT module's ``plan`` directly
PLAN_ENTRIES = ("wrapper", "module")


def version(name: str | None) -> dict:
    """The FlashInfer version's facts (``rules/flashinfer.json``) with its ``name``."""
    data = load("flashinfer")
    key = name or data["default"]
    if key not in data["versions"]:
        raise InputError("version", f"unknown FlashInfer version {echo(key)}; known: {', '.join(data['versions'])}")
    return {"name": key, **data["versions"][key]}


@dataclass(frozen=True)
class TrtllmGenCall:
    """One trtllm-gen decode call: ``batch`` requests of ``q_len_per_request`` query tokens."""

    kind: str
    batch: int
    q_len_per_request: int = 1
    h_q: int = 128
    label: str = ""

    def summary(self) -> str:
        return f"{self.kind} batch={self.batch} q_len_per_request={self.q_len_per_request} h_q={self.h_q}"

    def to_record(self) -> dict:
        rec = {"kind": self.kind, "batch": self.batch, "q_len_per_request": self.q_len_per_request, "h_q": self.h_q}
        if self.label:
            rec["label"] = self.label
        return rec


@dataclass(frozen=True, eq=False)
class MlaPlanCall:
    """``BatchMLAPagedAttentionWrapper.plan()``: indptrs of ``batch + 1`` entries (int64 numpy)."""

    qo_indptr: np.ndarray
    kv_indptr: np.ndarray
    kv_len: np.ndarray | None = None
    h_q: int = 128
    label: str = ""
    kind: str = "mla_plan"
    entry: str = "wrapper"
    causal: bool = False             # the plan's causal mask (it changes the work split)
    page_size: int | None = None     # tokens per KV page (kernel mode's inputs; the plan itself does not read it)

    @property
    def batch(self) -> int:
        return int(self.qo_indptr.shape[0]) - 1

    def summary(self) -> str:
        via = "" if self.entry == "wrapper" else f" entry={self.entry}"
        return f"mla_plan batch={self.batch} h_q={self.h_q}{via}"

    def to_record(self) -> dict:
        rec = {"kind": "mla_plan", "batch": self.batch, "h_q": self.h_q}
        if self.batch <= 64:
            rec["qo_indptr"] = self.qo_indptr.tolist()
            rec["kv_indptr"] = self.kv_indptr.tolist()
            if self.kv_len is not None:
                rec["kv_len"] = self.kv_len.tolist()
        if self.entry != "wrapper":
            rec["entry"] = self.entry
        if self.causal:
            rec["causal"] = True
        if self.page_size is not None:
            rec["page_size"] = self.page_size
        if self.label:
            rec["label"] = self.label
        return rec

    def full_record(self) -> dict:
        """The call as a record ``call_from_record`` reads back, every array whole."""
        rec = {"kind": "mla_plan", "qo_indptr": self.qo_indptr.tolist(), "kv_indptr": self.kv_indptr.tolist(),
               "h_q": self.h_q}
        if self.kv_len is not None:
            rec["kv_len"] = self.kv_len.tolist()
        for key, default in (("entry", "wrapper"), ("causal", False), ("page_size", None)):
            if getattr(self, key) != default:
                rec[key] = getattr(self, key)
        return rec


@dataclass(frozen=True, eq=False)
class FlashInferPlan:
    """What the ``FI0xx`` rules read about one call: the call, the GPU and the version's facts."""

    call: TrtllmGenCall | MlaPlanCall
    gpu: GPU
    facts: dict
    implementation = None
    num_sm_parts = None
    is_decode = False          # not a FlashMLA decode plan: no scheduler, no fallback
    library = "FlashInfer"

    @property
    def rule_kind(self) -> str:
        return TRTLLM_RULE_KIND if isinstance(self.call, TrtllmGenCall) else PLAN_RULE_KIND

    @property
    def entry(self) -> str:
        """The FlashInfer function the call is (``rules/flashinfer.json``)."""
        if isinstance(self.call, TrtllmGenCall):
            return self.facts["trtllm_gen"]["entries"][self.call.kind]
        return self.plan_facts["entry"]

    @property
    def plan_facts(self) -> dict:
        """The version's facts for the MLA plan's entry: ``mla_plan``, or its ``module_plan`` for a direct
        module call (a version without one behaves alike on both entries)."""
        facts = self.facts["mla_plan"]
        if isinstance(self.call, MlaPlanCall) and self.call.entry == "module":
            return facts.get("module_plan", facts)
        return facts

    @property
    def gen(self) -> dict:
        return {"build": self.facts["name"]}

    def fact_scope(self) -> tuple:
        """Where the rules' facts about this call live: its FlashInfer version."""
        return "flashinfer", self.facts["name"], self.facts["name"], {}

    @property
    def grid(self) -> dict | None:
        """The trtllm-gen launch grid's batch axis: ``{"axis": "z", "value": batch}`` (None for a plan)."""
        if not isinstance(self.call, TrtllmGenCall):
            return None
        axes = self.facts["trtllm_gen"]["grid"]
        axis = next(a for a, what in axes.items() if what == "batch")
        return {"axis": axis, "value": self.call.batch}

    def to_dict(self, with_schedule: bool = True) -> dict:
        return {"call": self.call.to_record(), "implementation": None, "num_sm_parts": None,
                "flashinfer": self.facts["name"]}


def _indptr(v: Any, where: str, n: int | None = None) -> np.ndarray:
    if hasattr(v, "detach") and hasattr(v, "cpu"):
        v = v.detach().cpu().numpy()
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or not np.issubdtype(v.dtype, np.integer):
            raise InputError(where, f"expected a 1-D integer array, got dtype {v.dtype} shape {v.shape}")
        arr = v.astype(np.int64)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
                raise InputError(f"{where}[{i}]", f"expected an integer, got {echo(x)}")
        try:
            arr = np.array(v, dtype=np.int64) if v else np.zeros(0, dtype=np.int64)
        except OverflowError:
            raise InputError(where, "values must fit in int32") from None
    else:
        raise InputError(where, f"expected a list of integers, got {type(v).__name__}")
    if arr.shape[0] > MAX_INDPTR:
        raise InputError(where, f"{arr.shape[0]} entries is absurd (expected <= {MAX_INDPTR})")
    if n is not None and arr.shape[0] != n:
        raise InputError(where, f"expected {n} entries (one per request), got {arr.shape[0]}")
    if arr.shape[0] and (arr.min() < -INT32_MAX - 1 or arr.max() > INT32_MAX):
        bad = int(np.argmax((arr < -INT32_MAX - 1) | (arr > INT32_MAX)))
        raise InputError(f"{where}[{bad}]", f"expected an int32, got {int(arr[bad])}")
    return arr


def call_from_record(rec: Mapping, prefix: str = "") -> TrtllmGenCall | MlaPlanCall:
    kind = rec.get("kind")
    label = str(rec.get("label") or "")
    if kind in ("trtllm_gen_mla", "trtllm_gen_fmha"):
        for k in rec:
            if k not in TRTLLM_KEYS:
                raise InputError(field_name(prefix, str(k)), f"unknown field (known: {', '.join(sorted(TRTLLM_KEYS))})")
        return TrtllmGenCall(kind, int_field(rec, "batch", prefix, 1, MAX_BATCH),
                             int_field(rec, "q_len_per_request", prefix, 1, 1 << 16, 1),
                             int_field(rec, "h_q", prefix, 1, 1 << 12, 128), label)
    if kind != "mla_plan":
        raise InputError(field_name(prefix, "kind"), f"expected one of {', '.join(KINDS)}, got {echo(kind)}")
    for k in rec:
        if k not in PLAN_KEYS:
            raise InputError(field_name(prefix, str(k)), f"unknown field (known: {', '.join(sorted(PLAN_KEYS))})")
    for k in ("qo_indptr", "kv_indptr"):
        if rec.get(k) is None:
            raise InputError(field_name(prefix, k), "missing (batch + 1 offsets)")
    qo = _indptr(rec["qo_indptr"], field_name(prefix, "qo_indptr"))
    if qo.shape[0] < 2:
        raise InputError(field_name(prefix, "qo_indptr"), f"expected at least 2 entries (batch + 1), got {qo.shape[0]}")
    kv = _indptr(rec["kv_indptr"], field_name(prefix, "kv_indptr"), qo.shape[0])
    kv_len = None if rec.get("kv_len") is None else _indptr(rec["kv_len"], field_name(prefix, "kv_len"), qo.shape[0] - 1)
    entry = rec.get("entry", "wrapper")
    if entry not in PLAN_ENTRIES:
        raise InputError(field_name(prefix, "entry"), f"expected one of {', '.join(PLAN_ENTRIES)}, got {echo(entry)}")
    return MlaPlanCall(qo, kv, kv_len, int_field(rec, "h_q", prefix, 1, 1 << 12, 128), label, entry=entry,
                       causal=bool_field(rec, "causal", prefix, False),
                       page_size=int_field(rec, "page_size", prefix, 1, MAX_PAGE_SIZE, None))


def plan(call: TrtllmGenCall | MlaPlanCall | Mapping, gpu: Any = "H200", name: str | None = None,
         prefix: str = "") -> FlashInferPlan:
    """Plan one FlashInfer call (a record or a call object) on ``gpu`` for FlashInfer version ``name``."""
    if isinstance(call, Mapping):
        name = name or call.get("version")
        call = call_from_record(call, prefix)
    return FlashInferPlan(call, resolve_gpu(gpu), version(name))
