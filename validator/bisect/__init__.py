"""Crash-report bisection: from engine evidence to the crashing step, the rule, the boundary, the fix.

Evidence (a log scanned by :mod:`validate_batch.ingest.scan`, a crash dump, a launch command) gives, per
DP rank, the steps around the crash. From it this package builds *candidate* crashing steps as
batch documents (:mod:`.builder`, :mod:`.without_steps`, :mod:`.docs`), asks the project's checker
about them (:mod:`.evaluate`, through ``validate_batch.check``), and bisects the one quantity that varies -
query rows, slot index or batch size - to find the largest legal value (:mod:`.boundary`).
Nothing here knows a limit: every verdict and boundary comes from the checker, so a new GPU, kernel
generation or engine version is a data change elsewhere; what bisection itself assumes about
engines when the evidence is silent is read from ``rules/bisect.json`` (:mod:`.data`).

Modules, down the flow: ``results`` (what is found) <- ``boundary`` (the checker, the search) <-
``docs`` (batch documents) <- ``builder`` / ``without_steps`` (candidates) <- ``evaluate`` (verdicts)
<- ``explain`` (a rule explains a crash only when its signature matches the error line; steps the
log shows completed) <- ``fixes`` / ``consistency`` / ``vllm`` / ``kernel`` <- ``diagnose`` (the entry point).
"""
from .boundary import MAX_VALUE, BisectChecker, error_codes, find_boundary
from .builder import Builder, running_len
from .data import default_max_prefill_tokens, era_releases, in_model_family
from .diagnose import BisectOptions, diagnose
from .docs import MAX_SYNTH_REQUESTS, decode_doc, prefill_doc, server_args, spec_tokens
from .candidates import add_headroom, evaluate
from .fixes import propose_fixes
from .kernel import kernel_hook
from .engine_choice import choose_profile, versions_to_try
from .results import Boundary, Candidate, Diagnosis

__all__ = ["diagnose", "BisectOptions", "Diagnosis", "Candidate", "Boundary", "BisectChecker", "find_boundary",
           "error_codes", "MAX_VALUE", "Builder", "running_len", "prefill_doc", "decode_doc", "server_args",
           "spec_tokens", "MAX_SYNTH_REQUESTS", "choose_profile", "versions_to_try", "evaluate", "add_headroom",
           "propose_fixes", "kernel_hook", "era_releases", "default_max_prefill_tokens", "in_model_family"]
