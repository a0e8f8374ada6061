"""What kernel mode would find here: the installed FlashMLA builds, torch, the GPU, what to install.

The calling process imports neither torch nor FlashMLA: builds come from package metadata and the
installed files (:mod:`.builds`, :func:`.providers.find_providers`), torch from
``importlib.util.find_spec`` and its metadata. Only the GPU needs a child process (with a timeout;
``check_gpu=False`` skips it).
"""
from __future__ import annotations

from typing import Any

from ..facts.knowledge import load
from .builds import (
    INSTALL_HINTS,
    canonical,
    installed_distributions,
    lookup_distribution,
    package_dir,
    vllm_flashmla_files,
)
from .providers import PROVIDER_NAMES, Provider, detect, find_providers, known_generation, torch_installed
from .runner import ChildSpec, run_job

VLLM_NOTE = ("found by its file (vLLM's metadata does not list the bundled copy); kernel mode runs it with "
             "--build {build} (or --provider vllm)")


def default_generation() -> str:
    return load("flashmla")["default"]


def auto_generation(providers: list[Provider]) -> dict:
    """``--build auto``: the build of the first installed provider that the model knows, else the
    default generation of ``rules/flashmla.json``."""
    for p in providers:
        if p.api is None:
            continue
        if known_generation(p.build):
            return {"generation": p.build, "why": f"the installed build ({p.module}, {p.distribution or 'no metadata'})"}
    for p in providers:
        if p.api is not None and p.generation:
            return {"generation": p.generation, "why": (f"the installed build {p.build} has no model; "
                                                        f"{p.generation} is the generation of its {p.api} API")}
    return {"generation": default_generation(), "why": "no FlashMLA build is installed: the default of "
                                                       "rules/flashmla.json"}


def _provider_entry(p: Provider) -> dict:
    d = p.to_dict()
    d["runnable"] = p.api is not None
    d["path"] = p.origin
    if p.takes_use_legacy:
        d["builds_by_use_legacy"] = {"true": p.build_for(True), "false": p.build_for(False)}
    return d


def environment(*, check_gpu: bool = True, timeout: float = 60.0, child: ChildSpec | None = None) -> dict[str, Any]:
    """The environment report (JSON-able)."""
    providers = find_providers(PROVIDER_NAMES)
    builds = [_provider_entry(p) for p in providers]
    dists = installed_distributions()
    vllm = next((d for d in dists if canonical(d.name) == "vllm"), None)
    if vllm is not None:
        files = vllm_flashmla_files()
        if files:
            build = f"vllm-{'.'.join(vllm.version.split('.')[:2])}"
            builds.append({"name": "vllm", "module": "vllm._flashmla_C", "api": None, "build": build,
                           "distribution": vllm.name, "version": vllm.version, "path": files[0], "runnable": False,
                           "note": VLLM_NOTE.format(build=build)})
    torch_dist = lookup_distribution("torch")
    torch_info = {"installed": torch_installed(), "version": torch_dist.version if torch_dist else None,
                  "path": str(package_dir("torch") or "") or None}
    out: dict[str, Any] = {
        "builds": builds,
        "distributions": [{"name": d.name, "version": d.version} for d in dists],
        "kernel_gen_auto": auto_generation(providers),
        "torch": torch_info,
        "gpu": None,
        "kernel_mode": None,
        "install": [],
    }
    runnable = [p for p in providers if p.api is not None]
    if not torch_info["installed"]:
        out["install"].append(INSTALL_HINTS["torch"])
    if not runnable:
        out["install"].append(INSTALL_HINTS["sgl-flash-mla"])
        out["install"].append(INSTALL_HINTS["flash-mla"])
    if not check_gpu:
        out["gpu"] = {"checked": False}
        ok = torch_info["installed"] and bool(runnable)
        out["kernel_mode"] = {"available": None if ok else False,
                              "reason": "the GPU was not checked (--no-gpu)" if ok else _static_reason(torch_info,
                                                                                                       runnable)}
        return out
    if not torch_info["installed"]:
        out["gpu"] = {"checked": False, "reason": "torch is not installed"}
        out["kernel_mode"] = {"available": False, "reason": _static_reason(torch_info, runnable)}
        return out
    if runnable:
        det = detect("auto", child, timeout)
        out["gpu"] = dict(det.device or {}, checked=True) if det.device else {"checked": True, "reason": det.reason}
        out["kernel_mode"] = {"available": det.available, "reason": det.reason or None,
                              "provider": det.provider.to_dict() if det.provider else None, "torch": det.torch or None}
        return out
    res = run_job({"op": "detect", "providers": []}, timeout, child)
    if res.is_ok and res.payload.get("device"):
        out["gpu"] = dict(res.payload["device"], checked=True)
    else:
        why = res.payload.get("cuda_reason") if res.is_ok else f"{res.outcome}: {res.message}"
        out["gpu"] = {"checked": True, "reason": why or "no CUDA GPU"}
    out["kernel_mode"] = {"available": False, "reason": _static_reason(torch_info, runnable)}
    return out


