"""Runs each hostile input of README "Security and limits" through the command line and prints its exit
code, wall time and peak memory (one line each). Not a test: the tests in tests/test_hostile_input*.py
hold the same cases to their verdicts; this is the quick look over all of them at once.

    python bench/hostile_inputs.py            # every case
    python bench/hostile_inputs.py dense      # the cases whose name holds "dense"
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

CLI = [sys.executable, "-m", "validate_batch.cli.main"]
SPARSE = "kind: sparse\nb: {b}\ns_q: 1\nh_q: 64\nd_qk: 576\ntopk: 64\n"
CALL = {"kind": "sparse", "b": 1, "s_q": 1, "h_q": 64, "d_qk": 576, "topk": 64}
BATCH = {"engine": "sglang-dsv4", "forward_mode": "extend", "requests": [{"id": "a", "extend_tokens": 10}]}
LOG = ("[2025-01-01 00:00:00 DP0 TP0] Prefill batch. #new-seq: {seq}, #new-token: 10, #cached-token: {cached}, "
       "token usage: 0.00, #running-req: {run}, #queue-req: 0\n")
DECODE = ("[2025-01-01 00:00:01 DP0 TP0] Decode batch. #running-req: {run}, #token: 100, token usage: 0.00, "
          "gen throughput (token/s): 1.0, #queue-req: 0\n")


def _write(d: str, name: str, text: str | bytes) -> str:
    p = os.path.join(d, name)
    with open(p, "wb") as fh:
        fh.write(text.encode() if isinstance(text, str) else text)
    return p


def cases(d: str) -> list[tuple[str, list[str], str | None, tuple[int, ...]]]:
    """(name, arguments, stdin, the exit codes that are right)."""
    out = []
    for tag in ("!!bool 1", "!!int ''", "!!timestamp 1"):
        p = _write(d, f"tag{len(out)}.yaml", SPARSE.format(b=tag))
        out += [(f"yaml tag {tag}: {cmd}", [cmd, p, *extra], None, (2,))
                for cmd, extra in (("check", []), ("metadata", []), ("map", ["--x", "b", "--y", "s_q"]))]
    corpus = os.path.join(d, "corpus")
    os.mkdir(corpus)
    _write(corpus, "a.yaml", SPARSE.format(b="!!bool 1"))
    _write(corpus, "b.json", json.dumps(CALL))
    out.append(("corpus with one odd YAML file", ["check", corpus], None, (2,)))
    zero = {"engine": "vllm-flashmla-sparse", "forward_mode": "extend",
            "server_args": {"kv_cache_dtype": "fp8_ds_mla", "tp_size": 4},
            "requests": [{"id": "a", "extend_tokens": 0, "prefix_len": 5}, {"id": "b", "extend_tokens": 300}]}
    out.append(("vllm sparse step, 0-token request with a prefix", ["check", "-"], json.dumps(zero), (2,)))
    out.append(("log: huge #new-seq", ["bisect", "-"], LOG.format(seq=99999999999, cached=0, run=0), (2,)))
    out.append(("log: huge #cached-token", ["bisect", "-"], LOG.format(seq=1, cached=99999999999, run=0), (2,)))
    out.append(("log: #running-req at its cap", ["bisect", "-"],
                LOG.format(seq=1, cached=0, run=1 << 20) + DECODE.format(run=1 << 20), (0,)))
    out.append(("log: #running-req past its cap", ["bisect", "-"],
                LOG.format(seq=1, cached=0, run=(1 << 20) + 1) + DECODE.format(run=(1 << 20) + 1), (2,)))
    out.append(("log: Assertion ' x 1e6", ["bisect", "-"], "Assertion '" * 1_000_000 + "\n", (0,)))
    out.append(("map requests x draft_tokens to 1048576",
                ["map", "--engine", "sglang-dsv4", "--x", "requests", "--y", "draft_tokens", "--x-max", "1048576"],
                None, (2,)))
    out.append(("map --x-max 16777216",
                ["map", "--engine", "sglang-dsv4", "--x", "requests", "--y", "draft_tokens", "--x-max", "16777216"],
                None, (2,)))
    out.append(("map {}", ["map", "-"], "{}", (2,)))
    p = _write(d, "long.yaml", "kind: dense\nb: 1\ns_q: 1\nh_q: 64\nd_qk: 576\nseqlens:\n" + "- 1\n" * 1_000_000)
    out.append(("2 MB YAML list of 1M values", ["check", p], None, (2,)))
    b, w = 65536, 210
    table = [[(i * w + j) % 1000 for j in range(w)] for i in range(b)]
    p = _write(d, "dense.json", json.dumps({"kind": "dense", "b": b, "s_q": 1, "h_q": 64, "d_qk": 576,
                                            "seqlens": [64 * w] * b, "block_table": table, "num_blocks": 1000}))
    out.append((f"dense record with a block table ({os.path.getsize(p) >> 20} MiB)", ["check", p], None, (1,)))
    # a release newer than every known one is judged as the newest, with a warning (README "Engine versions")
    for v, want in (("9.9.9", (0,)), ("-1", (2,)), ("", (2,)), ("0.5.22.5", (2,))):
        out.append((f"engine version @{v}", ["check", "--engine", f"sglang-dsv4@{v}", "--extend", "10"], None, want))
    out.append(("duplicate JSON key", ["check", "-"], '{"kind": "sparse", "b": 1, "b": 9, "s_q": 1, "h_q": 64, '
                '"d_qk": 576, "topk": 64}', (2,)))
    out.append(("YAML 1.1 octal", ["check", "-"], "engine: sglang-dsv4\nforward_mode: extend\nrequests:\n"
                "- {id: a, extend_tokens: 012000}\n", (2,)))
    out.append(("sparse prefill h_q 3", ["check", "-"],
                json.dumps({"kind": "prefill", "s_q": 128, "h_q": 3, "d_qk": 576, "topk": 2048}), (1,)))
    out.append(("sparse prefill on sm80", ["check", "-", "--gpu", "num_sms=108,cc=8.0,smem_optin=166912"],
                json.dumps({"kind": "prefill", "s_q": 128, "h_q": 64, "d_qk": 576, "topk": 2048}), (1,)))
    out.append(("GPU cc 0.0", ["check", "--gpu", "num_sms=132,cc=0.0,smem_optin=232448", "--engine", "sglang-dsv4",
                               "--extend", "10"], None, (2,)))
    out.append(("GPU cc -1.0", ["check", "--gpu", "num_sms=132,cc=-1.0,smem_optin=232448", "--engine",
                                "sglang-dsv4", "--extend", "10"], None, (2,)))
    big = {**BATCH, "forward_mode": "decode", "requests": [{"id": "a", "seq_len": 2 ** 31}]}
    out.append(("seq_len past int32 in a batch", ["check", "-"], json.dumps(big), (2,)))
    for sa in ("tp_size=0", "max_running_requests=0", "disaggregation_mode=bogus"):
        out.append((f"setting {sa}", ["check", "--engine", "sglang-dsv4", "--extend", "10", "--server-arg", sa],
                    None, (2,)))
    out.append(("env value [1]", ["check", "-"], json.dumps({**BATCH, "env": {"SGLANG_OPT_FLASHMLA_SPARSE_PREFILL": [1]}}),
                (2,)))
    dec = {**BATCH, "forward_mode": "decode", "requests": [{"id": "a", "extend_tokens": 10}]}
    out.append(("extend_tokens in a decode forward", ["check", "-"], json.dumps(dec), (2,)))
    p = _write(d, "call.json", json.dumps(CALL))
    out.append(("check FILE --env", ["check", p, "--env", "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=0"], None, (2,)))
    out.append(("check FILE --server-arg", ["check", p, "--server-arg", "tp_size=8"], None, (2,)))
    out.append(("--decode nan", ["check", "--engine", "sglang-dsv4", "--mode", "decode", "--decode", "nan"], None, (2,)))
    hostile = "x\n::error file=a::owned\n##[error]owned \x1b]0;t\x07 \x1b[2J \ufffe\uffff"
    doc = {**BATCH, "label": hostile, "requests": [{"id": hostile, "extend_tokens": 10}]}
    for fmt in ("text", "github", "junit", "sarif", "jsonl"):
        out.append((f"hostile label, --output-format {fmt}", ["check", "-", "--output-format", fmt],
                    json.dumps(doc), (0,)))
    return out


def main(argv: list[str]) -> int:
    pick = argv[1] if len(argv) > 1 else ""
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        for name, args, stdin, want in cases(d):
            if pick not in name:
                continue
            t0 = time.monotonic()
            r = subprocess.run(["/usr/bin/time", "-f", "%M", *CLI, *args] if os.path.exists("/usr/bin/time")
                               else [*CLI, *args], input=stdin.encode() if stdin is not None else None,
                               capture_output=True, timeout=600)
            took = time.monotonic() - t0
            lines = [ln for ln in r.stderr.splitlines() if not ln.startswith(b"Command exited with non-zero status")]
            peak = ""
            if os.path.exists("/usr/bin/time") and lines and lines[-1].strip().isdigit():
                peak = f" {int(lines[-1]) >> 10:5d} MiB"
                r = subprocess.CompletedProcess(r.args, r.returncode, r.stdout, b"\n".join(lines[:-1]))
            err = [ln for ln in r.stderr.decode(errors="replace").splitlines() if ln.strip()]
            leak = any(ln.lstrip().startswith(b"::") and not ln.startswith((b"::error file=", b"::warning file=",
                                                                              b"::notice"))
                       or b"##[" in ln or b"\x1b" in ln or b"\x07" in ln
                       for ln in (r.stdout + r.stderr).splitlines())
            one_line = len(err) == 1 or name.startswith("corpus")     # corpus mode reports each file on stdout
            ok = r.returncode in want and not leak and took < 30 and (r.returncode != 2 or one_line)
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} rc={r.returncode} {took:6.2f}s{peak}  {name}"
                  + (f"  [{err[-1][:100]}]" if r.returncode == 2 and err else "") + ("  LEAK" if leak else ""))
    print(f"{bad} case(s) not as expected")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
