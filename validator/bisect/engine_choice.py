"""Which engine profile and which engine versions a crash is checked under, and why."""
from __future__ import annotations

from ..errors import InputError
from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..ingest.scan import LogEvidence
from ..ingest.sglang_log import Era, after_forward_for_version, parse_version
from ..facts.knowledge import load
from ..engines import resolve_version
from .data import entry_point_releases, era_releases, in_model_family


def decode_backend(cfg: EngineConfig) -> str:
    """The attention backend SGLang's decode forwards run: ``--decode-attention-backend``, else
    ``--attention-backend`` (lower case; empty when neither is given)."""
    v = cfg.get("decode_attention_backend") or cfg.get("attention_backend") or ""
    return str(v).strip().lower()


def backend_profile(cfg: EngineConfig) -> str | None:
    """The SGLang profile that models the launch command's decode attention backend
    (``recognised_by.attention_backend`` in ``rules/engines.json``); None when none does."""
    backend = decode_backend(cfg)
    if not backend:
        return None
    for name, p in load("engines")["profiles"].items():
        if p.get("engine") == "sglang" and backend in p.get("recognised_by", {}).get("attention_backend", []):
            return name
    return None


def choose_profile(cfg: EngineConfig, err: ErrorEvent | None, override: list[str] | None,
                   evidence: LogEvidence | None) -> tuple[list[str], str]:
    """The engine profile(s) to check with, from the user, the error, the model and the log's fields."""
    if override:
        return override, "given with --engine"
    model = str(cfg.get("model_path", "") or "")
    pd_decode = str(cfg.get("disaggregation_mode", "") or "").lower() == "decode"
    slot_err = err is not None and err.quantity == "slot"
    is_dsv4 = in_model_family("deepseek_v4", model)
    swa_hint = evidence is not None and any(
        "full_token_usage" in s.fields or "swa_token_usage" in s.fields
        for tl in evidence.ranks.values() for s in list(tl.steps)[-4:])
    if slot_err:
        return ["sglang-slots"], f"the error ({err.kind}) is a slot index out of a buffer"
    if is_dsv4:
        prof = ["sglang-dsv4"] + (["sglang-slots"] if pd_decode else [])
        return prof, f"model {cfg.get('model_path')!r} is DeepSeek-V4"
    if err is not None and err.kind == "flashmla_sched":
        return ["sglang-dsv4"], "the error is FlashMLA's scheduler failing (one query row per token, as in DSv4)"
    if err is not None and err.kind in ("flashmla_sparse_prefill", "tma_descriptor") and err.owner in (None, "flashmla"):
        return ["sglang-dsv4"], f"the error ({err.kind}) comes from a sparse prefill kernel's TMA descriptor, not from a slot"
    by_backend = backend_profile(cfg)
    if by_backend is not None:
        return [by_backend], f"the launch command's attention backend {decode_backend(cfg)} runs {by_backend}'s kernels"
    if pd_decode and in_model_family("dsa_pd_decode", model):
        return ["sglang-slots"], "a PD decode worker of a DSA-indexer model"
    if swa_hint:
        return ["sglang-dsv4"], "hybrid SWA usage fields in the log (DeepSeek-V4 style)"
    if pd_decode:
        return ["sglang-slots"], "a PD decode worker"
    return ["sglang-dsv4"], "no model or error pointed elsewhere; the DeepSeek-V4 FlashMLA profile is the default"


def split_pinned(profile: list[str]) -> tuple[list[str], str | None]:
    """``--engine`` names as ``PROFILE`` or ``PROFILE@VERSION`` (as ``check`` takes them): the profile names
    and the one version they pin (None when none does). Profiles pinned to different versions are an
    input error: a crash ran one engine version."""
    names, pins = [], []
    for spec in profile:
        name, at, version = spec.partition("@")
        if at and not version.strip():
            raise InputError("--engine", f"{spec!r}: expected PROFILE@VERSION, got no version after '@'")
        names.append(name.strip())
        if at:
            pins.append(version.strip())
    if len(set(pins)) > 1:
        raise InputError("--engine", f"profiles pinned to different versions ({', '.join(profile)}): a crash ran one "
                                     "engine version; name it once, e.g. sglang-dsv4@0.5.23,sglang-slots")
    return names, (pins[0] if pins else None)


def versions_to_try(user_version: str | None, era: Era | None,
                    entry_point: str | None = None) -> tuple[list[str | None], bool | None, str]:
    """Profile versions to evaluate, whether Prefill lines follow their forward, and why."""
    if user_version:
        v = parse_version(user_version)
        return [".".join(str(x) for x in v[:3])], after_forward_for_version(v), f"--sglang-version {user_version}"
    if era is None and entry_point_releases(entry_point):
        rel = entry_point_releases(entry_point)
        return list(rel), None, f"{entry_point} exists up to SGLang {rel[-1]} (rules/bisect.json entry_point_release)"
    if era is None:
        return [None], None, "no scheduler lines to date the log; profiles' default versions"
    return era_releases(era.label), era.after_forward, f"line format {era.label}: SGLang {era.versions}"


def versions_known(profile: list[str], versions: list[str | None]) -> tuple[list[str | None], list[str]]:
    """``(kept, dropped)``: the releases every one of the profiles has a version for, and the others.
    When none is known all are kept (the checker then says which version is missing)."""
    def known(v: str | None) -> bool:
        try:
            for p in profile:
                resolve_version(p, v)
        except InputError:
            return False
        return True

    kept = [v for v in versions if known(v)]
    if not kept:
        return list(versions), []
    return kept, [v for v in versions if v is not None and v not in kept]
