"""Candidate crashing steps of one DP rank, built from its timeline and the engine configuration.

How a candidate is built depends on when the engine printed its lines (see
``sglang-log-formats.md`` section 3): up to SGLang 0.5.8 the last ``Prefill batch`` line before the
error IS the crashing batch; from 0.5.10 it is the previous, successful batch, and the crashing one
is reconstructed from ``#pending-token`` / ``#queue-req`` and the chunked-prefill budget - as a
range when it cannot be exact.
"""
from __future__ import annotations

from typing import Any

from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..ingest.scan import RankTimeline
from ..ingest.sglang_log import Step
from ..facts.modes import Mode
from ..engines.slots import default_extra_slots
from .data import default_max_prefill_tokens, in_model_family
from .docs import MAX_SYNTH_REQUESTS, decode_doc, prefill_doc, server_args, spec_tokens
from .results import Candidate


def running_len(step: Step | None, running: int) -> int:
    """A representative sequence length for running decodes (only their count matters for rows)."""
    if step is not None and running > 0:
        for key in ("full_token", "token"):
            v = step.fields.get(key)
            if isinstance(v, dict):
                v = v.get("full", v.get("value"))
            if isinstance(v, int) and v > 0:
                return max(1, v // max(running, 1))
    return 1024


class Builder:
    """Builds candidate steps for one rank from its timeline and the configuration."""

    def __init__(self, cfg: EngineConfig, profile: list[str], gpu: Any, versions: list[str | None],
                 after_forward: bool | None, notes: list[str]):
        self.cfg = cfg
        self.profile = profile
        self.gpu = gpu
        self.versions = versions
        self.after = after_forward
        self.notes = notes

    def sa(self, **kw) -> dict:
        return server_args(self.cfg, **kw)

    def budget(self) -> tuple[int | None, str]:
        """Upper bound of one prefill batch's new tokens on one rank, and where it comes from."""
        c = self.cfg.chunk_per_rank()
        if c is not None:
            src = self.cfg.sources.get("chunked_prefill_size", "")
            per = " per DP rank" if self.cfg.dp_attention else ""
            return c, f"--chunked-prefill-size {c}{per} ({src})"
        m = self.cfg.max_prefill_tokens()
        if m is not None:
            return None, f"no chunking: --max-prefill-tokens {m} caps a batch but its first request may be longer"
        return None, "chunked-prefill size unknown (pass --server-arg chunked_prefill_size=N or --launch)"

    def prefill_logged(self, rank: str, p: Step, exact: bool, label: str) -> Candidate:
        rows = p.new_token or 0
        running = p.running_req or 0
        mixed = bool(self.cfg.get("enable_mixed_chunk", False)) or p.mixed_running is not None
        n_seq = p.num("new_seq", 1) or 1
        cached = p.num("cached_token", 0) or 0
        rl = running_len(p, running)

        def make(v: int, version: str | None) -> dict:
            return prefill_doc(self.profile, version, self.gpu, self.sa(enable_mixed_chunk=mixed or None),
                               n_seq, v, cached, running, rl, f"{label} ({v} new tokens)")
        basis = [f"line {p.line_no}: {p.summary()}"]
        if mixed and running:
            basis.append(f"mixed chunking merges the {running} running decode(s) into this forward")
        c = Candidate(rank, "prefill", label, "query rows", rows, rows, rows, exact, basis, make, p,
                      list(self.versions))
        if n_seq > 1:
            c.assumptions.append(f"assumption: the {rows} new tokens are split evenly over the {n_seq} requests "
                                 f"(the line gives only the total; the row count does not depend on it)")
        if cached and n_seq > 1:
            c.assumptions.append(f"assumption: the {cached} cached tokens are split evenly over the {n_seq} requests")
        if running:
            c.assumptions.append(f"assumption: each of the {running} running request(s) holds {rl} tokens "
                                 "(the line gives only their count and the total)")
        return c

    def prefill_next(self, rank: str, p: Step | None, tl: RankTimeline) -> Candidate | None:
        """The unlogged batch after ``p`` (engines that print a Prefill line after its forward)."""
        budget, bsrc = self.budget()
        basis = []
        running = (p.running_req or 0) + (p.num("new_seq", 0) or 0) if p is not None else 0
        if p is not None:
            basis.append(f"line {p.line_no} (printed after its forward, so it ran): {p.summary()}")
        pending = p.num("pending_token") if p is not None else None
        queue = p.num("queue_req") if p is not None else None
        if budget is None:
            m = self.cfg.max_prefill_tokens() or default_max_prefill_tokens()
            ctx = self.cfg.get("context_length")
            hi = max(m, ctx if isinstance(ctx, int) else m)
            basis.append(bsrc + (f"; assuming SGLang's default --max-prefill-tokens {m}" if self.cfg.max_prefill_tokens() is None else ""))
        else:
            hi = budget
            basis.append(f"a prefill batch takes at most {bsrc}")
        likely: int | None
        exact = False
        if pending is not None:
            if pending >= hi:
                likely, exact = hi, budget is not None
                basis.append(f"#pending-token {pending} >= the budget: the next batch is a full {hi}-token chunk")
            elif pending > 0:
                likely = pending
                basis.append(f"#pending-token {pending}: the queued work alone makes a {pending}-token batch; "
                             f"requests arriving after line {p.line_no} can raise it up to {hi}")
            else:
                likely = None
                basis.append("#pending-token 0: nothing was waiting; only requests arriving after the line "
                             f"(up to {hi} tokens) could form the next prefill")
        elif queue:
            likely = hi if (p is not None and p.new_token == budget) else None
            basis.append(f"#queue-req {queue} (this version prints no #pending-token): the next batch has "
                         f"1..{hi} new tokens" + ("; the last batch filled its chunk, so the queue head is "
                                                    "probably a long prompt: likely a full chunk" if likely else ""))
        else:
            likely = None
            basis.append(f"no queued work in the last line: the next prefill comes from new arrivals, 1..{hi} tokens")
        rl = running_len(p, running)
        largest = tl.largest_prefill
        if largest is not None and largest.new_token and self.after:
            basis.append(f"largest prefill that ran on {rank}: {largest.new_token} new tokens (line {largest.line_no})")

        def make(v: int, version: str | None) -> dict:
            # How the tokens split between requests is not known (and does not change the row count).
            return prefill_doc(self.profile, version, self.gpu, self.sa(), 1, v, 0, running, rl,
                               f"reconstructed next prefill on {rank} ({v} new tokens)")
        label = (f"the prefill after line {p.line_no} (not in the log: this version prints a batch after its forward)"
                 if p is not None else "a prefill batch (no Prefill line on this rank)")
        c = Candidate(rank, "prefill", label, "query rows", 1, hi, likely, exact, basis, make, p,
                      list(self.versions))
        c.assumptions.append("assumption: the reconstructed batch is one request carrying all its new tokens (how they "
                             "split between requests is not known and does not change the row count)")
        return c

    def decode_step(self, rank: str, p: Step | None, d: Step | None) -> Candidate | None:
        last = max([s for s in (p, d) if s is not None], key=lambda s: s.line_no, default=None)
        if last is None:
            return None
        if last.kind == "decode":
            running = last.running_req or 0
            src = f"line {last.line_no}: {last.summary()} (a sample: decode lines are printed every " \
                  f"{self.cfg.get('decode_log_interval', 40)} steps)"
        else:
            running = (last.running_req or 0) + (last.num("new_seq", 0) or 0)
            src = f"line {last.line_no}: {last.summary()} -> about {running} running after it"
        if running <= 0:
            return None
        spec = spec_tokens(self.cfg)
        is_spec = spec > 0 or (d is not None and d.is_spec)
        limit = self.cfg.running_limit_per_rank()
        hi = max(running, limit or running)
        mode = Mode.TARGET_VERIFY if is_spec and spec > 0 else Mode.DECODE
        sl = running_len(d, running)
        basis = [src]
        if mode.is_target_verify():
            basis.append(f"speculative decoding verifies {spec} draft tokens per request: rows = batch size x {spec}")
        elif is_spec:
            basis.append("speculative decoding is on but the draft-token count is unknown "
                         "(pass --server-arg speculative_num_draft_tokens=N); checked as plain decode")
        if limit:
            basis.append(f"--max-running-requests allows up to {limit} per rank")

        def make(v: int, version: str | None) -> dict:
            return decode_doc(self.profile, version, self.gpu, self.sa(), v, sl, mode,
                              f"decode step on {rank} with {v} running request(s)")
        kind = "verify" if mode.is_target_verify() else "decode"
        c = Candidate(rank, kind, f"a {'verify' if kind == 'verify' else 'decode'} step near line {last.line_no}",
                      "batch size", running, hi, running, False, basis, make, last, list(self.versions))
        c.assumptions.append(f"assumption: every running request holds {sl} tokens (the line gives only the count "
                             "and the total)")
        return c

    def slot_buffers(self, d: Step | None, basis: list[str]) -> tuple[dict, list[dict]]:
        """Slot-indexed buffers the model and the log point to, beyond the request table.

        DSA compression tails exist only for DSA-indexer models; a hybrid mamba model (``mamba usage``
        in the log, or a known hybrid family) has a slot mapping table sized per DP worker but
        indexed by a global slot (the SLOT004 bug class)."""
        model = str(self.cfg.get("model_path", "") or "")
        dsa = (not model) or in_model_family("dsa", model)
        mamba = in_model_family("mamba", model) or (
            d is not None and any(k in d.fields for k in ("mamba_usage", "mamba_num")))
        model_doc: dict = {} if dsa else {"dsa_tails": False}
        buffers: list[dict] = []
        if mamba:
            buffers.append({"name": "mamba slot mapping", "rows_from": "running_limit", "scope": "per_dp",
                            "indexed_by": "global_slot"})
            basis.append("hybrid mamba model: its slot mapping table has max_running_requests / dp_size rows but is "
                         "indexed by a global slot")
        return model_doc, buffers

    def slot_step(self, rank: str, d: Step | None, err: ErrorEvent | None) -> Candidate | None:
        R = self.cfg.running_limit_per_rank()
        E = self.cfg.get("disaggregation_decode_extra_slots")
        pd = str(self.cfg.get("disaggregation_mode", "") or "").lower() == "decode"
        idx = err.numbers.get("index") if err is not None and err.kind == "index_oob" else None
        size = err.numbers.get("size") if err is not None and err.kind == "index_oob" else None
        basis = []
        if idx is not None:
            basis.append(f"the error names slot {idx} and a buffer of {size} rows (line {err.line_no})")
        running = d.running_req if d is not None and d.running_req else 1
        held = running
        if d is not None:
            held += (d.num("prealloc_req", 0) or 0) + (d.num("transfer_req", 0) or 0)
            basis.append(f"line {d.line_no}: {d.summary()}: about {held} slot(s) held")
        if R is None:
            self.notes.append("max_running_requests unknown: slot checks need it (pass --server-arg max_running_requests=N)")
            return None
        if pd and not isinstance(E, int):
            E, factor, lim = default_extra_slots(R)
            basis.append(f"--disaggregation-decode-extra-slots not given: SGLang's default {E} ({factor} x R when R <= {lim})")
        E = E if isinstance(E, int) and pd else 0
        table_max = R + E
        if pd:
            basis.append(f"PD decode worker: requests keep their pre-allocated slot, so live slots reach R + E = {R} + {E} = {table_max}")
        spec = spec_tokens(self.cfg)
        draft = spec > 0 or bool(self.cfg.get("speculative_algorithm"))
        mode = Mode.DRAFT_EXTEND if draft else Mode.DECODE
        if idx is not None:
            lo_v, hi_v, likely, exact = idx, idx, idx, True
        else:
            lo_v, hi_v, likely, exact = max(held, 1), max(table_max, held, 1), None, False
            basis.append(f"no slot number in the error: {lo_v} slot(s) are held, each distinct and >= 1, so the largest is "
                         f"at least {lo_v}; the table allows up to {hi_v}")
        n = max(1, min(running, MAX_SYNTH_REQUESTS))
        sl = running_len(d, running)

        model_doc, buffers = self.slot_buffers(d, basis)

        def make(v: int, version: str | None) -> dict:
            doc = decode_doc(self.profile, version, self.gpu, self.sa(), n, sl, mode,
                             f"{mode} step on {rank} with a request in slot {v}", slot=v)
            if model_doc:
                doc["model"] = dict(model_doc)
            if buffers:
                doc["buffers"] = [dict(b) for b in buffers]
                if global_indexed:      # the index a globally indexed buffer reports is a global slot
                    for r in doc["requests"]:
                        if "req_pool_idx" in r:
                            r["global_slot"] = r["req_pool_idx"]
            return doc
        global_indexed = any(b.get("indexed_by") == "global_slot" for b in buffers)
        if global_indexed:
            basis.append("the slot number is read as a global slot (the buffer is indexed across DP ranks)")
        label = (f"the {'draft-extend' if draft else 'decode'} step that indexed slot {idx}" if idx is not None
                 else f"a {'draft-extend' if draft else 'decode'} step on the PD decode worker" if pd
                 else f"a {'draft-extend' if draft else 'decode'} step")
        c = Candidate(rank, "slot", label, "slot index", lo_v, hi_v, likely, exact, basis, make, d,
                      list(self.versions))
        if n > 1:
            c.assumptions.append(f"assumption: the other {n - 1} request(s) hold the lowest free slots")
        return c
