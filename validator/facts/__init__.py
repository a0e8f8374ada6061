"""The knowledge and the vocabulary, the bottom room.

Owns: reading the data files of ``rules/`` (GPUs, kernel builds, engine profiles, settings), the one table
of setting and forward-mode names, field validation, the input limits, and the arithmetic language the
data writes its formulas in. May import: ``errors`` only.
"""
