"""FlashMLA, one kernel family: its calls, the plan of a call (implementation, partitions, schedule,
workspace) per build, the scheduler model, and the rules over a plan (``FMLA0xx``).

The builds' facts live in ``rules/flashmla.json``; a new build is a data entry plus, at most, a
new ``num_sm_parts`` formula in :mod:`.plan`.
"""
