"""Which FlashMLA build is installed, by the names of ``rules/flashmla.json``, from package metadata.

Nothing here imports torch or FlashMLA: the facts come from ``importlib.metadata`` (distribution
name and version) and from the installed files (``importlib.util.find_spec`` on a top-level package,
which imports nothing).

Distributions and the builds they carry:

* ``sgl-flash-mla`` (PyPI; imports as ``flash_mla``, every entry point takes ``use_legacy``):
  ``use_legacy=True`` (the default of SGLang's wrapper, and the only one that runs on SM90) is the
  fork's legacy kernels, ``sgl-flash-mla-<version>``; ``use_legacy=False`` is upstream's current
  kernels, ``flashmla-2026.09.30``;
* ``flash_mla`` / ``flash-mla`` (upstream built from source): told apart by its Python API, then by a
  commit in the version's local part (``1.0.0+9241ae3``): the 2026.09.30 release takes
  ``enable_batch_invariant``; the current ``sched_meta`` API is ``flashmla-9241ae3``; the Oct-2025
  ``tensors`` API is ``flashmla-1408756``;
* ``sgl-kernel`` / ``sglang-kernel`` (module ``sgl_kernel.flash_mla``): ``sglang-kernel-<version>`` for
  a version read from its binary (rules/flashmla.json), else ``sgl-kernel-flashmla``;
* ``vllm``: its bundled copy, the extension ``vllm/_flashmla_C*.so``, found by its file (vLLM's
  metadata does not list it separately): ``vllm-<major>.<minor>``. Kernel mode lists it but does not
  drive it.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from ..facts.knowledge import build_names

# distribution -> (provider, module kernel mode imports)
DISTRIBUTIONS = {
    "sgl-flash-mla": ("flash_mla", "flash_mla"),
    "flash-mla": ("flash_mla", "flash_mla"),
    "flash_mla": ("flash_mla", "flash_mla"),
    "sgl-kernel": ("sgl_kernel", "sgl_kernel.flash_mla"),
    "sglang-kernel": ("sgl_kernel", "sgl_kernel.flash_mla"),
    "vllm": ("vllm", "vllm._flashmla_C"),
}
# Upstream commits that name a build when they appear in an upstream version string.
UPSTREAM_COMMITS = {"1408756": "flashmla-1408756", "9241ae3": "flashmla-9241ae3"}
# The build of each API of an upstream flash_mla (when nothing more specific is known).
API_GENERATION = {"sched_meta": "flashmla-9241ae3", "tensors": "flashmla-1408756"}
CURRENT_UPSTREAM = "flashmla-2026.09.30"
SGL_KERNEL_BUILD = "sgl-kernel-flashmla"
# Parameters whose presence names an upstream release (signature, not version string).
CURRENT_ONLY_PARAM = "enable_batch_invariant"
LEGACY_PARAM = "use_legacy"

INSTALL_HINTS = {
    "sgl-flash-mla": "pip install 'sgl-flash-mla==1.0.0' 'torch>=2.14.1' (a CUDA torch; what the [kernel] extra "
                     "adds: from a checkout of validate-batch, pip install '.[kernel]'), or next to an existing "
                     "CUDA torch: pip install --no-deps sgl-flash-mla==1.0.0",
    "flash-mla": "build upstream https://github.com/deepseek-ai/FlashMLA for your GPU (on Hopper: "
                 "FLASH_MLA_DISABLE_SM100=1 pip install --no-build-isolation .)",
    "sgl-kernel": "pip install sgl-kernel (SGLang's kernel wheel; FlashMLA is sgl_kernel.flash_mla)",
    "torch": "pip install torch (a CUDA build on the GPU host; for CPU reproductions the CPU build: "
             "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu)",
}


@dataclass(frozen=True)
class Dist:
    """One installed distribution: its name as installed, version and where it lives."""

    name: str
    version: str
    location: str = ""


def lookup_distribution(name: str) -> Dist | None:
    """The installed distribution ``name`` (metadata only), or None."""
    try:
        d = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - broken metadata is "not installed" for this purpose
        return None
    try:
        loc = str(d.locate_file(""))
    except Exception:  # noqa: BLE001
        loc = ""
    return Dist(d.metadata.get("Name") or name, d.version or "", loc)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def package_dir(top: str) -> Path | None:
    """The folder of top-level package ``top`` without importing it."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locs = list(spec.submodule_search_locations or [])
    if locs:
        return Path(locs[0])
    return Path(spec.origin).parent if spec.origin else None


def installed_distributions() -> list[Dist]:
    """The FlashMLA-carrying distributions that are installed, one per canonical name."""
    seen, out = set(), []
    for name in DISTRIBUTIONS:
        d = lookup_distribution(name)
        if d is None or canonical(d.name) in seen:
            continue
        seen.add(canonical(d.name))
        out.append(d)
    return out


def distribution_of(provider: str, dists: list[Dist] | None = None) -> Dist | None:
    """The installed distribution that carries ``provider`` (``flash_mla``: the fork before upstream)."""
    dists = installed_distributions() if dists is None else dists
    by = {canonical(d.name): d for d in dists}
    for name, (prov, _module) in DISTRIBUTIONS.items():
        if prov == provider and canonical(name) in by:
            return by[canonical(name)]
    return None


def _commit_in(version: str) -> str | None:
    local = version.split("+", 1)[1] if "+" in version else ""
    for commit, build in UPSTREAM_COMMITS.items():
        if local.startswith(commit) or commit in local.split("."):
            return build
    return None


def build_name(provider: str, dist: Dist | None, api: str | None, params: frozenset | set = frozenset(),
               use_legacy: bool | None = None) -> str | None:
    """The build name (``rules/flashmla.json``) of a provider, for a call with ``use_legacy``.

    ``params``: names of ``flash_mla_with_kvcache``'s parameters, when known. ``use_legacy`` None is
    the build's default (True for a build that takes it, as SGLang's wrapper passes).
    """
    dname = canonical(dist.name) if dist else ""
    if provider == "sgl_kernel" or dname in ("sgl-kernel", "sglang-kernel"):
        if dist is not None:
            known = f"sglang-kernel-{dist.version.split('+')[0]}"
            if known in build_names():
                return known
        return SGL_KERNEL_BUILD
    if provider == "vllm" or dname == "vllm":
        m = re.match(r"(\d+)\.(\d+)", dist.version if dist else "")
        return f"vllm-{m.group(1)}.{m.group(2)}" if m else "vllm"
    if dname == "sgl-flash-mla" or LEGACY_PARAM in params:
        if use_legacy is False:
            return CURRENT_UPSTREAM
        version = dist.version if dist and dname == "sgl-flash-mla" else ""
        return f"sgl-flash-mla-{version.split('+')[0]}" if version else "sgl-flash-mla"
    if CURRENT_ONLY_PARAM in params:
        return CURRENT_UPSTREAM
    by_commit = _commit_in(dist.version) if dist else None
    if by_commit:
        return by_commit
    return API_GENERATION.get(api or "")


def vllm_flashmla_files(dist: Dist | None = None) -> list[str]:
    """vLLM's bundled FlashMLA extension files (``vllm/_flashmla_C*.so``), found without importing vLLM."""
    pkg = package_dir("vllm")
    if pkg is None or not pkg.is_dir():
        return []
    return sorted(str(p) for p in pkg.glob("_flashmla*C*.so"))
