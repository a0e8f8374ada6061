"""Loads the data files of the ``rules`` package (GPU profiles, kernel generations, engine profiles)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import import_module
from typing import Any, Mapping

from ..errors import InputError
from .fields import int_field
from .limits import echo


#: the package the data files ship in (the repository's ``rules/``, installed inside this package)
DATA_PACKAGE = __name__.rsplit(".", 2)[0] + ".rules"


@lru_cache(maxsize=1)
def data_dir() -> str | None:
    """The folder of the data package when it is one on disk (an installed wheel, a checkout); None
    when the package lives elsewhere (a zip), where :func:`data_text` reads through importlib.resources."""
    init = getattr(import_module(DATA_PACKAGE), "__file__", None)
    if init is None:
        return None
    folder = os.path.dirname(init)
    return folder if os.path.isdir(folder) else None


def data_text(*parts: str) -> str:
    """The text of the data file ``rules/<parts...>`` shipped in the package."""
    folder = data_dir()
    if folder is not None:
        with open(os.path.join(folder, *parts), encoding="utf-8") as f:
            return f.read()
    from importlib import resources     # (only off a plain folder: it loads tempfile and more)

    return resources.files(DATA_PACKAGE).joinpath(*parts).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """Return the parsed JSON data file ``rules/<name>.json``."""
    return json.loads(data_text(f"{name}.json"))


@dataclass(frozen=True)
class GPU:
    """The device facts the kernel model needs."""

    name: str
    num_sms: int
    cc: tuple[int, int]
    smem_optin: int
    source: str = ""
    memory_bytes: int | None = None

    @property
    def arch(self) -> int:
        """Compute-capability major version (9 for Hopper, 10 for Blackwell)."""
        return self.cc[0]

    def to_dict(self) -> dict:
        return {"name": self.name, "num_sms": self.num_sms, "cc": list(self.cc), "smem_optin": self.smem_optin}


def grid_limits() -> dict:
    """CUDA's largest launch grid per axis (``x``, ``y``, ``z``), from ``rules/gpus.json``."""
    return load("gpus")["grid_limits"]


def gpu_names() -> list[str]:
    return list(load("gpus")["gpus"])


def _norm(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())


@lru_cache(maxsize=256)       # keyed by what users type: bounded
def gpu_by_name(name: str) -> GPU:
    """Look a GPU profile up by name or alias (case and punctuation are ignored)."""
    table = load("gpus")["gpus"]
    want = _norm(name)
    for key, rec in table.items():
        if want in {_norm(key), *(_norm(a) for a in rec.get("aliases", []))}:
            return GPU(key, rec["num_sms"], tuple(rec["cc"]), rec["smem_optin"], rec.get("source", ""),
                       rec.get("memory_bytes"))
    raise InputError("gpu", f"unknown GPU {echo(name)}; known: {', '.join(table)} (or give num_sms, cc and smem_optin)")


def gpu_from_fields(d: Mapping[str, Any], field: str = "gpu") -> GPU:
    """Build a GPU from raw numbers: ``num_sms``, ``cc`` ([major, minor] or "9.0") and ``smem_optin``."""
    num_sms = int_field(d, "num_sms", field, 1, 4096)
    smem = int_field(d, "smem_optin", field, 1, 16 * 1024 * 1024)
    if "cc" not in d:
        raise InputError(f"{field}.cc", "missing (compute capability, e.g. [9, 0] or \"9.0\")")
    cc = d["cc"]
    if isinstance(cc, str):
        try:
            major, minor = (int(x) for x in cc.split("."))
        except ValueError:
            raise InputError(f"{field}.cc", f"expected \"MAJOR.MINOR\", got {echo(cc)}") from None
    elif isinstance(cc, (list, tuple)) and len(cc) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in cc):
        major, minor = cc
    else:
        raise InputError(f"{field}.cc", f"expected [major, minor], got {echo(cc)}")
    if not (1 <= major <= 99 and 0 <= minor <= 9):
        # CUDA's compute capabilities are 1.0 and up, with one-digit minor versions (8.9, 12.1)
        raise InputError(f"{field}.cc", f"expected a compute capability from 1.0 up (minor 0-9), got {echo(cc)}")
    name = d.get("device") or d.get("name") or f"custom-sm{major}{minor}"
    if not isinstance(name, str):
        raise InputError(f"{field}.name", f"expected a string, got {echo(name)}")
    mem = d.get("memory_bytes")
    if mem is not None and (isinstance(mem, bool) or not isinstance(mem, int) or mem <= 0):
        raise InputError(f"{field}.memory_bytes", f"expected a positive integer, got {echo(mem)}")
    return GPU(name, num_sms, (major, minor), smem, "given by the user", mem)


