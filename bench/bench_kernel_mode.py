"""Kernel mode's throughput: long-lived children against one child per call, on the GPU host.

Runs ``kernel-check`` (the library call behind it) twice over the same recorded calls, once with
served children and once with a fresh child per call, and prints calls per second for each, their
ratio, and whether every call got the same outcome and metadata verdict both ways. Usage::

    python bench/bench_kernel_mode.py FIXTURE.jsonl --build vllm-0.33 [--vllm-flashmla DIR] [-j 8]
        [--fresh-sample 60] [--out result.json]

``--fresh-sample`` runs the one-child-per-call pass on an even sample only (it is the slow one);
the comparison covers the calls both passes ran. Input fields are taken from each record (the
oracle format); recorded outcomes and metadata are ignored.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validate_batch.api import check_calls  # noqa: E402
from validate_batch.cli.kernel_cmd import spread_indices  # noqa: E402
from validate_batch.kernel_mode.check import kernel_check_report  # noqa: E402
from validate_batch.kernel_mode.vllm_bundle import ENV_VAR  # noqa: E402

INPUT_FIELDS = ("kind", "b", "s_q", "h_q", "d_qk", "topk", "topk_length", "extra_topk", "extra_topk_length",
                "page", "extra_page", "seqlens", "entry", "causal", "bytes_per_token", "block_table", "num_blocks")


def records(path: Path) -> list[dict]:
    out = []
    for ln in path.read_text().splitlines():
        if not ln.strip():
            continue
        r = json.loads(ln)
        if "kind" not in r:
            continue                       # a header line
        rec = {k: r[k] for k in INPUT_FIELDS if k in r}
        for k, v in list(rec.items()):     # "<N values>" lists
            if isinstance(v, str) and v.startswith("<"):
                rec[k] = [r[f"{k}_value"]] * r["b"]
        out.append(rec)
    return out


class Clock:
    """Stands in for the progress console: notes when each call's result came back."""

    def __init__(self):
        self.done: list[float] = []

    def print(self, text, **_kw) -> None:
        if str(text).startswith("kernel ["):
            self.done.append(time.monotonic())


def one_pass(recs, build, jobs, served):
    report = check_calls(recs, "H200", build)
    clock = Clock()
    t0 = time.monotonic()
    res = kernel_check_report(report, clock, provider="vllm" if build == "vllm-0.33" else "auto",
                              max_parallel=jobs, served=served)
    res["_done"] = [round(t - t0, 4) for t in clock.done]
    return res, time.monotonic() - t0


def steady_rate(done: list, jobs: int) -> tuple[float | None, float | None]:
    """Calls per second once every child is up (from the ``jobs``-th result to the last), and the
    seconds until the first result (detection, child start, torch import, CUDA context)."""
    if len(done) <= jobs + 1:
        return None, done[0] if done else None
    return (len(done) - jobs) / max(done[-1] - done[jobs - 1], 1e-9), done[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("fixture")
    ap.add_argument("--build", default="vllm-0.33")
    ap.add_argument("--vllm-flashmla", default=None)
    ap.add_argument("-j", "--jobs", type=int, default=8)
    ap.add_argument("--fresh-sample", type=int, default=60)
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeat", type=int, default=1, help="run the recorded calls this many times over (a long run)")
    args = ap.parse_args(argv)
    if args.vllm_flashmla:
        os.environ[ENV_VAR] = os.path.abspath(args.vllm_flashmla)
    recs = records(Path(args.fixture)) * max(args.repeat, 1)
    served, t_served = one_pass(recs, args.build, args.jobs, True)
    if not served.get("available"):
        print("kernel mode unavailable:", served.get("reason"))
        return 3
    idx = spread_indices(len(recs), args.fresh_sample)
    fresh, t_fresh = one_pass([recs[i] for i in idx], args.build, args.jobs, False)

    def key(e):
        return ((e.get("kernel") or {}).get("outcome"), e.get("agreement"), (e.get("metadata") or {}).get("identical"))

    same = [key(served["calls"][i]) == key(fresh["calls"][k]) for k, i in enumerate(idx)]
    rate_s, rate_f = len(recs) / t_served, len(idx) / t_fresh
    steady, first = steady_rate(served.pop("_done"), args.jobs)
    fresh.pop("_done", None)
    out = {"fixture": args.fixture, "build": args.build, "jobs": args.jobs, "repeat": args.repeat,
           "served": {"calls": len(recs), "wall_s": round(t_served, 2), "calls_per_s": round(rate_s, 2),
                      "steady_calls_per_s": round(steady, 2) if steady else None,
                      "first_result_s": first, "status": served["status"], "outcomes": served["summary"]["outcomes"]},
           "fresh": {"calls": len(idx), "wall_s": round(t_fresh, 2), "calls_per_s": round(rate_f, 2),
                     "status": fresh["status"]},
           "served_over_fresh": round(rate_s / rate_f, 2), "same_outcomes": all(same),
           "differing": [idx[k] for k, ok in enumerate(same) if not ok]}
    print(json.dumps(out, indent=1))
    print(f"served {rate_s:.1f} calls/s over the whole run ({steady or 0:.1f} once every child is up, first result "
          f"after {first or 0:.1f} s), fresh {rate_f:.2f} calls/s: ratio {rate_s / rate_f:.1f} (target: >= 50 calls/s "
          f"served); same outcomes on the {len(idx)} calls both ran: {all(same)}")
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": out, "served": served, "fresh": fresh}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
