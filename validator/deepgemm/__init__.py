"""DeepGEMM, one kernel family: the paged MQA-logits metadata of the DSA indexer, its plan per
DeepGEMM version and caller, and the ``DG0xx`` rules. Facts live in ``rules/deepgemm.json``."""
