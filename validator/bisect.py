"""Crash-report bisection: from engine evidence to the crashing step, the rule, the boundary, the fix.

Evidence (a log scanned by :mod:`validator.ingest.scan`, a crash dump, a launch command) gives, per
DP rank, the steps around the crash. From it this module builds *candidate* crashing steps as
batch documents, asks the project's checker about them (``validator.check``), and bisects the one
quantity that varies - query rows, slot index or batch size - to find the largest legal value.
Nothing here knows a limit: every verdict and boundary comes from the checker, so a new GPU, kernel
generation or engine version is a data change elsewhere.

How a candidate is built depends on when the engine printed its lines (see
``sglang-log-formats.md`` section 3): up to SGLang 0.5.8 the last ``Prefill batch`` line before the
error IS the crashing batch; from 0.5.10 it is the previous, successful batch, and the crashing one
is reconstructed from ``#pending-token`` / ``#queue-req`` and the chunked-prefill budget - as a
range when it cannot be exact.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import InputError
from .ingest.crash_dump import CrashDump
from .ingest.crash_lines import SIGNATURES, ErrorEvent
from .ingest.launch import EngineConfig
from .ingest.scan import LogEvidence, RankTimeline
from .ingest.sglang_log import Era, Step, after_forward_for_version, parse_version

# Batch server_args the engine profiles read (values are only passed when their type is right).
BATCH_ARGS = {
    "chunked_prefill_size": int, "max_prefill_tokens": int, "enable_mixed_chunk": bool,
    "max_running_requests": int, "dp_size": int, "enable_dp_attention": bool, "tp_size": int,
    "disaggregation_mode": str, "disaggregation_decode_extra_slots": int, "speculative_algorithm": str,
    "speculative_num_draft_tokens": int, "speculative_num_steps": int, "context_length": int,
    "prefill_max_requests": int, "cuda_graph_max_bs": int,
}
# Release number that stands for an era when the user gave no --sglang-version (the newest release
# that prints lines in that format). None: more than one profile version is possible.
ERA_RELEASE = {"E0-E1": ["0.4.0"], "E2-E4": ["0.5.3"], "E5": ["0.5.8"], "wild": ["0.5.8"],
               "E6": ["0.5.10"], "E6+ (decode)": ["0.5.10", "latest"], "E7+": ["0.5.12", "latest"],
               "E8": ["latest"], "E9": ["latest"]}
MAX_VALUE = 1 << 22          # search cap for a quantity (rows, slots, batch size)
MAX_SYNTH_REQUESTS = 1 << 16    # requests materialised in one synthetic batch
DEFAULT_MAX_PREFILL_TOKENS = 16384   # SGLang's default --max-prefill-tokens
# Model-path fragments (lower case) of DSA-indexer models (compression tails indexed by slot) and of
# hybrid mamba models (slot mapping tables).
DSA_MODELS = ("glm-5", "glm5", "deepseek-v3.2", "deepseek_v3.2", "v3.2-exp", "dsa")
MAMBA_MODELS = ("mamba", "qwen3-next", "qwen3_next", "nemotron-h", "jamba", "falcon-h", "granite-4", "lfm2")


# ------------------------------------------------------------------------------------ results
@dataclass
class Boundary:
    """Where the checker's verdict flips for the quantity that varies."""

    quantity: str
    largest_legal: int | None
    first_illegal: int | None
    observed: int | None
    codes: list[str]
    evaluations: int
    note: str = ""

    @property
    def margin(self) -> int | None:
        """How far the crash was past the boundary (negative: headroom left)."""
        if self.observed is None or self.largest_legal is None:
            return None
        return self.observed - self.largest_legal

    def to_dict(self) -> dict:
        return {"quantity": self.quantity, "largest_legal": self.largest_legal, "first_illegal": self.first_illegal,
                "observed": self.observed, "margin": self.margin, "codes": self.codes,
                "checks": self.evaluations, "note": self.note}


@dataclass
class Candidate:
    """One possible crashing step, as a family of batches indexed by the varying quantity."""

    rank: str
    kind: str                   # prefill | decode | verify | slot | vllm
    label: str
    quantity: str               # "query rows" | "slot index" | "batch size"
    lo: int
    hi: int
    likely: int | None
    exact: bool
    basis: list[str]
    make: Callable[[int, str | None], dict]
    step: Step | None = None
    versions: list[str | None] = field(default_factory=lambda: [None])
    # filled by evaluate()
    version: str | None = None
    verdict: str = "unchecked"          # illegal | legal | partly illegal | error
    codes: list[str] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    boundary: Boundary | None = None
    matches_error: bool = False
    batch: dict | None = None
    safe_split: dict | None = None
    check_error: str | None = None
    version_notes: list[str] = field(default_factory=list)

    @property
    def value(self) -> int:
        return self.likely if self.likely is not None else self.hi

    @property
    def is_illegal(self) -> bool:
        return self.verdict in ("illegal", "partly illegal")

    def to_dict(self) -> dict:
        d = {"rank": self.rank, "kind": self.kind, "label": self.label, "quantity": self.quantity,
             "range": [self.lo, self.hi], "likely": self.likely, "exact": self.exact, "basis": self.basis,
             "engine_version": self.version, "verdict": self.verdict, "codes": self.codes,
             "matches_error": self.matches_error, "findings": self.findings,
             "boundary": self.boundary.to_dict() if self.boundary else None, "batch": self.batch}
        if self.step is not None:
            d["from_line"] = self.step.line_no
        if self.safe_split is not None:
            d["safe_split"] = self.safe_split
        if self.check_error:
            d["check_error"] = self.check_error
        if self.version_notes:
            d["version_notes"] = self.version_notes
        return d


