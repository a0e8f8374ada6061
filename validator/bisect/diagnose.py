"""From engine evidence to the crashing step, the rule, the boundary and the fix."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import InputError
from ..ingest.crash_dump import CrashDump
from ..ingest.crash_lines import ErrorEvent
from ..ingest.launch import EngineConfig
from ..ingest.scan import LogEvidence
from ..engines import get_profile, provided_by, resolve_version
from .boundary import BisectChecker
from .builder import Builder
from .consistency import budget_check, cross_check, survival_check
from .candidates import add_headroom, evaluate
from .attribution import LIBRARY_NAMES, build_explanation, completed_reason, error_targets
from .fixes import propose_fixes
from .kernel import kernel_hook
from .engine_choice import backend_profile, choose_profile, split_pinned, versions_known, versions_to_try
from .results import Candidate, Diagnosis
from .vllm import diagnose_vllm, diagnose_vllm_without_dump, engine_of, vllm_profile_note
from .deduction import deduced_candidates
from .without_steps import candidates_without_steps


@dataclass
class BisectOptions:
    """What the user said: engine version, profile(s), GPU, kernel generation, rank, kernel mode."""

    sglang_version: str | None = None
    engine: list[str] | None = None
    gpu: Any = None
    kernel_gen: str | None = None
    rank: str | None = None
    kernel: bool = False
    kernel_console: Any = None
    keep_code: Callable[[str], bool] | None = None   # --select / --ignore: which rule codes count


def _ranks_to_check(ev: LogEvidence, err: ErrorEvent | None, want: str | None) -> list[str]:
    ranks = sorted(ev.ranks)
    if want:
        w = want.upper() if want.upper().startswith("DP") else f"DP{want}"
        if w not in ev.ranks:
            raise InputError("--rank", f"no scheduler lines for {w} in the log; ranks seen: {', '.join(ranks) or 'none'}")
        return [w]
    if err is not None and err.rank is not None and err.rank in ev.ranks:
        return [err.rank] + [r for r in ranks if r != err.rank]
    return ranks


def diagnose(evidence: LogEvidence | None, cfg: EngineConfig, dump: CrashDump | None = None,
             opts: BisectOptions | None = None) -> Diagnosis:
    """From the evidence and the settings to the crashing step, the rule, the boundary and the fixes."""
    opts = opts or BisectOptions()
    notes: list[str] = []
    err = evidence.root_error() if evidence is not None else None
    engine, why_engine = engine_of(evidence, cfg, dump)
    if why_engine:
        notes.append(why_engine)
    checker = BisectChecker(opts.gpu, opts.kernel_gen, opts.keep_code)
    targets, sigs = error_targets(err, opts.kernel_gen)

    if evidence is not None and evidence.vllm_steps and not evidence.ranks:
        notes.append(vllm_profile_note(cfg))
        return diagnose_vllm(evidence, cfg, err, checker, notes, targets, sigs, opts.kernel_gen)
    if engine == "vllm":
        return diagnose_vllm_without_dump(evidence, cfg, err, notes, sigs, opts.kernel_gen)

    profile, why_profile = choose_profile(cfg, err, opts.engine, evidence)
    profile, pinned = split_pinned(profile)
    era = evidence.era() if evidence is not None else None
    versions, after, vbasis = versions_to_try(opts.sglang_version, era, cfg.entry_point)
    if pinned is not None:
        for name in profile:
            resolve_version(name, pinned)       # an unknown version is an input error, never a guess
        versions, after, vbasis = [pinned], None, f"--engine names version {pinned}"
    versions, dropped = versions_known(profile, versions)
    if dropped:
        notes.append(f"profile {', '.join(profile)} has no version for SGLang {', '.join(dropped)} (the releases that "
                     f"stand for this log's format): checked as {', '.join(str(v) for v in versions)} only")
    eras_seen = list(evidence.era_examples.values()) if evidence is not None else []
    clash = any(not a.compatible(b) for a in eras_seen for b in eras_seen)
    if clash and not opts.sglang_version:
        notes.append(f"the log mixes line formats {dict(evidence.eras)}: the most recent one ({era.label if era else '?'}) "
                     "decides; pass --sglang-version to be sure")
    if after is None and not opts.sglang_version and evidence is not None and evidence.ranks:
        notes.append("the print order of this log's Prefill lines is not known for its version: both the last "
                     "logged batch and the next one are checked (pass --sglang-version to decide)")
    notes.append(f"engine profile {', '.join(profile)}: {why_profile}")
    b = Builder(cfg, profile, opts.gpu, versions, after, notes)
    cands: list[Candidate] = []
    quantity = err.quantity if err is not None else None

    if evidence is not None and evidence.ranks:
        for rank in _ranks_to_check(evidence, err, opts.rank):
            tl = evidence.ranks[rank]
            cut = err.line_no if err is not None else None
            p = tl.last("prefill", cut)
            d = tl.last("decode", cut)
            if quantity == "slot" or (quantity is None and provided_by(profile) == {"slots"}):
                sc = b.slot_step(rank, d, err)
                if sc:
                    cands.append(sc)
                continue
            p_last = p is not None and (d is None or p.line_no > d.line_no)
            if after is False or after is None:
                if p is not None:
                    done = completed_reason(tl, p, cut, cfg)
                    pc = b.prefill_logged(rank, p, exact=p_last and after is False and done is None,
                                          label=f"the last logged prefill (line {p.line_no}), printed before its forward"
                                          if after is False else f"the last logged prefill (line {p.line_no})")
                    pc.completed = done
                    cands.append(pc)
            if after is True or after is None:
                nc = b.prefill_next(rank, p, tl)
                if nc:
                    cands.append(nc)
            dc = b.decode_step(rank, p, d)
            if dc:
                if after is False and p_last:
                    dc.basis.append("less likely: the last line before the crash is a Prefill line")
                cands.append(dc)
            if "slots" in provided_by(profile) and quantity != "rows":
                sc = b.slot_step(rank, d, err)
                if sc:
                    cands.append(sc)
    else:
        cands.extend(candidates_without_steps(b, cfg, err, dump, notes))

    for c in cands:
        evaluate(c, checker, targets)
    explained = _pick(cands, err)
    if explained is None and err is not None and err.kind == "index_oob" and "slots" in provided_by(profile):
        rank = err.rank if evidence is not None and err.rank in evidence.ranks else (
            next(iter(_ranks_to_check(evidence, err, opts.rank)), "DP0") if evidence is not None and evidence.ranks
            else "DP0")
        d_step = evidence.ranks[rank].last("decode", err.line_no) if evidence is not None and rank in evidence.ranks else None
        for c in deduced_candidates(b, err, rank, d_step, notes):
            evaluate(c, checker, targets)
            cands.append(c)
        explained = _pick(cands, err)
    if explained is None:
        for c in [c for c in cands if not c.completed][:3]:
            add_headroom(c, checker, targets)
    if explained is None and err is not None and err.kind == "index_oob":
        n_, m_ = err.numbers["index"], err.numbers["size"]
        notes.append(f"the error itself says: index {n_} into a buffer of {m_} rows, so the largest legal index there is "
                     f"{m_ - 1} (over by {n_ - m_ + 1}); give the settings (--launch / --server-arg "
                     "max_running_requests=..., disaggregation_decode_extra_slots=...) to name the buffer and check it")
    if explained is None and cands and not any(c.is_illegal for c in cands):
        notes.append("no candidate step breaks a rule the model knows: the crash is not explained by the "
                     "checker (the settings may be incomplete - pass --launch / --server-arg - or the cause is "
                     "outside the modelled limits)")
    lib = (err.owner or err.numbers.get("library")) if err is not None else None
    if lib and lib not in ("flashmla", "cutlass", "sglang", "vllm") and explained is None and not any(
            k.startswith(lib) for p in profile for k in get_profile(p).call_kinds):
        src = f" ({err.numbers['owner_from']})" if err.numbers.get("owner_from") else ""
        notes.append(f"the error comes from {LIBRARY_NAMES.get(lib, lib)}{src}, not from FlashMLA: profile "
                     f"{', '.join(profile)} models FlashMLA calls, so only a rule whose signature names "
                     f"{LIBRARY_NAMES.get(lib, lib)} can explain it")
    if err is not None and err.numbers.get("prose"):
        notes.append(f"line {err.line_no} describes an error in words, not as the engine printed it: low-confidence "
                     "evidence, matched by no rule's signature; paste the error line itself (with its traceback)")
    backend = cfg.get("attention_backend")
    if (isinstance(backend, str) and backend and "flashmla" not in backend.lower() and "dsv4" not in backend.lower()
            and backend_profile(cfg) not in profile):
        notes.append(f"the server runs --attention-backend {backend}: verdicts of FlashMLA rules describe FlashMLA's "
                     "kernels, not this backend's")
    fixes = propose_fixes(explained, cfg, checker, profile) if explained is not None else []
    if explained is not None and explained.boundary is not None and err is not None:
        cross_check(explained, err, notes)
    if evidence is not None:
        survival_check(evidence, explained, after, notes)
        budget_check(evidence, b, notes)
    if err is None and evidence is not None:
        notes.append("no error line found: the log may end before the crash; the verdicts are for the last steps logged")
    diag = Diagnosis(engine or "sglang", profile, err, after, vbasis, cands, explained, fixes, cfg, evidence, dump, notes)
    diag.explanation = build_explanation(cands, explained, err, sigs, opts.kernel_gen)
    if opts.kernel:
        diag.kernel = kernel_hook(explained, checker, opts.kernel_console)
    return diag


def _pick(cands: list[Candidate], err: ErrorEvent | None) -> Candidate | None:
    """The candidate that explains the crash: it breaks a rule whose signature matches the error line
    (never a step the log shows completed), at its likely value rather than only at the top of its
    range, exact rather than reconstructed. Without such a rule nothing explains the crash."""
    illegal = [c for c in cands if c.is_illegal and c.matches_error and not c.completed]
    if not illegal:
        return None
    err_rank = err.rank if err is not None else None
    return max(illegal, key=lambda c: (c.matches_error, c.rank == err_rank, c.verdict == "illegal", c.exact,
                                       c.likely is not None, -cands.index(c)))
