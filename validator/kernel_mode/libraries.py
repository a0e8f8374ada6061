"""Kernel mode for the two libraries beside FlashMLA: FlashInfer's MLA ``plan()`` and DeepGEMM's paged
MQA-logits metadata, each through its real Python entry, in child processes.

Where each library is found (nothing imported here):

* FlashInfer: the folder named by :data:`FLASHINFER_ENV` (``--flashinfer DIR``: a folder holding
  ``flashinfer/``, as ``unzip`` of the wheel writes it, its ``flashinfer_python-*.dist-info`` beside it),
  else the installed ``flashinfer`` package (distribution ``flashinfer-python``). The version names the
  model's facts (``rules/flashinfer.json``: ``flashinfer-python-<version>``).
* DeepGEMM: the folder named by :data:`DEEPGEMM_ENV` (``--deep-gemm DIR``: a folder holding
  ``deep_gemm/``, the ``deep_gemm`` folder itself, or an extracted vLLM wheel holding
  ``vllm/third_party/deep_gemm``), else an installed ``deep_gemm`` package, else the copy inside an
  installed vLLM. Its ``__version__`` names the model's facts (``deep_gemm_version`` of each version of
  ``rules/deepgemm.json``; a copy inside vLLM by ``vendored_by``).

Per call, the child runs the library and reports what it did: for FlashInfer the 18 numbers ``plan()``
returns and every planned integer array read back from the GPU (compared with
:func:`validate_batch.flashinfer.mla_schedule.mla_schedule`, value for value), then the attention itself
with outputs pre-filled by a value attention cannot produce, so that rows the kernel never writes are
seen (rule FI003's silent class); for DeepGEMM the metadata tensor's shape and ends. Agreement is judged
as for FlashMLA (:mod:`.check`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from ..deepgemm.calls import DEFAULT_CONTEXT_LEN, DeepGemmPlan
from ..deepgemm.calls import plan as dg_plan
from ..deepgemm.schedule import atoms_for, mqa_metadata
from ..errors import InputError
from ..facts.knowledge import load
from ..flashinfer.calls import FlashInferPlan, MlaPlanCall
from ..flashinfer.calls import plan as fi_plan
from ..flashinfer.mla_schedule import MERGE, PER_WORK, mla_schedule
from .agreement import compare_call, gpu_from_device, run_judged, summarize
from .builds import lookup_distribution, package_dir
from .vllm_bundle import dist_info_version
from .runner import ChildSpec, run_job

FLASHINFER = "flashinfer"
DEEPGEMM = "deep_gemm"
FLASHINFER_ENV = "VALIDATE_BATCH_FLASHINFER"
DEEPGEMM_ENV = "VALIDATE_BATCH_DEEP_GEMM"
ENVS = {FLASHINFER: FLASHINFER_ENV, DEEPGEMM: DEEPGEMM_ENV}
OPTIONS = {FLASHINFER: "--flashinfer", DEEPGEMM: "--deep-gemm"}
#: the entry kernel mode drives, per library (shown as the provider's API)
ENTRIES = {FLASHINFER: "BatchMLAPagedAttentionWrapper.plan/run", DEEPGEMM: "get_paged_mqa_logits_metadata"}
INSTALL_HINTS = {
    FLASHINFER: (f"pip install flashinfer-python (its SM90 MLA module is JIT-compiled on first use: nvcc and the "
                 f"CUDA headers are needed), or unzip a flashinfer-python wheel into DIR and pass --flashinfer DIR "
                 f"(or set {FLASHINFER_ENV}=DIR)"),
    DEEPGEMM: (f"install DeepGEMM (deep_gemm), or extract vLLM's bundled copy (unzip vllm-*.whl "
               f"'vllm/third_party/deep_gemm/*' 'vllm-*.dist-info/METADATA' -d DIR) and pass --deep-gemm DIR "
               f"(or set {DEEPGEMM_ENV}=DIR)"),
}
DIST_NAMES = {FLASHINFER: ("flashinfer-python", "flashinfer"), DEEPGEMM: ("deep-gemm", "deep_gemm", "sgl-deep-gemm")}


@dataclass(frozen=True)
class Library:
    """One library kernel mode can drive: where it is and which model facts its calls are judged by."""

    name: str                 # FLASHINFER | DEEPGEMM
    root: str                 # the folder the child puts first on sys.path ("" = as installed)
    origin: str               # the package folder
    version: str = ""         # the library's own version
    build: str | None = None  # the version key of rules/flashinfer.json or rules/deepgemm.json
    vendored_by: str = ""     # "vllm 0.33.0" for a copy inside vLLM
    note: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "module": self.name, "api": ENTRIES[self.name], "origin": self.origin,
                "root": self.root or None, "version": self.version or None, "build": self.build,
                "vendored_by": self.vendored_by or None, "generation": self.build,
                "generation_note": self.note or None, "features": [], "reason": ""}


def _source_version(pkg: Path) -> str:
    """``__version__ = '...'`` as written in the package's ``__init__.py`` (or its ``version.py``)."""
    for rel in ("__init__.py", "version.py", "_build_meta.py"):
        try:
            text = (pkg / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        if m:
            return m.group(1)
    return ""


def flashinfer_build(version: str) -> tuple[str | None, str]:
    """The ``rules/flashinfer.json`` version a FlashInfer version is judged by, and a note when not itself."""
    data = load("flashinfer")
    key = f"flashinfer-python-{version}"
    if key in data["versions"]:
        return key, ""
    return data["default"], (f"rules/flashinfer.json has no facts for FlashInfer {version or '(version unknown)'}; "
                             f"its calls are compared with {data['default']}")


def _sm90_facts(facts: dict) -> str:
    """A version's SM90 numbers (the schedule, the metadata layouts, the shared-memory bound), without sources."""
    import json

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if not (k == "source" or k.endswith(("_source", "provenance")))}
        return v
    keep = {k: facts.get(k) for k in ("schedule", "metadata", "smem_capacity")}
    return json.dumps(strip(keep), sort_keys=True)