@dataclass
class Diagnosis:
    engine: str | None
    profile: list[str]
    error: ErrorEvent | None
    after_forward: bool | None
    version_basis: str
    candidates: list[Candidate]
    explained: Candidate | None
    fixes: list[dict]
    config: EngineConfig
    evidence: LogEvidence | None = None
    dump: CrashDump | None = None
    notes: list[str] = field(default_factory=list)
    kernel: dict | None = None

    @property
    def partial(self) -> bool:
        return self.explained is None or not self.explained.exact or self.error is None

    def to_dict(self) -> dict:
        ex = self.explained
        d = {
            "engine": self.engine, "profile": self.profile,
            "error": self.error.to_dict() if self.error else None,
            "prefill_logged_after_forward": self.after_forward, "version_basis": self.version_basis,
            "crashing_step": ex.to_dict() if ex else None,
            "rule": ex.codes if ex else [],
            "boundary": ex.boundary.to_dict() if ex and ex.boundary else None,
            "fixes": self.fixes, "partial": self.partial,
            "candidates": [c.to_dict() for c in self.candidates],
            "config": self.config.to_dict(), "notes": self.notes,
        }
        if self.evidence is not None:
            d["log"] = self.evidence.to_dict()
        if self.dump is not None:
            d["crash_dump"] = self.dump.to_dict()
        if self.kernel is not None:
            d["kernel"] = self.kernel
        return d


# ------------------------------------------------------------------------------------ checking
class Checker:
    """``validator.check`` with a cache; every verdict of this module comes through here."""

    def __init__(self, gpu: Any = None, kernel_gen: str | None = None):
        self.gpu = gpu
        self.kernel_gen = kernel_gen
        self.calls = 0

    def __call__(self, doc: dict, split: bool = False):
        from . import check

        self.calls += 1
        kw: dict = {"kernel": self.kernel_gen}
        if self.gpu is not None:
            kw["gpu"] = self.gpu
        if "engine" in doc:
            kw["split"] = split
        return check(doc, **kw)


def _error_codes(report, targets: set[str] | None) -> list[str]:
    codes = sorted({f.code for f in report.findings if f.is_error})
    if targets:
        return [c for c in codes if c in targets]
    return codes


def find_boundary(make: Callable[[int], dict], checker: Checker, lo: int, observed: int | None,
                  targets: set[str] | None, quantity: str, cap: int = MAX_VALUE) -> Boundary:
    """Largest ``v >= lo`` whose batch the checker finds legal (for the ``targets`` codes), by
    galloping up from ``observed`` (or ``lo``) and bisecting; assumes legality is monotone in ``v``."""
    cache: dict[int, list[str]] = {}

    def bad(v: int) -> list[str]:
        if v not in cache:
            cache[v] = _error_codes(checker(make(v)), targets)
        return cache[v]

    if bad(lo):
        return Boundary(quantity, None, lo, observed, bad(lo), len(cache),
                        note=f"illegal already at the smallest value {lo}: the varying quantity is not the cause")
    good = lo
    probe = observed if observed is not None and observed > lo else max(lo * 2, lo + 1)
    first_bad = None
    while probe <= cap:
        if bad(probe):
            first_bad = probe
            break
        good = probe
        probe = probe * 2
    if first_bad is None:
        return Boundary(quantity, None, None, observed, [], len(cache),
                        note=f"legal up to {good}: no boundary below {cap}")
    while first_bad - good > 1:
        mid = (good + first_bad) // 2
        if bad(mid):
            first_bad = mid
        else:
            good = mid
    return Boundary(quantity, good, first_bad, observed, bad(first_bad), len(cache))


# ------------------------------------------------------------------------------------ batches
def _server_args(cfg: EngineConfig, **override) -> dict:
    out = {}
    for k, typ in BATCH_ARGS.items():
        v = override.get(k, cfg.values.get(k))
        if v is None:
            continue
        if typ is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            continue
        if typ is bool and not isinstance(v, bool):
            continue
        if typ is str:
            v = str(v)
        out[k] = v
    if cfg.dp_attention and cfg.chunk_per_rank() is not None:
        out["chunked_prefill_size"] = cfg.chunk_per_rank()
    for k, v in override.items():
        if v is not None and k in BATCH_ARGS:
            out[k] = v
    return out


def _split_even(total: int, n: int) -> list[int]:
    n = max(1, min(n, max(total, 1)))
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _engine(profile: list[str], version: str | None) -> str | list[str]:
    names = [f"{p}@{version}" if version and "@" not in p else p for p in profile]
    return names[0] if len(names) == 1 else names


