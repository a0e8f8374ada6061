"""What the kernel-mode tests of FlashInfer and DeepGEMM share: a stand-in child backend that answers
each job with what an H200 recorded for the same inputs (the payload, or the error the call raised),
so that the real child processes, protocol and judging run without a GPU.

It stands in for the library only: the parent's planning, the children and the comparison are the
project's own. ``STANDIN_PAIRS`` names the recordings (``[inputs file, kernel-check record]`` pairs);
``STANDIN_VERSION`` is the library version the child reports; ``STANDIN_BUMP_WORK`` (FlashInfer) moves
one planned value of the call with that many ``qo_indptr`` entries, to see a difference caught.
"""
from __future__ import annotations

import json
from pathlib import Path

from validate_batch.kernel_mode.runner import ChildSpec

STANDIN = r'''
"""Answers FlashInfer and DeepGEMM jobs with what an H200 recorded for the same inputs."""
import gzip
import json
import os

_REC = {}


def _key(rec):
    return json.dumps([rec.get("qo_indptr"), rec.get("kv_indptr"), rec.get("kv_len"), rec.get("h_q"),
                       rec.get("entry", "wrapper"), rec.get("batch"), rec.get("next_n", 1), rec.get("context_len"),
                       rec.get("context_lens")])


def _lines(path):
    data = open(path, "rb").read()
    return (gzip.decompress(data) if path.endswith(".gz") else data).decode().splitlines()


def _load():
    if not _REC:
        for inputs, record in json.loads(os.environ["STANDIN_PAIRS"]):
            rec = json.loads(gzip.decompress(open(record, "rb").read()))
            for i, c in zip([json.loads(x) for x in _lines(inputs) if x.strip()], rec["calls"]):
                _REC[_key(i)] = c["kernel"]
    return _REC


def run(job, stage, partial):
    if job["op"] == "lib_detect":
        return {"torch": "stand-in", "cuda_available": True, "version": os.environ["STANDIN_VERSION"],
                "device": {"name": "NVIDIA H200", "cc": [9, 0], "num_sms": 132, "smem_optin": 232448}}
    k = _load()[_key(job["record"])]
    stage("call")
    if k["outcome"] != "ok":            # the error the call raised, as it raised it
        raise RuntimeError(k["message"])
    out = dict(k["payload"])
    bump = os.environ.get("STANDIN_BUMP_WORK")
    if bump and job["record"].get("qo_indptr") and len(job["record"]["qo_indptr"]) == int(bump):
        out["arrays"] = dict(out["arrays"])
        out["arrays"]["kv_end"] = [out["arrays"]["kv_end"][0] + 1] + out["arrays"]["kv_end"][1:]
    return out
'''


def write_standin(folder: Path) -> str:
    """The stand-in backend written to ``folder``; its path."""
    p = Path(folder) / "library_standin_backend.py"
    p.write_text(STANDIN)
    return str(p)


def standin_spec(backend: str, version: str, pairs, **extra) -> ChildSpec:
    """A child that runs the stand-in ``backend`` answering from ``pairs`` (``(inputs, record)`` paths)."""
    env = {"STANDIN_VERSION": version, "STANDIN_PAIRS": json.dumps([[str(i), str(r)] for i, r in pairs]),
           **{k: str(v) for k, v in extra.items()}}
    return ChildSpec(backend=backend, env=tuple(env.items()))
