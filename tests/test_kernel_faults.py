"""Kernel mode against children that misbehave: malformed results, floods of output, processes that
escape the timeout by leaving the child's session, and a torch that imports but does not work.

Every child here is a stand-in backend (or a fake ``torch`` package) written under ``tmp_path``; no
GPU, no real torch in the child. The caps and time limits asserted are the documented ones (1 MiB
head and tail of stderr; a timeout returns within the limit plus a couple of seconds).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from validate_batch.api import check_calls
from validate_batch.kernel_mode.check import kernel_check_report
from validate_batch.kernel_mode.outcome import RESULT_PREFIX, classify
from validate_batch.kernel_mode.runner import CappedBuffer, ChildSpec, run_job

MIB = 1 << 20
SPARSE = {"kind": "sparse", "b": 8, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
SCHED = "/src/FlashMLA/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu"

FAULT_SOURCE = r'''
"""Stand-in backend whose "ok" results and output are broken in the way STANDIN_FAULT names."""
import os
import subprocess
import sys
import time

RESULT = "@@validate-batch result "
SCHED = "/src/FlashMLA/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu"
DETECT = ('{"status":"ok","torch":"0.0+standin","cuda_available":true,"providers":[{"name":"flash_mla",'
          '"module":"flash_mla","api":"sched_meta","features":["indices","is_fp8_kvcache","topk_length"],'
          '"reason":"stand-in"}],"device":{"name":"Stand-in H200","cc":[9,0],"num_sms":132,'
          '"smem_optin":232448,"memory_bytes":150000000000}}')
ROW = "[0,0,0,0,0,0,0,0]"
RAW = {
    "md-string": '{"status":"ok","tile_scheduler_metadata":"not a table","num_splits":[0,1]}',
    "md-ragged": '{"status":"ok","tile_scheduler_metadata":[' + ROW + ',[0,0,0]],"num_splits":[0,1]}',
    "md-flat": '{"status":"ok","tile_scheduler_metadata":[0,0,0,0,0,0,0,0],"num_splits":[0,1]}',
    "md-huge-int": '{"status":"ok","tile_scheduler_metadata":[[' + "9" * 5000 + ',0,0,0,0,0,0,0]],"num_splits":[0,1]}',
    "md-int64": '{"status":"ok","tile_scheduler_metadata":[[' + str(1 << 40) + ',0,0,0,0,0,0,0]],"num_splits":[0,1]}',
    "md-nan": '{"status":"ok","tile_scheduler_metadata":[[NaN,0,0,0,0,0,0,0]],"num_splits":[0,1]}',
    "md-strings": '{"status":"ok","tile_scheduler_metadata":[["0","0","0","0","0","0","0","0"]],"num_splits":[0,1]}',
    "ns-nested": '{"status":"ok","tile_scheduler_metadata":[' + ROW + '],"num_splits":[[0],[1]]}',
    "ns-huge-int": '{"status":"ok","tile_scheduler_metadata":[' + ROW + '],"num_splits":[0,' + "1" * 400 + ']}',
    "deep": '{"status":"ok","tile_scheduler_metadata":' + "[" * 100000 + "]" * 100000 + '}',
}


def flood(stream, total, chunk=b"x" * 65535 + b"\n"):
    left = total
    while left > 0:
        part = chunk[:left]
        stream.write(part)
        left -= len(part)
    stream.flush()


def run(job, stage, partial):
    fault = os.environ.get("STANDIN_FAULT", "")
    if job.get("op") == "detect":
        sys.stdout.write(RESULT + DETECT + "\n")
        sys.stdout.flush()
        os._exit(0)
    stage("call")
    if fault in RAW:
        sys.stdout.write(RESULT + RAW[fault] + "\n")
        sys.stdout.flush()
        os._exit(0)
    if fault == "cuda-line-digits":
        sys.stderr.write(f"CUDA error ({SCHED}:{'7' * 5000}): invalid argument\n")
        sys.stderr.flush()
        os._exit(1)
    if fault == "flood":
        n_err, n_out = int(os.environ["FLOOD_STDERR"]), int(os.environ["FLOOD_STDOUT"])
        sys.stderr.buffer.write(b"HEAD-OF-STDERR\n")
        flood(sys.stderr.buffer, n_err - len(b"HEAD-OF-STDERR\n") - len(b"END-OF-STDERR\n"))
        sys.stderr.buffer.write(b"END-OF-STDERR\n")
        sys.stderr.flush()
        flood(sys.stdout.buffer, n_out)
        return {"message": "OK after the flood"}
    if fault in ("setsid-hang", "orphan-hang", "orphan-ok"):
        pidfile = os.environ["STANDIN_PIDFILE"]
        hold = f"import os, time; open({pidfile!r}, 'w').write(str(os.getpid())); time.sleep(60)"
        if fault == "setsid-hang":       # a grandchild in a session of its own, holding stdout and stderr
            subprocess.Popen([sys.executable, "-c", hold], start_new_session=True)
        else:                            # the same, orphaned: its parent is gone before the timeout
            spawn = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {hold!r}], start_new_session=True)"
            subprocess.Popen([sys.executable, "-c", spawn]).wait()
        while not os.path.exists(pidfile) or not open(pidfile).read():
            time.sleep(0.02)
        if fault == "orphan-ok":
            return {"message": "OK with an orphan holding the pipes"}
        time.sleep(600)
    return {"message": "OK"}
'''


@pytest.fixture()
def faulty(tmp_path) -> str:
    path = tmp_path / "fault_backend.py"
    path.write_text(FAULT_SOURCE, encoding="utf-8")
    return str(path)


def spec(backend: str, **env) -> ChildSpec:
    return ChildSpec(backend=backend, env=tuple((k, str(v)) for k, v in env.items()))


def decode_job() -> dict:
    return {"op": "decode", "record": dict(SPARSE)}


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _kill_left_over(pidfile: Path) -> None:
    if pidfile.exists() and pidfile.read_text():
        try:
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# ----------------------------------------------------------------------------- malformed results

@pytest.mark.parametrize("fault,needle", [
    ("md-string", "not a list of rows"),
    ("md-ragged", "row 1 has 3 values"),
    ("md-flat", "row 0 is int"),
    ("md-huge-int", "5000 digits"),
    ("md-int64", f"is {1 << 40}, outside"),
    ("md-nan", "NaN"),
    ("md-strings", "not an integer"),
    ("ns-nested", "num_splits[0]"),
    ("ns-huge-int", "400 digits"),
    ("deep", "nested too deeply"),
])
def test_malformed_ok_result_is_inconclusive_not_a_crash(faulty, fault, needle):
    res = kernel_check_report(check_calls([SPARSE], "H200"), None, child=spec(faulty, STANDIN_FAULT=fault),
                              timeout=30)
    e = res["calls"][0]
    assert e["kernel"]["outcome"] == "malformed" and e["kernel_verdict"] == "inconclusive"
    assert e["agreement"] == "inconclusive"
    assert e["agreement_reason"].startswith("malformed result from the child: ")
    assert needle in e["agreement_reason"]
    assert e["metadata"] is None
    assert res["summary"]["status"] == "inconclusive"
    assert json.loads(json.dumps(res)) == res


def test_cuda_error_line_number_of_5000_digits(faulty):
    r = run_job(decode_job(), 30, spec(faulty, STANDIN_FAULT="cuda-line-digits"))
    assert r.outcome == "malformed" and r.verdict == "inconclusive" and r.exit_code == 1
    assert r.inconclusive_reason.startswith("malformed result from the child: ")
    assert "5000 digits" in r.inconclusive_reason and len(r.message) < 300


def test_numbers_in_output_lines_are_bounded():
    ok = f'{RESULT_PREFIX}{{"status":"ok","message":"OK"}}\n'
    warn = (f"[WARNING] batch_size={'1' * 5000} requires 4B shared memory (max=232448B), using low-smem "
            "fallback kernel.\n")
    r = classify(0, warn + ok, "")
    assert r.outcome == "malformed" and "5000 digits" in r.message
    r = classify(None, "", f"CUDA error (a.cu:{'3' * 5000}): x\n", timed_out=True, elapsed_s=2.0)
    assert r.outcome == "timeout"                  # the parent's own observation wins
    # a line number of ordinary length still reads as before
    r = classify(1, "", f"CUDA error ({SCHED}:111): invalid argument\n")
    assert (r.outcome, r.cuda_error.line) == ("process_exit", 111)


def test_unreadable_result_line_after_a_clean_exit_is_malformed():
    r = classify(0, f'{RESULT_PREFIX}{{"status":"ok","tile_sch\n', "")
    assert r.outcome == "malformed" and "not JSON" in r.inconclusive_reason
    r = classify(-signal.SIGSEGV, f'{RESULT_PREFIX}{{"status":"ok","tile_sch\n', "")
    assert r.outcome == "process_crash"            # a crash mid-line is still a crash


# ----------------------------------------------------------------------------- output caps

def test_capped_buffer_keeps_head_and_tail():
    buf = CappedBuffer(4, 6)
    for piece in (b"abc", b"defgh", b"ijklmn", b"opq"):
        buf.write(piece)
    assert bytes(buf.head) == b"abcd" and bytes(buf.tail) == b"lmnopq" and buf.dropped == 7
    assert buf.text().startswith("abcd") and buf.text().endswith("lmnopq") and "7 bytes" in buf.text()
    small = CappedBuffer(4, 6)
    small.write(b"abcdefghij")
    assert small.dropped == 0 and small.text() == "abcdefghij"


def test_flooding_child_output_is_capped_and_the_result_kept(faulty):
    n_err, n_out = 48 * MIB, 8 * MIB
    r = run_job(decode_job(), 60, spec(faulty, STANDIN_FAULT="flood", FLOOD_STDERR=n_err, FLOOD_STDOUT=n_out))
    assert r.outcome == "ok" and r.payload["message"] == "OK after the flood"
    # stderr: the first and the last MiB are kept, the rest is counted
    assert r.output_dropped["stderr"] == n_err - 2 * MIB
    assert r.to_dict()["output_dropped"]["stderr"] == n_err - 2 * MIB
    assert "END-OF-STDERR" in r.stderr_tail


def test_flooded_stderr_keeps_the_failure_line(faulty, tmp_path):
    backend = tmp_path / "flood_then_die.py"
    backend.write_text(
        "import os, sys\n"
        "def run(job, stage, partial):\n"
        "    sys.stderr.buffer.write((b'y' * 4095 + b'\\n') * (8 * 1024))\n"
        f"    sys.stderr.write('CUDA error ({SCHED}:111): invalid argument\\n')\n"
        "    sys.stderr.flush()\n"
        "    os._exit(1)\n", encoding="utf-8")
    r = run_job(decode_job(), 30, ChildSpec(backend=str(backend)))
    assert r.outcome == "process_exit" and r.cuda_error.line == 111
    assert r.output_dropped["stderr"] > 0


# ----------------------------------------------------------------------------- timeouts that hold the pipes

def test_setsid_grandchild_holding_the_pipes_does_not_outlive_the_timeout(faulty, tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    try:
        t0 = time.monotonic()
        r = run_job(decode_job(), 2, spec(faulty, STANDIN_FAULT="setsid-hang", STANDIN_PIDFILE=pidfile))
        took = time.monotonic() - t0
        assert r.outcome == "timeout" and r.verdict == "inconclusive"
        assert took < 2 + 2.5, took
        pid = int(pidfile.read_text())
        deadline = time.monotonic() + 2
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(pid), "the grandchild in its own session was left running"
    finally:
        _kill_left_over(pidfile)


def test_orphan_holding_the_pipes_cannot_stall_a_timeout(faulty, tmp_path):
    pidfile = tmp_path / "orphan.pid"
    try:
        t0 = time.monotonic()
        r = run_job(decode_job(), 2, spec(faulty, STANDIN_FAULT="orphan-hang", STANDIN_PIDFILE=pidfile))
        took = time.monotonic() - t0
        assert r.outcome == "timeout" and took < 2 + 2.5, (r.outcome, took)
    finally:
        _kill_left_over(pidfile)


def test_orphan_holding_the_pipes_after_a_result_is_not_waited_for(faulty, tmp_path):
    pidfile = tmp_path / "orphan.pid"
    try:
        t0 = time.monotonic()
        r = run_job(decode_job(), 30, spec(faulty, STANDIN_FAULT="orphan-ok", STANDIN_PIDFILE=pidfile))
        took = time.monotonic() - t0
        assert r.outcome == "ok" and r.payload["message"] == "OK with an orphan holding the pipes"
        assert took < 5, took
    finally:
        _kill_left_over(pidfile)


# ----------------------------------------------------------------------------- a torch that imports but is broken

BROKEN_ATTRS = '''
def __getattr__(name):
    raise RuntimeError("libtorch_cpu.so: the library is damaged\\nsecond line of the message")
__version__ = "9.9.9+broken"
'''
BROKEN_IMPORT = 'raise OSError("libtorch_global_deps.so: invalid ELF header")\n'
BROKEN_MATH = '''
__version__ = "9.9.9+broken"
int64 = "int64"
class _T:
    def __setitem__(self, key, value):
        pass
    def sum(self):
        return self
    def item(self):
        return 0
def zeros(*shape, dtype=None):
    return _T()
def tensor(values, dtype=None):
    return _T()
'''


@pytest.fixture(autouse=True)
def _no_fake_torch_left_behind():
    """A fake torch imported by a test must not stay in sys.modules for the tests after it."""
    before = {k: v for k, v in sys.modules.items() if k == "torch" or k.startswith("torch.")}
    yield
    for k in [k for k in sys.modules if k == "torch" or k.startswith("torch.")]:
        if k not in before:
            del sys.modules[k]
    sys.modules.update(before)


def fake_torch(tmp_path: Path, source: str) -> Path:
    root = tmp_path / "fake_torch"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(source, encoding="utf-8")
    return root


@pytest.mark.parametrize("source,needle", [
    (BROKEN_ATTRS, "torch is broken: RuntimeError: libtorch_cpu.so: the library is damaged"),
    (BROKEN_IMPORT, "torch is broken: OSError: libtorch_global_deps.so: invalid ELF header"),
    (BROKEN_MATH, "torch is broken: torch 9.9.9+broken: writing 5 into a zero CPU tensor gives a sum of 0"),
])
def test_probe_slot_with_a_broken_torch_is_unavailable(tmp_path, monkeypatch, source, needle):
    from typer.testing import CliRunner

    from validate_batch.cli.main import app

    root = fake_torch(tmp_path, source)
    monkeypatch.setenv("PYTHONPATH", str(root))          # the child's torch; the parent imports none,
    monkeypatch.syspath_prepend(str(root))               # but finds it installed (with or without a real one)
    for device in ("cpu", "cuda"):
        r = CliRunner().invoke(app, ["probe-slot", "--rows", "33", "--slot", "3", "--device", device,
                                     "--timeout", "30", "--json"])
        assert r.exit_code == 3, r.output
        res = json.loads(r.stdout.strip().splitlines()[-1])
        assert res["available"] is False and res["in_bounds"] is True
        assert res["reason"].startswith(needle) and "second line" not in res["reason"]
    r = CliRunner().invoke(app, ["probe-slot", "--rows", "33", "--slot", "3", "--device", "cpu", "--timeout", "30"])
    assert r.exit_code == 3 and "unavailable" in r.stdout and needle in r.stdout


@pytest.mark.parametrize("source,needle", [
    (BROKEN_ATTRS, "torch is broken: RuntimeError: libtorch_cpu.so: the library is damaged"),
    (BROKEN_IMPORT, "torch is broken: OSError: libtorch_global_deps.so: invalid ELF header"),
    (BROKEN_MATH, "torch is broken: torch 9.9.9+broken: writing 5 into a zero CPU tensor gives a sum of 0"),
])
def test_check_reproduce_with_a_broken_torch_is_skipped(tmp_path, monkeypatch, source, needle):
    from typer.testing import CliRunner

    from validate_batch.cli.main import app

    runner = CliRunner()
    plain = runner.invoke(app, ["check", "--example", "pd-decode-slot-96", "--json"])
    assert plain.exception is None or isinstance(plain.exception, SystemExit)
    monkeypatch.syspath_prepend(str(fake_torch(tmp_path, source)))
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    r = runner.invoke(app, ["check", "--example", "pd-decode-slot-96", "--reproduce", "--json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert r.exit_code == plain.exit_code
    d = json.loads(r.stdout)
    assert d["legal"] == json.loads(plain.stdout)["legal"]
    assert len(d["reproduction"]) == 1 and d["reproduction"][0]["available"] is False
    assert d["reproduction"][0]["reason"].startswith(needle)
    r = runner.invoke(app, ["check", "--example", "pd-decode-slot-96", "--reproduce"])
    assert r.exit_code == plain.exit_code and f"reproduction: skipped - {needle}" in r.stdout
