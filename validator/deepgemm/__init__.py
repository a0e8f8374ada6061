"""DeepGEMM, one kernel family: the paged MQA-logits metadata of the DSA indexer, its plan per
DeepGEMM version and caller, and the ``DG0xx`` rules. Facts live in ``rules/deepgemm.json``."""

#: the rule kind of its plans and the call record kinds it reads (here, so that the rules and the
#: record dispatch name them without loading the calls module)
RULE_KIND = "deepgemm"
KINDS = ("paged_mqa_logits_metadata",)
