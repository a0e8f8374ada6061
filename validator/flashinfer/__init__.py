"""FlashInfer, one kernel family: the trtllm-gen decode kernels (MLA and FMHA) and the MLA
``plan()``, their calls and the ``FI0xx`` rules. Facts live in ``rules/flashinfer.json``."""

#: the rule kinds of the two call families: rules over trtllm-gen decode calls and over MLA ``plan()``
#: calls (an engine profile that derives only decode calls is judged by the first kind's rules), and
#: the call record kinds it reads (here, so that the rules and the record dispatch name them without
#: loading the calls module)
TRTLLM_RULE_KIND = "flashinfer_trtllm"
PLAN_RULE_KIND = "flashinfer_mla_plan"
KINDS = ("trtllm_gen_mla", "trtllm_gen_fmha", "mla_plan")