def prefill_doc(profile, version, gpu, sa, n_seq, rows, cached, running, running_len, label) -> dict:
    reqs = []
    prefix = _split_even(cached, n_seq) if cached else None
    for i, t in enumerate(_split_even(rows, min(n_seq, MAX_SYNTH_REQUESTS))):
        r = {"id": f"p{i + 1}", "extend_tokens": t}
        if prefix and i < len(prefix):
            r["prefix_len"] = prefix[i]
        reqs.append(r)
    doc = {"label": label, "engine": _engine(profile, version), "server_args": sa, "forward_mode": "extend",
           "requests": reqs}
    if gpu is not None:
        doc["gpu"] = gpu
    if running:
        doc["running"] = [{"id": f"d{i + 1}", "seq_len": running_len} for i in range(min(running, MAX_SYNTH_REQUESTS))]
    return doc


def decode_doc(profile, version, gpu, sa, n, seq_len, mode, label, slot: int | None = None,
               slots_used: int | None = None) -> dict:
    n = max(1, min(n, MAX_SYNTH_REQUESTS))
    reqs = []
    taken = set()
    if slot is not None:
        taken.add(slot)
    nxt = 1
    for i in range(n):
        r: dict = {"id": f"r{i + 1}", "seq_len": seq_len}
        if slot is not None:
            if i == n - 1:
                r["req_pool_idx"] = slot
            else:
                while nxt in taken:
                    nxt += 1
                r["req_pool_idx"] = nxt
                taken.add(nxt)
        if mode == "draft_extend":
            r = {"id": r["id"], "extend_tokens": max(int(sa.get("speculative_num_draft_tokens") or 1), 1),
                 "prefix_len": seq_len, **({"req_pool_idx": r["req_pool_idx"]} if "req_pool_idx" in r else {})}
        reqs.append(r)
    doc = {"label": label, "engine": _engine(profile, version), "server_args": sa, "forward_mode": mode,
           "requests": reqs}
    if gpu is not None:
        doc["gpu"] = gpu
    return doc


# ------------------------------------------------------------------------------------ profiles
def choose_profile(cfg: EngineConfig, err: ErrorEvent | None, override: list[str] | None,
                   evidence: LogEvidence | None) -> tuple[list[str], str]:
    if override:
        return override, "given with --engine"
    model = str(cfg.get("model_path", "") or "").lower()
    pd_decode = str(cfg.get("disaggregation_mode", "") or "").lower() == "decode"
    slot_err = err is not None and err.quantity == "slot"
    is_dsv4 = any(k in model for k in ("deepseek-v4", "deepseek_v4", "dsv4", "deepseekv4"))
    swa_hint = evidence is not None and any(
        "full_token_usage" in s.fields or "swa_token_usage" in s.fields
        for tl in evidence.ranks.values() for s in list(tl.steps)[-4:])
    if slot_err:
        return ["sglang-slots"], f"the error ({err.kind}) is a slot index out of a buffer"
    if is_dsv4:
        prof = ["sglang-dsv4"] + (["sglang-slots"] if pd_decode else [])
        return prof, f"model {cfg.get('model_path')!r} is DeepSeek-V4"
    if err is not None and err.kind == "flashmla_sched":
        return ["sglang-dsv4"], "the error is FlashMLA's scheduler failing (one query row per token, as in DSv4)"
    if pd_decode and any(k in model for k in ("glm", "dsa", "deepseek-v3.2", "v3.2")):
        return ["sglang-slots"], "a PD decode worker of a DSA-indexer model"
    if swa_hint:
        return ["sglang-dsv4"], "hybrid SWA usage fields in the log (DeepSeek-V4 style)"
    if pd_decode:
        return ["sglang-slots"], "a PD decode worker"
    return ["sglang-dsv4"], "no model or error pointed elsewhere; the DeepSeek-V4 FlashMLA profile is the default"


def versions_to_try(user_version: str | None, era: Era | None) -> tuple[list[str | None], bool | None, str]:
    """Profile versions to evaluate, whether Prefill lines follow their forward, and why."""
    if user_version:
        v = parse_version(user_version)
        return [".".join(str(x) for x in v[:3])], after_forward_for_version(v), f"--sglang-version {user_version}"
    if era is None:
        return [None], None, "no scheduler lines to date the log; profiles' default versions"
    rel = ERA_RELEASE.get(era.label, ["latest"])
    return list(rel), era.after_forward, f"line format {era.label}: SGLang {era.versions}"


