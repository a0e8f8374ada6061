"""Streaming a log: bounded memory whatever its size, every line counted, errors located per rank."""
from __future__ import annotations

import gzip
import tracemalloc

import pytest

from validate_batch.errors import InputError
from validate_batch.ingest.crash_lines import classify_error
from validate_batch.ingest.scan import MAX_LINE, scan_file, scan_lines


def _write_log(path, n_lines: int) -> None:
    with open(path, "w") as f:
        for i in range(n_lines):
            dp, k = i % 4, i % 4
            if k == 0:
                f.write(f"[2026-05-09 14:20:41 DP{dp} TP{dp}] Prefill batch, #new-seq: 1, #new-token: {i % 9000 + 1}, "
                        f"#cached-token: 0, token usage: 0.01, #running-req: 4, #queue-req: 0, #pending-token: {i}, "
                        "cuda graph: False, input throughput (token/s): 9120.55\n")
            elif k == 1:
                f.write(f"[2026-05-09 14:20:43 DP{dp} TP{dp}] Decode batch, #running-req: {i % 50 + 1}, #token: 30110, "
                        "token usage: 0.01, cuda graph: True, gen throughput (token/s): 480.31, #queue-req: 0\n")
            elif k == 2:
                f.write(f"[2026-05-09 14:20:43 DP{dp} TP{dp}] Prefill batch, #new-seq: x{i}, #new-token: 5\n")
            else:
                f.write(f'[2026-05-09 14:20:43] INFO:     10.0.0.7:{i} - "POST /generate HTTP/1.1" 200 OK\n')


def _peak(path) -> tuple[int, object]:
    tracemalloc.start()
    try:
        ev = scan_file(str(path))
        return tracemalloc.get_traced_memory()[1], ev
    finally:
        tracemalloc.stop()


def test_peak_memory_is_bounded_not_proportional(tmp_path):
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    _write_log(small, 5000)
    _write_log(big, 15000)
    size_big = big.stat().st_size
    assert size_big > 2_000_000
    peak_small, _ = _peak(small)
    peak_big, ev = _peak(big)
    # Three times the lines, not three times the memory; and far below the file's size.
    assert peak_big < peak_small * 1.5 + 200_000
    assert peak_big < size_big / 8
    # Nothing was dropped silently: every line is in a counter.
    assert ev.total_lines == 15000 and sum(ev.counts.values()) == 15000
    assert ev.counts["unparsed_batch_line"] == 15000 // 4
    assert all(len(tl.steps) <= 64 for tl in ev.ranks.values())
    assert sum(tl.num_prefill for tl in ev.ranks.values()) == 15000 // 4


def test_over_long_line_is_cut_and_counted(tmp_path):
    p = tmp_path / "long.log"
    with open(p, "w") as f:
        f.write("[2026-01-01 00:00:00] " + "x" * (3 * MAX_LINE) + "\n")
        f.write("[2026-01-01 00:00:01 TP0] Decode batch, #running-req: 3, #token: 9, token usage: 0.00, #queue-req: 0\n")
    ev = scan_file(str(p))
    assert ev.truncated_lines == 1 and ev.total_lines == 2
    assert ev.ranks["DP0"].num_decode == 1
    assert any("longer than" in n for n in ev.notes)


def test_gzip_logs_are_read(tmp_path):
    p = tmp_path / "server.log.gz"
    with gzip.open(p, "wt") as f:
        f.write("[2026-01-01 00:00:01 TP0] Decode batch, #running-req: 3, #token: 9, token usage: 0.00, #queue-req: 0\n")
    assert scan_file(str(p)).ranks["DP0"].num_decode == 1


