"""Candidate crashing steps when no scheduler line was logged: from the error, a crash dump, the settings."""
from __future__ import annotations

from ..ingest.crash_dump import CrashDump
from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..facts.modes import Mode
from .builder import Builder
from .docs import decode_doc, prefill_doc, spec_tokens
from .results import Candidate


def candidates_without_steps(b: Builder, cfg: EngineConfig, err: ErrorEvent | None, dump: CrashDump | None,
                              notes: list[str]) -> list[Candidate]:
    """Candidates when the log has no scheduler lines: from a slot error, a crash dump's unfinished
    requests, or the largest prefill the settings allow."""
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
            spec = spec_tokens(cfg)
            mode = Mode.TARGET_VERIFY if spec else Mode.DECODE

            def make_d(v: int, version: str | None) -> dict:
                return decode_doc(b.profile, version, b.gpu, b.sa(), v, sl, mode, f"decode of {v} request(s) (crash dump)")
            out.append(Candidate("DP0", "verify" if spec else "decode", "the decode step of the requests running at the crash",
                                 "batch size", n, n, n, False, [f"crash dump: {n} unfinished request(s) with output"],
                                 make_d, None, list(b.versions)))
        return out
    if cfg.entry_point == "sglang.bench_one_batch":
        return bench_one_batch_steps(b, cfg)
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


def _ints(v: object, default: int) -> list[int]:
    vals = v if isinstance(v, list) else [v]
    out = [x for x in vals if isinstance(x, int) and not isinstance(x, bool) and x > 0]
    return out or [default]


def bench_one_batch_steps(b: Builder, cfg: EngineConfig) -> list[Candidate]:
    """``sglang.bench_one_batch`` runs, for each ``--batch-size`` and ``--input-len``, one extend forward of
    batch-size requests of input-len tokens, unchunked (sglang 0.5.12 sglang/bench_one_batch.py:395-417 builds
    the requests, 441-458 runs them as one extend; defaults 1 and 1024 at 189-190): each is an exact step."""
    out = []
    for bs in _ints(cfg.get("batch_size"), 1)[:4]:
        for il in _ints(cfg.get("input_len"), 1024)[:4]:
            rows = bs * il

            def make(v: int, version: str | None, n=bs) -> dict:
                return prefill_doc(b.profile, version, b.gpu, b.sa(), n, v, 0, 0, 1024,
                                   f"bench_one_batch extend of {n} request(s) ({v} new tokens)")
            basis = [f"sglang.bench_one_batch --batch-size {bs} --input-len {il}: one extend forward of {bs} request(s) "
                     f"x {il} tokens = {rows} new tokens, not chunked"]
            c = Candidate("DP0", "prefill", f"bench_one_batch's extend of {bs} x {il} tokens", "query rows",
                          rows, rows, rows, True, basis, make, None, list(b.versions))
            out.append(c)
    return out