def deepgemm_build(version: str, vendored_by: str = "") -> tuple[str | None, str]:
    """The ``rules/deepgemm.json`` version a DeepGEMM copy is judged by, and a note when not itself."""
    data = load("deepgemm")
    for key, facts in data["versions"].items():
        if facts.get("deep_gemm_version") == version and (facts.get("vendored_by") or "") == (vendored_by or ""):
            return key, ""
    for key, facts in data["versions"].items():
        if vendored_by and facts.get("vendored_by") and vendored_by.startswith(facts["vendored_by"]):
            return key, ""
    same = [key for key, facts in data["versions"].items() if version and facts.get("deep_gemm_version") == version]
    if len(same) == 1:
        return same[0], ""
    if same and len({_sm90_facts(data["versions"][k]) for k in same}) == 1:
        # copies of one version string (vLLM's bundles) whose SM90 facts are the same: any of them judges it
        return same[0], (f"deep_gemm {version} is in more than one vLLM release ({', '.join(same)}), with the "
                         f"same SM90 facts; its calls are compared with {same[0]}")
    return data["default"], (f"rules/deepgemm.json has no facts for deep_gemm {version or '(version unknown)'}"
                             f"{' inside ' + vendored_by if vendored_by else ''}; its calls are compared with "
                             f"{data['default']}")


def _vllm_version(root: Path) -> str:
    v = dist_info_version(root, "vllm")
    if v:
        return v
    dist = lookup_distribution("vllm")
    return dist.version if dist else ""


def _vendored(pkg: Path) -> str:
    """``vllm <version>`` when ``pkg`` is ``.../vllm/third_party/deep_gemm``."""
    if pkg.parent.name == "third_party" and pkg.parent.parent.name == "vllm":
        v = _vllm_version(pkg.parent.parent.parent)
        return f"vllm {v}".strip()
    return ""


def _deepgemm_at(pkg: Path, source: str) -> tuple[Library | None, str]:
    if not (pkg / "__init__.py").is_file():
        return None, f"no deep_gemm package at {pkg} ({source})"
    version = _source_version(pkg)
    vendored = _vendored(pkg)
    build, note = deepgemm_build(version, vendored)
    return Library(DEEPGEMM, str(pkg.parent), str(pkg), version, build, vendored, note), ""


