"""Per-step cost of the guard on vLLM 0.33 steps (``vllm-dsv4``, H200), measured in one run.

Steps, as ``SchedulerOutput``-shaped objects (the attribute names of vLLM 0.33.0's
``vllm/v1/core/sched/output.py``; plain namespaces, so vLLM need not be installed): 256 decode
requests; the same with 3 draft tokens each (1024 tokens); and that plus one 4000-token prefill
chunk.

Columns: ``baseline`` - a bare Python loop touching each request's scheduled and computed tokens;
``verdict`` - ``Checker.verdict(scheduler_output)`` (the fast path); ``full`` - ``Checker.check``
(the backend's split, every call's plan and schedule, the report). Each time is this thread's CPU
time, the best of 7 rounds. ``full/3k``: the full check against three runs of the decode scheduling
kernel at the step's decode rows (requests x (1 + drafts); a DeepSeek-V4 forward runs it once per
compression ratio), from the recorded H200 device time of FlashMLA 9241ae3's scheduler (the one
recorded; vLLM 0.33's bundled copy runs the current scheduler, whose time is not recorded).
Target: full <= 0.5 x the three kernel runs. Run: ``python bench/bench_vllm.py [--quick]``.
"""
from __future__ import annotations

import sys
import time
from types import SimpleNamespace

from bench_overhead import kernel_times
from validate_batch import Checker

FULL_TARGET = 0.5


def scheduler_output(n: int, drafts: int, prefill: int = 0) -> SimpleNamespace:
    ids = [f"r{i}" for i in range(n)]
    cached = SimpleNamespace(req_ids=ids, num_computed_tokens=[900 + i for i in range(n)], num_output_tokens=[7] * n)
    tokens = {r: 1 + drafts for r in ids}
    new = []
    if prefill:
        new.append(SimpleNamespace(req_id="p", prompt_token_ids=list(range(2 * prefill)), num_computed_tokens=0))
        tokens["p"] = prefill
    return SimpleNamespace(scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens=tokens,
                           total_num_scheduled_tokens=sum(tokens.values()),
                           scheduled_spec_decode_tokens={r: [0] * drafts for r in ids} if drafts else {})


def best(f, iters: int, rounds: int = 7) -> float:
    out = float("inf")
    for _ in range(rounds):
        f()
        t0 = time.process_time()
        for _ in range(iters):
            f()
        out = min(out, (time.process_time() - t0) / iters)
    return out


def main() -> None:
    iters = 20 if "--quick" in sys.argv else 200
    guard = Checker("vllm-dsv4", "H200", {"num_speculative_tokens": 3})
    kern = kernel_times()
    steps = {"decode 256": (scheduler_output(256, 0), 256), "verify 256 x 4": (scheduler_output(256, 3), 1024),
             "verify 256 x 4 + prefill 4000": (scheduler_output(256, 3, 4000), 1024)}
    print(f"{'step':32} {'baseline us':>12} {'verdict us':>11} {'full us':>9} {'verdict/baseline':>17} "
          f"{'rows':>5} {'3 x kern':>9} {'full/3k':>8}  target")
    missed = []
    for name, (so, rows) in steps.items():
        def baseline(so=so):
            comp = so.scheduled_cached_reqs.num_computed_tokens
            for i, r in enumerate(so.scheduled_cached_reqs.req_ids):
                _ = so.num_scheduled_tokens[r] + comp[i]
        b = best(baseline, iters)
        v = best(lambda so=so: guard.verdict(so), iters)
        f = best(lambda so=so: guard.check(so), max(iters // 10, 2))
        k3 = 3 * kern[rows]
        ok = f * 1e6 <= FULL_TARGET * k3
        missed += [] if ok else [name]
        print(f"{name:32} {b * 1e6:12.1f} {v * 1e6:11.1f} {f * 1e6:9.0f} {v / b:17.1f} "
              f"{rows:>5} {k3:>9.1f} {f * 1e6 / k3:>8.2f}  full <= {FULL_TARGET:g} x 3k {'MET' if ok else 'MISSED'}")
    print("all targets met" if not missed else f"missed: {', '.join(missed)}")


if __name__ == "__main__":
    main()
