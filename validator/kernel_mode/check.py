"""Run every call of a report on the real kernels and compare with the model, call by call.

For each call: one child process (timeout), the kernel's outcome classified like the oracle, the
``tile_scheduler_metadata`` (columns the generation writes) and ``num_splits`` diffed against the
model's schedule, and the model's verdict set against the kernel's. Agreement is tallied per rule
code. Nothing here imports torch.

Agreement per call:

* ``agree`` - the model calls the call legal and the kernel ran; or the model calls it illegal and the
  kernel failed *in a class the model predicts* (``failure_matches``);
* ``agree_ub`` - the model flags undefined behaviour only, and the kernel happened to run;
* ``disagree`` - the verdicts differ, or both say illegal but the failure class differs (an engine
  recovers from an exception, not from ``exit(1)``);
* ``inconclusive`` - the run says nothing about the call: timeout, nothing ran, the provider lacks a
  feature, or the kernel refused for a reason that is not about the batch (the GPU architecture, a
  missing build part; ``inconclusive_reason`` says which); also a failure the model names no class for.

The run as a whole (``summary.status``): ``disagree`` when any call disagrees or any metadata differs;
``inconclusive`` when no call was conclusive; else ``agree`` (inconclusive calls are counted and listed).
"""
from __future__ import annotations

from typing import Sequence

from ..flashmla.calls import DecodeCall, SparsePrefillCall
from ..flashmla.plan import Plan
from .agreement import (  # noqa: F401 (the judging lives there; these names are kernel mode's API)
    LEGAL_KEY,
    UNDEFINED_BEHAVIOUR,
    MetadataDiff,
    ModelView,
    agreement,
    compare_call,
    diff_metadata,
    failure_class,
    failure_classes,
    failure_matches,
    gpu_from_device,
    judge,
    model_view,
    predicted_fatal,
    replan,
    run_judged,
    same_gpu,
    summarize,
)
from .libraries import library_of, run_library_calls
from .outcome import RunResult
from .providers import Detection, Provider, detect
from .runner import DEFAULT_TIMEOUT_S, ChildSpec
from .slot_probe import probe_slot_index


# ----------------------------------------------------------------------------- records for the child

def call_record(call) -> dict:
    """The call in the oracle record format, with every field the kernel inputs depend on."""
    rec = call.to_record()
    rec.pop("label", None)
    if isinstance(call, SparsePrefillCall):
        rec.update({"h_kv": call.h_kv, "d_v": call.d_v})
        if call.s_kv is not None:
            rec["s_kv"] = call.s_kv
    else:
        if call.kind == "dense":
            rec["d_qk"] = call.d_qk
        for key, default in (("d_v", 512), ("h_k", 1), ("bytes_per_token", None)):
            v = getattr(call, key)
            if v != default:
                rec[key] = v
        if call.causal:
            rec["causal"] = True
        if call.is_fp8 != (call.kind == "sparse"):
            rec["is_fp8"] = call.is_fp8
    if call.label:
        rec["label"] = call.label
    return rec


def call_use_legacy(call) -> bool | None:
    """The ``use_legacy`` a call record asks for (None: not said; the build's default applies)."""
    v = getattr(call, "use_legacy", None)
    if v is None:
        v = call.to_record().get("use_legacy")
    return None if v is None else bool(v)


def job_for(call, provider: Provider, use_legacy: bool | None = None) -> dict:
    """The child's job for ``call``. ``use_legacy`` (else the call's own) goes to the child as is;
    the child passes it, or the build's default, to a provider that takes it."""
    op = "prefill" if isinstance(call, SparsePrefillCall) else "decode"
    job = {"op": op, "provider": provider.to_job(), "record": call_record(call)}
    ul = use_legacy if use_legacy is not None else call_use_legacy(call)
    if ul is not None:
        job["use_legacy"] = ul
        job["record"]["use_legacy"] = ul
    return job


