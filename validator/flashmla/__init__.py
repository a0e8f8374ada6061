"""FlashMLA, one kernel family: its calls, the plan of a call (implementation, partitions, schedule,
workspace) per build, the scheduler model, and the rules over a plan (``FMLA0xx``).

The builds' facts live in ``rules/flashmla.json``; a new build is a data entry plus, at most, a
new ``num_sm_parts`` formula in :mod:`.plan`.
"""

#: the subjects of the two tensor checks (:mod:`.tensors`): their rule kinds and record kinds (here,
#: so that the rules and the record dispatch name them without loading that module)
REUSE_KIND = "flashmla-reuse"
INDICES_KIND = "flashmla-indices"
SUBJECT_KINDS = ("sched_meta_reuse", "decode_indices")
