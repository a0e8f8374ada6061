"""``sglang-slots``: SGLang's request slots and the buffers indexed by them.

The request table's rows (``R + 1``, or ``R + E + 1`` on a PD decode worker with ``E``
pre-allocation slots), the live slot domain, and every buffer indexed by ``req_pool_idx``: DSA
compression tails of the target and of the NextN draft that shares its table, and user buffers.
All of it depends on the configuration alone; provides the ``slots`` quantity (the largest slot).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..inputs.batch import Batch
from ..errors import InputError
from ..facts.fields import non_negative_int
from ..facts.knowledge import load
from .base import BatchPlan, Profile

NAME = "sglang-slots"
ROWS_FROM = ("running_limit", "table_rows", "running_limit_total")


@dataclass
class SlotBuffer:
    name: str
    rows: int
    owner: str                 # "target" | "draft" | "user"
    scope: str = "per_dp"      # rows sized per DP worker
    indexed_by: str = "req_pool_idx"
    width: int | None = None
    required_width: int | None = None
    sizing: str = ""

    def to_dict(self) -> dict:
        d = {"name": self.name, "rows": self.rows, "owner": self.owner, "scope": self.scope,
             "indexed_by": self.indexed_by, "sizing": self.sizing}
        if self.width is not None:
            d["width"] = self.width
        if self.required_width is not None:
            d["required_width"] = self.required_width
        return d


@dataclass
class SlotModel:
    max_running: int            # R per DP worker
    extra_slots: int            # E
    extra_slots_source: str
    table_rows: int             # T_rows
    pd_decode: bool
    draft_tokens: int
    buffers: list[SlotBuffer]
    attn_dp: int = 1            # attention data-parallel ranks (each has its own request table)

    @property
    def max_slot(self) -> int:
        """The largest slot every slot-indexed structure can take (request table and buffers)."""
        return min([self.table_rows] + [b.rows for b in self.buffers[1:]]) - 1

    def to_dict(self) -> dict:
        return {"max_running_requests_per_dp": self.max_running, "extra_slots": self.extra_slots,
                "extra_slots_source": self.extra_slots_source, "table_rows": self.table_rows,
                "live_slots": [1, self.table_rows - 1], "pd_decode": self.pd_decode,
                "draft_tokens": self.draft_tokens, "attn_dp": self.attn_dp,
                "buffers": [b.to_dict() for b in self.buffers]}


def default_extra_slots(R: int) -> tuple[int, int, int]:
    """SGLang's ``--disaggregation-decode-extra-slots`` when unset, for ``R`` running requests per DP
    worker: ``(E, factor, max_running)`` with ``E = factor x R`` when ``R <= max_running``, else 0."""
    dflt = load("engines")["profiles"][NAME]["defaults"]
    lim, factor = dflt["extra_slots_default_max_running"], dflt["extra_slots_default_factor"]
    return (factor * R if R <= lim else 0), factor, lim


def extra_slots(R: int, pd_decode: bool, given: int | None) -> tuple[int, str]:
    """Pre-allocation slots ``E`` of a worker with ``R`` running requests, and where the number comes from."""
    if not pd_decode:
        return 0, "not a PD decode worker"
    if given is not None:
        return int(given), "--disaggregation-decode-extra-slots"
    E, factor, lim = default_extra_slots(R)
    if R <= lim:
        return factor * R, f"default: {factor} x {R} (max_running_requests per DP <= {lim})"
    return 0, f"default: 0 (max_running_requests per DP {R} > {lim})"


def _user_buffer(ub, i: int, R: int, t_rows: int, r_total: int) -> SlotBuffer:
    where = f"buffers[{i}]"
    if not isinstance(ub, dict) or "name" not in ub:
        raise InputError(where, "expected {name, rows | rows_from, scope, indexed_by}")
    if "rows" in ub:
        rows, sizing = non_negative_int(ub["rows"], f"{where}.rows"), "given"
    else:
        src = ub.get("rows_from")
        base = {"running_limit": R, "table_rows": t_rows, "running_limit_total": r_total}.get(src)
        if base is None:
            raise InputError(f"{where}.rows_from", f"expected {', '.join(ROWS_FROM[:-1])} or {ROWS_FROM[-1]}, got {src!r}")
        plus = non_negative_int(ub.get("plus", 0), f"{where}.plus")
        rows, sizing = base + plus, f"{src} + {plus} = {base} + {plus}"
    scope = ub.get("scope", "per_dp")
    indexed_by = ub.get("indexed_by", "req_pool_idx")
    if scope not in ("per_dp", "global") or indexed_by not in ("req_pool_idx", "global_slot"):
        raise InputError(where, "scope must be per_dp|global and indexed_by req_pool_idx|global_slot")
    return SlotBuffer(str(ub["name"]), rows, "user", scope, indexed_by, sizing=sizing)


def derive_slots(batch: Batch, version: dict) -> SlotModel:
    """The request table and the buffers indexed by request slot (configuration only)."""
    dflt = load("engines")["profiles"][NAME]["defaults"]
    if batch.arg("max_running_requests") is None:
        raise InputError("server_args.max_running_requests", "missing (the request table is sized from it)")
    r_total = int(batch.arg("max_running_requests"))
    attn_dp = batch.attn_dp_size()
    R = max(r_total // attn_dp, int(version.get("running_limit_min", 0)))
    pd_decode = str(batch.arg("disaggregation_mode", "null")).lower() == "decode"
    per_worker = R
    if version.get("extra_slots_per_worker") == "num_dp_ranks":
        # replicas (dp_size next to attn_dp_size) times attention-DP groups
        replicas = int(batch.arg("dp_size", 1) or 1) if int(batch.arg("attn_dp_size", 1) or 1) > 1 else (
            1 if batch.arg("enable_dp_attention", False) else int(batch.arg("dp_size", 1) or 1))
        per_worker = max(1, r_total // (replicas * attn_dp))
    E, e_src = extra_slots(per_worker, pd_decode, batch.arg("disaggregation_decode_extra_slots"))
    t_rows = R + E + 1
    d = batch.arg("speculative_num_draft_tokens")
    d = int(d) if d else 0
    index_kpool = non_negative_int(batch.model.get("index_kpool", dflt["index_kpool"]), "model.index_kpool")
    tail_extra = batch.model.get("tail_extra_slots")
    width = index_kpool + (non_negative_int(tail_extra, "model.tail_extra_slots") if tail_extra is not None else d)
    required = index_kpool + d
    buffers = [SlotBuffer("req_to_token (request table)", t_rows, "target",
                          sizing=f"R + E + 1 = {R} + {E} + 1" if pd_decode else f"R + 1 = {R} + 1")]
    if batch.model.get("dsa_tails", True):
        buffers.append(SlotBuffer("target DSA compression tails (key, score)", t_rows + 1, "target", width=width,
                                  required_width=required, sizing=f"table rows + 1 = {t_rows} + 1 (hybrid builder)"))
        has_draft = d > 0 or str(batch.arg("speculative_algorithm", "") or "").upper() in dflt["draft_model_algorithms"]
        if has_draft:
            if version.get("draft_tail_sizing") == "running_limit":
                rows, sizing = R + 1, f"max_running_requests + 1 = {R} + 1 (plain DSA builder given the scheduler limit)"
            else:
                rows, sizing = t_rows + 1, f"table rows + 1 = {t_rows} + 1 (builder given the shared table's rows)"
            buffers.append(SlotBuffer("NextN draft DSA compression tails (key, score)", rows, "draft", width=width,
                                      required_width=required, sizing=sizing))
    for i, ub in enumerate(batch.buffers):
        buffers.append(_user_buffer(ub, i, R, t_rows, r_total))
    return SlotModel(R, E, e_src, t_rows, pd_decode, d, buffers, attn_dp)


class SlotsProfile(Profile):
    name = NAME
    provides = frozenset({"slots"})

    def setup(self, batch: Batch, version: dict, build: str | None) -> SlotModel:
        return derive_slots(batch, version)

    def derive(self, batch, version, setup: SlotModel, bp: BatchPlan, build, memo=None) -> None:
        bp.slots = setup     # read-only: shared by every step's plan

    def bound_hints(self, setup: SlotModel, bp: BatchPlan) -> dict:
        return {"max_slot": setup.max_slot}

    def prevention(self, batch: Batch, bp: BatchPlan, bounds) -> list[dict]:
        s = bp.slots
        out: list[dict] = []
        for buf in s.buffers[1:]:
            if buf.rows < s.table_rows:
                out.append({"flag": "(engine)", "value": f"size {buf.name} with {s.table_rows + 1} rows",
                            "why": f"live slots go up to {s.table_rows - 1}; it has {buf.rows} ({buf.sizing})"})
        if s.pd_decode and s.extra_slots:
            out.append({"flag": "--disaggregation-decode-extra-slots", "value": 0,
                        "why": f"stopgap: keeps slots within {s.max_running} so {s.max_running + 1}-row buffers suffice "
                               f"(fewer pre-allocated transfers)"})
        return out

    def context(self, bp: BatchPlan) -> dict:
        return {"slots": bp.slots.to_dict()}

    def summary_lines(self, bp: BatchPlan) -> list[str]:
        s = bp.slots
        lines = [f"  request table: {s.table_rows} rows (R={s.max_running} per DP, E={s.extra_slots}: "
                 f"{s.extra_slots_source}); live slots 1..{s.table_rows - 1}"]
        lines.extend(f"    {buf.name}: {buf.rows} rows ({buf.sizing})" for buf in s.buffers)
        slots = [f"{r.id}={r.req_pool_idx}" for r in bp.batch.requests if r.req_pool_idx is not None]
        if slots:
            shown = ", ".join(slots[:12]) + (f", ... ({len(slots)} in all)" if len(slots) > 12 else "")
            lines.append(f"  slots in this forward: {shown}")
        return lines


PROFILE = SlotsProfile()
