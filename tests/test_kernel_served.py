"""Long-lived kernel-mode children (``worker --serve``): the same outcomes as one child per call,
children reused across calls, replaced after any outcome that can poison a CUDA context, and calls
predicted to be fatal sent to a child of their own.

Stand-in: a backend written here (no GPU) whose jobs say what to do: return, raise, raise a CUDA
error, exit the process, kill it with a signal, or hang. It reports its process id, so the tests can
see which child served which call. The real torch backend runs the same protocol on the H200 host.
"""
from __future__ import annotations

import textwrap

import pytest

from validate_batch.kernel_mode.runner import ChildSpec, poisons, run_job, run_jobs, run_jobs_served

BACKEND = textwrap.dedent('''
    import os, signal, time

    def run(job, stage, partial):
        do = job["do"]
        stage("call")
        if do == "raise":
            raise ValueError("bad shape")
        if do == "raise-cuda":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if do == "exit":
            print("CUDA error (x.cu:7): invalid argument", flush=True)
            os._exit(1)
        if do == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if do == "hang":
            time.sleep(60)
        return {"message": "OK 1 1", "pid": os.getpid()}
''')


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    path = tmp_path_factory.mktemp("served") / "backend.py"
    path.write_text(BACKEND)
    return ChildSpec(backend=str(path))


JOBS = [{"do": d} for d in ("ok", "ok", "raise", "ok", "raise-cuda", "ok", "exit", "ok", "segv", "ok")]


def _shape(r):
    return (r.outcome, r.exit_code, r.signal, r.message.split(" in ")[0] if r.outcome != "ok" else "")


def test_served_children_give_the_outcomes_of_one_child_per_call(child):
    fresh = run_jobs(JOBS, 30, child)
    served = run_jobs_served(JOBS, 30, child)
    assert [_shape(r) for r in served] == [_shape(r) for r in fresh]
    assert [r.outcome for r in served] == ["ok", "ok", "python_exception", "ok", "illegal_memory_access", "ok",
                                           "process_exit", "ok", "process_crash", "ok"]


def test_a_child_serves_calls_until_an_outcome_that_may_poison_it(child):
    served = run_jobs_served(JOBS, 30, child)
    pid = [r.payload.get("pid") for r in served]
    assert pid[0] == pid[1] == pid[3]              # a plain Python exception keeps the child
    assert pid[5] != pid[3]                        # an illegal memory access raised as an exception retires it
    assert pid[7] != pid[5] and pid[9] != pid[7]   # so do a process exit and a signal
    assert len({p for p in pid if p}) == 4


def test_calls_predicted_fatal_run_alone(child):
    served = run_jobs_served([{"do": "ok"}, {"do": "ok"}, {"do": "ok"}], 30, child, alone=lambda i: i == 1)
    pid = [r.payload["pid"] for r in served]
    assert pid[0] == pid[2] != pid[1]


def test_a_hung_call_times_out_and_the_next_gets_a_fresh_child(child):
    served = run_jobs_served([{"do": "ok"}, {"do": "hang"}, {"do": "ok"}], 3, child)
    assert [r.outcome for r in served] == ["ok", "timeout", "ok"]
    assert served[0].payload["pid"] != served[2].payload["pid"]


def test_parallel_served_children_keep_input_order(child):
    jobs = [{"do": "ok"}] * 12 + [{"do": "exit"}] + [{"do": "ok"}] * 3
    served = run_jobs_served(jobs, 30, child, max_parallel=3)
    assert [r.outcome for r in served] == ["ok"] * 12 + ["process_exit"] + ["ok"] * 3
    assert len({r.payload.get("pid") for r in served if r.is_ok}) <= 4      # 3 slots, one replaced


def test_what_retires_a_child():
    from validate_batch.kernel_mode.outcome import RunResult
    assert not poisons(RunResult("ok")) and not poisons(RunResult("python_exception", "RuntimeError: bad shape"))
    assert poisons(RunResult("python_exception", "RuntimeError: CUDA error: invalid argument"))
    for o in ("process_exit", "process_crash", "illegal_memory_access", "device_assert", "timeout", "malformed"):
        assert poisons(RunResult(o))
