"""Everything a person or a program reads: the one output object (human, json, quiet), the CI
formats (JSON Lines, GitHub annotations, JUnit, SARIF) and schemas, rich rendering, ``explain`` and the
split in words. May import: ``facts``, ``legality`` (reports), nothing that computes a verdict.
"""
