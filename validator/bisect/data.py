"""What bisection assumes about engines when the evidence is silent, read from ``rules/bisect.json``
and, for the PD-decode request table, from ``rules/engines.json`` (profile ``sglang-slots``)."""
from __future__ import annotations

from typing import Callable

from ..facts.knowledge import load


def era_releases(era_label: str) -> list[str]:
    """SGLang releases that stand for a log line format when no version was given ('latest' if unlisted)."""
    return list(load("bisect")["era_release"].get(era_label, ["latest"]))


def entry_point_releases(entry_point: str | None) -> list[str]:
    """SGLang releases that stand for a non-server command (``sglang.bench_one_batch``), or []."""
    return list(load("bisect")["entry_point_release"].get(entry_point or "", []))


def bench_defaults(entry_point: str) -> dict:
    """A benchmark entry point's own flags and their defaults (``rules/bisect.json`` ``bench_flags``)."""
    return dict(load("bisect")["bench_flags"][entry_point])


def default_max_prefill_tokens() -> int:
    """SGLang's default ``--max-prefill-tokens``."""
    return int(load("bisect")["default_max_prefill_tokens"])


def in_model_family(family: str, model_path: str) -> bool:
    """Whether a model path contains one of the family's fragments (case is ignored)."""
    low = model_path.lower()
    return any(k in low for k in load("bisect")["model_families"][family])



def vllm_profile_for(model_path: str, in_family: Callable[[str, str], bool]) -> str:
    """The vLLM engine profile that judges a model (``rules/bisect.json`` ``vllm_profiles``: the first
    family the model is in, else ``default``)."""
    table = load("bisect")["vllm_profiles"]
    for fam, name in table["by_family"].items():
        if model_path and in_family(fam, model_path):
            return name
    return table["default"]
