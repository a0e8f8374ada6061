"""A forward as a :class:`~validate_batch.inputs.batch.Batch`, from whatever the user has.

Owns: batch documents (JSON / YAML), the command line's quick flags, SGLang and vLLM engine objects
(adapters), JSON Lines call records read in two passes. May import: ``facts``, ``errors``.
"""
