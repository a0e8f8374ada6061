"""DeepGEMM paged MQA-logits metadata calls and their plans.

Record (``validate-batch check``): ``{"kind": "paged_mqa_logits_metadata", "batch": B, "next_n": 1,
"varlen": false, "caller": "sglang-0.5.23", "jit_indexer_metadata": false, "version": "deepgemm-54e2261"}``.
``batch`` is ``context_lens.size(0)`` (requests); ``caller`` (optional) names an engine version that may
replace DeepGEMM's planner by its own (``callers`` in ``rules/deepgemm.json``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InputError
from ..facts.fields import bool_field, field_name, int_field
from ..facts.formula import Formula, formula_field, parse
from ..facts.knowledge import GPU, load, resolve_gpu
from ..facts.limits import echo

from . import KINDS, RULE_KIND  # noqa: F401  (the package names them; read here too)
KEYS = frozenset({"kind", "batch", "next_n", "varlen", "caller", "jit_indexer_metadata", "version", "label",
                  "context_len", "context_lens", "block_kv"})
MAX_CONTEXT_LEN = 1 << 24
#: kernel mode's inputs when a record does not give them: every request's context length, and the KV
#: block size of the indexer's paged cache (SGLang's and vLLM's DSA indexer pages hold 64 tokens)
DEFAULT_CONTEXT_LEN = 4096
DEFAULT_BLOCK_KV = 64
MAX_BATCH = 1 << 24


def version(name: str | None) -> dict:
    data = load("deepgemm")
    key = name or data["default"]
    if key not in data["versions"]:
        raise InputError("version", f"unknown DeepGEMM version {echo(key)}; known: {', '.join(data['versions'])}")
    return {"name": key, **data["versions"][key]}


@dataclass(frozen=True)
class MqaMetadataCall:
    """``get_paged_mqa_logits_metadata(context_lens [batch, next_n], block_kv, num_sms, indices)``."""

    batch: int
    next_n: int = 1
    varlen: bool = False
    caller: str | None = None
    jit_indexer_metadata: bool = False
    label: str = ""
    kind: str = "paged_mqa_logits_metadata"
    context_len: int | None = None    # kernel mode's context length per request (the limits do not read it)
    block_kv: int | None = None       # kernel mode's KV block size
    context_lens: tuple | None = None # every request's context length (kernel mode's input and the schedule's)

    @property
    def rows(self) -> int:
        """Query rows of the indexer call: requests x next_n."""
        return self.batch * self.next_n

    def summary(self) -> str:
        via = f" from {self.caller}" if self.caller else ""
        return f"paged_mqa_logits_metadata batch={self.batch} next_n={self.next_n}{' varlen' if self.varlen else ''}{via}"

    def to_record(self) -> dict:
        rec: dict = {"kind": self.kind, "batch": self.batch, "next_n": self.next_n}
        if self.varlen:
            rec["varlen"] = True
        if self.caller:
            rec["caller"] = self.caller
        if self.jit_indexer_metadata:
            rec["jit_indexer_metadata"] = True
        for key in ("context_len", "block_kv"):
            if getattr(self, key) is not None:
                rec[key] = getattr(self, key)
        if self.context_lens is not None:
            rec["context_lens"] = list(self.context_lens)
        if self.label:
            rec["label"] = self.label
        return rec


#: the shared-memory limits a metadata call meets, in the order DeepGEMM meets them: its host assertion
#: (``host``: the dynamic bytes against ``smem_capacity``), the JIT compile (``static``: a static array
#: against the layout's ``static_smem_limit``, ptxas's limit for the JIT's target), the launch (``launch``:
#: static + dynamic against the GPU's opt-in maximum, which the launch's shared-memory attribute needs)
LIMIT_KINDS = ("host", "static", "launch")


@dataclass(frozen=True)
class SmemLimit:
    """One shared-memory limit of a metadata call: its kind (:data:`LIMIT_KINDS`), the bytes the call
    needs against it, the limit, and the largest batch that passes it."""

    kind: str
    need: int
    limit: int
    max_batch: int

    @property
    def broken(self) -> bool:
        return self.need > self.limit


@dataclass(frozen=True, eq=False)
class DeepGemmPlan:
    """Which planner runs the call (DeepGEMM's, or the caller's replacement) and its shared memory."""

    call: MqaMetadataCall
    gpu: GPU
    facts: dict
    rule_kind: str = RULE_KIND
    implementation = None
    num_sm_parts = None

    @property
    def gen(self) -> dict:
        return {"build": self.facts["name"]}

    def fact_scope(self) -> tuple:
        """Where the rules' facts about this call live: its DeepGEMM version, this GPU's layout
        (``{layout}``)."""
        return "deepgemm", self.facts["name"], self.facts["name"], {"layout": self.layout_key}

    @property
    def caller_facts(self) -> dict | None:
        c = self.call.caller
        return None if c is None else load("deepgemm")["callers"][c]

    @property
    def replaced(self) -> bool:
        """The caller runs its own planner instead of DeepGEMM's for this call."""
        cf = self.caller_facts
        if cf is None or self.call.next_n != 1:
            return False
        return self.call.jit_indexer_metadata or self.call.rows > cf["replacement_threshold"]

    @property
    def layout(self) -> dict | None:
        """The metadata kernel's shared-memory layout for this GPU's architecture (None: none)."""
        return self.facts["metadata"].get(self.layout_key)

    @property
    def layout_key(self) -> str:
        """The ``metadata`` key of this GPU's layout: its compute-capability major, else ``*``."""
        arch = str(self.gpu.arch)
        return arch if arch in self.facts["metadata"] else "*"

    def _where(self) -> str:
        return f"deepgemm.versions.{self.facts['name']}.metadata.{self.layout_key}"

    def _bytes(self) -> Formula | None:
        """The layout's dynamic shared-memory formula for this call, the bytes the host checks and asks
        for at launch (varlen has its own, ``varlen_bytes``; None: no layout for this GPU)."""
        lay = self.layout
        if lay is None:
            return None
        key = "varlen_bytes" if self.call.varlen and "varlen_bytes" in lay else "bytes"
        return formula_field(lay, key, self._where(), ("b",))

    def _static_bytes(self) -> Formula | None:
        """The layout's static ``__shared__`` array formula (None: the layout keeps no static array)."""
        lay = self.layout
        if lay is None or "static_bytes" not in lay:
            return None
        return formula_field(lay, "static_bytes", self._where(), ("b",))

    def _total_bytes(self) -> Formula | None:
        """Static plus dynamic shared memory: what the launch needs of the GPU."""
        dyn, st = self._bytes(), self._static_bytes()
        if dyn is None or st is None:
            return dyn
        return parse(f"({dyn.text})+({st.text})", f"{self._where()}.static_bytes+bytes", ("b",))

    @property
    def smem_bytes(self) -> int | None:
        """Dynamic shared memory the metadata kernel asks for, in bytes (None: no layout for this GPU)."""
        f = self._bytes()
        return None if f is None else f(b=self.call.batch)

    @property
    def static_smem_bytes(self) -> int:
        """The metadata kernel's static shared memory, in bytes (0: it keeps no static array)."""
        f = self._static_bytes()
        return 0 if f is None else f(b=self.call.batch)

    @property
    def limits(self) -> tuple[SmemLimit, ...]:
        """The call's shared-memory limits in the order DeepGEMM meets them (:data:`LIMIT_KINDS`);
        empty when there is no layout for this GPU."""
        dyn = self._bytes()
        if dyn is None:
            return ()
        b = self.call.batch
        checks = [("host", dyn, self.facts["smem_capacity"])]
        st = self._static_bytes()
        if st is not None:
            checks.append(("static", st, self.layout["static_smem_limit"]))
        checks.append(("launch", self._total_bytes(), self.gpu.smem_optin))
        return tuple(SmemLimit(kind, f(b=b), cap, f.largest("b", cap, hi=MAX_BATCH)) for kind, f, cap in checks)

    @property
    def broken(self) -> SmemLimit | None:
        """The first limit the call breaks (the one whose failure the process shows), or None."""
        return next((lim for lim in self.limits if lim.broken), None)

    @property
    def max_batch(self) -> int | None:
        """Largest batch whose metadata passes every shared-memory limit (None: no layout for this GPU)."""
        lims = self.limits
        return min(lim.max_batch for lim in lims) if lims else None

    @property
    def empty_batch(self) -> dict | None:
        """This GPU's layout's ``empty_batch`` facts, when the version's kernel fails on a batch whose
        every context length is 0 (None: it does not, or no layout)."""
        lay = self.layout
        return None if lay is None or self.call.varlen else lay.get("empty_batch")

    @property
    def lengths_all_zero(self) -> bool | None:
        """Whether every request's context length is 0: None when the record gives no lengths (the
        verdict then does not depend on them)."""
        c = self.call
        if c.context_lens is not None:
            return not any(c.context_lens)
        if c.context_len is not None:
            return c.context_len == 0
        return None

    def to_dict(self, with_schedule: bool = True) -> dict:
        return {"call": self.call.to_record(), "implementation": None, "num_sm_parts": None,
                "deepgemm": self.facts["name"], "planner": "caller" if self.replaced else "deepgemm",
                "smem_bytes": None if self.replaced else self.smem_bytes,
                "static_smem_bytes": None if self.replaced else self.static_smem_bytes}


