"""Guard latency under load: 16 threads share one Checker and run a mix of legal and illegal steps.

Prints the median, p99 and maximum per-call latency, per kind of step and overall, and the ratio p99 /
median: the guard's worst case must stay within a small factor of its typical cost, also when steps
are illegal (their split is built only when read, and the mix reads none here).

    python bench/bench_load.py            # about 20 s on 2 cores
    python bench/bench_load.py --quick
"""
from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from validate_batch import Checker  # noqa: E402

TARGET = 10.0          # p99 within this factor of the median, for every kind of step
CLOCK = time.thread_time   # this thread's CPU time: waiting for the GIL (16 threads on few cores) does not count


def steps(rng: random.Random) -> list[tuple[str, dict]]:
    out = []
    for _ in range(64):
        n = rng.choice([1, 16, 256, 1024])
        out.append((f"decode legal ({n} requests)", {"forward_mode": "decode",
                                                     "seq_lens": [rng.randint(10, 9000) for _ in range(n)]}))
    for _ in range(8):
        out.append(("decode illegal (16384 rows)", {"forward_mode": "decode", "seq_lens": [700] * 16384}))
        out.append(("prefill illegal (3 x 4096)", {"forward_mode": "extend", "extend_lens": [4096] * 3}))
        out.append(("prefill legal (2 x 4096)", {"forward_mode": "extend", "extend_lens": [4096] * 2}))
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: each thread's CPU time (default); wall: elapsed time, GIL waits included")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    guard = Checker(engine="sglang-dsv4@pre-25418", gpu="H200")
    rng = random.Random(5)
    mix = steps(rng)
    rounds = 3 if args.quick else 12
    lat: dict[str, list[float]] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def worker(seed: int) -> None:
        r = random.Random(seed)
        mine: dict[str, list[float]] = {}
        for _ in range(rounds):
            for kind, step in r.sample(mix, len(mix)):
                t0 = CLOCK()
                v = guard.verdict(**step)
                dt = CLOCK() - t0
                if bool(v) is ("illegal" in kind):
                    errors.append(f"{kind}: verdict {bool(v)}")
                mine.setdefault(kind, []).append(dt * 1e6)
        with lock:
            for k, v in mine.items():
                lat.setdefault(k, []).extend(v)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    every = [x for v in lat.values() for x in v]
    print(f"{args.threads} threads, one shared Checker, {len(every)} verdicts in {wall:.1f} s "
          f"(latency in us, {args.clock} clock)")
    print(f"{'step':<30} {'calls':>6} {'median':>9} {'p99':>9} {'max':>9} {'p99/med':>8}")
    for kind in sorted(lat):
        v = lat[kind]
        print(f"{kind:<30} {len(v):>6} {pct(v, .5):>9.0f} {pct(v, .99):>9.0f} {max(v):>9.0f} {pct(v, .99) / pct(v, .5):>8.1f}")
    worst = max(pct(v, .99) / pct(v, .5) for v in lat.values())
    ok = worst <= TARGET
    print(f"target: p99 <= {TARGET:g} x median for every kind of step (worst {worst:.1f}): {'MET' if ok else 'MISSED'}"
          + (f"; {len(errors)} wrong verdicts" if errors else "; every verdict as expected"))
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
