"""Per-step overhead of the pre-dispatch guard (``validate_batch.Checker``), measured in one run.

Steps (DeepSeek-V4 on SGLang, H200; per-request data drawn once with a fixed seed):

* decode of 256 and of 1024 requests (sequence lengths 1024..16384, one slot each);
* prefill of 8192 rows: 16 prompts x 512 new tokens (cached prefixes 0..2048), and, as an extra
  row, one 8192-token prompt (the fewest requests, so the smallest baseline);
* target verify of 64 requests x 4 draft tokens (256 rows).

Columns:

* ``baseline``: a bare Python loop over the step's requests calling a trivial function once per
  request with that request's data (decode / verify: sequence length and slot; prefill: new tokens,
  cached prefix and slot) - the least any per-request check written in Python can cost.
* ``verdict``: ``Checker.verdict`` on the same lists (the fast path: no schedule, no report), and
  ``verdict (engine object)`` on a stand-in SGLang ``ScheduleBatch`` holding the same data.
* ``full`` (cold): ``Checker.check`` on the same lists: the full report, including the FlashMLA
  schedule of every decode-kernel call (the benchmark asserts that the schedules were computed).
  A Checker reuses schedule walks across steps with the same block counts (its own
  ``schedule_memo``); every timed call here empties that memo first (its ``clear()``, included in the
  time), so each one computes its schedules from scratch, as the first step of a new batch does.
* ``steady``: the mean cost per step of ``Checker.check`` over a run of consecutive steps of the
  decode and verify batches (every request's sequence length + 1 per step, 256 steps, the memo
  emptied before the first): what a guard that checks every step of a running batch pays. A walk is
  reused while no request's block count changes; the step lists are built before timing. Best of 5
  runs.
* ``kernel``: device time of the real scheduling kernel for the same b on an H200 (median of 5,
  configuration ``model1_h64_topk128_extra512``), from the recorded oracle. A DeepSeek-V4 forward
  runs that kernel once per compression ratio (3 calls) and the full check plans all 3, so the
  target compares ``full`` with 3 x kernel; the 1 x ratio is printed too.

Targets: verdict / baseline <= 5, full / (3 x kernel) <= 1. Each time is the best of 9 rounds of
many iterations, the rounds interleaving the four measurements of a step so that background load
hits them alike; each round starts with one untimed call. Times are this thread's CPU time by
default (``--clock wall``: elapsed time); ``--runs N`` repeats the whole measurement and keeps each
time's best. The header says whether the compiled helpers (schedule walk, list checks) ran or the
pure-Python paths (``--pure-python`` forces those). With the compiled walk a Checker walks every
non-uniform schedule (cheaper than looking it up) and its memo keeps uniform periods only, so
"walks reused" is shown for the pure-Python paths alone. Run:
``python bench/bench_overhead.py [--quick] [--runs N] [--pure-python] [--json FILE]``.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from enum import Enum
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validate_batch import Checker, _accel  # noqa: E402

ORACLE_NAMES = [ROOT / "fixtures" / "oracle" / "flashmla_h200_sched_kernel_timing.json",
                ROOT.parent / "shared" / "oracle" / "flashmla_h200_sched_kernel_timing.json"]
KERNEL_CONFIG = "model1_h64_topk128_extra512"
VERDICT_TARGET = 5.0
FULL_TARGET = 1.0
CALLS_PER_FORWARD = 3
STEADY_STEPS = 256


def kernel_times() -> dict[int, float]:
    for p in ORACLE_NAMES:
        if p.is_file():
            recs = json.loads(p.read_text())
            return {r["b"]: r["median_us"] for r in recs if r["config"] == KERNEL_CONFIG}
    raise SystemExit(f"scheduler kernel timing not found (looked in {', '.join(map(str, ORACLE_NAMES))})")


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def timed(fns: dict, numbers: dict, repeat: int) -> dict:
    """Per function, the best (minimum) over ``repeat`` rounds of the mean time of one call, in
    microseconds. Rounds interleave the functions, so background load hits them alike; each round
    starts with one untimed call, so that it measures the function's own cost rather than the
    first call after thousands of calls of another one (which finds the CPU caches full of the
    other's code and data, and can cost several times more: it would dominate rounds of few calls)."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            number = numbers[k]
            fn()
            t0 = clock()
            for _ in range(number):
                fn()
            best[k] = min(best[k], (clock() - t0) / number * 1e6)
    return best


def trivial(*data):
    return None


class _Mode(Enum):  # stands in for SGLang's ForwardMode
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3


def fake_schedule_batch(mode: str, rids, extend=None, prefix=None, seq=None, slots=None):
    """A stand-in for SGLang's ``ScheduleBatch`` (a dataclass whose unused fields default to None: as in
    0.5.23's, ``global_num_tokens`` and ``beam_tail`` are there and None when data parallelism and beam
    search are off), holding the step's lists."""
    reqs = [SimpleNamespace(rid=r, req_pool_idx=s) for r, s in zip(rids, slots)]
    fm = {"extend": _Mode.EXTEND, "decode": _Mode.DECODE, "target_verify": _Mode.DECODE}[mode]
    spec = SimpleNamespace(is_none=lambda: mode != "target_verify")
    return SimpleNamespace(forward_mode=fm, reqs=reqs, extend_lens=extend, prefix_lens=prefix, seq_lens_cpu=seq,
                           seq_lens=seq, req_pool_indices=slots, decoding_reqs=None, spec_algorithm=spec,
                           global_num_tokens=None, beam_tail=None)


def scenarios(rng: random.Random):
    out = []
    for n in (256, 1024):
        seq = [rng.randint(1024, 16384) for _ in range(n)]
        out.append((f"decode {n} requests", n, "decode", dict(seq_lens=seq)))
    for n, tok in ((16, 512), (1, 8192)):
        ext = [tok] * n
        pre = [rng.randint(0, 2048) for _ in range(n)]
        out.append((f"prefill 8192 rows ({n} x {tok})", 8192, "extend", dict(extend_lens=ext, prefix_lens=pre)))
    seq = [rng.randint(1024, 16384) for _ in range(64)]
    out.append(("verify 64 x 4 rows", 256, "target_verify", dict(seq_lens=seq)))
    return out


def measure(args, checkers: dict, scale: float) -> tuple[dict, dict]:
    """One pass over the steps: per step, the best times (us) of baseline / verdict / verdict on the
    engine object / cold full check, and of the steady-state full check with its walk-reuse rate."""
    cold, steady = {}, {}
    for label, b, mode, data in scenarios(random.Random(20260429)):
        chk = checkers[mode == "target_verify"]
        n = len(data.get("seq_lens") or data.get("extend_lens"))
        slots = list(range(1, n + 1))
        rids = [f"req-{i}" for i in range(n)]
        per_req = ([data["seq_lens"], slots] if "seq_lens" in data else [data["extend_lens"], data["prefix_lens"], slots])
        obj = fake_schedule_batch(mode, rids, data.get("extend_lens"), data.get("prefix_lens"), data.get("seq_lens"), slots)

        def baseline(cols=per_req):
            for rec in zip(*cols):
                trivial(*rec)

        def verdict():
            return chk.verdict(mode, req_pool_indices=slots, **data)

        def verdict_obj():
            return chk.verdict(obj)

        def full():
            chk.schedule_memo.clear()  # cold: no walk reused from an earlier call
            return chk.check(mode, req_pool_indices=slots, rids=rids, **data)

        # correctness of what is being timed: legal steps, and the full check really plans the schedule
        assert verdict().legal and verdict_obj().legal
        rep = full()
        assert rep.legal and rep.context["query_rows"] == b, (label, rep.context.get("query_rows"))
        decode_plans = [p for p in rep.plans if p.is_decode]
        assert len(decode_plans) == CALLS_PER_FORWARD and all("schedule" in p.__dict__ for p in decode_plans)

        fast_n = max(int(20000 * scale * 256 / max(n, 16)), 50)
        full_n = max(int(1000 * scale * 256 / max(b, 256)), 10)
        t = timed({"base": baseline, "verdict": verdict, "obj": verdict_obj, "full": full},
                  {"base": fast_n, "verdict": fast_n, "obj": fast_n, "full": full_n}, 9)
        cold[label] = dict(t, b=b, n=n)

        if "seq_lens" in data:  # steady state: consecutive steps of the same running batch
            seqs = [[x + t for x in data["seq_lens"]] for t in range(STEADY_STEPS)]
            assert all(chk.check(mode, seq_lens=s, req_pool_indices=slots, rids=rids).legal for s in seqs[:2])
            best, hit_rate = float("inf"), 0.0
            for _ in range(2 if args.quick else 5):
                chk.schedule_memo.clear()
                t0 = clock()
                for s in seqs:
                    chk.check(mode, seq_lens=s, req_pool_indices=slots, rids=rids)
                best = min(best, (clock() - t0) / STEADY_STEPS * 1e6)
                hit_rate = chk.schedule_memo.hits / max(chk.schedule_memo.hits + chk.schedule_memo.misses, 1)
            steady[label] = {"steady": best, "reused": hit_rate, "b": b, "n": n}
    return cold, steady


WORST_TARGET = 10.0


def illegal_steps(checker, scale: float) -> dict:
    """Verdicts of illegal steps against legal ones of about the same size: decode steps of 16384 and
    11622 requests (over and at the row limit), and a PD decode step holding one slot past a buffer."""
    rng = random.Random(11)
    n = max(int(20 * scale), 3)
    out = {}
    seq = [rng.randint(100, 8000) for _ in range(16384)]
    legal = timed({"v": lambda: checker.verdict("decode", seq_lens=seq[:11622])}, {"v": 1}, n)["v"]
    illegal = timed({"v": lambda: checker.verdict("decode", seq_lens=seq)}, {"v": 1}, n)["v"]
    split = timed({"v": lambda: checker.verdict("decode", seq_lens=seq).safe_split}, {"v": 1}, max(n // 4, 2))["v"]
    out["decode 16384 vs 11622 requests"] = {"legal": legal, "illegal": illegal, "ratio": illegal / legal, "split": split}
    pd = Checker(engine=["sglang-dsv4@pre-25418", "sglang-slots@pre-fix"], gpu="H200",
                 server_args={"max_running_requests": 32, "disaggregation_mode": "decode",
                              "disaggregation_decode_extra_slots": 64, "speculative_algorithm": "NEXTN",
                              "speculative_num_draft_tokens": 1})
    m = 8000
    seqs = [rng.randint(100, 800) for _ in range(m)]
    ok = [rng.randint(1, 32) for _ in range(m)]
    bad = ok[:-1] + [96]
    legal = timed({"v": lambda: pd.verdict("decode", seq_lens=seqs, req_pool_indices=ok)}, {"v": 1}, n)["v"]
    illegal = timed({"v": lambda: pd.verdict("decode", seq_lens=seqs, req_pool_indices=bad)}, {"v": 1}, n)["v"]
    split = timed({"v": lambda: pd.verdict("decode", seq_lens=seqs, req_pool_indices=bad).safe_split}, {"v": 1},
                  max(n // 4, 2))["v"]
    out["PD decode 8000 requests, slot 96"] = {"legal": legal, "illegal": illegal, "ratio": illegal / legal,
                                              "split": split}
    return out


def _merge_min(into: dict, new: dict) -> None:
    for label, row in new.items():
        if label not in into:
            into[label] = dict(row)
        else:
            for k, v in row.items():
                if k not in ("b", "n", "reused"):
                    into[label][k] = min(into[label][k], v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (noisier)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="cpu: this thread's CPU time (default; time the thread is not running does not count); "
                         "wall: elapsed time (use on an idle machine)")
    ap.add_argument("--runs", type=int, default=1, metavar="N",
                    help="measure every step N times, spread over the run, and keep each time's best "
                         "(a shared machine's bursts of load then fall on some runs only)")
    ap.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    ap.add_argument("--pure-python", action="store_true",
                    help="measure the pure-Python paths even when the compiled helpers are built")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.pure_python:
        _accel.compiled = None
        _accel.reason = "--pure-python"
    compiled = _accel.compiled is not None
    global clock
    clock = CLOCKS[args.clock]
    scale = 0.2 if args.quick else 1.0
    ktimes = kernel_times()
    engine = "sglang-dsv4@pre-25418"
    base_args = {"chunked_prefill_size": 8192, "max_running_requests": 1024}
    checkers = {
        False: Checker(engine=engine, gpu="H200", server_args=base_args),
        True: Checker(engine=engine, gpu="H200", server_args={**base_args, "speculative_num_draft_tokens": 4}),
    }
    warm = time.perf_counter() + (0.2 if args.quick else 1.0)   # a busy core before the first row
    while time.perf_counter() < warm:
        checkers[False].check("decode", seq_lens=list(range(1000, 1256)))
    cold: dict = {}
    steady: dict = {}
    for i in range(args.runs):
        if args.runs > 1:
            print(f"run {i + 1} of {args.runs} ...", file=sys.stderr, flush=True)
        c, s = measure(args, checkers, scale)
        _merge_min(cold, c)
        _merge_min(steady, s)

    all_ok = True
    runs = f", best of {args.runs} runs" if args.runs > 1 else ""
    print(f"validate-batch guard overhead - {engine} on H200, Python {sys.version.split()[0]}, {args.clock} clock{runs}")
    print(f"implementation: {_accel.status()}")
    print(f"kernel: recorded H200 scheduler device time, config {KERNEL_CONFIG}; a forward runs it "
          f"{CALLS_PER_FORWARD} times (one per compression ratio)")
    hdr = (f"{'step':<30} {'b':>5} {'reqs':>4} {'base us':>8} {'verdict':>8} {'v/base':>6} {'obj':>7} {'o/base':>6} "
           f"{'full us':>8} {'kern us':>8} {'full/3k':>7} {'full/1k':>7}  targets")
    print(hdr)
    print("-" * len(hdr))
    for label, r in cold.items():
        k = ktimes[r["b"]]
        r["kernel"] = k
        r["verdict_ratio"], r["obj_ratio"] = r["verdict"] / r["base"], r["obj"] / r["base"]
        r["full_3k"], r["full_1k"] = r["full"] / (CALLS_PER_FORWARD * k), r["full"] / k
        ok_v, ok_f = r["verdict_ratio"] <= VERDICT_TARGET, r["full_3k"] <= FULL_TARGET
        all_ok &= ok_v and ok_f
        mark = f"verdict {'MET' if ok_v else 'MISSED'}, full {'MET' if ok_f else 'MISSED'}"
        print(f"{label:<30} {r['b']:>5} {r['n']:>4} {r['base']:>8.2f} {r['verdict']:>8.2f} {r['verdict_ratio']:>6.2f} "
              f"{r['obj']:>7.2f} {r['obj_ratio']:>6.2f} {r['full']:>8.1f} {k:>8.1f} {r['full_3k']:>7.2f} "
              f"{r['full_1k']:>7.2f}  {mark}")
    print()
    print(f"full check in steady state: mean per step over {STEADY_STEPS} consecutive steps (sequence lengths + 1 "
          f"per step), starting with no reusable schedule walk")
    hdr2 = (f"{'step':<30} {'b':>5} {'reqs':>4} {'steady us':>9} {'walks reused':>12} {'kern us':>8} {'full/3k':>7} "
            f"{'full/1k':>7}  target")
    print(hdr2)
    print("-" * len(hdr2))
    for label, r in steady.items():
        k = ktimes[r["b"]]
        r["kernel"] = k
        r["full_3k"], r["full_1k"] = r["steady"] / (CALLS_PER_FORWARD * k), r["steady"] / k
        ok_s = r["full_3k"] <= FULL_TARGET
        all_ok &= ok_s
        reused = "n/a" if compiled else f"{r['reused']:.0%}"
        print(f"{label:<30} {r['b']:>5} {r['n']:>4} {r['steady']:>9.1f} {reused:>12} {k:>8.1f} "
              f"{r['full_3k']:>7.2f} {r['full_1k']:>7.2f}  full {'MET' if ok_s else 'MISSED'}")
    if compiled:
        print("walks reused: n/a - the compiled walk computes every non-uniform schedule (cheaper than reusing it)")
    print(f"targets: verdict <= {VERDICT_TARGET:g} x baseline; full check <= {CALLS_PER_FORWARD} x kernel "
          f"(full/3k <= {FULL_TARGET:g}); full/1k compares with one kernel call, for information")
    worst = illegal_steps(checkers[False], scale)
    print()
    print("illegal steps (the worst case next to a legal step of about the same size; the split is built when read)")
    hdr3 = f"{'step':<38} {'legal us':>9} {'illegal us':>11} {'ratio':>6} {'+split us':>10}  target"
    print(hdr3)
    print("-" * len(hdr3))
    for label, r in worst.items():
        ok_w = r["ratio"] <= WORST_TARGET
        all_ok &= ok_w
        print(f"{label:<38} {r['legal']:>9.1f} {r['illegal']:>11.1f} {r['ratio']:>6.2f} {r['split']:>10.1f}  "
              f"{'MET' if ok_w else 'MISSED'}")
    print(f"target: an illegal step's verdict <= {WORST_TARGET:g} x the legal step's")
    print("all targets met" if all_ok else "some targets missed (see rows marked MISSED)")
    if args.json:
        Path(args.json).write_text(json.dumps({"python": sys.version.split()[0], "clock": args.clock, "runs": args.runs,
                                               "implementation": _accel.status(),
                                               "cold": cold, "steady": steady}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