def call_from_record(rec: Mapping, prefix: str = "") -> MqaMetadataCall:
    if rec.get("kind") not in KINDS:
        raise InputError(field_name(prefix, "kind"), f"expected one of {', '.join(KINDS)}, got {echo(rec.get('kind'))}")
    for k in rec:
        if k not in KEYS:
            raise InputError(field_name(prefix, str(k)), f"unknown field (known: {', '.join(sorted(KEYS))})")
    caller = rec.get("caller")
    callers = load("deepgemm")["callers"]
    if caller is not None and caller not in callers:
        raise InputError(field_name(prefix, "caller"), f"expected one of {', '.join(callers)}, got {echo(caller)}")
    return MqaMetadataCall(int_field(rec, "batch", prefix, 1, MAX_BATCH), int_field(rec, "next_n", prefix, 1, 64, 1),
                           bool_field(rec, "varlen", prefix, False), caller,
                           bool_field(rec, "jit_indexer_metadata", prefix, False), str(rec.get("label") or ""),
                           context_len=int_field(rec, "context_len", prefix, 0, MAX_CONTEXT_LEN, None),
                           block_kv=int_field(rec, "block_kv", prefix, 1, 1 << 10, None),
                           context_lens=_context_lens(rec, prefix))


def _context_lens(rec: Mapping, prefix: str) -> tuple | None:
    """``context_lens``: one length per request (``batch`` of them), each 0 .. MAX_CONTEXT_LEN."""
    v = rec.get("context_lens")
    if v is None:
        return None
    where = field_name(prefix, "context_lens")
    if not isinstance(v, (list, tuple)):
        raise InputError(where, f"expected a list of lengths, got {type(v).__name__}")
    batch = rec.get("batch")
    if len(v) != batch:
        raise InputError(where, f"expected {batch} lengths (one per request, batch), got {len(v)}")
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_CONTEXT_LEN:
            raise InputError(f"{where}[{i}]", f"expected an integer 0..{MAX_CONTEXT_LEN}, got {echo(x)}")
    return tuple(v)


def plan(call: MqaMetadataCall | Mapping, gpu: Any = "H200", name: str | None = None, prefix: str = "") -> DeepGemmPlan:
    """Plan one metadata call (a record or a call object) on ``gpu`` for DeepGEMM version ``name``."""
    if isinstance(call, Mapping):
        name = name or call.get("version")
        call = call_from_record(call, prefix)
    return DeepGemmPlan(call, resolve_gpu(gpu), version(name))
