"""The norm_linear family: a fused norm node and the projections that read it, in one node
(rules.py; contract in docs/ops.md). It reads the norm family's ops, so it runs after it.

Opt-in until it is measured on every CPU kind: its CPU kernel keeps no copy of the weights and on
the Zen 3 (AVX2) measured it is never slower than the unfused graph (fp32 and fp16, 1 to 2048 rows;
bench/README.md, "Norm + Linear"), but its own GEMM has AVX2 kernels only, and on full-width AVX-512
CPUs MLAS may win at long prompts: unmeasured."""

from otfuse.fusions.norm_linear import rules
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass

FAMILY = Family(
    name="norm_linear",
    passes=(RulePass(rules.RULES),),
    emits=("RMSNormLinear", "AddRMSNormLinear", "LayerNormLinear", "AddLayerNormLinear"),
    opt_in=True,
)
