"""Every public path at b = 1, 64, 256, 1024, 4096 and 11622, each row with its ratio and target.

Sections (times in microseconds unless marked; every number is the best of several interleaved
rounds, each round starting with one untimed call; ``--clock`` as in the other benchmarks):

* ``guard``: decode steps of b requests (sequence lengths 1024..16384, one slot each) on
  DeepSeek-V4 / SGLang / H200, given as Python lists, as numpy arrays and as a stand-in SGLang
  ``ScheduleBatch`` holding lists (the one in ``bench_overhead.py``). ``base`` is a bare Python loop
  over the same requests as lists, calling a trivial function with each request's sequence length
  and slot (the least a per-request check written in Python costs); ``loop`` is the same loop over
  the requests in the form the verdict gets them (the arrays' elements; the engine object's
  ``reqs`` with its sequence lengths). ``verdict`` is ``Checker.verdict``, ``check`` the full
  ``Checker.check`` (schedules included; the checker's walk memo emptied before each call, so every
  call computes its schedules from scratch). ``kern`` is the recorded H200 device time of the
  scheduling kernel at that b (``model1_h64_topk128_extra512``); a DeepSeek-V4 forward runs it 3
  times. Targets: verdict <= 2 x loop, verdict <= check, check <= 0.5 x (3 x kern) with the
  compiled helpers (1.0 in pure Python).
* ``one-shot``: ``validate_batch.plan(record).schedule`` and ``validate_batch.check(record)`` of one sparse
  call record of that shape (h_q 64, d_qk 512, topk 128, extra_topk 512, per-request
  ``topk_length`` / ``extra_topk_length`` drawn with a fixed seed) with list fields, and (for
  information) numpy array fields. Target: each <= 1 x kern for list input.
* ``document``: ``validate_batch.check(batch document)`` of the same decode step (requests as
  ``{id, seq_len, req_pool_idx}`` objects) against ``Checker.check`` on the same requests as lists
  (with their ids). Target: document <= 3 x the Checker path.
* ``cli`` (elapsed time, median of ``--cli-runs`` runs, interleaved; every command from compiled
  bytecode, as an installed wheel runs, through a bytecode cache of the run's own filled by one
  untimed run of each; run in a directory standing for a user's project, whose ``pyproject.toml``
  names other tools only): ``python -c pass`` for reference and ``python -c 'import numpy'`` (the least
  any command that reads a request column as an array pays), ``validate-batch check --example
  dsv4-prefill-3x4096`` (target < 250 ms), the start-up
  of ``check --example``, ``--version``, ``--help`` and ``rules`` as a ratio of the bare interpreter's
  (target <= 6 x; with each one's import time per dependency from a ``python -X importtime`` run), and
  ``validate-batch metadata --json`` on the recorded oracle file (250 calls) and on the same calls
  repeated to 10,000 (target >= 5000 calls/s end to end, for a file whose calls at that rate take
  longer than ``import numpy`` alone: the 250-call file, mostly start-up, is information).
* ``memory``: peak RSS of ``validate-batch bisect`` on a generated SGLang log of ``--log-mb`` MiB
  (default 1024; the crashing step at its end) and of ``validate-batch metadata --json`` on
  ``--calls`` generated call records (default 100,000), each also on an input 1/8 the size: the
  ratio shows whether memory grows with the input. Inputs are written to a temporary directory
  and removed afterwards.

At the end, every target with its measured ratio as a Markdown table (``--readme`` writes it into the
README's performance section, between its summary markers).

Run: ``python bench/bench_paths.py [--quick] [--pure-python] [--only guard,one-shot,...] [--json FILE] [--readme]``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import fake_schedule_batch, kernel_times, trivial  # noqa: E402

import validate_batch  # noqa: E402
from validate_batch import Checker, _accel  # noqa: E402

BS = (1, 64, 256, 1024, 4096, 11622)
SECTIONS = ("guard", "one-shot", "document", "cli", "memory")
ENGINE = "sglang-dsv4@pre-25418"
SERVER_ARGS = {"chunked_prefill_size": 8192, "max_running_requests": 16384}
ORACLE = [ROOT.parent / "shared" / "oracle" / "flashmla_h200_cases.jsonl",
          ROOT / "fixtures" / "oracle" / "flashmla_h200_cases.jsonl"]
LOG = ROOT / "fixtures" / "logs" / "sglang-dsv4-prefill-12288.log"
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def timed(fns: dict, numbers: dict, repeat: int) -> dict:
    """Per function, the best over ``repeat`` interleaved rounds of the mean time of one call (us)."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            n = numbers[k]
            fn()
            t0 = clock()
            for _ in range(n):
                fn()
            best[k] = min(best[k], (clock() - t0) / n * 1e6)
    return best


