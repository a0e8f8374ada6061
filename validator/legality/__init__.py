"""The one legality model.

Owns: the rule registry and the registered rules, planning a forward through its profile and running the
rules, the bounds of a configuration derived from the rules, the one boundary search, the minimal safe
split, the whole pipeline, the report and legality maps. May import: ``facts``, ``inputs``, ``engines``,
the kernel families.
"""