def _given(name: str, folder: str | None) -> tuple[Path | None, str, str]:
    """The folder named by the option (else the environment variable): ``(path, where, why)``; ``path``
    None with ``why`` "" when none is named, with ``why`` when it is not a folder."""
    given = folder or os.environ.get(ENVS[name]) or ""
    if not given:
        return None, "", ""
    path = Path(given).expanduser()
    where = OPTIONS[name] if folder else ENVS[name]
    if not path.is_dir():
        return None, where, f"{given} (from {where}) is not a folder: {INSTALL_HINTS[name]}"
    return path, where, ""


def package_in(name: str, path: Path) -> Path | None:
    """The library's package inside a named folder: the package folder itself, ``DIR/<package>``, or for
    DeepGEMM a copy inside vLLM (``DIR/vllm/third_party/deep_gemm``, ``DIR/third_party/deep_gemm``)."""
    places = [path if path.name == name else None, path / name]
    if name == DEEPGEMM:
        places += [path / "vllm" / "third_party" / name, path / "third_party" / name]
    return next((p for p in places if p is not None and (p / "__init__.py").is_file()), None)


def locate_deep_gemm(folder: str | None = None) -> tuple[Library | None, str]:
    path, where, why = _given(DEEPGEMM, folder)
    if why:
        return None, why
    if path is not None:
        pkg = package_in(DEEPGEMM, path)
        if pkg is None:
            return None, f"no deep_gemm package in {path} (from {where}): {INSTALL_HINTS[DEEPGEMM]}"
        return _deepgemm_at(pkg, where)
    pkg = package_dir("deep_gemm")
    if pkg is not None and pkg.is_dir():
        lib, why = _deepgemm_at(pkg, "installed")
        if lib is not None:
            return Library(lib.name, "", lib.origin, lib.version, lib.build, lib.vendored_by, lib.note), ""
    vpkg = package_dir("vllm")
    if vpkg is not None and (vpkg / "third_party" / "deep_gemm" / "__init__.py").is_file():
        return _deepgemm_at(vpkg / "third_party" / "deep_gemm", "installed vllm")
    return None, f"DeepGEMM is not installed (no deep_gemm package, no copy inside vllm): {INSTALL_HINTS[DEEPGEMM]}"


def locate_flashinfer(folder: str | None = None) -> tuple[Library | None, str]:
    path, where, why = _given(FLASHINFER, folder)
    if why:
        return None, why
    if path is not None:
        pkg = package_in(FLASHINFER, path)
        if pkg is None:
            return None, f"no flashinfer package in {path} (from {where}): {INSTALL_HINTS[FLASHINFER]}"
        version = dist_info_version(pkg.parent, "flashinfer_python") or _source_version(pkg)
        build, note = flashinfer_build(version)
        return Library(FLASHINFER, str(pkg.parent), str(pkg), version, build, note=note), ""
    pkg = package_dir("flashinfer")
    if pkg is None or not pkg.is_dir():
        return None, f"FlashInfer is not installed (no flashinfer package): {INSTALL_HINTS[FLASHINFER]}"
    dist = next((d for d in (lookup_distribution(n) for n in DIST_NAMES[FLASHINFER]) if d is not None), None)
    version = dist.version if dist else _source_version(pkg)
    build, note = flashinfer_build(version)
    return Library(FLASHINFER, "", str(pkg), version, build, note=note), ""


def locate(name: str) -> tuple[Library | None, str]:
    return locate_flashinfer() if name == FLASHINFER else locate_deep_gemm()


def child_env(lib: Library) -> tuple:
    """Environment entries that let a child import the library from its folder."""
    return ((ENVS[lib.name], lib.root),) if lib.root else ()


def add_to_path(name: str, sys_path: list) -> str:
    """In the child: put the library's folder first on ``sys_path``; returns it ("" if none)."""
    root = os.environ.get(ENVS[name], "")
    if not root:
        return ""
    pkg = package_in(name, Path(root))
    root = str(pkg.parent) if pkg is not None else root
    if root not in sys_path:
        sys_path.insert(0, root)
    return root


# ----------------------------------------------------------------------------- which plans, which jobs

def library_of(p: Any) -> str | None:
    """The library kernel mode runs a plan's call with (None: not one of these two)."""
    if isinstance(p, FlashInferPlan) and isinstance(p.call, MlaPlanCall):
        return FLASHINFER
    if isinstance(p, DeepGemmPlan):
        return DEEPGEMM
    return None


