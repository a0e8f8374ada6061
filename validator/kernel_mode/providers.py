"""Which FlashMLA build can run the kernels, and which of its two Python APIs it exposes.

Providers, in order of preference:

* ``flash_mla`` - upstream deepseek-ai/FlashMLA built from source;
* ``sgl_kernel`` - the copy vendored in SGLang's kernel wheel (module ``sgl_kernel.flash_mla``).

APIs, told apart by the *signature* of ``get_mla_metadata`` (never by a version string):

* ``sched_meta`` (current upstream): ``get_mla_metadata(*args, **kwargs)`` takes nothing real and
  returns an empty ``FlashMLASchedMeta``; the first ``flash_mla_with_kvcache`` call fills it.
* ``tensors`` (upstream Oct 2025 and older copies): ``get_mla_metadata(cache_seqlens,
  num_q_tokens_per_head_k, num_heads_k, num_heads_q=None, is_fp8_kvcache=False, topk=None)``
  returns ``(tile_scheduler_metadata, num_splits)``. Without a ``topk`` parameter the copy is
  dense-only.

Detection happens in two steps. :func:`find_providers` looks at the installed files without
importing them (so torch is not imported here): ``importlib.util.find_spec`` on the top-level
package, an AST read of its Python source and the package metadata (:mod:`.builds`: which
distribution carries it, so which build it is). :func:`detect` then asks a child process, which
imports torch and the provider, checks the GPU, and repeats the API check on the live functions.

Each provider knows its build name (``sgl-flash-mla-1.0.0``, ``flashmla-9241ae3``, ...) and the model
generation its calls are compared with: the build itself when ``rules/flashmla.json`` models it, else
the generation of its API (said so in ``generation_note``).
"""
from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import InputError
from ..facts.knowledge import decode_archs, sm_list
from ..facts.knowledge import generation as generation_facts
from . import vllm_bundle
from .builds import API_GENERATION, INSTALL_HINTS, Dist, build_name, distribution_of, package_dir
from .runner import ChildSpec, run_job

PROVIDER_NAMES = ("flash_mla", "sgl_kernel")
# Providers kernel mode drives only when asked (``--provider vllm``, or ``--build vllm-*``).
EXPLICIT_PROVIDERS = (vllm_bundle.PROVIDER,)
PROVIDER_MODULES = {"flash_mla": "flash_mla", "sgl_kernel": "sgl_kernel.flash_mla",
                    vllm_bundle.PROVIDER: vllm_bundle.INTERFACE_MODULE}
# Source files (relative to the package folder) that may define get_mla_metadata.
PROVIDER_SOURCES = {"flash_mla": ("flash_mla_interface.py", "__init__.py"), "sgl_kernel": ("flash_mla.py",),
                    vllm_bundle.PROVIDER: (vllm_bundle.INTERFACE_FILE,)}
# Build-name prefixes (``--build``) that only one provider runs.
BUILD_PROVIDERS = {"vllm-": vllm_bundle.PROVIDER}
# Keyword arguments of flash_mla_with_kvcache that a call may need, by feature.
FEATURE_PARAMS = {
    "indices": "indices",
    "topk_length": "topk_length",
    "extra_k_cache": "extra_k_cache",
    "extra_indices": "extra_indices_in_kvcache",
    "extra_topk_length": "extra_topk_length",
    "is_fp8_kvcache": "is_fp8_kvcache",
    "use_legacy": "use_legacy",
    "enable_batch_invariant": "enable_batch_invariant",
}

INSTALL_HINT = (f"{INSTALL_HINTS['sgl-flash-mla']}; or {INSTALL_HINTS['flash-mla']}; or install sgl-kernel "
                "(`validate-batch env` lists what is installed)")


def known_generation(name: str | None) -> bool:
    if not name:
        return False
    try:
        generation_facts(name)
    except InputError:
        return False
    return True