def resolve_gpu(spec: Any) -> GPU:
    """Accept a GPU, a profile name, or a mapping of raw numbers (optionally with ``name``)."""
    if isinstance(spec, GPU):
        return spec
    if isinstance(spec, str):
        if "=" in spec:  # "num_sms=132,cc=9.0,smem_optin=232448" from the command line
            fields: dict[str, Any] = {}
            for part in spec.split(","):
                k, _, v = part.partition("=")
                k = k.strip()
                fields[k] = v.strip() if k in ("cc", "name") else _parse_int(v, f"gpu.{k}")
            return gpu_from_fields(fields)
        return gpu_by_name(spec)
    if isinstance(spec, Mapping):
        if set(spec) <= {"name", "device"} and (spec.get("name") or spec.get("device")):
            return gpu_by_name(spec.get("name") or spec.get("device"))
        return gpu_from_fields(spec)
    raise InputError("gpu", f"expected a GPU name or {{num_sms, cc, smem_optin}}, got {echo(spec)}")


def _parse_int(v: str, field: str) -> int:
    try:
        return int(v.strip())
    except ValueError:
        raise InputError(field, f"expected an integer, got {echo(v.strip())}") from None


def build_names() -> list[str]:
    """The FlashMLA builds the tool knows by name (``rules/flashmla.json``'s ``builds``)."""
    return [k for k in load("flashmla")["builds"] if not k.startswith("_")]


def build_record(name: str | None = None) -> dict:
    """One build: ``{"name", "kernels": {selector: generation}, ...}``. A generation's own name is a
    build of that generation alone."""
    data = load("flashmla")
    if name is not None and not isinstance(name, str):
        raise InputError("kernel", f"expected a FlashMLA build name, got {type(name).__name__}")
    key = name or data["default"]
    builds = data["builds"]
    if key in builds and not key.startswith("_"):
        return {"name": key, **builds[key]}
    if key in data["generations"]:
        return {"name": key, "kernels": {"*": key}}
    raise InputError("kernel", f"unknown FlashMLA build {echo(key)}; known: {', '.join(build_names())}")


def generation_name(name: str | None, path: str | None = None, use_legacy: bool | None = None,
                    arch: int | None = None) -> str:
    """The generation that runs a call of ``path`` (sparse, dense, dense_fp8, prefill) with this
    ``use_legacy`` on build ``name``: by ``use_legacy`` where the build has both halves (its default
    when None), else by path, else the build's ``*``."""
    b = build_record(name)
    kernels = b["kernels"]
    if path == "prefill" and path not in kernels:
        path = "sparse"             # flash_mla_sparse_fwd ships with the sparse decode kernels
    if path is not None and path in kernels:
        k = kernels[path]
        if isinstance(k, dict):             # by compute-capability major
            if arch is None:
                return next(iter(k.values()))
            if str(arch) not in k:
                raise InputError("kernel", f"build {b['name']} has no {path} kernels for SM{arch}0 (it has: "
                                           f"{', '.join('SM' + a + '0' for a in k)})")
            return k[str(arch)]
        return k
    if "legacy" in kernels:
        legacy = b.get("use_legacy_default", True) if use_legacy is None else use_legacy
        return kernels["legacy" if legacy else "current"]
    if "*" in kernels:
        return kernels["*"]
    if path is None:            # the build's first kernel stands for it
        first = next(iter(kernels.values()))
        return next(iter(first.values())) if isinstance(first, dict) else first
    raise InputError("kernel", f"build {b['name']} has no kernel for {path} calls (it has: {', '.join(kernels)})")


@lru_cache(maxsize=256)
def generation(name: str | None = None, path: str | None = None, use_legacy: bool | None = None,
               arch: int | None = None) -> dict:
    """The FlashMLA generation a call runs on build ``name`` (see :func:`generation_name`): its
    ``shared`` facts, then its own keys (which replace shared ones of the same name), with ``name``
    (the generation) and ``build``. ``kv_layouts`` is keyed by ``d_qk`` as an int."""
    data = load("flashmla")
    b = build_record(name)
    key = generation_name(b["name"], path, use_legacy, arch)
    if key not in data["generations"]:
        raise InputError("kernel", f"build {b['name']} names an unknown generation {echo(key)}")
    shared = {k: v for k, v in data.get("shared", {}).items() if not k.startswith("_")}
    gen = {"name": key, "build": b["name"], **shared, **data["generations"][key]}
    # what this build has differently from the generation (one sglang-kernel release's combine kernel)
    for k, v in b.get("generation_overrides", {}).get(key, {}).items():
        gen[k] = {**gen[k], **v} if isinstance(v, dict) and isinstance(gen.get(k), dict) else v
    if "kv_layouts" in gen:
        gen["kv_layouts"] = {int(d): rec for d, rec in gen["kv_layouts"].items()}
    return gen


def path_archs(gen: Mapping[str, Any], path: str) -> frozenset:
    """Compute-capability majors with at least one implementation of ``path`` in ``gen``."""
    return frozenset(row["arch"] for row in gen["implementations"] if row["path"] == path)


@lru_cache(maxsize=None)
def decode_archs() -> tuple[int, ...]:
    """Compute-capability majors with a decode implementation in any generation, ascending."""
    data = load("flashmla")
    return tuple(sorted({row["arch"] for g in data["generations"] for row in data["generations"][g]["implementations"]}))


def sm_name(arch: int) -> str:
    """``SM90`` for compute-capability major 9 (the minor version written as 0)."""
    return f"SM{arch}0"


def sm_list(archs) -> str:
    """``SM90 or SM100``: the architectures in ascending order."""
    return " or ".join(sm_name(a) for a in sorted(archs))

