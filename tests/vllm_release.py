"""The real vLLM classes the tests build (0.33.0 and 0.34.0), read from the releases themselves.

Where a release's source comes from, first found: its wheel, ``VALIDATE_BATCH_VLLM_WHEEL`` or a
wheel of that release beside it (``wheel_path``; CI downloads both with ``pip download --no-deps
vllm==<version>``), or an installed ``vllm`` distribution of that version (its files are read, the
package is not imported). None: the tests that need it skip, saying why.

Importing ``vllm`` itself needs CUDA-era dependencies (torch 2.14, transformers, ...) that a CPU
test run does not have, so the release's modules are executed from their own source text:

* ``vllm/v1/core/sched/output.py`` as it is (``SchedulerOutput``, ``NewRequestData``,
  ``CachedRequestData``: the real dataclasses). Its two imports from other vLLM modules are
  stand-ins: ``EncoderCacheManagerMetadata`` (only named as a field type, 0.33),
  ``strip_covered_mm_data`` (only called by ``NewRequestData.from_request``, which the tests do
  not use) and ``untrack_long_lists`` (0.34: a garbage-collector hint, a no-op here).
* ``EngineCore.step`` and ``EngineCore._should_throttle_prefills`` (and 0.34's
  ``_wait_for_output``) from ``vllm/v1/engine/core.py``: the methods' own source, bound to a
  stand-in engine core (the real one starts model executors on GPUs). ``EngineCoreOutputs`` (only
  named in the return annotation) is a stand-in.
"""
from __future__ import annotations

import ast
import os
import sys
import zipfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from types import ModuleType, SimpleNamespace

VERSION = "0.33.0"
OUTPUT = "vllm/v1/core/sched/output.py"
CORE = "vllm/v1/engine/core.py"


def wheel_path(version: str = VERSION) -> tuple[str | None, str]:
    """``(path of vllm-<version>-*.whl or None, why not)``: the wheel ``VALIDATE_BATCH_VLLM_WHEEL``
    names when it is that release's, else one of that release beside it (or in it, when it names a
    folder), as ``pip download --no-deps vllm==<version> -d FOLDER`` leaves them."""
    given = os.environ.get("VALIDATE_BATCH_VLLM_WHEEL")
    if not given:
        return None, f"VALIDATE_BATCH_VLLM_WHEEL not set (pip download --no-deps vllm=={version})"
    p = Path(given)
    if p.is_file() and p.name.startswith(f"vllm-{version}-"):
        return str(p), ""
    folder = p if p.is_dir() else p.parent
    found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    if found:
        return str(found[0]), ""
    return None, f"no vllm-{version}-*.whl in {folder} (pip download --no-deps vllm=={version} -d {folder})"


def _from_wheel(path: str, name: str) -> str:
    with zipfile.ZipFile(path) as zf:
        return zf.read(name).decode("utf-8")


def _from_installed(name: str, version: str = VERSION) -> str | None:
    try:
        dist = metadata.distribution("vllm")
    except metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    f = Path(dist.locate_file(name))
    return f.read_text(encoding="utf-8") if f.is_file() else None


@lru_cache(maxsize=None)
def source(name: str, version: str = VERSION) -> tuple[str | None, str]:
    """``(source text or None, where it came from or why not)`` of the release ``version``."""
    wheel, why = wheel_path(version)
    if wheel:
        try:
            return _from_wheel(wheel, name), f"{Path(wheel).name}:{name}"
        except (KeyError, zipfile.BadZipFile) as e:
            return None, f"{wheel}: {e}"
    text = _from_installed(name, version)
    if text is not None:
        return text, f"installed vllm {version}:{name}"
    return None, (f"vLLM {version} not available: {why}, or install it")


@lru_cache(maxsize=None)
def sched_output(version: str = VERSION) -> ModuleType | None:
    """``vllm.v1.core.sched.output`` of the release (None: not available)."""
    text, _ = source(OUTPUT, version)
    if text is None:
        return None
    stand_ins = {
        "vllm": ModuleType("vllm"), "vllm.config": ModuleType("vllm.config"),
        "vllm.config.ec_manager_config": ModuleType("vllm.config.ec_manager_config"),
        "vllm.multimodal": ModuleType("vllm.multimodal"),
        "vllm.multimodal.utils": ModuleType("vllm.multimodal.utils"),
        "vllm.utils": ModuleType("vllm.utils"), "vllm.utils.gc_utils": ModuleType("vllm.utils.gc_utils"),
    }
    stand_ins["vllm.config.ec_manager_config"].EncoderCacheManagerMetadata = type("EncoderCacheManagerMetadata", (), {})

    def strip_covered_mm_data(*args, **kwargs):      # stand-in: the tests never call from_request
        raise NotImplementedError

    stand_ins["vllm.multimodal.utils"].strip_covered_mm_data = strip_covered_mm_data
    stand_ins["vllm.utils.gc_utils"].untrack_long_lists = lambda lists, min_len=256: None   # stand-in: a GC hint
    mod = ModuleType(f"vllm_{version.replace('.', '_')}_sched_output")
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


def engine_core_methods(names=("step", "_should_throttle_prefills"), version: str = VERSION) -> dict | None:
    """The named methods of ``EngineCore`` in the release's ``core.py``, compiled from their own
    source (None: not available)."""
    text, _ = source(CORE, version)
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


def readme_hook_snippets() -> dict[str, str]:
    """The README's vLLM guard snippets by name (``<!-- guard:NAME -->`` before a python block)."""
    import re
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    found = dict(re.findall(r"<!-- guard:([\w-]+) -->\s*```python\n(.*?)```", text, flags=re.S))
    assert {"vllm-init", "vllm-hook", "vllm-prevent"} <= set(found)
    return found


class StandInCore:
    """Stand-in for ``EngineCore``: the attributes the release's ``step`` uses, none of them GPU work;
    ``step``, ``_should_throttle_prefills`` (and, where the release has it, ``_wait_for_output``) are
    the release's own methods. ``throttle``: the prefill throttle always asks to defer."""

    def __init__(self, outputs, throttle=False, version: str = VERSION):
        methods = engine_core_methods(("step", "_should_throttle_prefills"), version)
        methods.update(engine_core_methods(("_wait_for_output",), version) or {})
        for name, (fn, _) in methods.items():
            setattr(self, "_step" if name == "step" else name, fn.__get__(self))
        if throttle:
            self._should_throttle_prefills = lambda: True
        self.schedule_args: list = []
        self.executed: list = []
        core = self

        class Scheduler:
            def has_requests(self):
                return bool(outputs)

            def schedule(self, *args):
                core.schedule_args.append(args)
                return outputs.pop(0)

            def get_grammar_bitmask(self, so):
                return None

            def update_from_output(self, so, model_output):
                return {0: model_output}

        class Executor:
            def execute_model(self, so, non_block=False):
                core.executed.append(so)
                return SimpleNamespace(result=lambda: "model output")

        self.scheduler, self.model_executor = Scheduler(), Executor()

    def capture_iteration_details(self, so):
        return _Null()

    def log_error_detail(self, so):
        return _Null()

    def _process_aborts_queue(self):
        pass

    def _attach_iteration_details(self, outputs, details):
        pass

    def _attach_weight_version(self, outputs):
        pass

    def step(self):
        return self._step()


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False
