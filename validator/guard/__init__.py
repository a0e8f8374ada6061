"""The per-step guard an engine runs before dispatch: ``Checker``, ``Verdict`` and headroom, read off
the legality model's bounds. May import: ``facts``, ``inputs``, ``engines``, ``legality``, the kernel
families.
"""