def mark(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def decode_step(b: int, rng: random.Random):
    seq = [rng.randint(1024, 16384) for _ in range(b)]
    return seq, list(range(1, b + 1)), [f"req-{i}" for i in range(b)]


# ----------------------------------------------------------------------------------- guard
def guard_rows(chk: Checker, kern: dict, scale: float, rounds: int, check_target: float) -> list[dict]:
    rng = random.Random(20260501)
    rows = []
    for b in BS:
        seq, slots, rids = decode_step(b, rng)
        seq_a, slots_a = np.array(seq, dtype=np.int64), np.array(slots, dtype=np.int64)
        obj = fake_schedule_batch("decode", rids, seq=seq, slots=slots)

        def base():
            for rec in zip(seq, slots):
                trivial(*rec)

        def base_arrays():
            for rec in zip(seq_a, slots_a):
                trivial(*rec)

        def base_object():
            for r, s in zip(obj.reqs, obj.seq_lens_cpu):
                trivial(s, r.req_pool_idx)

        kinds = {   # input: (verdict, check, the bare loop over the requests in that form)
            "lists": (lambda: chk.verdict("decode", seq_lens=seq, req_pool_indices=slots),
                      lambda: chk.check("decode", seq_lens=seq, req_pool_indices=slots), base),
            "arrays": (lambda: chk.verdict("decode", seq_lens=seq_a, req_pool_indices=slots_a),
                       lambda: chk.check("decode", seq_lens=seq_a, req_pool_indices=slots_a), base_arrays),
            "engine object": (lambda: chk.verdict(obj), lambda: chk.check(obj), base_object),
        }
        fast_n = max(int(4000 * scale * 64 / max(b, 64)), 20)
        check_n = max(int(300 * scale * 256 / max(b, 256)), 4)
        for kind, (verdict, check, native) in kinds.items():
            def cold(check=check):
                chk.schedule_memo.clear()
                return check()

            def cold_py(check=check):        # the same check with the compiled helpers off
                chk.schedule_memo.clear()
                compiled, _accel.compiled = _accel.compiled, None
                try:
                    return check()
                finally:
                    _accel.compiled = compiled
            assert verdict().legal and cold().legal, (b, kind)
            fns = {"base": base, "native": native, "verdict": verdict, "check": cold}
            numbers = {"base": fast_n, "native": fast_n, "verdict": fast_n, "check": check_n}
            if _accel.compiled is not None:
                fns["check_py"], numbers["check_py"] = cold_py, check_n
            t = timed(fns, numbers, rounds)
            k3 = 3 * kern[b]
            r = {"b": b, "input": kind, **t, "kernel": kern[b], "v_base": t["verdict"] / t["base"],
                 "v_native": t["verdict"] / t["native"], "v_check": t["verdict"] / t["check"],
                 "check_3k": t["check"] / k3}
            if "check_py" in t:
                r["py_3k"] = t["check_py"] / k3
            r["ok"] = {"verdict/loop": r["v_native"] <= 2.0, "verdict/check": r["v_check"] <= 1.0,
                       "check/3k": r["check_3k"] <= check_target}
            rows.append(r)
    return rows


def print_guard(rows: list[dict], check_target: float) -> bool:
    print(f"guard: decode steps, {ENGINE} on H200; base: the bare loop over the requests as lists, loop: over "
          f"them in the input's own form; targets verdict <= 2 x loop, verdict <= check, check <= {check_target:g} "
          f"x (3 x kernel); py/3k: the same check in pure Python (information; its own target is 1.0)")
    hdr = (f"{'b':>6} {'input':<14} {'base':>9} {'loop':>9} {'verdict':>9} {'v/base':>7} {'v/loop':>7} "
           f"{'check':>9} {'v/check':>7} {'3 x kern':>9} {'check/3k':>8} {'py/3k':>6}  targets")
    print(hdr)
    print("-" * len(hdr))
    ok = True
    for r in rows:
        ok &= all(r["ok"].values())
        marks = ", ".join(f"{k} {mark(v)}" for k, v in r["ok"].items())
        print(f"{r['b']:>6} {r['input']:<14} {r['base']:>9.2f} {r['native']:>9.2f} {r['verdict']:>9.2f} "
              f"{r['v_base']:>7.2f} {r['v_native']:>7.2f} {r['check']:>9.1f} {r['v_check']:>7.2f} "
              f"{3 * r['kernel']:>9.1f} {r['check_3k']:>8.2f} {r['py_3k'] if 'py_3k' in r else float('nan'):>6.2f}  {marks}")
    return ok


# ----------------------------------------------------------------------------------- one-shot
def call_record(b: int, rng: random.Random, as_array: bool) -> dict:
    tl = [rng.randint(1, 128) for _ in range(b)]
    etl = [rng.randint(1, 512) for _ in range(b)]
    if as_array:
        tl, etl = np.array(tl, dtype=np.int64), np.array(etl, dtype=np.int64)
    return {"kind": "sparse", "b": b, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128, "extra_topk": 512,
            "topk_length": tl, "extra_topk_length": etl}


def one_shot_rows(kern: dict, scale: float, rounds: int) -> list[dict]:
    rows = []
    for b in BS:
        for as_array in (False, True):
            rec = call_record(b, random.Random(b), as_array)

            def plan(rec=rec):
                return validate_batch.plan(rec).schedule

            def check(rec=rec):
                return validate_batch.check(rec)

            assert plan() is not None and check().legal, b
            n = max(int(600 * scale * 256 / max(b, 256)), 4)
            t = timed({"plan": plan, "check": check}, {"plan": n, "check": n}, rounds)
            r = {"b": b, "input": "arrays" if as_array else "lists", **t, "kernel": kern[b],
                 "plan_k": t["plan"] / kern[b], "check_k": t["check"] / kern[b]}
            r["ok"] = {} if as_array else {"plan/kern": r["plan_k"] <= 1.0, "check/kern": r["check_k"] <= 1.0}
            rows.append(r)
    return rows


def print_one_shot(rows: list[dict]) -> bool:
    print("one-shot: validate_batch.plan(record).schedule and validate_batch.check(record), one sparse call record "
          "(h_q 64, d_qk 512, topk 128 + extra 512); target <= 1 x kernel for list input")
    hdr = f"{'b':>6} {'input':<7} {'plan':>9} {'check':>9} {'kern':>8} {'plan/k':>7} {'check/k':>7}  targets"
    print(hdr)
    print("-" * len(hdr))
    ok = True
    for r in rows:
        ok &= all(r["ok"].values())
        marks = ", ".join(f"{k} {mark(v)}" for k, v in r["ok"].items()) or "(information)"
        print(f"{r['b']:>6} {r['input']:<7} {r['plan']:>9.1f} {r['check']:>9.1f} {r['kernel']:>8.1f} "
              f"{r['plan_k']:>7.2f} {r['check_k']:>7.2f}  {marks}")
    return ok


# ----------------------------------------------------------------------------------- documents
def document_rows(chk: Checker, scale: float, rounds: int) -> list[dict]:
    rng = random.Random(20260502)
    rows = []
    for b in BS:
        seq, slots, rids = decode_step(b, rng)
        doc = {"engine": ENGINE, "gpu": "H200", "server_args": SERVER_ARGS, "forward_mode": "decode",
               "requests": [{"id": r, "seq_len": s, "req_pool_idx": k} for r, s, k in zip(rids, seq, slots)]}

        def document():
            return validate_batch.check(doc)

        def checker():
            chk.schedule_memo.clear()
            return chk.check("decode", seq_lens=seq, req_pool_indices=slots, rids=rids)

        assert document().legal and checker().legal
        n = max(int(300 * scale * 256 / max(b, 256)), 4)
        t = timed({"document": document, "checker": checker}, {"document": n, "checker": n}, rounds)
        r = {"b": b, **t, "ratio": t["document"] / t["checker"]}
        r["ok"] = {"document/checker": r["ratio"] <= 3.0}
        rows.append(r)
    return rows


def print_documents(rows: list[dict]) -> bool:
    print("document: validate_batch.check(batch document) against Checker.check on the same requests; target <= 3 x")
    hdr = f"{'b':>6} {'document':>10} {'checker':>10} {'ratio':>6}  target"
    print(hdr)
    print("-" * len(hdr))
    ok = True
    for r in rows:
        ok &= all(r["ok"].values())
        print(f"{r['b']:>6} {r['document']:>10.1f} {r['checker']:>10.1f} {r['ratio']:>6.2f}  "
              f"{mark(r['ok']['document/checker'])}")
    return ok


# ----------------------------------------------------------------------------------- CLI
def console_script() -> list[str]:
    """The installed ``validate-batch`` (beside this Python, else on PATH), else ``python -m validate_batch.cli.main``."""
    exe = Path(sys.executable).with_name("validate-batch")
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("validate-batch")
    return [found] if found else [sys.executable, "-m", "validate_batch.cli.main"]


def install_kind() -> str:
    """``"wheel"`` when the package runs from site-packages as an installed wheel, else ``"checkout"``
    (an editable install, or the checkout on the path): then every Python start in the environment,
    ``python -c pass`` too, runs the install's import hook first (it loads pathlib and re), so the
    start-up ratios come out below those of an installed wheel."""
    here = Path(validate_batch.__file__).resolve()
    return "checkout" if ROOT in here.parents else "wheel"


def oracle_file() -> Path:
    for p in ORACLE:
        if p.is_file():
            return p
    raise SystemExit("oracle call records not found")


def call_lines(n: int) -> list[str]:
    """``n`` call records: the oracle's inputs (outputs dropped), repeated."""
    skip = {"tile_scheduler_metadata", "num_splits", "i", "error", "outcome", "expected"}
    recs = []
    for line in oracle_file().read_text().splitlines():
        d = json.loads(line)
        if "kind" in d:
            recs.append(json.dumps({k: v for k, v in d.items() if k not in skip}))
    return [recs[i % len(recs)] for i in range(n)]


def run_wall(cmd: list[str], env: dict | None = None, cwd: Path = ROOT) -> tuple[float, int, int]:
    """(elapsed seconds, exit code, peak RSS in KiB) of one run in ``cwd``, output discarded."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, p.returncode, usage.ru_maxrss


# A child's peak RSS as wait4 reports it is at least its parent's at the spawn (Linux keeps the larger
# of the memory it started from and its own), and this process holds the generated inputs: the
# measured command is started by a fresh small Python instead, which reports what wait4 says.
LAUNCHER = (
    "import os, sys, time\n"
    "t0 = time.perf_counter()\n"
    "pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, file_actions=[\n"
    "    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0), (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "print(time.perf_counter() - t0, os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n"
)


def run_peak(cmd: list[str]) -> tuple[float, int, int]:
    """(elapsed seconds, exit code, peak RSS in KiB) of one run started by :data:`LAUNCHER`, output
    discarded; :func:`run_wall` where there is no ``posix_spawn``."""
    if not hasattr(os, "posix_spawn"):
        return run_wall(cmd)
    p = subprocess.run([sys.executable, "-c", LAUNCHER, *cmd], capture_output=True, text=True, cwd=ROOT, check=True)
    t, rc, rss = p.stdout.split()
    return float(t), int(rc), int(rss)


def cli_rows(runs: int, tmp: Path) -> list[dict]:
    vb = console_script()
    big = tmp / "calls-10000.jsonl"
    big.write_text("\n".join(call_lines(10000)) + "\n")
    oracle = oracle_file()
    n_oracle = sum(1 for line in oracle.read_text().splitlines() if '"kind"' in line)
    cmds = {
        "python -c pass": ([sys.executable, "-c", "pass"], None, (0,)),
        "python -c 'import numpy'": ([sys.executable, "-c", "import numpy"], None, (0,)),
        FLOOR_COMMAND: ([sys.executable, "-c", f"import {', '.join(CHECK_NEEDS)}"], None, (0,)),
        "check --example dsv4-prefill-3x4096": (vb + ["check", "--example", "dsv4-prefill-3x4096"], None, (1,)),
        "--version": (vb + ["--version"], None, (0,)),
        "--help": (vb + ["--help"], None, (0,)),
        "rules": (vb + ["rules"], None, (0,)),
        f"metadata --json oracle ({n_oracle} calls)": (vb + ["metadata", "--json", str(oracle)], n_oracle, (0, 1)),
        "metadata --json 10000 calls": (vb + ["metadata", "--json", str(big)], 10000, (0, 1)),
    }
    # every command starts from compiled bytecode, as from an installed wheel (pip compiles it at
    # install): a cache of its own, filled by one untimed run of each command, even where the
    # environment turns writing bytecode off or the package is an editable checkout
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    # run where a user runs it: a project of their own, whose pyproject.toml names other tools
    project = tmp / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(PROJECT_FILE)
    for k, (cmd, _, codes) in cmds.items():
        run_wall(cmd, env, project)
    times: dict = {k: [] for k in cmds}
    for _ in range(runs):
        for k, (cmd, _, codes) in cmds.items():
            t, rc, _ = run_wall(cmd, env, project)
            assert rc in codes, (k, rc)
            times[k].append(t)
    rows = []
    bare = statistics.median(times["python -c pass"])
    floor = statistics.median(times["python -c 'import numpy'"])
    for k, (cmd, calls, _) in cmds.items():
        med = statistics.median(times[k])
        r = {"command": k, "median_ms": med * 1e3, "min_ms": min(times[k]) * 1e3, "x_bare": med / bare, "ok": {}}
        if calls:
            r["calls_per_s"] = calls / med
            if calls / 5000 > floor:
                r["ok"]["calls/s"] = r["calls_per_s"] >= 5000
            else:   # (no command could: it has less time for all its calls than the interpreter takes to import numpy)
                r["below_floor"] = f"{calls} calls at 5000/s is {calls / 5:.0f} ms, less than `import numpy` alone ({floor * 1e3:.0f} ms)"
        if k in START_COMMANDS:
            r["ok"]["<= 6 x bare"] = r["x_bare"] <= 6.0
            r["imports_ms"] = import_groups(cmd, env, project)
        if k.startswith("check"):     # the floor's modules are ones this command imports
            missing = set(CHECK_NEEDS) - {name for name, _ in imports_of(cmd, env, project)}
            assert not missing, f"{k} no longer imports {sorted(missing)}: CHECK_NEEDS is out of date"
        if k.startswith("check"):
            r["ok"]["< 250 ms"] = med < 0.25
        rows.append(r)
    return rows


#: the pyproject.toml of the directory the command lines run in: a user's project (no table of this tool)
PROJECT_FILE = ('[project]\nname = "serving-stack"\nversion = "0.1.0"\ndependencies = ["sglang==0.5.23"]\n\n'
                '[tool.ruff]\nline-length = 120\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
#: what ``check --example`` imports that is not the project's and that it cannot run without: numpy
#: (its columns and plans), PyYAML (the example is YAML) and the standard-library modules the
#: project's code is written with; timed alone, with no project code, as a floor for its start-up
CHECK_NEEDS = ("numpy", "yaml", "dataclasses", "typing", "json", "re", "pathlib")
FLOOR_COMMAND = f"python -c 'import {', '.join(CHECK_NEEDS)}'"
#: the command lines whose start-up is held to 6 x a bare interpreter's
START_COMMANDS = ("check --example dsv4-prefill-3x4096", "--version", "--help", "rules")
#: import-time groups: the heavy dependencies, the project, everything else
IMPORT_GROUPS = ("numpy", "rich", "typer", "pydantic", "yaml", "validate_batch")


def import_groups(cmd: list[str], env: dict | None = None, cwd: Path = ROOT) -> dict:
    """Milliseconds of imports per group (:data:`IMPORT_GROUPS`, then ``other``) in one run of ``cmd``
    under ``python -X importtime`` (each module's own time; the tracing adds its share)."""
    out = {g: 0.0 for g in (*IMPORT_GROUPS, "other")}
    for name, us in imports_of(cmd, env, cwd):
        top = name.split(".")[0]
        top = "pydantic" if top.startswith("pydantic") else top
        out[top if top in IMPORT_GROUPS else "other"] += us / 1e3
    return out


def imports_of(cmd: list[str], env: dict | None = None, cwd: Path = ROOT) -> list[tuple[str, int]]:
    """``(module, microseconds of its own import)`` for every module one run of ``cmd`` imports,
    from ``python -X importtime``."""
    exe = cmd[0]
    if Path(exe).name == "validate-batch":    # the console script: run its entry point under the tracing
        cmd = [sys.executable, "-X", "importtime", "-c", "from validate_batch.cli.main import main; main()", *cmd[1:]]
    else:
        cmd = [cmd[0], "-X", "importtime", *cmd[1:]]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    out = []
    for line in p.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line[len("import time:"):].split("|")
        if not parts[0].strip().isdigit():
            continue            # the header line
        out.append((parts[2].strip(), int(parts[0])))
    return out


def print_cli(rows: list[dict], runs: int) -> bool:
    print(f"cli: elapsed time, median (and best) of {runs} runs, interleaved; x bare: median / python -c pass's; "
          f"targets: start-up <= 6 x bare ({', '.join(START_COMMANDS)}), check < 250 ms, metadata >= 5000 calls/s")
    if install_kind() == "checkout":
        print("NOTE: the package runs from this checkout (an editable install): every Python start here, python -c "
              "pass's too, first runs the install's import hook, so the x bare ratios are below an installed "
              "wheel's; `pip install .` into a fresh environment and run this bench with its Python for a user's "
              "figures (--readme refuses this install)")
    hdr = f"{'command':<42} {'median ms':>10} {'best ms':>8} {'x bare':>7} {'calls/s':>9}  targets"
    print(hdr)
    print("-" * len(hdr))
    ok = True
    for r in rows:
        ok &= all(r["ok"].values())
        cps = f"{r['calls_per_s']:>9.0f}" if "calls_per_s" in r else f"{'':>9}"
        marks = ", ".join(f"{k} {mark(v)}" for k, v in r["ok"].items()) or \
            (f"(information: {r['below_floor']})" if "below_floor" in r else "(reference)")
        print(f"{r['command']:<42} {r['median_ms']:>10.1f} {r['min_ms']:>8.1f} {r['x_bare']:>7.2f} {cps}  {marks}")
    print()
    print("imports per command line (ms, one run under python -X importtime, each module's own time)")
    hdr = f"{'command':<42} " + " ".join(f"{g.replace('validate_batch', 'project'):>8}" for g in (*IMPORT_GROUPS, "other"))
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "imports_ms" in r:
            print(f"{r['command']:<42} " + " ".join(f"{v:>8.1f}" for v in r["imports_ms"].values()))
    return ok


# ----------------------------------------------------------------------------------- memory
def write_log(path: Path, mib: int) -> None:
    """An SGLang DeepSeek-V4 server log of about ``mib`` MiB: the fixture's start, its legal steps and
    request lines repeated, and its crashing step at the end."""
    lines = LOG.read_text().splitlines(True)
    crash = next(i for i, line in enumerate(lines) if "#new-token: 12288" in line)
    head, body, tail = lines[:8], "".join(lines[8:crash]), lines[crash:]
    block = body * max(1, (1 << 20) // len(body))
    with open(path, "w") as f:
        f.writelines(head)
        written = 0
        while written < mib << 20:
            f.write(block)
            written += len(block)
        f.writelines(tail)


def memory_rows(log_mib: int, calls: int, tmp: Path) -> list[dict]:
    vb = console_script()
    rows = []
    for mib in (max(log_mib // 8, 1), log_mib):
        log = tmp / f"server-{mib}.log"
        write_log(log, mib)
        t, rc, rss = run_peak(vb + ["bisect", str(log), "--no-progress", "-q"])
        assert rc == 1, rc   # the crash is explained
        rows.append({"command": f"bisect, {mib} MiB log", "input": mib, "seconds": t, "rss_mib": rss / 1024})
        log.unlink()
    for n in (max(calls // 8, 1), calls):
        f = tmp / f"calls-{n}.jsonl"
        f.write_text("\n".join(call_lines(n)) + "\n")
        t, rc, rss = run_peak(vb + ["metadata", "--json", str(f)])
        assert rc in (0, 1), rc
        rows.append({"command": f"metadata --json, {n} calls", "input": n, "seconds": t, "rss_mib": rss / 1024,
                     "calls_per_s": n / t})
        f.unlink()
    for small, big in ((rows[0], rows[1]), (rows[2], rows[3])):
        big["growth"] = big["rss_mib"] / small["rss_mib"]
        big["small"] = small
        big["ok"] = {"bounded (< 2 x the 1/8 input's)": big["growth"] < 2.0}
    return rows


def print_memory(rows: list[dict]) -> bool:
    print("memory: peak RSS of one run (and of a run on 1/8 of the input); target: the full input's "
          "peak < 2 x the small one's (memory does not grow with the input)")
    hdr = f"{'command':<34} {'seconds':>8} {'peak RSS MiB':>12} {'growth':>7}  target"
    print(hdr)
    print("-" * len(hdr))
    ok = True
    for r in rows:
        marks = ", ".join(f"{k} {mark(v)}" for k, v in r.get("ok", {}).items())
        ok &= all(r.get("ok", {}).values())
        growth = f"{r['growth']:>7.2f}" if "growth" in r else f"{'':>7}"
        extra = f" ({r['calls_per_s']:.0f} calls/s)" if "calls_per_s" in r else ""
        print(f"{r['command']:<34} {r['seconds']:>8.1f} {r['rss_mib']:>12.1f} {growth}  {marks}{extra}")
    for r in rows:
        if "growth" in r:
            print(f"ratio: {r['command']}: {r['rss_mib']:.1f} MiB / {r['small']['rss_mib']:.1f} MiB "
                  f"({r['small']['command']}) = {r['growth']:.2f}")
    return ok


# ----------------------------------------------------------------------------------- summary
README = ROOT / "README.md"
#: the README's performance table lies between these lines (``--readme`` rewrites it)
BEGIN, END = "<!-- bench_paths summary: begin -->", "<!-- bench_paths summary: end -->"


def _per_b(rows: list[dict], key: str) -> str:
    return ", ".join(f"{r[key]:.2f}" for r in rows) + f" at b = {', '.join(str(r['b']) for r in rows)}"


def _status(oks: list[bool], where: list[str] | None = None) -> str:
    """``met``, ``missed``, or ``missed at`` the rows that missed (``where``: each row's name)."""
    if all(oks):
        return "met"
    if not any(oks):
        return "missed"
    return "missed at " + (", ".join(w for w, ok in zip(where, oks) if not ok) if where else "some rows")


def summary_rows(out: dict, check_target: float) -> list[tuple[str, str, str]]:
    """``(target, measured, status)`` for every target of the run, from the sections it ran."""
    rows = []
    guard = out.get("guard")
    if guard:
        for kind in ("lists", "arrays", "engine object"):
            g = [r for r in guard if r["input"] == kind]
            miss = [r["b"] for r in g if not r["ok"]["verdict/loop"]]
            rows.append((f"verdict <= 2 x a bare loop over the same requests, {kind}",
                         f"{g[0]['v_native']:.2f} at b = 1 ({g[0]['verdict']:.2f} us against {g[0]['native']:.2f} us); "
                         f"at most {max(r['v_native'] for r in g[1:]):.2f} from b = 64",
                         "met" if not miss else f"missed at b = {', '.join(map(str, miss))}"))
        rows.append(("verdict never slower than the full check",
                     f"at most {max(r['v_check'] for r in guard):.2f} of the check",
                     _status([r["ok"]["verdict/check"] for r in guard])))
        for kind in ("lists", "arrays", "engine object"):
            g = [r for r in guard if r["input"] == kind]
            miss = [r["b"] for r in g if not r["ok"]["check/3k"]]
            py = f"; pure Python {_per_b(g, 'py_3k')}" if all("py_3k" in r for r in g) else ""
            rows.append((f"full check <= {check_target:g} x the 3 scheduler-kernel runs, {kind}",
                         _per_b(g, "check_3k") + py,
                         "met" if not miss else f"missed at b = {', '.join(map(str, miss))}"))
    one = [r for r in out.get("one_shot", []) if r["input"] == "lists"]
    for key, name in (("plan_k", "one-shot `plan(record).schedule`"), ("check_k", "one-shot `check(record)`")):
        if one:
            miss = [r["b"] for r in one if r[key] > 1.0]
            rows.append((f"{name} <= 1 kernel run, list fields", _per_b(one, key),
                         "met" if not miss else f"missed at b = {', '.join(map(str, miss))}"))
    doc = out.get("document")
    if doc:
        rows.append(("batch document <= 3 x the Checker path",
                     f"{min(r['ratio'] for r in doc):.2f}-{max(r['ratio'] for r in doc):.2f}",
                     _status([r["ok"]["document/checker"] for r in doc])))
    cli = {r["command"]: r for r in out.get("cli", [])}
    if cli:
        bare = cli["python -c pass"]["median_ms"]
        numpy_x = cli["python -c 'import numpy'"]["x_bare"]
        for k in START_COMMANDS:
            r = cli[k]
            heavy = ", ".join(f"{g.replace('validate_batch', 'project')} {v:.0f}"
                              for g, v in r["imports_ms"].items() if v >= 1 and g != "other")
            floor = ""
            if r["imports_ms"].get("numpy", 0) >= 1:
                floor = f"; `import numpy` alone: {numpy_x:.2f} x"
                if k.startswith("check") and FLOOR_COMMAND in cli:
                    floor += (f"; the modules it cannot do without, with no project code "
                              f"(`{FLOOR_COMMAND[len('python -c '):].strip(chr(39))}`): {cli[FLOOR_COMMAND]['x_bare']:.2f} x")
            rows.append((f"start-up of `validate-batch {k}` <= 6 x a bare interpreter",
                         f"{r['x_bare']:.2f} x ({r['median_ms']:.0f} ms against {bare:.0f} ms; imports in ms: {heavy or 'none'}{floor})",
                         "met" if r["ok"]["<= 6 x bare"] else "missed"))
        r = cli["check --example dsv4-prefill-3x4096"]
        rows.append(("`check --example dsv4-prefill-3x4096` < 250 ms", f"{r['median_ms']:.0f} ms median",
                     "met" if r["ok"]["< 250 ms"] else "missed"))
        m = [r for r in cli.values() if "calls/s" in r["ok"]]
        info = "".join(f"; information: {r['calls_per_s']:.0f}/s ({r['command']}: {r['below_floor']})"
                       for r in cli.values() if "below_floor" in r)
        rows.append(("`metadata --json` >= 5000 calls/s",
                     "; ".join(f"{r['calls_per_s']:.0f}/s ({r['command']})" for r in m) + info,
                     _status([r["ok"]["calls/s"] for r in m], [r["command"] for r in m])))
    for r in out.get("memory", []):
        if "growth" in r:
            rows.append((f"memory of {r['command']} < 2 x that of 1/8 the input",
                         f"{r['rss_mib']:.1f} MiB, {r['growth']:.2f} x", _status(list(r["ok"].values()))))
    return rows


def summary_table(out: dict, check_target: float) -> str:
    """The run's targets as a Markdown table, with the machine and the implementation it ran on."""
    where = {"wheel": "; the package installed as a wheel", "checkout": "; the package run from the checkout"}
    lines = [f"One run of `python bench/bench_paths.py` (Python {out['python']}, numpy {np.__version__}, "
             f"{os.cpu_count()} CPUs, {out['clock']} clock; {out['implementation']}"
             f"{where[out['install']] if 'install' in out else ''}):", "",
             "| target | measured | |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {st} |" for t, m, st in summary_rows(out, check_target)]
    return "\n".join(lines)


def write_readme(table: str) -> None:
    """Put ``table`` between the README's summary markers."""
    text = README.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")


# ----------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations and smaller memory inputs (noisier)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="cpu: this thread's CPU time; wall: elapsed")
    ap.add_argument("--pure-python", action="store_true", help="without the compiled helpers")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections ({', '.join(SECTIONS)})")
    ap.add_argument("--cli-runs", type=int, default=None, help="runs per command line (default 15, quick 5)")
    ap.add_argument("--log-mb", type=int, default=None, help="bisect log size in MiB (default 1024, quick 64)")
    ap.add_argument("--calls", type=int, default=None, help="metadata call records (default 100000, quick 20000)")
    ap.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    ap.add_argument("--readme", action="store_true", help="rewrite the README's performance table from this run")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = set(only) - set(SECTIONS)
    if bad:
        ap.error(f"unknown section(s) {', '.join(sorted(bad))}")
    if args.pure_python:
        _accel.compiled = None
        _accel.reason = "--pure-python"
        os.environ["VALIDATE_BATCH_PURE_PYTHON"] = "1"    # and the command lines it starts
    global clock
    clock = CLOCKS[args.clock]
    scale, rounds = (0.2, 5) if args.quick else (1.0, 9)
    check_target = 0.5 if _accel.compiled is not None else 1.0
    print(f"validate-batch paths - Python {sys.version.split()[0]}, numpy {np.__version__}, {args.clock} clock, "
          f"{os.cpu_count()} CPUs")
    print(f"implementation: {_accel.status()}")
    kern = kernel_times()
    chk = Checker(engine=ENGINE, gpu="H200", server_args=SERVER_ARGS)
    warm = time.perf_counter() + (0.2 if args.quick else 1.0)
    while time.perf_counter() < warm:
        chk.check("decode", seq_lens=list(range(1000, 1256)))
    out: dict = {"python": sys.version.split()[0], "implementation": _accel.status(), "clock": args.clock,
                 "install": install_kind()}
    if args.readme and "cli" in only and out["install"] == "checkout":
        ap.error("--readme with the cli section needs the package installed as a wheel (pip install . into a fresh "
                 "environment, then this bench with its Python): from the checkout every start, the bare "
                 "interpreter's too, pays the install's import hook")
    ok = True
    if "guard" in only:
        out["guard"] = rows = guard_rows(chk, kern, scale, rounds, check_target)
        print()
        ok &= print_guard(rows, check_target)
    if "one-shot" in only:
        out["one_shot"] = rows = one_shot_rows(kern, scale, rounds)
        print()
        ok &= print_one_shot(rows)
    if "document" in only:
        out["document"] = rows = document_rows(chk, scale, rounds)
        print()
        ok &= print_documents(rows)
    tmp = Path(tempfile.mkdtemp(prefix="bench-paths-"))
    try:
        if "cli" in only:
            runs = args.cli_runs or (5 if args.quick else 15)
            out["cli"] = rows = cli_rows(runs, tmp)
            print()
            ok &= print_cli(rows, runs)
        if "memory" in only:
            log_mb = args.log_mb or (64 if args.quick else 1024)
            calls = args.calls or (20000 if args.quick else 100000)
            out["memory"] = rows = memory_rows(log_mb, calls, tmp)
            print()
            ok &= print_memory(rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table = summary_table(out, check_target)
    print()
    print("summary")
    print(table)
    print()
    print("all targets met" if ok else "some targets missed (see rows marked MISSED)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    if args.readme:
        write_readme(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
