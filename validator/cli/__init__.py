"""The commands (``check``, ``metadata``, ``explain``, ``rules``, ``gpus``, ``builds``, ``bisect``,
``kernel-check``, ``map`` ...): parsing, then one call into the rooms below, then ``output``. Nothing below
imports it.
"""