def run_calls(plans: Sequence[Plan], det: Detection, *, timeout: float = DEFAULT_TIMEOUT_S,
              child: ChildSpec | None = None, max_parallel: int = 1, console=None, served: bool = True,
              keep_output: bool = False) -> dict:
    """Run the plans' calls with a detected provider and build the full result.

    ``served`` (the default): long-lived children take the calls the model expects to run or to
    raise, and are replaced after any outcome that may poison the CUDA context; a call the model
    expects to be fatal runs in a fresh child of its own. Otherwise every call gets a fresh child."""
    provider = det.provider
    base_gpu = plans[0].gpu if plans else None
    gpu = gpu_from_device(det.device, base_gpu) if (det.device and base_gpu is not None) else base_gpu
    replanned = [replan(p, gpu, provider.generation_for(call_use_legacy(p.call))) for p in plans]
    jobs = [job_for(p.call, provider) for p in replanned]
    results, wall = run_judged(replanned, jobs, timeout=timeout, child=child, max_parallel=max_parallel,
                               console=console, served=served)
    entries = [compare_call(i, p, r, keep_output) for i, (p, r) in enumerate(zip(replanned, results))]
    summary = summarize(entries)
    return {
        "available": True,
        "provider": provider.to_dict(),
        "device": det.device,
        "torch": det.torch,
        "model_generation": replanned[0].gen.get("name") if replanned else None,
        "model_build": replanned[0].gen.get("build") if replanned else None,
        "model_gpu": base_gpu.to_dict() if base_gpu else None,
        "gpu_replanned": bool(base_gpu is not None and gpu is not None and not same_gpu(base_gpu, gpu)),
        "timeout_s": timeout,
        "calls": entries,
        "children": "served" if served else "one per call",
        "wall_s": round(wall, 3),
        "calls_per_s": round(len(jobs) / wall, 2) if wall > 0 else None,
        "summary": summary,
        "status": summary["status"],
        "agreement": summary["all_agree"],
    }


def kernel_check_report(report, console=None, *, provider: str = "auto", timeout: float = DEFAULT_TIMEOUT_S,
                        max_parallel: int = 1, child: ChildSpec | None = None, served: bool = True,
                        keep_output: bool = False) -> dict:
    """Run each call of ``report`` on the real kernels; a JSON-able result (never a traceback).

    Without torch, a CUDA GPU or FlashMLA the result is ``{"available": false, "reason": ...}``.
    """
    every = list(getattr(report, "plans", []))
    plans = [p for p in every if isinstance(p.call, (DecodeCall, SparsePrefillCall))]
    by_library: dict[str, list] = {}
    for p in every:
        name = library_of(p)
        if name is not None:
            by_library.setdefault(name, []).append(p)
    slots = slot_buffer_checks(report, timeout=timeout, child=child, console=console)
    libraries = {name: run_library_calls(ps, name, timeout=timeout, child=child, max_parallel=max_parallel,
                                         console=console, served=served, keep_output=keep_output)
                 for name, ps in by_library.items()}
    if not plans:
        if libraries:
            first, *rest = libraries.values()
            result = dict(first)
            if rest:
                result["libraries"] = rest
            if slots is not None:
                result["slot_buffers"] = slots
            return result
        if slots is not None:
            return slots
        return {"available": False, "reason": "the report has no FlashMLA, FlashInfer MLA plan or DeepGEMM metadata "
                                              "calls to run"}
    if console is not None:
        console.print("kernel mode: detecting torch, GPU and FlashMLA in a child process ...", markup=False,
                      highlight=False)
    det = detect(provider, child, timeout)
    if not det.available:
        out = {"available": False, "reason": det.reason, "detection": det.to_dict()}
        if libraries:
            out["libraries"] = list(libraries.values())
        return out
    if console is not None:
        p = det.provider
        console.print(f"kernel mode: {p.build or p.module} via {p.module} ({p.api} API) on {det.device.get('name')} "
                      f"sm{''.join(map(str, det.device.get('cc', [])))}, {det.device.get('num_sms')} SMs; "
                      f"{len(plans)} call(s), timeout {timeout:g} s each", markup=False, highlight=False)
    result = run_calls(plans, det, timeout=timeout, child=child, max_parallel=max_parallel, console=console,
                       served=served, keep_output=keep_output)
    if slots is not None:
        result["slot_buffers"] = slots
    if libraries:
        result["libraries"] = list(libraries.values())
    return result