# ------------------------------------------------------------------------------------ candidates
def _running_len(step: Step | None, running: int) -> int:
    """A representative sequence length for running decodes (only their count matters for rows)."""
    if step is not None and running > 0:
        for key in ("full_token", "token"):
            v = step.fields.get(key)
            if isinstance(v, dict):
                v = v.get("full", v.get("value"))
            if isinstance(v, int) and v > 0:
                return max(1, v // max(running, 1))
    return 1024


def _spec_tokens(cfg: EngineConfig) -> int:
    d = cfg.get("speculative_num_draft_tokens")
    return d if isinstance(d, int) and not isinstance(d, bool) and d > 0 else 0


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
        return _server_args(self.cfg, **kw)

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
        rl = _running_len(p, running)

        def make(v: int, version: str | None) -> dict:
            return prefill_doc(self.profile, version, self.gpu, self.sa(enable_mixed_chunk=mixed or None),
                               n_seq, v, cached, running, rl, f"{label} ({v} new tokens)")
        basis = [f"line {p.line_no}: {p.summary()}"]
        if mixed and running:
            basis.append(f"mixed chunking merges the {running} running decode(s) into this forward")
        return Candidate(rank, "prefill", label, "query rows", rows, rows, rows, exact, basis, make, p,
                         list(self.versions))

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
            m = self.cfg.max_prefill_tokens() or DEFAULT_MAX_PREFILL_TOKENS
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
        rl = _running_len(p, running)
        largest = tl.largest_prefill
        if largest is not None and largest.new_token and self.after:
            basis.append(f"largest prefill that ran on {rank}: {largest.new_token} new tokens (line {largest.line_no})")

        def make(v: int, version: str | None) -> dict:
            # How the tokens split between requests is not known (and does not change the row count).
            return prefill_doc(self.profile, version, self.gpu, self.sa(), 1, v, 0, running, rl,
                               f"reconstructed next prefill on {rank} ({v} new tokens)")
        label = (f"the prefill after line {p.line_no} (not in the log: this version prints a batch after its forward)"
                 if p is not None else "a prefill batch (no Prefill line on this rank)")
        return Candidate(rank, "prefill", label, "query rows", 1, hi, likely, exact, basis, make, p,
                         list(self.versions))

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
        spec = _spec_tokens(self.cfg)
        is_spec = spec > 0 or (d is not None and d.is_spec)
        limit = self.cfg.running_limit_per_rank()
        hi = max(running, limit or running)
        mode = "target_verify" if is_spec and spec > 0 else "decode"
        sl = _running_len(d, running)
        basis = [src]
        if mode == "target_verify":
            basis.append(f"speculative decoding verifies {spec} draft tokens per request: rows = batch size x {spec}")
        elif is_spec:
            basis.append("speculative decoding is on but the draft-token count is unknown "
                         "(pass --server-arg speculative_num_draft_tokens=N); checked as plain decode")
        if limit:
            basis.append(f"--max-running-requests allows up to {limit} per rank")

        def make(v: int, version: str | None) -> dict:
            return decode_doc(self.profile, version, self.gpu, self.sa(), v, sl, mode,
                              f"decode step on {rank} with {v} running request(s)")
        kind = "verify" if mode == "target_verify" else "decode"
        return Candidate(rank, kind, f"a {'verify' if kind == 'verify' else 'decode'} step near line {last.line_no}",
                         "batch size", running, hi, running, False, basis, make, last, list(self.versions))

    def slot_buffers(self, d: Step | None, basis: list[str]) -> tuple[dict, list[dict]]:
        """Slot-indexed buffers the model and the log point to, beyond the request table.

        DSA compression tails exist only for DSA-indexer models; a hybrid mamba model (``mamba usage``
        in the log, or a known hybrid family) has a slot mapping table sized per DP worker but
        indexed by a global slot (the SLOT004 bug class)."""
        model = str(self.cfg.get("model_path", "") or "").lower()
        dsa = (not model) or any(k in model for k in DSA_MODELS)
        mamba = any(k in model for k in MAMBA_MODELS) or (
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
            lim = 32
            E = 2 * R if R <= lim else 0
            basis.append(f"--disaggregation-decode-extra-slots not given: SGLang's default {E} (2 x R when R <= {lim})")
        E = E if isinstance(E, int) and pd else 0
        table_max = R + E
        if pd:
            basis.append(f"PD decode worker: requests keep their pre-allocated slot, so live slots reach R + E = {R} + {E} = {table_max}")
        spec = _spec_tokens(self.cfg)
        draft = spec > 0 or bool(self.cfg.get("speculative_algorithm"))
        mode = "draft_extend" if draft else "decode"
        if idx is not None:
            lo_v, hi_v, likely, exact = idx, idx, idx, True
        else:
            lo_v, hi_v, likely, exact = max(held, 1), max(table_max, held, 1), None, False
            basis.append(f"no slot number in the error: {lo_v} slot(s) are held, each distinct and >= 1, so the largest is "
                         f"at least {lo_v}; the table allows up to {hi_v}")
        n = max(1, min(running, MAX_SYNTH_REQUESTS))
        sl = _running_len(d, running)

        model_doc, buffers = self.slot_buffers(d, basis)

        def make(v: int, version: str | None) -> dict:
            doc = decode_doc(self.profile, version, self.gpu, self.sa(), n, sl, mode,
                             f"{mode} step on {rank} with a request in slot {v}", slot=v)
            if model_doc:
                doc["model"] = dict(model_doc)
            if buffers:
                doc["buffers"] = [dict(b) for b in buffers]
            return doc
        label = (f"the {'draft-extend' if draft else 'decode'} step that indexed slot {idx}" if idx is not None
                 else f"a {'draft-extend' if draft else 'decode'} step on the PD decode worker" if pd
                 else f"a {'draft-extend' if draft else 'decode'} step")
        return Candidate(rank, "slot", label, "slot index", lo_v, hi_v, likely, exact, basis, make, d,
                         list(self.versions))


# ------------------------------------------------------------------------------------ evaluate
def _summarise(report) -> list[dict]:
    out = []
    for f in report.findings:
        if f.is_error:
            out.append({"code": f.code, "message": f.message, "numbers": f.numbers, "fix": f.fix})
    return out


def evaluate(c: Candidate, checker: Checker, err: ErrorEvent | None) -> None:
    """Check the candidate under each possible engine version; keep the version most consistent with the
    error, then bisect the boundary of the varying quantity.

    Verdicts: ``illegal`` (at the likely value, or at the lower end of the range when no value is
    likely), ``partly illegal`` (only the upper part of the range breaks a rule), ``legal``."""
    targets = set(SIGNATURES.get(err.kind, (0, (), None))[1]) if err is not None else set()
    best = None
    for ver in c.versions:
        try:
            point = c.likely if c.likely is not None else c.lo
            rep_p = checker(c.make(point, ver), split=False)
            codes_p = _error_codes(rep_p, None)
            rep_h, codes_h = rep_p, codes_p
            if c.hi != point:
                rep_h = checker(c.make(c.hi, ver), split=False)
                codes_h = _error_codes(rep_h, None)
        except InputError as e:
            c.check_error = f"the checker rejected the reconstructed batch: {e}"
            c.verdict = "error"
            return
        if codes_p:
            verdict, codes, rep, at = "illegal", codes_p, rep_p, point
        elif codes_h:
            verdict, codes, rep, at = "partly illegal", codes_h, rep_h, c.hi
        else:
            verdict, codes, rep, at = "legal", [], rep_p, point
        match = bool(targets & set(codes)) if targets else bool(codes)
        score = (match, {"illegal": 2, "partly illegal": 1}.get(verdict, 0))
        if ver is not None and len(c.versions) > 1:
            c.version_notes.append(f"{ver}: {verdict}" + (f" ({', '.join(codes)})" if codes else "")
                                   + f" at {at} {c.quantity}")
        if best is None or score > best[0]:
            best = (score, ver, verdict, codes, rep, at, match)
    assert best is not None
    _, ver, verdict, codes, rep, at, match = best
    c.version, c.verdict, c.codes = ver, verdict, codes
    c.findings = _summarise(rep)
    c.matches_error = match
    c.batch = c.make(at, ver)
    if verdict == "legal":
        return   # its headroom is only bisected when nothing explains the crash (see add_headroom)
    tcodes = set(c.codes) or targets or None
    c.boundary = find_boundary(lambda v: c.make(v, ver), checker, 1, at, tcodes, c.quantity)
    try:
        full = checker(c.batch, split=True)
        if full.safe_split is not None:
            c.safe_split = full.safe_split.to_dict() if hasattr(full.safe_split, "to_dict") else full.safe_split
    except InputError:
        pass


# ------------------------------------------------------------------------------------ fixes
def _power_of_two_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def propose_fixes(c: Candidate, cfg: EngineConfig, checker: Checker, profile: list[str]) -> list[dict]:
    """Settings that keep the crashing quantity at or below the boundary, each verified by the checker."""
    b = c.boundary
    fixes: list[dict] = []
    if b is None or b.largest_legal is None:
        return fixes
    L = b.largest_legal
    ver = c.version
    dp = cfg.dp_size if cfg.dp_attention else 1

    def verify(doc: dict) -> bool:
        try:
            return checker(doc, split=False).legal
        except InputError:
            return False

    if c.kind == "prefill":
        mixed = bool(cfg.get("enable_mixed_chunk", False))
        R = cfg.running_limit_per_rank() or 0
        cap = L - (R if mixed else 0)
        if cap >= 1:
            for val, why in ((cap, "the largest legal chunk"), (_power_of_two_at_most(cap), "a round value below it")):
                worst = c.make(val, ver)
                if mixed and R:
                    worst = prefill_doc(profile, ver, checker.gpu, _server_args(cfg, enable_mixed_chunk=True), 1, val,
                                        0, R, 1024, f"worst case: {val}-token chunk + {R} merged decodes")
                flag_val = val * dp
                fix = {"flag": "--chunked-prefill-size", "value": flag_val,
                       "why": f"{why}: every extend forward then has <= {val} new tokens per rank"
                              + (f" (+ {R} merged decodes)" if mixed else "")
                              + (f"; the flag is divided by dp_size={dp} under DP attention" if dp > 1 else ""),
                       "verified": verify(worst)}
                if not any(f["flag"] == fix["flag"] and f["value"] == flag_val for f in fixes):
                    fixes.append(fix)
            fixes.append({"flag": "--max-prefill-tokens", "value": cap,
                          "why": "keeps a whole prefill batch within the limit (chunking must stay on: "
                                 "without it one long prompt exceeds any max-prefill-tokens)",
                          "verified": verify(c.make(cap, ver))})
        if "sglang-dsv4" in profile and ver not in (None, "latest"):
            try:
                up = checker(c.make(c.value if c.verdict != "partly illegal" else c.hi, "latest"), split=False)
                fixes.append({"flag": "(upgrade)", "value": "an SGLang build with sparse-prefill routing",
                              "why": "large extend forwards go to flash_mla_sparse_fwd; forwards just above the "
                                     "limit may still reach the decode kernel (see SGL001)",
                              "verified": up.legal})
            except InputError:
                pass
    elif c.kind in ("decode", "verify"):
        spec = _spec_tokens(cfg) if c.kind == "verify" else 1
        per_rank = L
        fixes.append({"flag": "--max-running-requests", "value": per_rank * dp,
                      "why": f"at most {per_rank} requests per rank decode at once"
                             + (f" ({per_rank} x {spec} draft tokens = {per_rank * spec} rows)" if c.kind == "verify" else ""),
                      "verified": verify(c.make(per_rank, ver))})
    elif c.kind == "slot":
        R = cfg.running_limit_per_rank()
        pd = str(cfg.get("disaggregation_mode", "") or "").lower() == "decode"
        if pd and R is not None and L >= R:
            e_new = L - R
            doc = c.make(max(R + e_new, 1), ver)
            doc["server_args"] = {**doc["server_args"], "disaggregation_decode_extra_slots": e_new}
            fixes.append({"flag": "--disaggregation-decode-extra-slots", "value": e_new,
                          "why": f"live slots then stay <= R + E = {R + e_new}, inside every slot-indexed buffer "
                                 "(a stopgap: it limits PD pre-allocation)", "verified": verify(doc)})
        if "sglang-slots" in profile and "SLOT002" in c.codes:
            doc = c.make(c.value, "latest")
            fixes.append({"flag": "(upgrade)", "value": "an SGLang build whose slot-indexed buffers are sized from the request table",
                          "why": "the NextN draft's DSA tails get table rows + 1 rows", "verified": verify(doc)})
    # What each broken rule itself says to do (engine-side fixes; not settings the checker can try).
    seen = set()
    for f in c.findings:
        if f.get("fix") and f["code"] not in seen:
            seen.add(f["code"])
            fixes.append({"flag": f"({f['code']})", "value": f["fix"], "why": "the rule's own advice", "verified": None})
    return fixes


# ------------------------------------------------------------------------------------ main entry
@dataclass
class BisectOptions:
    sglang_version: str | None = None
    engine: list[str] | None = None
    gpu: Any = None
    kernel_gen: str | None = None
    rank: str | None = None
    kernel: bool = False
    kernel_console: Any = None


def _ranks_to_check(ev: LogEvidence, err: ErrorEvent | None, want: str | None) -> list[str]:
    ranks = sorted(ev.ranks)
    if want:
        w = want.upper() if want.upper().startswith("DP") else f"DP{want}"
        if w not in ev.ranks:
            raise InputError("--rank", f"no scheduler lines for {w} in the log; ranks seen: {', '.join(ranks) or 'none'}")
        return [w]
    if err is not None and err.rank is not None and err.rank in ev.ranks:
        return [err.rank] + [r for r in ranks if r != err.rank]
    return ranks


def diagnose(evidence: LogEvidence | None, cfg: EngineConfig, dump: CrashDump | None = None,
             opts: BisectOptions | None = None) -> Diagnosis:
    opts = opts or BisectOptions()
    notes: list[str] = []
    err = evidence.root_error() if evidence is not None else None
    engine = (evidence.engine if evidence is not None else None) or cfg.engine or ("sglang" if dump else None)
    checker = Checker(opts.gpu, opts.kernel_gen)

    if evidence is not None and evidence.vllm_steps and not evidence.ranks:
        return _diagnose_vllm(evidence, cfg, err, checker, opts, notes)

    profile, why_profile = choose_profile(cfg, err, opts.engine, evidence)
    era = evidence.era() if evidence is not None else None
    versions, after, vbasis = versions_to_try(opts.sglang_version, era)
    eras_seen = list(evidence.era_examples.values()) if evidence is not None else []
    clash = any(not a.compatible(b) for a in eras_seen for b in eras_seen)
    if clash and not opts.sglang_version:
        notes.append(f"the log mixes line formats {dict(evidence.eras)}: the most recent one ({era.label if era else '?'}) "
                     "decides; pass --sglang-version to be sure")
    if after is None and not opts.sglang_version:
        notes.append("the print order of this log's Prefill lines is not known for its version: both the last "
                     "logged batch and the next one are checked (pass --sglang-version to decide)")
    notes.append(f"engine profile {', '.join(profile)}: {why_profile}")
    b = Builder(cfg, profile, opts.gpu, versions, after, notes)
    cands: list[Candidate] = []
    quantity = err.quantity if err is not None else None

    if evidence is not None and evidence.ranks:
        for rank in _ranks_to_check(evidence, err, opts.rank):
            tl = evidence.ranks[rank]
            cut = err.line_no if err is not None else None
            p = tl.last("prefill", cut)
            d = tl.last("decode", cut)
            if quantity == "slot" or (quantity is None and profile == ["sglang-slots"]):
                sc = b.slot_step(rank, d, err)
                if sc:
                    cands.append(sc)
                continue
            p_last = p is not None and (d is None or p.line_no > d.line_no)
            if after is False or after is None:
                if p is not None:
                    cands.append(b.prefill_logged(rank, p, exact=p_last and after is False,
                                                  label=f"the last logged prefill (line {p.line_no}), printed before its forward"
                                                  if after is False else f"the last logged prefill (line {p.line_no})"))
            if after is True or after is None:
                nc = b.prefill_next(rank, p, tl)
                if nc:
                    cands.append(nc)
            dc = b.decode_step(rank, p, d)
            if dc:
                if after is False and p_last:
                    dc.basis.append("less likely: the last line before the crash is a Prefill line")
                cands.append(dc)
            if "sglang-slots" in profile and quantity != "rows":
                sc = b.slot_step(rank, d, err)
                if sc:
                    cands.append(sc)
    else:
        cands.extend(_candidates_without_steps(b, cfg, err, dump, notes))

    for c in cands:
        evaluate(c, checker, err)
    explained = _pick(cands, err)
    if explained is None:
        for c in cands[:3]:
            add_headroom(c, checker, err)
    if explained is None and err is not None and err.kind == "index_oob":
        n_, m_ = err.numbers["index"], err.numbers["size"]
        notes.append(f"the error itself says: index {n_} into a buffer of {m_} rows, so the largest legal index there is "
                     f"{m_ - 1} (over by {n_ - m_ + 1}); give the settings (--launch / --server-arg "
                     "max_running_requests=..., disaggregation_decode_extra_slots=...) to name the buffer and check it")
    if explained is None and cands:
        notes.append("no candidate step breaks a rule the model knows: the crash is not explained by the "
                     "checker (the settings may be incomplete - pass --launch / --server-arg - or the cause is "
                     "outside the modelled limits)")
    fixes = propose_fixes(explained, cfg, checker, profile) if explained is not None else []
    if explained is not None and explained.boundary is not None and err is not None:
        _cross_check(explained, err, notes)
    if evidence is not None:
        _survival_check(evidence, explained, after, notes)
        _budget_check(evidence, b, notes)
    if err is None and evidence is not None:
        notes.append("no error line found: the log may end before the crash; the verdicts are for the last steps logged")
    diag = Diagnosis(engine or "sglang", profile, err, after, vbasis, cands, explained, fixes, cfg, evidence, dump, notes)
    if opts.kernel:
        diag.kernel = kernel_hook(explained, checker, opts.kernel_console)
    return diag


def add_headroom(c: Candidate, checker: Checker, err: ErrorEvent | None) -> None:
    """For a legal candidate: how far its quantity could grow before the error's rules (or any rule) fire."""
    if c.verdict != "legal" or c.boundary is not None:
        return
    targets = set(SIGNATURES.get(err.kind, (0, (), None))[1]) if err is not None else set()
    c.boundary = find_boundary(lambda v: c.make(v, c.version), checker, 1, c.value, targets or None, c.quantity)


def _pick(cands: list[Candidate], err: ErrorEvent | None) -> Candidate | None:
    """The candidate that best explains the crash: breaks a rule whose failure matches the error,
    at its likely value rather than only at the top of its range, exact rather than reconstructed."""
    illegal = [c for c in cands if c.is_illegal]
    if not illegal:
        return None
    err_rank = err.rank if err is not None else None
    return max(illegal, key=lambda c: (c.matches_error, c.rank == err_rank, c.verdict == "illegal", c.exact,
                                       c.likely is not None, -cands.index(c)))


def _cross_check(c: Candidate, err: ErrorEvent, notes: list[str]) -> None:
    b = c.boundary
    if err.kind == "index_oob" and b is not None and b.largest_legal is not None:
        size = err.numbers.get("size")
        if size is not None and b.largest_legal != size - 1:
            notes.append(f"the error's buffer has {size} rows (largest index {size - 1}) but the model's boundary is "
                         f"{b.largest_legal}: the settings given differ from the crashed server's")
        elif size is not None:
            notes.append(f"the model agrees with the error: the buffer has {size} rows, so slot {size - 1} is the "
                         f"largest legal one")


def _survival_check(ev: LogEvidence, c: Candidate | None, after: bool | None, notes: list[str]) -> None:
    """A prefill printed after its forward ran: if the model calls it illegal, say so."""
    if c is None or c.boundary is None or c.boundary.largest_legal is None or c.quantity != "query rows":
        return
    if after is not True:
        return
    tl = ev.ranks.get(c.rank)
    big = tl.largest_prefill if tl else None
    if big is not None and big.new_token and big.new_token > c.boundary.largest_legal and c.kind == "prefill":
        notes.append(f"line {big.line_no}: a prefill of {big.new_token} new tokens completed, above the model's "
                     f"boundary {c.boundary.largest_legal}: the engine version or settings differ from those assumed")


def _budget_check(ev: LogEvidence, b: Builder, notes: list[str]) -> None:
    """A logged prefill larger than the chunk budget means the settings given are not the server's."""
    budget, bsrc = b.budget()
    if budget is None:
        return
    big = max((tl.largest_prefill for tl in ev.ranks.values() if tl.largest_prefill is not None),
              key=lambda s: s.new_token or 0, default=None)
    if big is not None and (big.new_token or 0) > budget:
        notes.append(f"line {big.line_no}: a prefill of {big.new_token} new tokens on {big.rank} is larger than the "
                     f"budget {bsrc}: the settings given do not match this server's")


def _candidates_without_steps(b: Builder, cfg: EngineConfig, err: ErrorEvent | None, dump: CrashDump | None,
                              notes: list[str]) -> list[Candidate]:
    out: list[Candidate] = []
    if err is not None and err.quantity == "slot":
        sc = b.slot_step("DP0", None, err)
        return [sc] if sc else []
    if dump is not None and dump.unfinished:
        waiting = [r for r in dump.unfinished if not r.completion_tokens]
        decoding = [r for r in dump.unfinished if r.completion_tokens]
        budget, bsrc = b.budget()
        toks = [max((r.prompt_tokens or 0) - (r.cached_tokens or 0), 0) for r in waiting]
        total = sum(toks)
        if waiting and total:
            hi = min(total, budget) if budget else total
            basis = [f"crash dump: {len(waiting)} unfinished request(s) without output ({total} prompt tokens not cached), "
                     f"{len(decoding)} decoding", f"a prefill batch takes at most {bsrc}" if budget else bsrc]

            def make(v: int, version: str | None, n=len(waiting), run=len(decoding)) -> dict:
                return prefill_doc(b.profile, version, b.gpu, b.sa(), n, v, 0, run, 1024,
                                   f"prefill of the dump's waiting requests ({v} new tokens)")
            out.append(Candidate("DP0", "prefill", "the prefill of the requests waiting at the crash (crash dump)",
                                 "query rows", 1, hi, hi, budget is not None and total >= budget, basis, make, None,
                                 list(b.versions)))
        if decoding:
            n = len(decoding)
            sl = sum((r.prompt_tokens or 0) + (r.completion_tokens or 0) for r in decoding) // n or 1
            spec = _spec_tokens(cfg)
            mode = "target_verify" if spec else "decode"

            def make_d(v: int, version: str | None) -> dict:
                return decode_doc(b.profile, version, b.gpu, b.sa(), v, sl, mode, f"decode of {v} request(s) (crash dump)")
            out.append(Candidate("DP0", "verify" if spec else "decode", "the decode step of the requests running at the crash",
                                 "batch size", n, n, n, False, [f"crash dump: {n} unfinished request(s) with output"],
                                 make_d, None, list(b.versions)))
        return out
    budget, bsrc = b.budget()
    if budget is not None:
        notes.append("no scheduler lines: judging the largest prefill the settings allow")

        def make(v: int, version: str | None) -> dict:
            return prefill_doc(b.profile, version, b.gpu, b.sa(), 1, v, 0, 0, 1024, f"a {v}-token prefill")
        out.append(Candidate("DP0", "prefill", "the largest prefill the settings allow (no scheduler lines in the log)",
                             "query rows", 1, budget, None, False, [f"a prefill batch takes at most {bsrc}"], make,
                             None, list(b.versions)))
    else:
        notes.append("no scheduler lines and no chunked-prefill size: nothing to reconstruct a step from")
    return out


def _diagnose_vllm(ev: LogEvidence, cfg: EngineConfig, err: ErrorEvent | None, checker: Checker,
                   opts: BisectOptions, notes: list[str]) -> Diagnosis:
    """vLLM's dump IS the crashing step; its rows are checked as one FlashMLA call with b = total
    scheduled tokens (vLLM's FP8 sparse MLA runs a whole mixed batch through the decode kernel)."""
    step = ev.vllm_steps[-1]
    rows = step.total_rows
    h_q = 64
    topk = 2048

    def make(v: int, version: str | None = None) -> dict:
        rec = {"kind": "sparse", "b": max(v, 1), "s_q": 1, "h_q": h_q, "d_qk": 512, "topk": topk,
               "label": f"vLLM step with {v} scheduled tokens"}
        return rec
    dec = sum(1 for r in step.requests if r.is_decode)
    basis = [f"line {step.line_no}: SchedulerOutput with {len(step.requests)} request(s) ({dec} decoding), "
             f"{rows} scheduled tokens" + (f" (total_num_scheduled_tokens={step.total_num_scheduled_tokens})"
                                           if step.total_num_scheduled_tokens is not None else ""),
             f"checked as one FlashMLA sparse decode call with b = {rows} rows (s_q 1, h_q {h_q}, topk {topk}): "
             "vLLM's FP8 sparse MLA treats the whole batch as decode rows"]
    basis += step.notes
    c = Candidate("DP0", "vllm", f"the step vLLM dumped at line {step.line_no} (the crashing step)", "query rows",
                  rows, rows, rows, step.complete, basis, make, None, [None])
    c_batch = {"requests": [r.to_dict() for r in step.requests]}
    evaluate(c, checker, err)
    c.batch = {**(c.batch or {}), "vllm_step": c_batch}
    explained = c if c.is_illegal else None
    fixes = []
    if explained is not None and c.boundary and c.boundary.largest_legal:
        L = c.boundary.largest_legal
        fixes.append({"flag": "--max-num-batched-tokens", "value": L,
                      "why": f"caps the tokens of one step at {L} rows", "verified": checker(make(L)).legal})
    else:
        notes.append("the dumped step does not break a modelled limit")
    notes.append("engine: vLLM (crash-time scheduler dump)")
    return Diagnosis("vllm", ["flashmla-call"], err, False, "vLLM dumps the crashing step itself", [c], explained,
                     fixes, cfg, ev, None, notes)


def kernel_hook(c: Candidate | None, checker: "Checker", console: Any = None) -> dict:
    """Kernel mode: run the crashing step's FlashMLA calls on the real kernels through
    ``validator.kernel.check.kernel_check_report`` (one child process per call) and return its
    JSON-able result; when kernel mode is not built in, say so instead."""
    if c is None or c.batch is None:
        return {"available": False, "reason": "no crashing step to run"}
    try:
        from .kernel.check import kernel_check_report  # type: ignore[import-not-found]
    except ImportError as e:
        return {"available": False, "reason": f"kernel mode is not available in this build ({e})"}
    try:
        rep = checker(c.batch, split=False)
        return kernel_check_report(rep, console)
    except Exception as e:  # the kernel bridge drives real GPUs: report, never crash the diagnosis
        return {"available": False, "reason": f"kernel mode failed: {type(e).__name__}: {e}"}
