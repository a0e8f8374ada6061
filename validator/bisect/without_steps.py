"""Candidate crashing steps when no scheduler line was logged: from the error, a crash dump, the settings."""
from __future__ import annotations

from ..ingest.crash_dump import CrashDump
from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..facts.modes import Mode
from .builder import Builder
from .data import bench_defaults
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
    if cfg.entry_point == "sglang.bench_offline_throughput":
        return bench_offline_steps(b, cfg, notes)
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
    dflt = bench_defaults("sglang.bench_one_batch")
    for bs in _ints(cfg.get("batch_size"), dflt["batch_size"])[:4]:
        for il in _ints(cfg.get("input_len"), dflt["input_len"])[:4]:
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


def _bench_value(cfg: EngineConfig, key: str, dflt: dict) -> tuple[object, str]:
    v = cfg.get(key)
    return (v, f"--{key.replace('_', '-')} {v}") if v is not None else (dflt[key], f"{key} {dflt[key]} (its default)")


def bench_offline_steps(b: Builder, cfg: EngineConfig, notes: list[str]) -> list[Candidate]:
    """``sglang.bench_offline_throughput`` starts an engine and submits ``--num-prompts`` requests at once;
    with ``--dataset-name random`` each has up to ``--random-input-len`` prompt tokens (at least
    ``--random-range-ratio`` of it) and ``--random-output-len`` output tokens (sgl-project/sglang ad8e676
    python/sglang/bench_offline_throughput.py:37-46, rules/bisect.json bench_flags). Its first prefill takes the
    queued prompts up to the prefill budget; its decode runs up to ``--max-running-requests`` of them."""
    dflt = bench_defaults("sglang.bench_offline_throughput")
    ds, ds_src = _bench_value(cfg, "dataset_name", dflt)
    if ds != "random":
        notes.append(f"sglang.bench_offline_throughput with dataset {ds} ({ds_src}): prompt lengths come from the "
                     "dataset, not the command; no step is reconstructed from it")
        return []
    n, n_src = _bench_value(cfg, "num_prompts", dflt)
    il, il_src = _bench_value(cfg, "random_input_len", dflt)
    ol, ol_src = _bench_value(cfg, "random_output_len", dflt)
    ratio, r_src = _bench_value(cfg, "random_range_ratio", dflt)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (n, il, ol)):
        notes.append("sglang.bench_offline_throughput: --num-prompts, --random-input-len and --random-output-len must be "
                     "positive integers to reconstruct its steps")
        return []
    ratio = float(ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) else 0.0
    lo_len = max(int(il * ratio), 1)
    budget, bsrc = b.budget()
    total_hi = n * il
    hi = min(total_hi, budget) if budget else max(il, min(total_hi, b.cfg.max_prefill_tokens() or il))
    exact = ratio >= 1.0 and (budget is not None and total_hi >= budget or n == 1 and budget is None)
    basis = [f"sglang.bench_offline_throughput --dataset-name random: {n} prompt(s) ({n_src}) of {lo_len}..{il} tokens "
             f"({il_src}; {r_src}), submitted at once", f"a prefill batch takes at most {bsrc}" if budget else bsrc]

    def make(v: int, version: str | None) -> dict:
        return prefill_doc(b.profile, version, b.gpu, b.sa(), 1, v, 0, 0, 1024,
                           f"bench_offline_throughput's first prefill ({v} new tokens)")
    pre = Candidate("DP0", "prefill", "bench_offline_throughput's first prefill", "query rows", min(lo_len, hi), hi, hi,
                    exact, basis, make, None, list(b.versions))
    pre.assumptions.append("assumption: the first prefill takes the queued prompts up to the budget (the engine's "
                           "scheduler may start smaller)")
    out = [pre]
    R = cfg.running_limit_per_rank()
    running = min(n, R) if R else n
    spec = spec_tokens(cfg)
    mode = Mode.TARGET_VERIFY if spec else Mode.DECODE

    def make_d(v: int, version: str | None) -> dict:
        return decode_doc(b.profile, version, b.gpu, b.sa(), v, il + ol, mode,
                          f"bench_offline_throughput decode of {v} request(s)")
    dec = Candidate("DP0", "verify" if spec else "decode", "bench_offline_throughput's full decode step", "batch size",
                    1, running, running, False,
                    [f"{n} prompt(s) decode together, at most {R} per rank (--max-running-requests)" if R
                     else f"{n} prompt(s) decode together", f"{ol_src}: each holds up to {il} + {ol} tokens"],
                    make_d, None, list(b.versions))
    dec.assumptions.append(f"assumption: every request holds {il + ol} tokens (the longest the command allows)")
    out.append(dec)
    return out
