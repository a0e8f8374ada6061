"""Record real FlashMLA calls for the fixtures: random calls per entry point, and limit probes.

Not a benchmark: a recording harness, run on the GPU host, whose output becomes
``fixtures/measured/*.jsonl``. Usage::

    python bench/record_kernels.py --out DIR [--vllm-flashmla DIR] [--sgl] [--seed 20261201]
        [--calls 220] [--jobs 8] [--backend standin.py]

Every call record is the oracle format (``../shared/oracle/README.md``): the input fields, then what
the kernel wrote (``tile_scheduler_metadata``, ``num_splits``) or the failure (``outcome``,
``exit_code``, ``message``). Calls the model calls legal run many to a child process (a chunk stops
at its first failure, which is run again alone); every other call and every probe runs in a child
of its own, so that a process exit or a poisoned CUDA context cannot reach the next call.
``--backend`` runs the same plumbing on a stand-in (no GPU) to test the harness.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validate_batch.kernel_mode.check import model_view  # noqa: E402
from validate_batch.kernel_mode.providers import Provider  # noqa: E402
from validate_batch.kernel_mode.runner import ChildSpec, run_job, run_jobs  # noqa: E402
from validate_batch.kernel_mode.vllm_bundle import ENV_VAR  # noqa: E402
from validate_batch.flashmla.plan import plan as make_plan  # noqa: E402

BATCH_BACKEND = ROOT / "bench" / "record_batch_backend.py"
CHUNK = 40
VLLM = Provider("vllm", "vllm.third_party.flashmla.flash_mla_interface", "sched_meta")
SGL = Provider("flash_mla", "flash_mla", "sched_meta", features=frozenset({"use_legacy"}))
SMEM_OPTIN = 232448


# ----------------------------------------------------------------------------- random calls

def _lengths(rng: random.Random, b: int, top: int, zeros: float = 0.1, lo: int = 0) -> list[int]:
    mode = rng.random()
    if mode < 0.1 and lo == 0:
        return [0] * b
    if mode < 0.25:
        v = rng.randint(lo, top)
        return [v] * b
    return [0 if rng.random() < zeros else rng.randint(lo, top) for _ in range(b)]


def sparse_call(rng: random.Random, wide: bool) -> dict:
    d_qk = rng.choice((512, 512, 576))
    b = rng.randint(1, 1536) if wide else rng.randint(1, 64)
    rec = {"kind": "sparse", "b": b, "s_q": rng.choice((1, 2)) if wide else rng.randint(1, 4),
           "h_q": rng.choice((64, 128)), "d_qk": d_qk, "topk": 64 * rng.randint(1, 16 if wide else 32),
           "page": rng.choice((64, 256))}
    if d_qk == 512:
        if rng.random() < 0.5:
            rec["topk_length"] = _lengths(rng, b, rec["topk"])
        if rng.random() < 0.4:
            rec["extra_topk"] = 64 * rng.randint(1, 16)
            rec["extra_page"] = rng.choice((64, 2))
            if rng.random() < 0.5:
                rec["extra_topk_length"] = _lengths(rng, b, rec["extra_topk"])
    return rec


def dense_call(rng: random.Random, wide: bool, kind: str = "dense") -> dict:
    b = rng.randint(1, 2048) if wide else rng.randint(1, 64)
    rec = {"kind": kind, "b": b, "s_q": rng.choice((1, 2)) if wide else rng.randint(1, 4),
           "h_q": rng.choice((16, 32, 64, 128))}
    empty_rows = kind == "dense" or rng.random() < 0.25
    rec["seqlens"] = _lengths(rng, b, rng.choice((512, 4096, 16384)), 0.1 if empty_rows else 0.0, 0 if empty_rows else 1)
    if kind == "dense_fp8":
        rec["entry"] = "fwd_kvcache_mla_fp8"
        rec["causal"] = True
    return rec


def scheduler_fp8_call(rng: random.Random) -> dict:
    """A dense fp8 scheduler call with many query rows per head (s_q*h_q up to ~3x the partition limit)."""
    h_q = rng.choice((16, 32, 64, 128))
    b = rng.randint(1, 64)
    return {"kind": "dense_fp8", "b": b, "s_q": rng.randint(1, 3 * 8448 // h_q), "h_q": h_q,
            "seqlens": _lengths(rng, b, 4096), "entry": "get_mla_decoding_metadata"}


def hoisted_call(rng: random.Random, wide: bool) -> dict:
    """The hoisted metadata op alone: a sparse call's (cache_seqlens = topk) or a dense one's."""
    if rng.random() < 0.5:
        rec = sparse_call(rng, wide)
        for key in ("topk_length", "extra_topk", "extra_page", "extra_topk_length"):
            rec.pop(key, None)
    else:
        rec = dense_call(rng, wide)
    rec["entry"] = "get_mla_decoding_metadata"
    return rec


def random_calls(n: int, seed: int, make) -> list[dict]:
    rng = random.Random(seed)
    return [dict(make(rng, i % 2 == 1), i=i) for i in range(n)]


# ----------------------------------------------------------------------------- probes

def probes(sgl: bool = True) -> list[tuple[str, dict, str]]:
    """(tag, record, provider) at each limit: limit-1, limit, limit+1 (``sgl``: sgl-flash-mla's too)."""
    out = []
    cur = (SMEM_OPTIN - 4) // 16           # 4*(4b+1): 14527 rows fit
    leg = (SMEM_OPTIN - 4) // 20           # 4*(5b+1): 11622 rows fit
    for topk, extra in ((128, None), (1024, None), (128, 640)):
        for b in (leg, leg + 1, cur, cur + 1, cur + 2):
            rec = {"kind": "sparse", "b": b, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": topk}
            if extra:
                rec["extra_topk"] = extra
            out.append((f"sparse_sched_rows topk={topk} extra={extra}", rec, "vllm"))
    for b in (leg - 1, leg, leg + 1, leg + 2):
        out.append(("dense_sched_rows", {"kind": "dense", "b": b, "s_q": 1, "h_q": 16, "seqlens": [64] * b}, "vllm"))
    for b in (4094, 4095, 4096, 4097):
        out.append(("dense_fp8_max_batch", {"kind": "dense_fp8", "b": b, "s_q": 1, "h_q": 16, "seqlens": [64] * b,
                                            "entry": "fwd_kvcache_mla_fp8", "causal": True}, "vllm"))
    # dense fp8 partitions: num_sms / h_k / ceil(s_q*h_q/h_k / 64) reaches 0 past 132*64 = 8448 rows per head
    for h_q in (16, 64, 128):
        limit = 132 * 64 // h_q
        for s_q in (limit - 1, limit, limit + 1, limit + 2):
            base = {"kind": "dense_fp8", "b": 2, "s_q": s_q, "h_q": h_q, "seqlens": [100, 300]}
            out.append(("dense_fp8_parts", dict(base, entry="get_mla_decoding_metadata"), "sgl"))
            out.append(("dense_fp8_parts", dict(base, entry="get_mla_decoding_metadata"), "vllm"))
            out.append(("dense_fp8_parts", dict(base, entry="fwd_kvcache_mla_fp8", causal=True), "vllm"))
    # the sparse layouts the bundled copy takes on SM90
    for d_qk, bpt in ((512, 584), (512, 528), (576, 656)):
        out.append(("sparse_kv_layout", {"kind": "sparse", "b": 4, "s_q": 1, "h_q": 64, "d_qk": d_qk, "topk": 128,
                                         "bytes_per_token": bpt}, "vllm"))
    # topk multiple of 64, h_q 64/128 only, s_q*h_q
    for topk in (96, 128):
        out.append(("sparse_topk_block", {"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": topk},
                    "vllm"))
    for h_q in (32, 64, 128):
        out.append(("sparse_h_q", {"kind": "sparse", "b": 2, "s_q": 1, "h_q": h_q, "d_qk": 512, "topk": 128}, "vllm"))
    return [p for p in out if sgl or p[2] != "sgl"]


def gap_probes(providers=("sgl", "vllm")) -> list[tuple[str, dict, str]]:
    """Limits read from source or measured on another build only: probed on each H200 build of ``providers``."""
    out = []
    for pv in providers:
        for h_q in (32, 64, 96, 128):
            out.append(("sparse_h_q", {"kind": "sparse", "b": 2, "s_q": 1, "h_q": h_q, "d_qk": 512, "topk": 128}, pv))
        for d_qk in (448, 512, 576):
            out.append(("sparse_d_qk", {"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "d_qk": d_qk, "topk": 128}, pv))
        for d_qk, bpt in ((512, 584), (512, 528), (576, 656)):
            out.append(("sparse_kv_layout", {"kind": "sparse", "b": 4, "s_q": 1, "h_q": 64, "d_qk": d_qk, "topk": 128,
                                             "bytes_per_token": bpt}, pv))
        base = {"kind": "sparse", "b": 2, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
        out.append(("sparse_requires is_fp8=false", dict(base, is_fp8=False), pv))
        out.append(("sparse_requires causal=true", dict(base, causal=True), pv))
        out.append(("sparse_requires ok", dict(base), pv))
        for topk in (64, 96, 128):
            out.append(("sparse_topk_block", dict(base, topk=topk), pv))
        # the 32-bit o_accum offset at h_q 128, s_q 8: the model's first wrapping b is 4676 (topk 1024), 4675 (2048)
        for topk, first in ((1024, 4676), (2048, 4675)):
            for b in (first - 1, first, first + 1):
                out.append(("oaccum_offset", {"kind": "sparse", "b": b, "s_q": 8, "h_q": 128, "d_qk": 512,
                                              "topk": topk}, pv))
        # 32-bit strides: q of s_q*h_q*d_qk elements per request
        for s_q in (32767, 32768):
            out.append(("int32_strides", {"kind": "sparse", "b": 1, "s_q": s_q, "h_q": 128, "d_qk": 512, "topk": 64}, pv))
        # sparse prefill: no rows, one, two; heads
        for s_q in (0, 1, 2):
            out.append(("prefill_rows", {"kind": "prefill", "s_q": s_q, "h_q": 64, "d_qk": 512, "topk": 512}, pv))
        for h_q in (32, 64, 128):
            out.append(("prefill_h_q", {"kind": "prefill", "s_q": 16, "h_q": h_q, "d_qk": 512, "topk": 512}, pv))
    return out


# ----------------------------------------------------------------------------- running

def job(rec: dict, prov: Provider) -> dict:
    r = {k: v for k, v in rec.items() if k not in ("i", "tag")}
    if prov is SGL:
        r["use_legacy"] = True
    j = {"op": "prefill" if r.get("kind") == "prefill" else "decode", "provider": prov.to_job(), "record": r}
    if prov is SGL:
        j["use_legacy"] = True
    return j


def model_legal(rec: dict, build: str) -> bool:
    r = {k: v for k, v in rec.items() if k not in ("i", "tag")}
    try:
        return model_view(make_plan(r, "H200", build)).verdict == "legal"
    except Exception:  # noqa: BLE001 - a record the model rejects runs alone
        return False


def result_fields(res) -> dict:
    out = {"outcome": res.outcome, "oracle_outcome": res.oracle_outcome, "exit_code": res.exit_code,
           "message": res.message}
    if res.signal:
        out["signal"] = res.signal
    pay = res.payload if res.is_ok else {}
    if res.is_ok:
        out["tile_scheduler_metadata"] = pay.get("tile_scheduler_metadata")
        out["num_splits"] = pay.get("num_splits")
    elif res.partial.get("tile_scheduler_metadata") is not None:
        out["partial_tile_scheduler_metadata"] = res.partial["tile_scheduler_metadata"]
        out["partial_num_splits"] = res.partial.get("num_splits")
    if not res.is_ok and res.stderr_tail:
        out["stderr_tail"] = res.stderr_tail[-600:]
    if res.fallback_used:
        out["fallback_used"] = True
    return out


def run_probe_set(plist: list[tuple[str, dict, str]], path: Path, header: dict, child: ChildSpec,
                  timeout: float) -> None:
    """Each probe in a child of its own (six at a time), written to ``path`` with its tag and provider."""
    t0 = time.time()
    res = run_jobs([job(r, VLLM if pv == "vllm" else SGL) for _, r, pv in plist], timeout, child, max_parallel=6)
    rows = [dict(r, tag=tag, provider=pv, **result_fields(x)) for (tag, r, pv), x in zip(plist, res)]
    for row in rows:
        compact_probe(row)
    write(path, header, rows)
    print(f"{path.name}: {len(rows)} probes in {time.time() - t0:.0f} s", file=sys.stderr)


def run_set(recs: list[dict], prov: Provider, build: str, child: ChildSpec, tmp: Path, timeout: float) -> list[dict]:
    """Each record with its result: model-legal ones in chunks, the rest alone."""
    results: dict[int, dict] = {}
    alone = [k for k, r in enumerate(recs) if not model_legal(r, build)]
    todo = [k for k in range(len(recs)) if k not in set(alone)]
    batch_child = ChildSpec(child.python, str(BATCH_BACKEND),
                            child.env + (("RECORD_INNER_BACKEND", child.backend or ""),))
    while todo:
        chunk, todo = todo[:CHUNK], todo[CHUNK:]
        path = tmp / f"chunk_{os.getpid()}_{threading.get_ident()}_{chunk[0]}.jsonl"
        path.unlink(missing_ok=True)
        res = run_job({"op": "batch", "jobs": [job(recs[k], prov) for k in chunk], "out": str(path)},
                      timeout * 4, batch_child)
        done = []
        if path.exists():
            done = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        ok = [d for d in done if d.get("status") == "ok"]
        for k, d in zip(chunk, ok):
            results[k] = {"outcome": "ok", "oracle_outcome": "ok", "exit_code": 0, "message": d.get("message"),
                          "tile_scheduler_metadata": d.get("tile_scheduler_metadata"),
                          "num_splits": d.get("num_splits"), "run": "chunk"}
        rest = chunk[len(ok):]
        failed = done[len(ok)] if len(done) > len(ok) else None
        if rest and failed is not None and failed.get("status") == "unsupported":
            # the provider cannot run this entry at all: every record left says so, none is retried
            for k in rest + todo + alone:
                results[k] = {"outcome": "unsupported", "oracle_outcome": "unsupported", "exit_code": 0,
                              "message": failed.get("message"), "run": "chunk"}
            return [dict(recs[k], **results[k]) for k in range(len(recs))]
        if rest:
            alone.append(rest[0])
            todo = rest[1:] + todo
            if not res.is_ok and not done:
                print(f"chunk child ended {res.outcome}: {res.message}", file=sys.stderr)
    singles = run_jobs([job(recs[k], prov) for k in alone], timeout, child, max_parallel=4)
    for k, r in zip(alone, singles):
        results[k] = dict(result_fields(r), run="alone")
    return [dict(recs[k], **results[k]) for k in range(len(recs))]


def compact_probe(row: dict) -> None:
    """A probe of many rows keeps its verdict, not its metadata; a constant list is written as
    ``"<N values>"`` with the value in ``<field>_value``."""
    for key in ("seqlens", "topk_length", "extra_topk_length"):
        v = row.get(key)
        if isinstance(v, list) and len(v) > 8 and len(set(v)) == 1:
            row[key], row[f"{key}_value"] = f"<{len(v)} values>", v[0]
    if row.get("b", 0) > 1000:
        for key in ("tile_scheduler_metadata", "num_splits", "partial_tile_scheduler_metadata", "partial_num_splits"):
            row.pop(key, None)


def portable(provider: dict) -> dict:
    """A provider's record with its module file named from its top-level package on (``flash_mla/...``,
    ``vllm/...``), not from where this machine keeps it."""
    out = dict(provider)
    origin, top = out.get("origin"), str(out.get("module") or "").split(".")[0]
    if isinstance(origin, str) and top and f"/{top}/" in origin:
        out["origin"] = top + "/" + origin.split(f"/{top}/", 1)[1]
    return out


def vllm_build(providers) -> tuple[str, str]:
    """The build name of the detected vLLM copy (``vllm-0.34``) and the fixtures' file prefix (``vllm034``),
    from the version its wheel's metadata gives; vLLM 0.33's when none is detected."""
    version = next((p.get("version") for p in providers if p.get("name") == "vllm" and p.get("version")), "0.33.0")
    major, minor = (version.split(".") + ["0"])[:2]
    return f"vllm-{major}.{minor}", f"vllm{int(major)}{int(minor):02d}"


def write(path: Path, header: dict, rows: list[dict]) -> None:
    with path.open("w") as fh:
        fh.write(json.dumps(header) + "\n")
        for r in rows:
            fh.write(json.dumps(r, separators=(",", ":")) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm-flashmla", default=None)
    ap.add_argument("--sgl", action="store_true", help="also the sgl-flash-mla dense fp8 scheduler")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"), help="the header's date (default: today)")
    ap.add_argument("--calls", type=int, default=220)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--memcheck", action="store_true", help="padding: also run each under compute-sanitizer memcheck")
    ap.add_argument("--only", default="", help="comma list of sets: sparse,dense,dense_fp8,sched_fp8,probes")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="record_kernels_"))
    env = ((ENV_VAR, os.path.abspath(args.vllm_flashmla)),) if args.vllm_flashmla else ()
    child = ChildSpec(backend=args.backend, env=env)
    det = run_job({"op": "detect", "providers": ["vllm"] + (["flash_mla"] if args.sgl else [])}, 120, child)
    print("detect:", det.outcome, json.dumps(det.payload)[:2000], file=sys.stderr)
    dev = det.payload.get("device") or {}
    header = {"device": dev.get("name"), "num_sms": dev.get("num_sms"), "cc": dev.get("cc"),
              "smem_optin": dev.get("smem_optin"), "torch": det.payload.get("torch"), "date": args.date,
              "providers": [portable(p) for p in det.payload.get("providers") or ()]}
    vbuild, vtag = vllm_build(det.payload.get("providers") or ())
    only = set(filter(None, args.only.split(",")))
    sets = {
        "sparse": (f"{vtag}_h200_sparse_cases.jsonl", lambda: random_calls(args.calls, args.seed, sparse_call), VLLM),
        "dense": (f"{vtag}_h200_dense_cases.jsonl", lambda: random_calls(args.calls, args.seed + 1, dense_call), VLLM),
        "dense_fp8": (f"{vtag}_h200_densefp8_cases.jsonl",
                      lambda: random_calls(args.calls, args.seed + 2, lambda r, w: dense_call(r, w, "dense_fp8")), VLLM),
        "sched_fp8": (f"{vtag}_h200_densefp8_sched_cases.jsonl",
                      lambda: random_calls(60, args.seed + 3, lambda r, w: scheduler_fp8_call(r)), VLLM),
    }
    if args.sgl:
        sets["sgl_sched_fp8"] = ("sglfm_h200_densefp8_sched_cases.jsonl",
                                 lambda: random_calls(60, args.seed + 3, lambda r, w: scheduler_fp8_call(r)), SGL)
        sets["sgl_sparse"] = ("sglfm_h200_sparse_cases.jsonl",
                              lambda: random_calls(args.calls, args.seed + 10, sparse_call), SGL)
        sets["sgl_dense"] = ("sglfm_h200_dense_cases.jsonl",
                             lambda: random_calls(args.calls, args.seed + 11, dense_call), SGL)
        sets["sgl_dense_fp8"] = ("sglfm_h200_densefp8_attn_cases.jsonl",
                                 lambda: random_calls(args.calls, args.seed + 12,
                                                      lambda r, w: dense_call(r, w, "dense_fp8")), SGL)
        sets["sgl_hoisted"] = ("sglfm_h200_hoisted_cases.jsonl",
                               lambda: random_calls(args.calls, args.seed + 13, hoisted_call), SGL)
    threads = []

    def one(name, fname, make, prov):
        t0 = time.time()
        build = vbuild if prov is VLLM else "sgl-flash-mla-1.0.0"
        rows = run_set(make(), prov, build, child, tmp, args.timeout)
        write(out / fname, dict(header, build=build, entry=name), rows)
        print(f"{name}: {len(rows)} calls in {time.time() - t0:.0f} s", file=sys.stderr)

    for name, (fname, make, prov) in sets.items():
        if only and name not in only:
            continue
        th = threading.Thread(target=one, args=(name, fname, make, prov))
        th.start()
        threads.append(th)
    if not only or "probes" in only:
        run_probe_set(probes(args.sgl), out / f"{vtag}_h200_probes.jsonl", dict(header, entry="probes"), child,
                      args.timeout)
    if "gaps" in only:
        run_probe_set(gap_probes(("sgl", "vllm") if args.sgl else ("vllm",)),
                      out / ("h200_gap_probes.jsonl" if args.sgl else f"{vtag}_h200_gap_probes.jsonl"),
                      dict(header, entry="probes of facts read or measured elsewhere"), child, args.timeout)
    if "padding" in only:
        run_padding(out, header, child, ("vllm", "sgl") if args.sgl else ("vllm",), memcheck=args.memcheck, vtag=vtag)
    for th in threads:
        th.join()


#: dense fp8 attention with length-0 rows (tag, seqlens, pad_block, pad_rows). A length-0 row's first
#: block is ceil(0/64) - 1 = -1: it reads the block-table word before its own row (the previous
#: row's last entry; before the table for row 0). pad_block is written into the rows of pad_rows
#: (default: the length-0 rows); None keeps the valid pages.
PADDING = (
    ("two padding rows after two requests", [900, 12, 0, 0], -1, None),
    ("two padding rows after two requests, valid pages", [900, 12, 0, 0], None, None),
    ("padding row first", [0, 900], -1, None),
    ("padding row first, valid pages", [0, 900], None, None),
    ("half of 64 rows padding", [300] * 32 + [0] * 32, -1, None),
    ("half of 64 rows padding, valid pages", [300] * 32 + [0] * 32, None, None),
    ("padding with length 1", [900, 12, 1, 1], -1, [2, 3]),
    ("padding with length 1, valid pages", [900, 12, 1, 1], None, None),
    ("one padding row after a request", [900, 0], -1, None),
    ("length-0 row whose neighbour row is -1", [900, 12, 0, 0], -1, [2]),
    ("length-0 row after a valid length-0 row", [900, 12, 0, 0], -1, [3]),
    ("two padding rows first", [0, 0, 900], -1, None),
    ("padding rows with an out-of-range page", [900, 12, 0, 0], 1 << 20, None),
)


def padding_jobs(provider: str) -> list[tuple[str, dict, dict]]:
    out = []
    for tag, lens, pad, rows in PADDING:
        rec = {"kind": "dense_fp8", "b": len(lens), "s_q": 1, "h_q": 128, "seqlens": lens,
               "entry": "fwd_kvcache_mla_fp8", "causal": True}
        if provider == "vllm":
            j = {"op": "padded_fp8", "record": rec, "pad_block": pad, "pad_rows": rows}
        else:
            j = dict(job(rec, SGL), pad_block=pad, pad_rows=rows)
        out.append((tag, rec, j))
    return out


def run_padding(out: Path, header: dict, child: ChildSpec, providers=("vllm",), memcheck: bool = False,
                vtag: str = "vllm033") -> None:
    """Dense fp8 attention with length-0 rows, per provider: plain (one child each), and with
    ``memcheck`` each again under compute-sanitizer's memcheck (error count and first error)."""
    for pv in providers:
        plist = padding_jobs(pv)
        spec = ChildSpec(child.python, str(BATCH_BACKEND) if pv == "vllm" else child.backend, child.env)
        res = run_jobs([j for _, _, j in plist], 120, spec, max_parallel=4)
        rows = [dict(r, tag=tag, provider=pv, pad_block=j.get("pad_block"), pad_rows=j.get("pad_rows"),
                     **result_fields(x)) for (tag, r, j), x in zip(plist, res)]
        if memcheck:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(6) as pool:
                checks = list(pool.map(lambda j: memcheck_one(j, spec), [j for _, _, j in plist]))
            for row, mc in zip(rows, checks):
                row["memcheck"] = mc
        name = vtag if pv == "vllm" else "sglfm"
        write(out / f"{name}_h200_densefp8_padding_probes.jsonl",
              dict(header, entry="padding probes", provider=pv, memcheck=memcheck_tool() if memcheck else None), rows)


def memcheck_tool() -> str:
    import subprocess
    try:
        v = subprocess.run(["compute-sanitizer", "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "compute-sanitizer: unavailable"
    ver = next((ln.split()[-1] for ln in v.splitlines() if "Version" in ln), "?")
    return f"compute-sanitizer {ver} --tool memcheck, PYTORCH_NO_CUDA_MEMORY_CACHING=1"


def memcheck_one(j: dict, spec: ChildSpec) -> dict:
    """One job under memcheck: its error count, the first error in the project's words, the kernel kind."""
    import re
    import subprocess
    env = spec.environment()
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    cmd = ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "20"] + spec.command()
    try:
        p = subprocess.run(cmd, input=json.dumps(j), capture_output=True, text=True, timeout=300, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"ran": False, "why": str(e)[:200]}
    text = p.stdout + p.stderr
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
    first = re.search(r"Invalid \S+ (read|write) of size (\d+) bytes", text)
    kern = re.search(r"at (?:0x[0-9a-f]+ in )?(\w*(?:fp8|mla|splitkv|combine)\w*)", text, re.I)
    return {"ran": True, "exit_code": p.returncode, "errors": int(m.group(1)) if m else None,
            "first_error": (f"an invalid {first.group(1)} of {first.group(2)} bytes from global memory"
                            if first else None),
            "kernel_symbol_seen": bool(kern)}


if __name__ == "__main__":
    main()
