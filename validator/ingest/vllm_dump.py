"""vLLM's crash-time ``SchedulerOutput(...)`` dump -> the requests of the step that crashed.

vLLM V1 prints the scheduler output of the failing step when the model runner raises
(``Dumping scheduler output for model execution: SchedulerOutput(...)``, in one line on newer
builds, on the next line on older ones). Unlike SGLang's Prefill lines, this IS the crashing step.

What is read:
* ``num_scheduled_tokens={req: n, ...}`` - query rows of each request in this step
  (speculative tokens included);
* ``scheduled_new_reqs=[NewRequestData(req_id=..., prompt_token_ids_len=..., num_computed_tokens=...)]``
  (older builds print ``prompt_token_ids=[...]``: its length is used);
* ``scheduled_cached_reqs=CachedRequestData(req_ids=[...], num_computed_tokens=[...])`` (older
  builds print a list of ``CachedRequestData(req_id=..., num_computed_tokens=...)``);
* ``scheduled_spec_decode_tokens={req: [tokens]}`` and ``total_num_scheduled_tokens``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..facts.limits import echo
from .reprparse import Call, ReprParseError, parse_call_at

MARKER = "Dumping scheduler output"


@dataclass
class VllmRequest:
    id: str
    num_scheduled: int           # query rows in this step
    num_computed: int            # KV tokens before this step
    prompt_len: int | None = None
    num_spec: int = 0
    is_new: bool = False

    @property
    def is_decode(self) -> bool:
        """A request past its prompt that computes 1 token (+ speculative tokens) this step."""
        if self.prompt_len is not None and self.num_computed < self.prompt_len:
            return False
        return self.num_computed > 0 and self.num_scheduled == 1 + self.num_spec

    def to_dict(self) -> dict:
        d = {"id": self.id, "num_scheduled_tokens": self.num_scheduled, "num_computed_tokens": self.num_computed,
             "decode": self.is_decode}
        if self.prompt_len is not None:
            d["prompt_len"] = self.prompt_len
        if self.num_spec:
            d["num_spec_tokens"] = self.num_spec
        return d


@dataclass
class VllmStep:
    requests: list[VllmRequest]
    total_num_scheduled_tokens: int | None
    line_no: int = 0
    complete: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def total_rows(self) -> int:
        return sum(r.num_scheduled for r in self.requests)

    def to_dict(self) -> dict:
        return {"line": self.line_no, "total_num_scheduled_tokens": self.total_num_scheduled_tokens,
                "rows": self.total_rows, "complete": self.complete,
                "requests": [r.to_dict() for r in self.requests], "notes": list(self.notes)}


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(where, f"expected an integer, got {echo(v)}")
    if v < 0:
        raise InputError(where, f"expected >= 0, got {v}")
    return v


def parse_scheduler_output(text: str, line_no: int = 0) -> VllmStep:
    """Parse the ``SchedulerOutput(...)`` text. Raises :class:`InputError` naming the field/line."""
    where = f"line {line_no}" if line_no else "SchedulerOutput"
    try:
        so = parse_call_at(text, "SchedulerOutput", partial=True)
    except ReprParseError as e:
        raise InputError(where, f"unreadable SchedulerOutput: {e}") from None
    if so is None:
        raise InputError(where, "no 'SchedulerOutput(' in the text")
    notes: list[str] = []
    if not so.complete:
        notes.append("the dump is cut off before its closing parenthesis; fields after the cut are missing")
    nst = so.get("num_scheduled_tokens")
    if not isinstance(nst, dict):
        raise InputError(f"{where}: num_scheduled_tokens", "missing (the per-request query rows of the step)"
                         if nst is None else f"expected {{req: n}}, got {echo(nst)}")
    sched = {str(k): _int(v, f"{where}: num_scheduled_tokens[{k}]") for k, v in nst.items()}
    spec_raw = so.get("scheduled_spec_decode_tokens") or {}
    spec = {str(k): (len(v) if isinstance(v, (list, tuple)) else 0) for k, v in spec_raw.items()} if isinstance(spec_raw, dict) else {}

    computed: dict[str, int] = {}
    prompt: dict[str, int] = {}
    new_ids: set[str] = set()
    for i, nr in enumerate(so.get("scheduled_new_reqs") or []):
        if not isinstance(nr, Call):
            continue
        rid = str(nr.get("req_id"))
        new_ids.add(rid)
        if nr.get("num_computed_tokens") is not None:
            computed[rid] = _int(nr.get("num_computed_tokens"), f"{where}: scheduled_new_reqs[{i}].num_computed_tokens")
        plen = nr.get("prompt_token_ids_len")
        if plen is None and isinstance(nr.get("prompt_token_ids"), (list, tuple)):
            plen = len(nr.get("prompt_token_ids"))
        if isinstance(plen, int) and not isinstance(plen, bool):
            prompt[rid] = plen
    cached = so.get("scheduled_cached_reqs")
    if isinstance(cached, Call):
        ids = cached.get("req_ids") or []
        nct = cached.get("num_computed_tokens") or []
        if isinstance(ids, (list, tuple)) and isinstance(nct, (list, tuple)):
            if len(ids) != len(nct):
                notes.append(f"CachedRequestData has {len(ids)} req_ids but {len(nct)} num_computed_tokens")
            for j, (rid, n) in enumerate(zip(ids, nct)):
                computed[str(rid)] = _int(n, f"{where}: scheduled_cached_reqs.num_computed_tokens[{j}]")
    elif isinstance(cached, (list, tuple)):
        for j, c in enumerate(cached):
            if isinstance(c, Call) and c.get("req_id") is not None:
                computed[str(c.get("req_id"))] = _int(c.get("num_computed_tokens", 0),
                                                     f"{where}: scheduled_cached_reqs[{j}].num_computed_tokens")
    reqs = []
    for rid, n in sched.items():
        if rid not in computed:
            notes.append(f"request {rid}: num_computed_tokens not in the dump (assumed 0)")
        reqs.append(VllmRequest(rid, n, computed.get(rid, 0), prompt.get(rid), spec.get(rid, 0), rid in new_ids))
    total = so.get("total_num_scheduled_tokens")
    total = total if isinstance(total, int) and not isinstance(total, bool) else None
    if total is not None and total != sum(sched.values()):
        notes.append(f"total_num_scheduled_tokens={total} but num_scheduled_tokens sums to {sum(sched.values())}")
    if not reqs:
        notes.append("the step schedules no requests")
    return VllmStep(reqs, total, line_no, so.complete, notes)