def slot_buffer_checks(report, *, timeout: float = DEFAULT_TIMEOUT_S, child: ChildSpec | None = None,
                       console=None) -> dict | None:
    """For a batch with request slots: write the batch's largest slot into every slot-indexed buffer,
    allocated at its computed size on the GPU (and on the CPU), each in a child process; compare with
    the model's verdict (out of bounds exactly when the slot is >= the buffer's rows)."""
    bp = getattr(report, "batch_plan", None)
    if bp is None or bp.slots is None:
        return None
    slots = [r.req_pool_idx for r in bp.batch.requests if r.req_pool_idx is not None]
    if not slots:
        return None
    top = max(slots)
    entries = []
    for buf in bp.slots.buffers:
        if buf.indexed_by != "req_pool_idx":
            continue
        if console is not None:
            console.print(f"kernel mode: writing slot {top} into {buf.name} ({buf.rows} rows) on the GPU ...",
                          markup=False, highlight=False)
        res = probe_slot_index(buf.rows, min(buf.width or 1, 4096), top, device="cuda", timeout=timeout, child=child)
        model_fails = top >= buf.rows
        if not res.get("available"):
            said = "inconclusive"
        else:
            said = "agree" if (res.get("outcome") != "ok") == model_fails else "disagree"
        entries.append({"buffer": buf.name, "rows": buf.rows, "slot": top, "model": "out of bounds" if model_fails
                        else "in bounds", "agreement": said, "probe": res})
    available = any(e["probe"].get("available") for e in entries)
    out = {"available": available, "slot_buffers": entries,
           "all_agree": all(e["agreement"] == "agree" for e in entries) if available else None}
    if not available and entries:
        out["reason"] = entries[0]["probe"].get("reason", "slot probe unavailable")
    return out


# ----------------------------------------------------------------------------- rendering

AGREE_STYLE = {"agree": "green", "agree_ub": "yellow", "disagree": "bold red", "inconclusive": "yellow"}


