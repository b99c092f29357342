"""The norm_linear family: a fused norm node and the projections that read it, in one node
(rules.py; contract in docs/ops.md). It reads the norm family's ops, so it runs after it.

A default family since session 20: no slower than the unfused graph on the models and row
counts of bench/norm_linear_models.py (bench/README.md, "norm_linear, the default flip, session
20"). ``--skip norm_linear`` leaves it out. The ``ort`` and ``onnx`` targets have no op for its
nodes, so their default families leave it out (an explicit ``--only norm_linear`` gives each
site back with the reason). Its CPU kernels keep no extra copy of the weights (bench/README.md,
"Norm + Linear"; docs/ops.md, "Norm + Linear family")."""

from otfuse.fusions.norm_linear import rules
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass

FAMILY = Family(
    name="norm_linear",
    passes=(RulePass(rules.RULES),),
    emits=("RMSNormLinear", "AddRMSNormLinear", "LayerNormLinear", "AddLayerNormLinear"),
)