def test_bad_files(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        scan_file(str(tmp_path / "nope.log"))
    (tmp_path / "empty.log").write_text("")
    with pytest.raises(InputError, match="empty"):
        scan_file(str(tmp_path / "empty.log"))
    (tmp_path / "dump.pkl").write_bytes(b"\x80\x04N.")
    with pytest.raises(InputError, match="--dump"):
        scan_file(str(tmp_path / "dump.pkl"))


@pytest.mark.parametrize("line,kind,numbers", [
    ("CUDA error (/x/FlashMLA/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:111): invalid argument",
     "flashmla_sched", {"file": "get_decoding_sched_meta.cu", "source_line": 111, "message": "invalid argument"}),
    ("CUDA error (/x/csrc/smxx/decode/combine/combine.cu:197): an illegal memory access was encountered",
     "flashmla_combine", {"file": "combine.cu", "source_line": 197}),
    ("CUDA error (/x/FlashMLA/csrc/sm90/get_mla_metadata.cu:93): invalid argument", "flashmla_sched", {"source_line": 93}),
    ("IndexError: index 32 is out of bounds for dimension 0 with size 32", "index_oob", {"index": 32, "size": 32, "dim": 0}),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "illegal_memory_access", {}),
    ("RuntimeError: CUDA error: device-side assert triggered", "device_assert", {}),
    ("/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [5,0,0] "
     "Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.", "device_assert", {}),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", "oom", {"allocation": "20.00 GiB"}),
    ("Fatal Python error: Segmentation fault", "segfault", {}),
    ("AssertionError: tail_k.shape[1] == index_kpool + tail_extra_slots", "python_error", {"exception": "AssertionError"}),
    ("[2026-01-01 00:00:00 DP0 TP0] Scheduler hit an exception: Traceback (most recent call last):", "scheduler_exception", {}),
    ("Traceback (most recent call last):", "traceback", {}),
    ("[2026-01-01 00:00:00] Received sigquit from a child process. It usually means the child failed.", "process_exit", {}),
])
def test_error_lines(line, kind, numbers):
    got = classify_error(line)
    assert got is not None and got[0] == kind
    for k, v in numbers.items():
        assert got[1][k] == v


@pytest.mark.parametrize("line", ["[2026-01-01 00:00:00] INFO: 127.0.0.1 - POST /generate 200 OK",
                                  "  File \"/sgl/scheduler.py\", line 10, in run", "Load weight end. mem usage=70.11 GB."])
def test_ordinary_lines_are_not_errors(line):
    assert classify_error(line) is None


def test_root_error_is_the_most_specific_first_one_and_ranks_come_from_prefixes():
    ev = scan_lines([
        "[2026-01-01 00:00:00 DP1 TP1] Decode batch, #running-req: 3, #token: 9, token usage: 0.00, #queue-req: 0",
        "[2026-01-01 00:00:01 DP1 TP1] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "IndexError: index 40 is out of bounds for dimension 0 with size 33",
        "[2026-01-01 00:00:02 DP0 TP0] Decode batch, #running-req: 3, #token: 9, token usage: 0.00, #queue-req: 0",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "CUDA error (/x/get_decoding_sched_meta.cu:111): invalid argument",
    ])
    root = ev.root_error()
    assert root.kind == "flashmla_sched" and root.rank is None   # the kernel library prints without a prefix
    idx = next(e for e in ev.errors if e.kind == "index_oob")
    assert idx.rank == "DP1" and idx.rank_inferred                 # inside DP1's traceback
    ima = next(e for e in ev.errors if e.kind == "illegal_memory_access")
    assert ima.rank is None                                        # a later prefixed line ended the traceback


def test_errors_the_server_survived_are_not_the_cause_and_late_errors_are_kept():
    step = "[2026-01-01 00:00:{:02d} TP0] Decode batch, #running-req: 3, #token: 9, token usage: 0.00, #queue-req: 0"
    lines = ["IndexError: index 5 is out of bounds for dimension 0 with size 5"]           # survived: steps follow
    lines += ["RuntimeError: something recoverable"] * 500                                # more than the error cap
    lines += [step.format(1), step.format(2)]
    lines += ["CUDA error (/x/get_decoding_sched_meta.cu:111): invalid argument"]
    ev = scan_lines(lines)
    root = ev.root_error()
    assert root.kind == "flashmla_sched" and root.line_no == len(lines)
    assert ev.error_counts["python_error"] == 500 and len(ev.errors) <= 200
