"""Knowledge as data: GPU profiles, kernel generations, engine profiles and rule metadata.

The JSON files in this package are loaded by :mod:`validate_batch.facts.knowledge`; adding a GPU or a kernel
release is a data change here, not a code change.
"""
