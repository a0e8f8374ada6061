"""vLLM's bundled FlashMLA as a kernel-mode provider, without vLLM itself.

The vLLM wheel carries FlashMLA as three files: ``vllm/_flashmla_C.abi3.so`` (the decode and
prefill kernels, registered as ``torch.ops._flashmla_C``), ``vllm/_flashmla_extension_C.abi3.so``
(the dense fp8 path, ``torch.ops._flashmla_extension_C``) and
``vllm/third_party/flashmla/flash_mla_interface.py`` (the Python API; it imports only torch and
``vllm._flashmla_C``). Those three load beside a CUDA torch with no other part of vLLM: in a
folder that holds ``vllm/`` without ``vllm/__init__.py``, ``vllm`` is a namespace package.

Where they are found, in order:

* the folder named by ``--vllm-flashmla`` or the environment variable :data:`ENV_VAR`: either the
  folder that holds ``vllm/`` (as ``unzip`` of the wheel writes it) or the ``vllm`` folder itself;
* the installed ``vllm`` package (found with ``importlib.util.find_spec``, nothing imported).

The version comes from a ``vllm-*.dist-info`` folder beside ``vllm/`` when there is one (extract it
with the three files), else from the installed distribution. Nothing here imports torch.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .builds import lookup_distribution, package_dir

ENV_VAR = "VALIDATE_BATCH_VLLM_FLASHMLA"
PROVIDER = "vllm"
INTERFACE_MODULE = "vllm.third_party.flashmla.flash_mla_interface"
INTERFACE_FILE = "third_party/flashmla/flash_mla_interface.py"
KERNELS_GLOB = "_flashmla_C*.so"
EXTENSION_GLOB = "_flashmla_extension_C*.so"
EXTENSION_OPS = "_flashmla_extension_C"        # torch.ops namespace of the dense fp8 extension
WHEEL_FILES = ("vllm/_flashmla_C.abi3.so", "vllm/_flashmla_extension_C.abi3.so",
               f"vllm/{INTERFACE_FILE}", "vllm-*.dist-info/METADATA")
INSTALL_HINT = (f"install vllm, or extract its bundled FlashMLA from the wheel (unzip vllm-*.whl "
                f"{' '.join(repr(f) for f in WHEEL_FILES)} -d DIR) and pass --vllm-flashmla DIR "
                f"(or set {ENV_VAR}=DIR)")


@dataclass(frozen=True)
class Bundle:
    """Where vLLM's FlashMLA files are: ``root`` holds ``vllm/``; ``version`` of the wheel if known."""

    root: str
    kernels: str
    extension: str
    interface: str
    version: str = ""
    source: str = ""          # "option" (a folder given) or "installed"

    @property
    def package(self) -> Path:
        return Path(self.root) / "vllm"


def _one(folder: Path, pattern: str) -> str:
    found = sorted(folder.glob(pattern))
    return str(found[0]) if found else ""


def dist_info_version(root: Path, prefix: str = "vllm") -> str:
    """The version in ``root/<prefix>-*.dist-info/METADATA`` (``Version:`` line), or ""."""
    for meta in sorted(root.glob(f"{prefix}-*.dist-info/METADATA")):
        try:
            text = meta.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        m = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
        if m:
            return m.group(1)
    return ""


def _from_package(pkg: Path, source: str) -> tuple[Bundle | None, str]:
    missing = []
    kernels, extension = _one(pkg, KERNELS_GLOB), _one(pkg, EXTENSION_GLOB)
    interface = pkg / INTERFACE_FILE
    if not kernels:
        missing.append(f"{pkg}/{KERNELS_GLOB}")
    if not extension:
        missing.append(f"{pkg}/{EXTENSION_GLOB}")
    if not interface.is_file():
        missing.append(str(interface))
    if missing:
        return None, f"vLLM's bundled FlashMLA is incomplete: no {', no '.join(missing)}"
    root = pkg.parent
    version = dist_info_version(root)
    if not version and source == "installed":
        dist = lookup_distribution("vllm")
        version = dist.version if dist else ""
    return Bundle(str(root), kernels, extension, str(interface), version, source), ""


def locate(folder: str | None = None) -> tuple[Bundle | None, str]:
    """``(bundle, "")``, or ``(None, why)`` with what is missing and how to get it."""
    given = folder or os.environ.get(ENV_VAR) or ""
    if given:
        path = Path(given).expanduser()
        if not path.is_dir():
            return None, f"{given} (from {'--vllm-flashmla' if folder else ENV_VAR}) is not a folder: {INSTALL_HINT}"
        pkg = path if path.name == "vllm" and not (path / "vllm").is_dir() else path / "vllm"
        bundle, why = _from_package(pkg, "option")
        return bundle, (f"{why}: {INSTALL_HINT}" if why else "")
    pkg = package_dir("vllm")
    if pkg is None or not pkg.is_dir():
        return None, f"vLLM's bundled FlashMLA is not here (no vllm package): {INSTALL_HINT}"
    bundle, why = _from_package(pkg, "installed")
    return bundle, (f"{why}: {INSTALL_HINT}" if why else "")


def child_env(bundle: Bundle) -> tuple:
    """Environment entries that let a child import the bundle (:func:`add_to_path` reads them)."""
    return ((ENV_VAR, bundle.root),)


def add_to_path(sys_path: list) -> str:
    """In the child: put the bundle's folder first on ``sys_path``; returns the folder ("" if none)."""
    given = os.environ.get(ENV_VAR, "")
    if not given:
        return ""
    path = Path(given)
    root = str(path.parent if path.name == "vllm" and not (path / "vllm").is_dir() else path)
    if root not in sys_path:
        sys_path.insert(0, root)
    return root
