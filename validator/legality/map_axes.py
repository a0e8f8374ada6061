"""The axes a legality map (:mod:`validate_batch.legality.maps`) can run over, the pairs it maps, and
the picture formats it writes: plain data, read by the ``map`` command's help without loading the maps."""
from __future__ import annotations

#: axis name -> (what it means, default lowest value, default highest value)
AXES: dict[str, tuple[str, int, int]] = {
    "prefill_tokens": ("extend rows (new prefill tokens) of one step", 1, 24576),
    "running_decodes": ("running decodes (merged into the step under mixed chunking)", 0, 256),
    "requests": ("requests in a target-verify step", 1, 4096),
    "draft_tokens": ("speculative draft tokens per request", 1, 8),
    "b": ("query rows b of the kernel call", 1, 24576),
    "s_q": ("query tokens per row s_q of the kernel call", 1, 4),
}
#: (searched axis, row axis) -> what kind of source it needs
PAIRS: dict[tuple[str, str], str] = {
    ("prefill_tokens", "running_decodes"): "engine",
    ("requests", "draft_tokens"): "engine",
    ("b", "s_q"): "call",
}
#: the picture formats a map is saved as (by the output file's extension)
IMAGE_FORMATS = ("png", "svg")
