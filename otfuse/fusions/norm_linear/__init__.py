"""The norm_linear family: a fused norm node and the projections that read it, in one node
(rules.py; contract in docs/ops.md). It reads the norm family's ops, so it runs after it.

Opt-in: it is not faster than the unfused graph everywhere. Its CPU kernel keeps no copy of the
weights; on the Zen 3 (AVX2) measured it is never slower (fp32 and fp16, 1 to 2048 rows), but on an
AVX-512 Xeon it loses at prompt sizes (fp32 0.91x and fp16 0.81x the unfused time at 512 rows:
MLAS's prepacked AVX-512 GEMM against otfuse's in-place one) while winning at 1 and 16 rows
(bench/README.md, "Norm + Linear")"""

from otfuse.fusions.norm_linear import rules
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass

FAMILY = Family(
    name="norm_linear",
    passes=(RulePass(rules.RULES),),
    emits=("RMSNormLinear", "AddRMSNormLinear", "LayerNormLinear", "AddLayerNormLinear"),
)