def render_kernel_result(result: dict, console) -> None:
    """Human output of :func:`kernel_check_report` (rich)."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    slot_part = result.get("slot_buffers")
    if isinstance(slot_part, dict):  # a batch with FlashMLA calls and slots: both parts
        _render_slots(slot_part, console)
    elif isinstance(slot_part, list):  # a batch with slots only
        _render_slots(result, console)
        return
    for part in result.get("libraries") or ():
        render_kernel_result(part, console)
    if not result.get("available"):
        what = f" ({result['library']})" if result.get("library") else ""
        console.print(f"[bold yellow]kernel mode unavailable{what}[/]: {escape(str(result.get('reason', '')))}",
                      markup=True)
        return
    prov, dev = result["provider"], result.get("device") or {}
    build = prov.get("build") or prov["module"]
    console.print(f"[bold]kernel mode[/]: {escape(str(build))} via {escape(prov['module'])} ({prov['api']} API, "
                  f"model generation {result.get('model_generation')}) on {escape(str(dev.get('name')))}, "
                  f"{dev.get('num_sms')} SMs, smem opt-in {dev.get('smem_optin')} B", markup=True)
    if prov.get("generation_note"):
        console.print(f"  note: {escape(prov['generation_note'])}", markup=True)
    if result.get("gpu_replanned"):
        console.print("  the calls were re-planned for the measured device (it differs from the requested GPU profile)")
    t = Table("#", "call", "model", "kernel", "metadata (model vs kernel)", "agreement")
    for e in result["calls"]:
        m = e["model"]
        model_txt = "legal" if m["verdict"] == "legal" else f"illegal {','.join(m['codes'])}"
        k = e["kernel"]
        kern_txt = k["outcome"] + (f" ({k['signal']})" if k.get("signal") else "")
        if k.get("fallback_used"):
            kern_txt += " (fallback kernel)"
        md = e.get("metadata")
        md_txt = "-" if md is None else ("identical" if md.get("identical") else "DIFFERS")
        st = AGREE_STYLE.get(e["agreement"], "")
        t.add_row(str(e["index"]), e["call"], model_txt, kern_txt, md_txt,
                  Text(e["agreement"], style=st or ""))
    console.print(t)
    for e in result["calls"]:
        k = e["kernel"]
        if k["outcome"] != "ok" and k.get("message"):
            console.print(f"  call {e['index']}: {k['outcome']}: {escape(k['message'])}", markup=True)
        if k.get("fallback"):
            console.print(f"  call {e['index']}: fallback used: {escape(k['fallback']['text'])}", markup=True)
        md = e.get("metadata")
        if md is not None and not md.get("identical"):
            console.print(f"  call {e['index']}: metadata {escape(md.get('summary', ''))}", markup=True)
        if k.get("unwritten_requests"):
            console.print(f"  call {e['index']}: output rows left unwritten for request(s) "
                          f"{k['unwritten_requests'][:16]}", markup=True)
        if e["agreement"] == "agree_ub":
            console.print(f"  call {e['index']}: the model flags undefined behaviour "
                          f"({','.join(e['model']['codes'])}); the kernel happened to run this time")
        elif e["agreement"] in ("disagree", "inconclusive") and e.get("agreement_reason"):
            console.print(f"  call {e['index']}: {e['agreement']}: {escape(e['agreement_reason'])}", markup=True)
    s = result["summary"]
    rt = Table("model says", "calls", "kernel ran", "kernel failed", "inconclusive", "agree", "disagree",
               "failure class as predicted")
    for code in sorted(s["per_rule"]):
        r = s["per_rule"][code]
        rt.add_row(code, str(r["calls"]), str(r["kernel_ok"]), str(r["kernel_failed"]), str(r["inconclusive"]),
                   str(r["agree"] + r["agree_ub"]), str(r["disagree"]),
                   str(r["failure_class_match"]) if code != LEGAL_KEY else "-")
    console.print(rt)
    mdsum = s["metadata"]
    status = s.get("status", "agree" if s.get("all_agree") else "disagree")
    verdict = {"agree": "[bold green]AGREE[/]", "disagree": "[bold red]DISAGREE[/]",
               "inconclusive": "[bold yellow]INCONCLUSIVE[/]"}[status]
    ag = s["agreement"]
    fb = f"; low-smem fallback kernel used in {s['fallback_used']}" if s.get("fallback_used") else ""
    console.print(f"kernel vs model: {verdict} - {ag['agree'] + ag['agree_ub']} of {s['calls']} call(s) agree, "
                  f"{ag['disagree']} disagree, {ag['inconclusive']} inconclusive; metadata identical for "
                  f"{mdsum['identical']} of {mdsum['compared']} compared{fb}", markup=True)
    for why, n in sorted((s.get("inconclusive_reasons") or {}).items()):
        console.print(f"  inconclusive ({n}): {escape(why)}", markup=True)
    if status == "inconclusive":
        console.print("  nothing was measured about these calls: the kernels did not run for reasons outside "
                      "the batch (see above; `validate-batch env` shows the installed builds)")


def _render_slots(part: dict, console) -> None:
    from rich.markup import escape

    if not part.get("available"):
        console.print(f"[bold yellow]slot probe unavailable[/]: {escape(str(part.get('reason', '')))}", markup=True)
        return
    for e in part.get("slot_buffers", []):
        pr = e["probe"]
        if not pr.get("available"):
            continue
        cpu = pr.get("cpu") or {}
        st = AGREE_STYLE.get(e["agreement"], "")
        console.print(f"slot {e['slot']} into {escape(e['buffer'])} ({e['rows']} rows): model {e['model']}; "
                      f"GPU {pr.get('outcome')}: {escape(str(pr.get('message') or ''))}; CPU {cpu.get('outcome')}: "
                      f"{escape(str(cpu.get('message') or ''))} -> [{st}]{e['agreement']}[/]", markup=True)
