"""The activation family: the MLP activations exporters write (GELU in its erf and tanh forms,
QuickGELU, SiLU, squared ReLU; spelled out in any order, or the standard Gelu / Swish ops and ORT's contrib
ones) and the gated forms built on them (SwiGLU, GeGLU: two projections or the halves of one).
Two passes: the element-wise activations first (spelled.py, onnx_op.py, relu_squared.py), then the gates over what
they made (gated.py). Contract in docs/ops.md, "Activation family"."""

from otfuse.fusions.activation import gated, onnx_op, polynomial, relu_squared, spelled
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass
from otfuse.rewriter.sites import SiteSignature

_PROJECTIONS = {"MatMul", "Gemm", "FusedMatMul"}
# What lies between a projection and an activation spelled out: its polynomial, a bias, casts, and
# the Reshape of a flattened projection (GPT-2's Conv1D is a Gemm over [B*S, D]).
_BETWEEN = set(polynomial.POLYNOMIAL_OPS) | {"Cast", "Reshape"}


def _inside_an_mlp(scan, node) -> bool:
    """A projection upstream and one downstream (the up and down projections of an MLP), through
    polynomial nodes, casts and reshapes only: not attention's soft-capping Tanh (a Softmax follows it) nor a final
    logit cap (nothing follows)."""
    return (scan.reaches(node, _PROJECTIONS, _BETWEEN, upstream=True) and
            scan.reaches(node, _PROJECTIONS, _BETWEEN, upstream=False))


FAMILY = Family(
    name="activation",
    passes=(RulePass(spelled.RULES + onnx_op.RULES + relu_squared.RULES), RulePass(gated.RULES)),
    emits=("Gelu", "QuickGelu", "SiLU", "ReluSquared", "SwiGLU", "GeGLU"),
    sites=(
        SiteSignature("an activation op", frozenset({"Gelu", "Swish", "FastGelu", "BiasGelu", "QuickGelu",
                                                     "GemmFastGelu", "BiasSplitGelu"})),
        SiteSignature("Erf / Tanh / Sigmoid between two projections (an MLP activation)",
                      frozenset(polynomial.TRANSCENDENTAL_OPS), _inside_an_mlp),
    ),
)
