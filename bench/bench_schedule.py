#!/usr/bin/env python3
"""Benchmark of the FlashMLA scheduler model against the real scheduling kernel's device time.

For the two configurations whose kernel time was measured on an H200
(``flashmla_h200_sched_kernel_timing.json``) and b in {64, 256, 1024, 4096, 11622}, s_q = 1:

* ``ref``  - the plain reference loop (``schedule_reference``);
* ``fast`` - the production path (``schedule_fast``; rows and num_splits not yet built);
* ``+md``  - fast path plus the materialised ``tile_scheduler_metadata`` and ``num_splits`` arrays
  (reference likewise);
* ``nonuni`` variants - per-request ``topk_length`` (seeded random in [0, topk]) instead of one
  shared length, so the fast path cannot use its closed form.

Printed per row: reference us, fast us, speed-up (ref / fast), and fast us / kernel device us.
Targets: speed-up >= 20x at b = 11622, and fast / kernel < 1 at every b (the model is cheaper than
the GPU's own scheduler). All ratios come from one run on this machine.

The production path uses the compiled walk when it was built at install (``--pure-python``
measures the pure-Python walk instead); the header says which one ran.

Usage: ``python bench/bench_schedule.py [--quick] [--pure-python] [--json OUT]``
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from validate_batch import _accel  # noqa: E402
from validate_batch.flashmla.calls import call_from_record  # noqa: E402
from validate_batch.flashmla.plan import plan  # noqa: E402
from validate_batch.flashmla.schedule import schedule_fast, schedule_reference  # noqa: E402

TIMING_NAME = "flashmla_h200_sched_kernel_timing.json"
TIMING_CANDIDATES = [
    REPO_ROOT.parent / "shared" / "oracle" / TIMING_NAME,
    REPO_ROOT / "fixtures" / "oracle" / TIMING_NAME,
]
B_VALUES = [64, 256, 1024, 4096, 11622]
TARGET_SPEEDUP = 20.0
TARGET_B = 11622

CONFIGS = {
    "model1_h64_topk128_extra512": {"kind": "sparse", "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128,
                                    "extra_topk": 512},
    "v32_h128_topk2048": {"kind": "sparse", "s_q": 1, "h_q": 128, "d_qk": 576, "topk": 2048},
}


def load_kernel_times() -> tuple[dict, Path]:
    for path in TIMING_CANDIDATES:
        if path.is_file():
            data = json.loads(path.read_text())
            return {(r["config"], r["b"]): r["median_us"] for r in data}, path
    sys.exit("kernel timing file not found; looked in: " + ", ".join(str(p) for p in TIMING_CANDIDATES))


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def warm_up(seconds: float) -> None:
    """Keep this core busy with the code under test for a moment before measuring: the first rows
    should not pay for a CPU that is still clocking up or caches that still hold start-up work."""
    P, F, s, _ = make_inputs(next(iter(CONFIGS.values())), 256, True)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        schedule_fast(s, P, F).metadata


def time_us(fn, quick: bool, clock) -> float:
    """Median over repeats of the mean time per call (us); each repeat runs >= a few ms."""
    budget = 0.004 if quick else 0.02
    repeats = 3 if quick else 9
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    number = max(1, int(budget / one))
    samples = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(number):
            fn()
        samples.append((clock() - t0) / number * 1e6)
    return statistics.median(samples)


def make_inputs(cfg: dict, b: int, nonuniform: bool, seed: int = 0):
    """(P, F, lengths array, uniform length or None) the scheduler sees for this call."""
    rec = dict(cfg, b=b)
    if nonuniform:
        rng = np.random.default_rng(seed + b)
        rec["topk_length"] = rng.integers(0, cfg["topk"] + 1, size=b).tolist()
    p = plan(call_from_record(rec), "H200")
    arr, uni = p.lengths
    full = np.full(b, uni, dtype=np.int64) if uni is not None else arr
    return p.num_sm_parts, p.fixed_overhead, full, uni


def bench_row(cfg: dict, b: int, nonuniform: bool, quick: bool, clock) -> dict:
    P, F, full, uni = make_inputs(cfg, b, nonuniform)
    if uni is not None:
        def fast():
            return schedule_fast(None, P, F, uniform=uni, b=b)
    else:
        def fast():
            return schedule_fast(full, P, F)

    def ref():
        return schedule_reference(full, P, F)

    def fast_md():
        s = fast()
        return s.metadata, s.num_splits

    def ref_md():
        s = ref()
        return s.metadata, s.num_splits

    # The two paths must agree before their speed means anything.
    a, r = fast(), ref()
    assert np.array_equal(a.metadata[:, :7], r.metadata[:, :7]) and np.array_equal(a.num_splits, r.num_splits)
    return {
        "num_sm_parts": P,
        "ref_us": time_us(ref, quick, clock),
        "fast_us": time_us(fast, quick, clock),
        "ref_md_us": time_us(ref_md, quick, clock),
        "fast_md_us": time_us(fast_md, quick, clock),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer and shorter repeats (noisier)")
    ap.add_argument("--json", metavar="OUT", help="also write the measurements as JSON")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="cpu: this thread's CPU time (default; robust to other load); wall: elapsed time")
    ap.add_argument("--pure-python", action="store_true",
                    help="measure the pure-Python walk even when the compiled one is built")
    args = ap.parse_args(argv)
    if args.pure_python:
        _accel.compiled = None
        _accel.reason = "--pure-python"

    kernel, kpath = load_kernel_times()
    print(f"kernel device times: {kpath}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
          f"{'quick' if args.quick else 'full'} run, {args.clock} clock; walk: {_accel.status()}\n")
    warm_up(0.2 if args.quick else 1.0)
    results = []
    hdr = (f"{'config':<28} {'variant':<10} {'b':>6} {'P':>4} {'kernel':>8} | {'ref':>9} {'fast':>8} "
           f"{'speedup':>8} {'f/kern':>7} | {'ref+md':>9} {'fast+md':>8} {'speedup':>8} {'f/kern':>7}")
    print(hdr)
    print("-" * len(hdr))
    for name, cfg in CONFIGS.items():
        for variant in ("uniform", "nonuni"):
            for b in B_VALUES:
                row = bench_row(cfg, b, variant == "nonuni", args.quick, CLOCKS[args.clock])
                k_us = kernel[(name, b)]
                row.update(config=name, variant=variant, b=b, kernel_us=k_us,
                           speedup=row["ref_us"] / row["fast_us"], fast_over_kernel=row["fast_us"] / k_us,
                           speedup_md=row["ref_md_us"] / row["fast_md_us"],
                           fast_md_over_kernel=row["fast_md_us"] / k_us)
                results.append(row)
                print(f"{name:<28} {variant:<10} {b:>6} {row['num_sm_parts']:>4} {k_us:>8.1f} | "
                      f"{row['ref_us']:>9.1f} {row['fast_us']:>8.1f} {row['speedup']:>7.1f}x {row['fast_over_kernel']:>7.2f} | "
                      f"{row['ref_md_us']:>9.1f} {row['fast_md_us']:>8.1f} {row['speedup_md']:>7.1f}x "
                      f"{row['fast_md_over_kernel']:>7.2f}")
        print()

    print(f"targets (us = microseconds of {args.clock} time here; kernel = H200 device time of the scheduler):")
    verdicts = []
    for variant in ("uniform", "nonuni"):
        for md, key_s, key_k in (("", "speedup", "fast_over_kernel"), ("+md", "speedup_md", "fast_md_over_kernel")):
            rows = [r for r in results if r["variant"] == variant]
            at_max = [r[key_s] for r in rows if r["b"] == TARGET_B]
            worst_k = max(rows, key=lambda r: r[key_k])
            ok_s = min(at_max) >= TARGET_SPEEDUP
            ok_k = worst_k[key_k] < 1.0
            label = f"{variant}{md}"
            print(f"  {label:<12} speed-up at b={TARGET_B} >= {TARGET_SPEEDUP:.0f}x: "
                  f"{'MET' if ok_s else 'NOT MET'} (min {min(at_max):.1f}x)")
            print(f"  {label:<12} fast / kernel < 1 at every b: {'MET' if ok_k else 'NOT MET'} "
                  f"(worst {worst_k[key_k]:.2f} at {worst_k['config']} b={worst_k['b']})")
            verdicts.append({"variant": label, "speedup_met": ok_s, "kernel_ratio_met": ok_k})
    if args.json:
        Path(args.json).write_text(json.dumps({"implementation": _accel.status(), "results": results,
                                               "targets": verdicts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
