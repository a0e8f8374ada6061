"""The project's rules, registered: the registry with every rule module imported.

Code that runs or lists rules imports them from here (the rule modules import the registry, this
module imports them, so nothing runs in a circle).
"""
from __future__ import annotations

from ..deepgemm import rules as _deepgemm_rules  # noqa: F401  (registration)
from ..flashinfer import rules as _flashinfer_rules  # noqa: F401  (registration)
from ..flashmla import partition_rules as _flashmla_partition_rules  # noqa: F401  (registration)
from ..flashmla import rules as _flashmla_rules  # noqa: F401  (registration)
from ..engines import rules as _engine_rules  # noqa: F401  (registration)
from .registry import (
                       QUANTITIES,
                       REGISTRY,
                       STATE,
                       Rule,
                       all_rules,
                       all_signatures,
                       forward_rules,
                       revision,
                       get_rule,
                       rule,
                       rules_for,
                       run_rules,
                       rows_rules,
                       shape_rules,
                       silent_rows,
                       unregister,
)

__all__ = ["QUANTITIES", "REGISTRY", "STATE", "Rule", "all_rules", "all_signatures", "forward_rules", "revision", "get_rule", "rule", "rules_for", "run_rules",
           "rows_rules", "shape_rules", "silent_rows", "unregister"]