def model_generation(build: str | None, api: str | None) -> tuple[str | None, str]:
    """The generation of ``rules/flashmla.json`` a build's calls are compared with, and a note when it is
    not the build itself."""
    if known_generation(build):
        return build, ""
    fallback = API_GENERATION.get(api or "")
    if build and fallback:
        return fallback, (f"rules/flashmla.json has no model of {build}; its calls are compared with "
                          f"{fallback} (the generation of its {api} API)")
    return fallback, ""


@dataclass(frozen=True)
class Param:
    """One parameter of a Python function: its name and ``inspect.Parameter`` kind name."""

    name: str
    kind: str = "POSITIONAL_OR_KEYWORD"
    has_default: bool = False


@dataclass(frozen=True)
class ApiShape:
    """What a provider's Python interface looks like."""

    api: str | None                  # "sched_meta", "tensors" or None (not recognised)
    features: frozenset = frozenset()
    reason: str = ""

    @property
    def supports_sparse(self) -> bool:
        return "indices" in self.features

    def missing_features(self, needed: Iterable[str]) -> list[str]:
        return [f for f in needed if f not in self.features]


def classify_api(metadata_params: Sequence[Param] | None, has_sched_meta_class: bool,
                 kvcache_params: Sequence[Param] | None) -> ApiShape:
    """Tell the API from the parameters of ``get_mla_metadata`` and ``flash_mla_with_kvcache``."""
    if metadata_params is None:
        return ApiShape(None, reason="no get_mla_metadata function")
    if kvcache_params is None:
        return ApiShape(None, reason="no flash_mla_with_kvcache function")
    names = [p.name for p in metadata_params]
    required = [p for p in metadata_params
                if p.kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD") and not p.has_default]
    var_positional = any(p.kind == "VAR_POSITIONAL" for p in metadata_params)
    kv_names = {p.name for p in kvcache_params}
    features = frozenset(f for f, pname in FEATURE_PARAMS.items() if pname in kv_names)
    if has_sched_meta_class and not required:
        why = "get_mla_metadata takes no required arguments" + (" (*args)" if var_positional else "")
        return ApiShape("sched_meta", features, why + " and FlashMLASchedMeta exists")
    if required and required[0].name == "cache_seqlens":
        feats = features if "topk" in names else features - {"indices"}
        why = f"get_mla_metadata({', '.join(names)}) returns the metadata tensors"
        if "topk" not in names:
            why += "; no topk parameter, so dense only"
        return ApiShape("tensors", feats, why)
    return ApiShape(None, features, f"unrecognised get_mla_metadata({', '.join(names)})")


# ----------------------------------------------------------------------------- static (no import)

def _params_from_ast(fn: ast.FunctionDef) -> list[Param]:
    a = fn.args
    pos = list(a.posonlyargs) + list(a.args)
    n_default = len(a.defaults)
    out = []
    for i, arg in enumerate(pos):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        out.append(Param(arg.arg, kind, i >= len(pos) - n_default))
    if a.vararg is not None:
        out.append(Param(a.vararg.arg, "VAR_POSITIONAL", True))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append(Param(arg.arg, "KEYWORD_ONLY", default is not None))
    if a.kwarg is not None:
        out.append(Param(a.kwarg.arg, "VAR_KEYWORD", True))
    return out


def api_from_source(sources: Sequence[str]) -> ApiShape:
    """Classify the API from Python source text (the first file that defines the functions wins)."""
    meta = kv = None
    has_class = False
    for text in sources:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                if node.name == "get_mla_metadata" and meta is None:
                    meta = _params_from_ast(node)
                elif node.name == "flash_mla_with_kvcache" and kv is None:
                    kv = _params_from_ast(node)
            elif isinstance(node, ast.ClassDef) and node.name == "FlashMLASchedMeta":
                has_class = True
            elif isinstance(node, ast.ImportFrom) and any(n.name == "FlashMLASchedMeta" for n in node.names):
                has_class = True
    return classify_api(meta, has_class, kv)


@dataclass(frozen=True)
class Provider:
    """An installed FlashMLA build: ``name`` (flash_mla | sgl_kernel), the module to import, its API."""

    name: str
    module: str
    api: str | None
    origin: str = ""
    features: frozenset = frozenset()
    reason: str = ""
    distribution: str = ""
    version: str = ""

    @property
    def takes_use_legacy(self) -> bool:
        return "use_legacy" in self.features

    def build_for(self, use_legacy: bool | None = None) -> str | None:
        """The build that runs a call with ``use_legacy`` (None: the provider's default)."""
        dist = Dist(self.distribution, self.version) if self.distribution else None
        params = frozenset(FEATURE_PARAMS[f] for f in self.features if f in FEATURE_PARAMS)
        return build_name(self.name, dist, self.api, params, use_legacy)

    @property
    def build(self) -> str | None:
        return self.build_for(None)

    def generation_for(self, use_legacy: bool | None = None) -> str | None:
        return model_generation(self.build_for(use_legacy), self.api)[0]

    @property
    def generation(self) -> str | None:
        return self.generation_for(None)

    @property
    def generation_note(self) -> str:
        return model_generation(self.build, self.api)[1]

    def default_use_legacy(self) -> bool | None:
        """What the provider is called with when a call record says nothing (SGLang's wrapper: True)."""
        return True if self.takes_use_legacy else None

    def to_job(self) -> dict:
        return {"name": self.name, "module": self.module, "api": self.api, "build": self.build}

    def to_dict(self) -> dict:
        return {"name": self.name, "module": self.module, "api": self.api, "origin": self.origin,
                "features": sorted(self.features), "build": self.build, "distribution": self.distribution or None,
                "version": self.version or None, "takes_use_legacy": self.takes_use_legacy,
                "generation": self.generation, "generation_note": self.generation_note or None,
                "reason": self.reason}


def provider_for_build(build: str | None, provider: str = "auto") -> str:
    """The provider that runs ``build`` (``--build``): ``vllm`` for a ``vllm-*`` build, else
    ``provider`` as given (``auto`` picks among the installed ones)."""
    if provider == "auto" and build:
        for prefix, name in BUILD_PROVIDERS.items():
            if build.startswith(prefix):
                return name
    return provider


def _bundle_provider() -> Provider | None:
    """vLLM's bundled FlashMLA, read from its interface file (nothing imported), or None."""
    bundle, _why = vllm_bundle.locate()
    if bundle is None:
        return None
    text = Path(bundle.interface).read_text(encoding="utf-8", errors="replace")
    shape = api_from_source([text])
    return Provider(vllm_bundle.PROVIDER, vllm_bundle.INTERFACE_MODULE, shape.api, bundle.interface, shape.features,
                    shape.reason, "vllm" if bundle.version else "", bundle.version)


def find_providers(names: Sequence[str] = PROVIDER_NAMES) -> list[Provider]:
    """Installed providers, in preference order, with their API read from source (nothing imported)."""
    found = []
    for name in names:
        if name == vllm_bundle.PROVIDER:
            bp = _bundle_provider()
            found.extend([bp] if bp else [])
            continue
        pkg = package_dir(name)
        if pkg is None:
            continue
        texts, origin = [], ""
        for rel in PROVIDER_SOURCES[name]:
            f = pkg / rel
            if f.is_file():
                texts.append(f.read_text(encoding="utf-8", errors="replace"))
                origin = origin or str(f)
        shape = api_from_source(texts) if texts else ApiShape(None, reason=f"no {PROVIDER_SOURCES[name][0]} in {pkg}")
        dist = distribution_of(name)
        found.append(Provider(name, PROVIDER_MODULES[name], shape.api, origin or str(pkg), shape.features,
                              shape.reason, dist.name if dist else "", dist.version if dist else ""))
    return found


# ----------------------------------------------------------------------------- runtime (child)

@dataclass(frozen=True)
class Detection:
    """The answer to "can kernel mode run here?" with the device facts when it can."""

    available: bool
    reason: str = ""
    provider: Provider | None = None
    device: dict = field(default_factory=dict)     # name, cc, num_sms, smem_optin, memory_bytes
    torch: str = ""
    candidates: tuple = ()

    def to_dict(self) -> dict:
        d = {"available": self.available, "reason": self.reason,
             "provider": self.provider.to_dict() if self.provider else None,
             "device": self.device or None, "torch": self.torch or None,
             "candidates": [c.to_dict() for c in self.candidates]}
        return d


def torch_installed() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def detect(provider: str = "auto", child: ChildSpec | None = None, timeout: float = 120.0) -> Detection:
    """Find a provider and a GPU, importing torch only in a child process.

    ``provider``: ``auto`` (first that works), ``flash_mla`` or ``sgl_kernel``. A custom child
    backend (tests) skips the static checks, which only concern the torch backend.
    """
    if provider not in ("auto", *PROVIDER_NAMES, *EXPLICIT_PROVIDERS):
        return Detection(False, f"unknown provider {provider!r}; expected auto, flash_mla, sgl_kernel or vllm")
    child = child or ChildSpec()
    wanted = PROVIDER_NAMES if provider == "auto" else (provider,)
    static = ()
    if provider == vllm_bundle.PROVIDER and child.backend is None:
        bundle, why = vllm_bundle.locate()
        if bundle is None:
            return Detection(False, why)
    if child.backend is None and child.python == ChildSpec().python:
        if not torch_installed():
            return Detection(False, "torch is not installed in this Python: kernel mode runs FlashMLA through "
                                    "PyTorch with CUDA; install torch, then " + INSTALL_HINT)
        static = tuple(find_providers(wanted))
        if not static:
            names = " or ".join(f"'{PROVIDER_MODULES[n]}'" for n in wanted)
            return Detection(False, f"no FlashMLA provider is installed (cannot find {names}): " + INSTALL_HINT)
    res = run_job({"op": "detect", "providers": list(wanted)}, timeout, child)
    if not res.is_ok:
        why = res.message or res.outcome
        return Detection(False, f"the detection child failed ({res.outcome}): {why}", candidates=static)
    p = res.payload
    cands = []
    for c in p.get("providers", []):
        name = c.get("name", "")
        dist = distribution_of(name) if not c.get("distribution") else Dist(c["distribution"], c.get("version", ""))
        cands.append(Provider(name, c.get("module", ""), c.get("api"), c.get("origin", ""),
                              frozenset(c.get("features", [])), c.get("reason", ""),
                              dist.name if dist else "", dist.version if dist else (c.get("version") or "")))
    usable = [c for c in cands if c.api is not None and not c.reason.startswith("import failed")]
    device = p.get("device") or {}
    torch_v = p.get("torch", "")
    if not p.get("cuda_available"):
        return Detection(False, p.get("cuda_reason") or f"torch {torch_v} sees no CUDA GPU", device=device,
                         torch=torch_v, candidates=tuple(cands))
    if not usable:
        reasons = "; ".join(f"{c.module}: {c.reason}" for c in cands) or "none found"
        return Detection(False, f"no usable FlashMLA provider ({reasons}): " + INSTALL_HINT, device=device,
                         torch=torch_v, candidates=tuple(cands))
    cc = tuple(device.get("cc") or (0, 0))
    archs = decode_archs()
    if cc[0] not in archs:
        return Detection(False, f"FlashMLA's decode kernels need an {sm_list(archs)} GPU; {device.get('name')} is "
                                f"sm{cc[0]}{cc[1]}", provider=usable[0], device=device, torch=torch_v,
                         candidates=tuple(cands))
    return Detection(True, "", usable[0], device, torch_v, tuple(cands))
