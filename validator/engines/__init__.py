"""Engine profiles, one module each; ``rules/engines.json`` names them and holds their data.

A profile entry's ``module`` names the module here that implements it (its ``PROFILE``); adding a
profile is a data entry plus one module.

Owns: one module per profile (its configuration part, step derivation, the quantities it provides and their
bounds), the one row counter of a forward, chunked prefill as the engine forms its steps, and the engine
rules (``SGL``, ``SLOT``). May import: ``facts``, ``inputs``, the kernel families (``flashmla``,
``flashinfer``, ``deepgemm``), and ``legality.registry`` / ``legality.report`` to register its rules.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import import_module

from ..errors import InputError
from ..facts.knowledge import load
from ..facts.provenance import record_kind
from .base import BatchPlan, DerivedCall, Profile
from .versions import judged_label, release_key, releases, resolve_version


def profile_names() -> list[str]:
    return list(load("engines")["profiles"])


@lru_cache(maxsize=None)
def get_profile(name: str) -> Profile:
    """The profile object of a profile name (as :func:`validate_batch.inputs.batch.parse_engine` resolved it)."""
    entry = load("engines")["profiles"].get(name)
    if entry is None:
        raise InputError("engine", f"unknown engine profile {name!r}; known: {', '.join(profile_names())}")
    return import_module(f"{__name__}.{entry['module']}").PROFILE


def engine_family(name: str) -> str:
    """The engine a profile models (``sglang`` or ``vllm``), from its entry's ``engine``."""
    entry = load("engines")["profiles"].get(name, {})
    return entry.get("engine", name.split("-", 1)[0])


def provided_by(names) -> frozenset:
    """The per-step quantities the named profiles provide together (``rows``, ``slots``)."""
    return frozenset().union(*(get_profile(n).provides for n in names)) if names else frozenset()


@record_kind("engine")
def _engine_record(name: str) -> dict:
    """``PROFILE@VERSION``: the profile's record with its version's entry over it (where the engine
    rules' facts live)."""
    profile, _, version = name.partition("@")
    return {**load("engines")["profiles"][profile], **resolve_version(profile, version or None)}


__all__ = ["BatchPlan", "DerivedCall", "Profile", "engine_family", "get_profile", "profile_names", "provided_by",
           "judged_label", "release_key", "releases", "resolve_version"]
