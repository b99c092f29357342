"""The activation family: the MLP activations exporters write (GELU in its erf and tanh forms,
QuickGELU, SiLU; spelled out in any order, or the standard Gelu / Swish ops) and the gated forms
built on them (SwiGLU, GeGLU: two projections or the halves of one). Two passes: the element-wise
activations first (spelled.py, onnx_op.py), then the gates over what they made (gated.py).
Contract in docs/ops.md, "Activation family"."""

from otfuse.fusions.activation import gated, onnx_op, spelled
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass

FAMILY = Family(
    name="activation",
    passes=(RulePass(spelled.RULES + onnx_op.RULES), RulePass(gated.RULES)),
    emits=("Gelu", "QuickGelu", "SiLU", "SwiGLU", "GeGLU"),
)
