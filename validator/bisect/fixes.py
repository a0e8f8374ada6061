"""Settings that keep the crashing quantity within its boundary, each verified by the checker."""
from __future__ import annotations

from ..errors import InputError
from ..ingest.launch import EngineConfig
from ..engines import provided_by
from .boundary import BisectChecker
from .docs import prefill_doc, server_args, spec_tokens
from .results import Candidate


def power_of_two_at_most(n: int) -> int:
    """The largest power of two <= n (1 for n < 2)."""
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def propose_fixes(c: Candidate, cfg: EngineConfig, checker: BisectChecker, profile: list[str]) -> list[dict]:
    """Settings that keep the crashing quantity at or below the boundary, each verified by the checker."""
    b = c.boundary
    fixes: list[dict] = []
    if b is None or b.largest_legal is None:
        return fixes
    L = b.largest_legal
    ver = c.version
    dp = cfg.attn_dp_size

    def verify(doc: dict) -> bool:
        try:
            return checker(doc, split=False).legal
        except InputError:
            return False

    if c.kind == "prefill":
        mixed = bool(cfg.get("enable_mixed_chunk", False))
        R = cfg.running_limit_per_rank() or 0
        cap = L - (R if mixed else 0)
        if cap >= 1:
            for val, why in ((cap, "the largest legal chunk"), (power_of_two_at_most(cap), "a round value below it")):
                worst = c.make(val, ver)
                if mixed and R:
                    worst = prefill_doc(profile, ver, checker.gpu, server_args(cfg, enable_mixed_chunk=True), 1, val,
                                        0, R, 1024, f"worst case: {val}-token chunk + {R} merged decodes")
                flag_val = val * dp
                fix = {"flag": "--chunked-prefill-size", "value": flag_val,
                       "why": f"{why}: every extend forward then has <= {val} new tokens per rank"
                              + (f" (+ {R} merged decodes)" if mixed else "")
                              + (f"; the flag is divided by the attention-DP width {dp}" if dp > 1 else ""),
                       "verified": verify(worst)}
                if not any(f["flag"] == fix["flag"] and f["value"] == flag_val for f in fixes):
                    fixes.append(fix)
            fixes.append({"flag": "--max-prefill-tokens", "value": cap,
                          "why": "keeps a whole prefill batch within the limit (chunking must stay on: "
                                 "without it one long prompt exceeds any max-prefill-tokens)",
                          "verified": verify(c.make(cap, ver))})
        if "rows" in provided_by(profile) and ver not in (None, "latest"):
            try:
                up = checker(c.make(c.value if c.verdict != "partly illegal" else c.hi, "latest"), split=False)
                fixes.append({"flag": "(upgrade)", "value": "an SGLang build with sparse-prefill routing",
                              "why": "large extend forwards go to flash_mla_sparse_fwd; forwards just above the "
                                     "limit may still reach the decode kernel (see SGL001)",
                              "verified": up.legal})
            except InputError:
                pass
    elif c.kind in ("decode", "verify"):
        spec = spec_tokens(cfg) if c.kind == "verify" else 1
        per_rank = L
        fixes.append({"flag": "--max-running-requests", "value": per_rank * dp,
                      "why": f"at most {per_rank} requests per rank decode at once"
                             + (f" ({per_rank} x {spec} draft tokens = {per_rank * spec} rows)" if c.kind == "verify" else ""),
                      "verified": verify(c.make(per_rank, ver))})
    elif c.kind == "slot":
        R = cfg.running_limit_per_rank()
        pd = str(cfg.get("disaggregation_mode", "") or "").lower() == "decode"
        if pd and R is not None and L >= R:
            e_new = L - R
            doc = c.make(max(R + e_new, 1), ver)
            doc["server_args"] = {**doc["server_args"], "disaggregation_decode_extra_slots": e_new}
            fixes.append({"flag": "--disaggregation-decode-extra-slots", "value": e_new,
                          "why": f"live slots then stay <= R + E = {R + e_new}, inside every slot-indexed buffer "
                                 "(a stopgap: it limits PD pre-allocation)", "verified": verify(doc)})
        if "slots" in provided_by(profile) and "SLOT002" in c.codes:
            doc = c.make(c.value, "latest")
            fixes.append({"flag": "(upgrade)", "value": "an SGLang build whose slot-indexed buffers are sized from the request table",
                          "why": "the NextN draft's DSA tails get table rows + 1 rows", "verified": verify(doc)})
    # What each broken rule itself says to do (engine-side fixes; not settings the checker can try).
    seen = set()
    for f in c.findings:
        if f.get("fix") and f["code"] not in seen:
            seen.add(f["code"])
            fixes.append({"flag": f"({f['code']})", "value": f["fix"], "why": "the rule's own advice", "verified": None})
    return fixes
