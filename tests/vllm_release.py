"""The real vLLM 0.33.0 classes the tests build, read from the release itself.

Where the source comes from, first found: ``VALIDATE_BATCH_VLLM_WHEEL`` (the path of the
``vllm-0.33.0`` wheel; CI downloads it with ``pip download --no-deps vllm==0.33.0``), or an
installed ``vllm`` 0.33.0 distribution (its files are read, the package is not imported). None:
the tests that need it skip, saying why.

Importing ``vllm`` itself needs CUDA-era dependencies (torch 2.14, transformers, ...) that a CPU
test run does not have, so the release's modules are executed from their own source text:

* ``vllm/v1/core/sched/output.py`` as it is (``SchedulerOutput``, ``NewRequestData``,
  ``CachedRequestData``: the real dataclasses). Its two imports from other vLLM modules are
  stand-ins: ``EncoderCacheManagerMetadata`` (only named as a field type) and
  ``strip_covered_mm_data`` (only called by ``NewRequestData.from_request``, which the tests do
  not use).
* ``EngineCore.step`` and ``EngineCore._should_throttle_prefills`` from
  ``vllm/v1/engine/core.py``: the two methods' own source, bound to a stand-in engine core (the
  real one starts model executors on GPUs). ``EngineCoreOutputs`` (only named in the return
  annotation) is a stand-in.
"""
from __future__ import annotations

import ast
import os
import sys
import zipfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from types import ModuleType

VERSION = "0.33.0"
OUTPUT = "vllm/v1/core/sched/output.py"
CORE = "vllm/v1/engine/core.py"


def _from_wheel(path: str, name: str) -> str:
    with zipfile.ZipFile(path) as zf:
        return zf.read(name).decode("utf-8")


def _from_installed(name: str) -> str | None:
    try:
        dist = metadata.distribution("vllm")
    except metadata.PackageNotFoundError:
        return None
    if dist.version != VERSION:
        return None
    f = Path(dist.locate_file(name))
    return f.read_text(encoding="utf-8") if f.is_file() else None


@lru_cache(maxsize=None)
def source(name: str) -> tuple[str | None, str]:
    """``(source text or None, where it came from or why not)``."""
    wheel = os.environ.get("VALIDATE_BATCH_VLLM_WHEEL")
    if wheel:
        if not Path(wheel).is_file():
            return None, f"VALIDATE_BATCH_VLLM_WHEEL={wheel} is not a file"
        try:
            return _from_wheel(wheel, name), f"{Path(wheel).name}:{name}"
        except (KeyError, zipfile.BadZipFile) as e:
            return None, f"{wheel}: {e}"
    text = _from_installed(name)
    if text is not None:
        return text, f"installed vllm {VERSION}:{name}"
    return None, (f"vLLM {VERSION} not available: set VALIDATE_BATCH_VLLM_WHEEL to the wheel "
                  f"(pip download --no-deps vllm=={VERSION}) or install it")


@lru_cache(maxsize=None)
def sched_output() -> ModuleType | None:
    """``vllm.v1.core.sched.output`` of the release (None: not available)."""
    text, _ = source(OUTPUT)
    if text is None:
        return None
    stand_ins = {
        "vllm": ModuleType("vllm"), "vllm.config": ModuleType("vllm.config"),
        "vllm.config.ec_manager_config": ModuleType("vllm.config.ec_manager_config"),
        "vllm.multimodal": ModuleType("vllm.multimodal"),
        "vllm.multimodal.utils": ModuleType("vllm.multimodal.utils"),
    }
    stand_ins["vllm.config.ec_manager_config"].EncoderCacheManagerMetadata = type("EncoderCacheManagerMetadata", (), {})

    def strip_covered_mm_data(*args, **kwargs):      # stand-in: the tests never call from_request
        raise NotImplementedError

    stand_ins["vllm.multimodal.utils"].strip_covered_mm_data = strip_covered_mm_data
    mod = ModuleType("vllm_033_sched_output")
    mod.__file__ = OUTPUT
    saved = {k: sys.modules.get(k) for k in list(stand_ins) + [mod.__name__]}
    try:
        for k, v in stand_ins.items():
            if saved[k] is None:
                sys.modules[k] = v
        sys.modules[mod.__name__] = mod       # dataclasses look their module up while building
        exec(compile(text, OUTPUT, "exec"), mod.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
    return mod


def engine_core_methods(names=("step", "_should_throttle_prefills")) -> dict | None:
    """The named methods of ``EngineCore`` in the release's ``core.py``, compiled from their own
    source (None: not available)."""
    text, _ = source(CORE)
    if text is None:
        return None
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineCore")
    scope: dict = {"EngineCoreOutputs": type("EngineCoreOutputs", (), {})}   # stand-in: an annotation
    out = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            code = ast.Module(body=[node], type_ignores=[])
            exec(compile(ast.fix_missing_locations(code), f"{CORE}:{node.lineno}", "exec"), scope)
            out[node.name] = (scope[node.name], node.lineno)
    return out if set(out) == set(names) else None