def job_for(p: Any, lib: Library) -> dict:
    """The child's job for one plan."""
    if lib.name == FLASHINFER:
        return {"op": "fi_mla_plan", "library": lib.name, "record": p.call.full_record(), "run_attention": True}
    rec = p.call.to_record()
    rec.pop("label", None)
    return {"op": "dg_mqa_metadata", "library": lib.name, "record": rec, "replaced": p.replaced}


def replan(p: Any, lib: Library, device: dict) -> Any:
    """The plan for the library version found and the device measured (their facts, not the request's)."""
    gpu = gpu_from_device(device, p.gpu) if device else p.gpu
    make = fi_plan if lib.name == FLASHINFER else dg_plan
    try:
        return make(p.call, gpu, lib.build)
    except InputError:
        return make(p.call, gpu, None)


# ----------------------------------------------------------------------------- the comparison

def plan_diff(call: MlaPlanCall, num_sm: int, got: dict) -> dict:
    """The model's MLA plan against the one the library made: plan_info and every array, value for value."""
    kv_len = call.kv_len if call.kv_len is not None else None
    if kv_len is None:
        return {"identical": False, "summary": "the call has no kv_len: the model's plan needs it"}
    try:
        m = mla_schedule(call.qo_indptr, call.kv_indptr, kv_len, call.h_q, num_sm, call.causal)
    except (ValueError, ZeroDivisionError, AssertionError) as e:
        return {"identical": False, "summary": f"the model makes no plan ({e}); the library made one"}
    diffs = []
    if list(got.get("plan_info") or []) != m["plan_info"]:
        diffs.append(f"plan_info expected {m['plan_info']}, got {got.get('plan_info')}")
    arrays = got.get("arrays") or {}
    n = m["total_works"]
    for k in ("work_indptr", *PER_WORK, *MERGE):
        want = m["arrays"][k] if k in MERGE or k == "work_indptr" else m["arrays"][k][:n]
        have = list(arrays.get(k) or [])
        have = have[:len(want)] if k in PER_WORK else have
        if have != want:
            i = next((j for j, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
            diffs.append(f"{k}[{i}] expected {want[i] if i < len(want) else '(end)'}, "
                         f"got {have[i] if i < len(have) else '(end)'}")
    return {"identical": not diffs, "total_works": n, "compared": ["plan_info", "work_indptr", *PER_WORK, *MERGE],
            "summary": (f"identical: plan_info and {len(PER_WORK) + len(MERGE) + 1} arrays, {n} work items"
                        if not diffs else "; ".join(diffs[:4]) + (f" (+{len(diffs) - 4} more)" if len(diffs) > 4 else ""))}


def schedule_diff(p: DeepGemmPlan, got: dict) -> dict | None:
    """The model's DeepGEMM schedule metadata against the kernel's (None: the version has no schedule facts)."""
    facts = p.facts.get("schedule")
    if not facts:
        return None
    c = p.call
    lens = list(c.context_lens) if c.context_lens is not None else \
        [got.get("context_len", DEFAULT_CONTEXT_LEN)] * c.batch
    num_sms = int(got.get("num_sms") or p.gpu.num_sms)
    want = mqa_metadata(lens, num_sms, facts["split_kv"], atoms_for(facts, c.next_n))
    have = [list(r) for r in got["metadata"]]
    if want == have:
        return {"identical": True, "summary": f"identical: {len(want)} rows"}
    i = next((j for j, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
    return {"identical": False, "summary": f"row {i} expected {want[i] if i < len(want) else '(end)'}, "
                                           f"got {have[i] if i < len(have) else '(end)'}"}


def compare(index: int, p: Any, run, num_sm: int, keep_output: bool = False) -> dict:
    """One call's line of the result (as :func:`.check.compare_call` writes it for FlashMLA)."""
    entry = compare_call(index, p, run, keep_output)
    got = run.payload if run.is_ok else {}
    if isinstance(p.call, MlaPlanCall) and got.get("plan_info") is not None:
        diff = plan_diff(p.call, num_sm, got)
        if entry["model"]["verdict"] == "legal":
            entry["metadata"] = diff
        else:
            # past a limit the plan's arrays are not defined (an overrun writes into the next array): shown,
            # not counted as a metadata difference
            entry["plan_vs_model"] = diff
    if isinstance(p, DeepGemmPlan) and got.get("metadata") is not None and entry["model"]["verdict"] == "legal":
        entry["metadata"] = schedule_diff(p, got)
    unwritten = got.get("unwritten_requests")
    if unwritten:
        # the call returned, but output rows stayed as they were filled: the silent class
        entry["kernel"]["unwritten_requests"] = unwritten
        predicted = entry["model"]["expected_failures"]
        if "silent_wrong" in predicted or "undefined_behaviour" in predicted:
            entry["agreement"], entry["agreement_reason"] = "agree", None
            entry["failure_class_match"] = True
        else:
            entry["agreement"] = "disagree"
            entry["agreement_reason"] = (f"the library returned but left the output rows of request(s) "
                                         f"{unwritten[:8]} unwritten; the model "
                                         f"{'calls the call legal' if entry['model']['verdict'] == 'legal' else 'predicts ' + ' or '.join(predicted)}")
        entry["kernel_verdict"] = "illegal"
    elif run.is_ok and "silent_wrong" in entry["model"]["expected_failures"] and entry["agreement"] == "disagree" \
            and got.get("output_checked"):
        entry["agreement_reason"] = "the model predicts silent_wrong; the library wrote every output row"
    return entry


def run_library_calls(plans: Sequence[Any], name: str, *, timeout: float, child=None, max_parallel: int = 1,
                      console=None, served: bool = True, keep_output: bool = False) -> dict:
    """Detect the library and a GPU in a child, run every call, compare with the model."""
    child = child or ChildSpec()
    lib = None
    if child.backend is None:
        lib, why = locate(name)
        if lib is None:
            return {"available": False, "library": name, "reason": why}
        child = replace(child, env=tuple(child.env) + child_env(lib))
    else:
        lib = Library(name, "", "(stand-in backend)", "", None)
    det = run_job({"op": "lib_detect", "library": name}, timeout, child)
    if not det.is_ok:
        return {"available": False, "library": name, "reason": f"the detection child failed ({det.outcome}): "
                                                                f"{det.message or det.outcome}"}
    info = det.payload
    if not info.get("cuda_available"):
        return {"available": False, "library": name,
                "reason": info.get("cuda_reason") or "torch sees no CUDA GPU"}
    if info.get("import_error"):
        return {"available": False, "library": name,
                "reason": f"{name} does not import: {info['import_error']}: {INSTALL_HINTS[name]}"}
    if child.backend is not None and info.get("version"):
        build = (flashinfer_build if name == FLASHINFER else deepgemm_build)(info["version"])
        lib = Library(name, "", info.get("origin", ""), info["version"], build[0], note=build[1])
    elif info.get("version") and info["version"] != lib.version:
        lib = replace(lib, version=info["version"])
    device = info.get("device") or {}
    replanned = [replan(p, lib, device) for p in plans]
    jobs = [job_for(p, lib) for p in replanned]
    num_sm = int(device.get("num_sms") or (plans[0].gpu.num_sms if plans else 0))
    if console is not None:
        console.print(f"kernel mode: {name} {lib.version or ''} ({lib.build}) on {device.get('name')}, "
                      f"{num_sm} SMs; {len(jobs)} call(s), timeout {timeout:g} s each", markup=False, highlight=False)
    results, wall = run_judged(replanned, jobs, timeout=timeout, child=child, max_parallel=max_parallel,
                               console=console, served=served)
    entries = [compare(i, p, r, num_sm, keep_output) for i, (p, r) in enumerate(zip(replanned, results))]
    summary = summarize(entries)
    return {"available": True, "library": name, "provider": lib.to_dict(), "device": device,
            "torch": info.get("torch"), "model_generation": lib.build, "model_build": lib.build,
            "model_gpu": plans[0].gpu.to_dict() if plans else None, "gpu_replanned": False, "timeout_s": timeout,
            "calls": entries, "children": "served" if served else "one per call", "wall_s": round(wall, 3),
            "calls_per_s": round(len(jobs) / wall, 2) if wall > 0 else None, "summary": summary,
            "status": summary["status"], "agreement": summary["all_agree"]}
