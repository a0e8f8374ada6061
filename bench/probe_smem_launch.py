"""Compile and run ``probe_smem_launch.cu`` and write its record as one JSON document.

    python3 bench/probe_smem_launch.py --out fixtures/measured/h200_smem_launch_probe.json

Needs ``nvcc`` and one CUDA GPU; no Python packages. The probe launches a one-block kernel with 48
or 64 bytes of static shared memory and a dynamic size around each edge (48 KiB - static, 48 KiB,
the opt-in maximum - static), (a) with no attribute set and (b) after raising
``cudaFuncAttributeMaxDynamicSharedMemorySize`` to 48 KiB (SGLang 0.5.23's opt-in) or to the
largest value allowed, and also at the schedule precompute's own sizes ``4*(5b+1+8P)`` for the
``--parts`` values (B200: 148, H200: 132). The record keeps every line the probe printed.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "probe_smem_launch.cu"


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return next((ln.strip() for ln in out.splitlines() if "release" in ln), out.strip().splitlines()[-1])


def compile_probe(nvcc: str, arch: str, workdir: Path) -> tuple[Path, list[str]]:
    exe = workdir / "probe_smem_launch"
    cmd = [nvcc, f"-arch={arch}", "-std=c++17", "-O2", "-o", str(exe), str(SOURCE)]
    subprocess.run(cmd, check=True)
    return exe, cmd


def run_probe(exe: Path, parts: list[int]) -> tuple[int, list[dict], str]:
    proc = subprocess.run([str(exe), *map(str, parts)], capture_output=True, text=True)
    lines = []
    for ln in proc.stdout.splitlines():
        ln = ln.strip()
        if ln:
            lines.append(json.loads(ln))
    return proc.returncode, lines, proc.stderr


def summarise(lines: list[dict]) -> dict:
    """Per kernel and mode: the largest dynamic size that launched and the smallest that did not."""
    out: dict = {}
    for ln in lines:
        if ln.get("type") != "launch" or ln.get("why") == "precompute":
            continue
        key = f"{ln['kernel']}/{ln['mode']}"
        s = out.setdefault(key, {"largest_ok": None, "smallest_failed": None, "errors": []})
        if ln["ok"]:
            s["largest_ok"] = max(s["largest_ok"] or 0, ln["dynamic_bytes"])
        else:
            s["smallest_failed"] = min(s["smallest_failed"] or 1 << 30, ln["dynamic_bytes"])
            if ln["error"] not in s["errors"]:
                s["errors"].append(ln["error"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the JSON record")
    ap.add_argument("--arch", default="sm_90", help="nvcc -arch (default sm_90)")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--parts", type=int, nargs="*", default=[148, 132],
                    help="num_sm_parts values for the precompute-size launches (default: B200 148, H200 132)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        exe, cmd = compile_probe(args.nvcc, args.arch, Path(tmp))
        rc, lines, err = run_probe(exe, args.parts)
    device = next((ln for ln in lines if ln.get("type") == "device"), None)
    if device is None:
        print(f"the probe found no CUDA device (exit code {rc}): nothing written", file=sys.stderr)
        return 1
    record = {
        "probe": "bench/probe_smem_launch.cu",
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "nvcc": nvcc_version(args.nvcc),
        "compile": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd[:-3])) + " probe_smem_launch.cu",
        "parts": args.parts,
        "exit_code": rc,
        "stderr": err[-2000:],
        "device": device,
        "kernels": [ln for ln in lines if ln.get("type") == "kernel"],
        "attributes": [ln for ln in lines if ln.get("type") == "attribute"],
        "launches": [ln for ln in lines if ln.get("type") == "launch"],
        "summary": summarise(lines),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"device": device, "summary": record["summary"], "exit_code": rc}, indent=1))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