def _static_reason(torch_info: dict, runnable: list) -> str | None:
    if not torch_info["installed"]:
        return "torch is not installed in this Python"
    if not runnable:
        return "no FlashMLA build is installed (flash_mla, sgl_kernel.flash_mla)"
    return None


def render_environment(env: dict, console) -> None:
    """Human output of :func:`environment`."""
    from rich.markup import escape

    p = console.print
    p("[bold]FlashMLA builds[/]", markup=True)
    if not env["builds"]:
        p("  none installed")
    for b in env["builds"]:
        ver = f" {b['version']}" if b.get("version") else ""
        dist = f"{b['distribution']}{ver}" if b.get("distribution") else "no package metadata"
        api = f"{b['api']} API" if b.get("api") else "API not read"
        p(f"  {escape(str(b.get('build')))}: {escape(dist)}; module {b['module']} ({api}) at "
          f"{escape(str(b.get('path') or '?'))}", markup=True)
        if b.get("builds_by_use_legacy"):
            bl = b["builds_by_use_legacy"]
            p(f"    use_legacy=True (default): {bl['true']}; use_legacy=False: {bl['false']}")
        if b.get("generation_note"):
            p(f"    note: {escape(b['generation_note'])}", markup=True)
        if b.get("note"):
            p(f"    note: {escape(b['note'])}", markup=True)
        if b.get("reason") and not b.get("runnable"):
            p(f"    not usable: {escape(b['reason'])}", markup=True)
    auto = env["kernel_gen_auto"]
    p(f"[bold]--build auto[/]: {auto['generation']} ({escape(auto['why'])})", markup=True)
    t = env["torch"]
    p("[bold]torch[/]: " + (f"{t['version'] or 'installed'} at {escape(str(t['path']))}" if t["installed"]
                             else "not installed"), markup=True)
    g = env["gpu"] or {}
    if not g.get("checked"):
        p(f"[bold]GPU[/]: not checked{(' (' + g['reason'] + ')') if g.get('reason') else ''}", markup=True)
    elif g.get("name"):
        cc = "".join(map(str, g.get("cc") or []))
        p(f"[bold]GPU[/]: {escape(g['name'])} sm{cc}, {g.get('num_sms')} SMs, smem opt-in {g.get('smem_optin')} B",
          markup=True)
    else:
        p(f"[bold]GPU[/]: none ({escape(str(g.get('reason')))})", markup=True)
    km = env["kernel_mode"] or {}
    state = {True: "[bold green]available[/]", False: "[bold yellow]unavailable[/]", None: "not determined"}
    p(f"[bold]kernel mode[/]: {state[km.get('available')]}"
      + (f" - {escape(str(km['reason']))}" if km.get("reason") else ""), markup=True)
    for hint in env["install"]:
        p(f"  to install: {escape(hint)}", markup=True)
