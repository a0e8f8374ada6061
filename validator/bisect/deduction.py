"""Deductions from an index error's own numbers: ``index N is out of bounds for dimension 0 with size M``
names a buffer of M rows and an index N. Checked against every capacity the engine profile derives from
the settings (running limits per DP rank and in all, the request table with pre-allocation, padded
batch sizes), the pair says what sized the buffer and which index space N comes from. Each reading is
a *deduction*: a candidate step whose batch carries the deduced buffer, with the assumption it makes
said as such; the checker then decides whether a rule breaks on it."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..ingest.sglang_log import Step
from ..engines.slots import extra_slots
from .builder import Builder
from .results import Candidate


@dataclass(frozen=True)
class Capacity:
    """A row count the settings give: what it is, its value, and how it follows from the settings."""

    name: str
    value: int
    how: str
    scope: str          # per_dp | global


def capacities(cfg: EngineConfig) -> list[Capacity]:
    """Every capacity the settings derive (none when ``max_running_requests`` is unknown)."""
    R = cfg.running_limit_per_rank()
    if R is None:
        return []
    total = int(cfg.get("max_running_requests"))
    dp = cfg.attn_dp_size if cfg.dp_attention else 1
    pd = str(cfg.get("disaggregation_mode", "") or "").lower() == "decode"
    given = cfg.get("disaggregation_decode_extra_slots")
    E, e_src = extra_slots(R, pd, given if isinstance(given, int) and not isinstance(given, bool) else None)
    per = f"max_running_requests {total} / dp_size {dp}" if dp > 1 else f"max_running_requests {total}"
    out = [Capacity("the per-rank running limit R", R, per, "per_dp"),
           Capacity("the request table's rows R + E + 1", R + E + 1, f"R + E + 1 = {R} + {E} + 1 (E: {e_src})", "per_dp")]
    if E:
        out.append(Capacity("the live slots with pre-allocation R + E", R + E, f"R + E = {R} + {E} ({e_src})", "per_dp"))
    if dp > 1:
        out.append(Capacity("the global running limit", total, f"max_running_requests {total} (all {dp} DP ranks)",
                            "global"))
        if E:
            out.append(Capacity("the global slots with pre-allocation", (R + E) * dp,
                                f"(R + E) x dp_size = ({R} + {E}) x {dp}", "global"))
    bs = cfg.get("cuda_graph_max_bs")
    if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0:
        out.append(Capacity("the largest padded (CUDA-graph) batch", bs, f"--cuda-graph-max-bs {bs}", "per_dp"))
    return out


@dataclass
class Reading:
    """One reading of the index error: the buffer it deduces and the assumption it makes."""

    buffer: dict
    global_slot: bool
    deduction: str
    assumption: str


def _rank_no(err: ErrorEvent) -> int | None:
    r = err.rank or ""
    return int(r[2:]) if r.upper().startswith("DP") and r[2:].isdigit() else None


def readings(err: ErrorEvent, cfg: EngineConfig, notes: list[str]) -> list[Reading]:
    """The readings of an index error the settings' capacities support, most specific first; what the
    numbers show is added to ``notes``."""
    idx, size = err.numbers.get("index"), err.numbers.get("size")
    caps = capacities(cfg)
    if not isinstance(idx, int) or not isinstance(size, int) or not caps or idx < size:
        return []
    sized = [c for c in caps if c.value == size]
    fits = [c for c in caps if c.value > idx]
    shown = ", ".join(f"{c.name} {c.value}" for c in caps)
    if not sized:
        notes.append(f"deduction: the buffer's {size} rows are none of the capacities the settings give ({shown}): "
                     "its size does not come from them")
        return []
    by = sized[0]
    where = ", ".join(f"{c.name} ({c.value})" for c in fits) or "none of them"
    notes.append(f"deduction from the error's numbers: {size} rows = {by.name} ({by.how}); index {idx} is within "
                 f"{where}")
    out: list[Reading] = []
    R = cfg.running_limit_per_rank()
    dp = cfg.attn_dp_size if cfg.dp_attention else 1
    total = int(cfg.get("max_running_requests"))
    if by.scope == "per_dp" and by.value == R and dp > 1 and idx < total:
        k = _rank_no(err)
        on_rank = (f"; the error is on DP{k}, whose global slots are {k * R}..{(k + 1) * R - 1}: index {idx} is one "
                   "of them" if k is not None and k * R <= idx < (k + 1) * R else "")
        out.append(Reading(
            {"name": f"a {size}-row buffer (deduced: {by.how})", "rows_from": "running_limit", "scope": "per_dp",
             "indexed_by": "global_slot"}, True,
            f"deduction: a buffer sized per DP rank ({size} = {by.how}) indexed by a global slot{on_rank}",
            f"assumption: index {idx} is a global slot (numbered across the {dp} DP ranks, < {total}); the error "
            "does not say which numbering it uses"))
    live_max = max(c.value for c in caps if c.scope == "per_dp" and c.name.startswith("the request table")) - 1
    if by.scope == "per_dp" and idx <= live_max:
        out.append(Reading(
            {"name": f"a {size}-row buffer (deduced: {by.how})", "rows": size, "scope": "per_dp",
             "indexed_by": "req_pool_idx"}, False,
            f"deduction: a buffer of {size} rows ({by.how}) indexed by the rank's request slot, which reaches "
            f"{live_max} (the request table's last row)",
            f"assumption: index {idx} is the rank's own req_pool_idx; the buffer lacks the rows for slots {size}.."
            f"{live_max}"))
    return out


def deduced_candidates(b: Builder, err: ErrorEvent, rank: str, d: Step | None, notes: list[str]) -> list[Candidate]:
    """Candidate slot steps that carry a buffer deduced from the index error's numbers (see :func:`readings`)."""
    out = []
    for rd in readings(err, b.cfg, notes):
        base = b.slot_step(rank, d, err)
        if base is None:
            continue
        make0 = base.make

        def make(v: int, version: str | None, make0=make0, rd=rd) -> dict:
            doc = make0(v, version)
            doc["buffers"] = [*doc.get("buffers", []), dict(rd.buffer)]
            if rd.global_slot:
                for r in doc["requests"]:
                    if "req_pool_idx" in r:
                        r["global_slot"] = r["req_pool_idx"]
            return doc
        c = replace(base, make=make, exact=False, label=f"{base.label} ({rd.deduction.split(': ', 1)[1]})",
                    basis=[*base.basis, rd.deduction], assumptions=[*base.assumptions, rd.assumption])
        c.deduction = rd.deduction
        out.append(c)
    return out
