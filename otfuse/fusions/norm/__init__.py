"""The norm family: RMSNorm, LayerNorm and their residual-Add forms, spelled out or as the ONNX
LayerNormalization / RMSNormalization ops (rules.py; contract in docs/ops.md)."""

from otfuse.fusions.norm import rules
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass

FAMILY = Family(
    name="norm",
    passes=(RulePass(rules.RULES),),
    emits=("RMSNorm", "AddRMSNorm", "LayerNorm", "AddLayerNorm"),
)
