"""What bisection assumes about engines when the evidence is silent, read from ``rules/bisect.json``
and, for the PD-decode request table, from ``rules/engines.json`` (profile ``sglang-slots``)."""
from __future__ import annotations

from ..knowledge import load


def era_releases(era_label: str) -> list[str]:
    """SGLang releases that stand for a log line format when no version was given ('latest' if unlisted)."""
    return list(load("bisect")["era_release"].get(era_label, ["latest"]))


def default_max_prefill_tokens() -> int:
    """SGLang's default ``--max-prefill-tokens``."""
    return int(load("bisect")["default_max_prefill_tokens"])


def in_model_family(family: str, model_path: str) -> bool:
    """Whether a model path contains one of the family's fragments (case is ignored)."""
    low = model_path.lower()
    return any(k in low for k in load("bisect")["model_families"][family])


def extra_slots_default(running_per_rank: int) -> tuple[int, int, int]:
    """SGLang's ``--disaggregation-decode-extra-slots`` when unset, for a running limit R per DP worker:
    ``(E, factor, max_running)`` with ``E = factor * R`` when ``R <= max_running``, else 0."""
    dflt = load("engines")["profiles"]["sglang-slots"]["defaults"]
    factor = dflt["extra_slots_default_factor"]
    lim = dflt["extra_slots_default_max_running"]
    return (factor * running_per_rank if running_per_rank <= lim else 0), factor, lim
