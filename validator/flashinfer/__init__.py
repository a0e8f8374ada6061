"""FlashInfer, one kernel family: the trtllm-gen decode kernels (MLA and FMHA) and the MLA
``plan()``, their calls and the ``FI0xx`` rules. Facts live in ``rules/flashinfer.json``."""
