"""The norm_linear family: a fused norm node and the projections that read it, in one node
(rules.py; contract in docs/ops.md). It reads the norm family's ops, so it runs after it.

Opt-in: its packed weights sit beside the initializers ORT keeps, doubling the projections'
memory, for ~1.3x at 8-32 tokens, 2x in fp16 decode, but only 1.0-1.1x in fp32 decode and at long
prompts (MLAS at this CPU's FMA peak or the memory bandwidth; bench/README.md): a trade-off to
opt into."""

from otfuse.fusions.norm_linear import rules
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass

FAMILY = Family(
    name="norm_linear",
    passes=(RulePass(rules.RULES),),
    emits=("RMSNormLinear", "AddRMSNormLinear", "LayerNormLinear", "AddLayerNormLinear"),
    opt_in=True,
)
