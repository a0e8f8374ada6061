"""Judging a candidate: its verdict under each possible engine version, and its boundary."""
from __future__ import annotations

from ..errors import InputError
from .boundary import BisectChecker, error_codes, find_boundary
from .results import Boundary, Candidate


def summarise_findings(report) -> list[dict]:
    """The report's errors as plain dicts (code, message, numbers, fix)."""
    out = []
    for f in report.findings:
        if f.is_error:
            out.append({"code": f.code, "message": f.message, "numbers": f.numbers, "fix": f.fix})
    return out


def mark_invented(c: Candidate) -> None:
    """The request ids of a reconstructed batch are made up (a log line gives counts, not ids): say so."""
    b = c.batch or {}
    ids = [r["id"] for key in ("requests", "running") for r in (b.get(key) or []) if isinstance(r, dict) and "id" in r]
    if not ids:
        return
    c.invented_ids = ids if len(ids) <= 8 else ids[:4] + ["..."] + ids[-2:]
    shown = ", ".join(c.invented_ids)
    c.assumptions.insert(0, f"invented: request ids {shown} ({len(ids)} in all) are made up; the evidence gives only counts")


def evaluate(c: Candidate, checker: BisectChecker, targets: set[str]) -> None:
    """Check the candidate under each possible engine version; keep the version most consistent with the
    error (a rule in ``targets``, the rules whose signature matches the error line, fires), then bisect
    the boundary of the varying quantity.

    Verdicts: ``illegal`` (at the likely value, or at the lower end of the range when no value is
    likely), ``partly illegal`` (only the upper part of the range breaks a rule), ``legal``. The
    candidate explains the error only through a rule in ``targets`` (``c.explains``); its other
    errors are illegal but do not explain this crash."""
    best = None
    for ver in c.versions:
        try:
            point = c.likely if c.likely is not None else c.lo
            rep_p = checker(c.make(point, ver), split=False)
            codes_p = error_codes(rep_p, None)
            rep_h, codes_h = rep_p, codes_p
            if c.hi != point:
                rep_h = checker(c.make(c.hi, ver), split=False)
                codes_h = error_codes(rep_h, None)
        except InputError as e:
            c.check_error = f"the checker rejected the reconstructed batch: {e}"
            c.verdict = "error"
            return
        if codes_p:
            verdict, codes, rep, at = "illegal", codes_p, rep_p, point
        elif codes_h:
            verdict, codes, rep, at = "partly illegal", codes_h, rep_h, c.hi
        else:
            verdict, codes, rep, at = "legal", [], rep_p, point
        match = bool(targets & set(codes))
        score = (match, {"illegal": 2, "partly illegal": 1}.get(verdict, 0))
        if ver is not None and len(c.versions) > 1:
            c.version_notes.append(f"{ver}: {verdict}" + (f" ({', '.join(codes)})" if codes else "")
                                   + f" at {at} {c.quantity}")
        if best is None or score > best[0]:
            best = (score, ver, verdict, codes, rep, at, match)
    assert best is not None
    _, ver, verdict, codes, rep, at, match = best
    c.version, c.verdict, c.codes = ver, verdict, codes
    c.findings = summarise_findings(rep)
    ctx = rep.context
    c.judged_as = list((ctx.get("judged_as") if isinstance(ctx, dict) else getattr(ctx, "judged_as", None)) or [])
    c.matches_error = match
    c.explains = [x for x in codes if x in targets]
    c.batch = c.make(at, ver)
    mark_invented(c)
    if verdict == "legal":
        return   # its headroom is only bisected when nothing explains the crash (see add_headroom)
    tcodes = set(c.explains) or set(c.codes) or None
    if at == 0:     # an empty step: the limit is a lower one (at least 1), not a largest legal value
        one_ok = not error_codes(checker(c.make(1, ver), split=False), tcodes)
        c.boundary = Boundary(c.quantity, None, 0, 0, list(codes), 1,
                              note="illegal at 0 only: an empty step must not be launched" +
                                   ("; 1 is legal" if one_ok else "; 1 is illegal too"))
    else:
        c.boundary = find_boundary(lambda v: c.make(v, ver), checker, 1, at, tcodes, c.quantity)
    try:
        full = checker(c.batch, split=True)
        if full.safe_split is not None:
            c.safe_split = full.safe_split.to_dict() if hasattr(full.safe_split, "to_dict") else full.safe_split
    except InputError:
        pass


def add_headroom(c: Candidate, checker: BisectChecker, targets: set[str]) -> None:
    """For a legal candidate: how far its quantity could grow before the error's rules (or any rule) fire."""
    if c.verdict != "legal" or c.boundary is not None:
        return
    c.boundary = find_boundary(lambda v: c.make(v, c.version), checker, 1, c.value, targets or None, c.quantity)
