"""What every engine profile shares: the plan of one forward, and the interface a profile implements.

An engine profile turns a :class:`~validate_batch.inputs.batch.Batch` into the kernel calls and slot-indexed
buffers one forward touches (:class:`BatchPlan`). It is split into what depends on the
configuration alone (:meth:`Profile.setup`, computed once per configuration) and what depends on
the step (:meth:`Profile.derive`). It names the per-step quantities it provides (``rows``: query
rows of the forward; ``slots``: the largest request slot) with the bounds that its configuration
puts on them, which :mod:`validate_batch.legality.bounds` checks against the rules themselves.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..inputs.batch import Batch
from ..flashmla.calls import DecodeCall


@dataclass
class DerivedCall:
    name: str
    call: Any                   # a FlashMLA DecodeCall / SparsePrefillCall, or a FlashInfer TrtllmGenCall
    plan: Any                   # its plan (FlashMLA Plan or FlashInferPlan)
    route: str  # "decode_kernel" | "sparse_prefill" | "trtllm_gen_decode"

    @property
    def kernel(self) -> str:
        entry = getattr(self.plan, "entry", None)
        if entry is not None:
            return entry.rsplit(".", 1)[-1]
        return "flash_mla_sparse_fwd" if self.route == "sparse_prefill" else "flash_mla_with_kvcache"

    def summary(self) -> dict:
        call = self.call
        if isinstance(call, DecodeCall) and (call.topk_length is not None or call.extra_topk_length is not None):
            call = call.light()   # per-row arrays shown as counts: do not convert thousands of values
        out = {"name": self.name, "route": self.route, "kernel": self.kernel, "call": call.to_record()}
        if self.plan.num_sm_parts is not None:
            out["num_sm_parts"] = self.plan.num_sm_parts
            out["sched_smem_bytes"] = self.plan.sched_smem_bytes
        return out


@dataclass
class BatchPlan:
    """Everything the engine rules read about one forward, computed once.

    ``rows``, ``row_breakdown``, ``routing`` and ``max_rows`` are filled in by a profile that
    provides query rows; ``slots`` by one that provides request slots; ``calls`` by any profile that
    derives kernel calls. ``profiles`` are the profiles that built it, in order.
    """

    batch: Batch
    versions: dict = field(default_factory=dict)
    rows: int | None = None
    row_breakdown: dict = field(default_factory=dict)
    calls: list[DerivedCall] = field(default_factory=list)
    routing: dict = field(default_factory=dict)
    max_rows: int | None = None
    slots: Any = None
    profiles: tuple = ()
    rows_only: bool = False     # only rules that read rows and the configuration run: no per-row lengths
    # per step path the profiles do not model (the engine runs another kernel for this step): one
    # record each (``profile``, ``path``, ``why``, ``field``, ``source``, ...); a step with one is
    # judged "not modelled", never legal
    unmodelled: list = field(default_factory=list)
    probe: bool = False         # a bounds probe: the modelled path's calls are derived for every step

    def fact_scope(self) -> tuple | None:
        """Where the engine rules' facts live: the first profile's record with its version's entry."""
        if not self.versions:
            return None
        profile, version = next(iter(self.versions.items()))
        return "engine", f"{profile}@{version}", f"{profile}@{version}", {}

    def to_dict(self) -> dict:
        d: dict = {"forward_mode": self.batch.forward_mode, "versions": self.versions}
        for prof in self.profiles:
            d.update(prof.context(self))
        return d


class Profile:
    """One engine profile (a module under :mod:`validate_batch.engines` defines one and names it
    ``PROFILE``; ``rules/engines.json`` lists it with its versions and defaults)."""

    #: the key in ``rules/engines.json``
    name: str = ""
    #: per-step quantities this profile derives (``rows``, ``slots``)
    provides: frozenset = frozenset()
    #: rule inputs the derivation keeps within their limits by construction (``lengths``: the
    #: per-row cache lengths it builds are always inside their cache widths)
    guarantees: frozenset = frozenset()
    #: the calls' shapes (``s_q``) grow with the step's rows (a vLLM mixed batch is one call with
    #: ``s_q`` = the step's tokens): the row bound is then checked with the shape-only rules too
    shape_grows_with_rows: bool = False
    #: the kinds of kernel-call rules its derived calls are judged by (``Rule.subject``)
    call_kinds: frozenset = frozenset({"flashmla"})

    def setup(self, batch: Batch, version: dict, build: str | None) -> Any:
        """What the profile derives from the configuration alone (built once per configuration)."""
        return None

    def derive(self, batch: Batch, version: dict, setup: Any, bp: BatchPlan, build: str | None, memo=None) -> None:
        """Fill ``bp`` with this step's calls / buffers."""

    def bound_hints(self, setup: Any, bp: BatchPlan) -> dict:
        """The bounds the configuration puts on the quantities this profile provides, as the profile
        knows them (``max_rows``, ``threshold``; ``max_slot``; ``row_modes``: the forward modes
        whose query rows are what ``max_rows`` bounds, when the limit is on another count in the
        others; ``unmodelled``: ``(modes, max_rows)`` spans of steps that run a path the profile
        does not model, ``max_rows`` None for any rows). :mod:`validate_batch.legality.bounds` verifies them against the rules and searches when they disagree."""
        return {}

    def prevention(self, batch: Batch, bp: BatchPlan, bounds) -> list[dict]:
        """Engine settings that would have kept this batch legal: ``{flag, value, why}``."""
        return []

    def context(self, bp: BatchPlan) -> dict:
        """This profile's part of a report's machine-readable context."""
        return {}

    @staticmethod
    def rows_context(bp: BatchPlan) -> dict:
        """The context of a profile that derives kernel calls from a forward's query rows: the rows,
        their breakdown, the routing and each call (empty when no rows were derived)."""
        if bp.rows is None:
            return {}
        return {"query_rows": bp.rows, "row_breakdown": bp.row_breakdown, "routing": bp.routing,
                "kernel_calls": [c.summary() for c in bp.calls]}

    def summary_lines(self, bp: BatchPlan) -> list[str]:
        """This profile's part of the human description of a forward."""
        return []
