"""The norm family: RMSNorm, LayerNorm and their residual-Add forms, spelled out or as the ONNX
LayerNormalization / RMSNormalization ops (rules.py), or as ORT's (Skip)(Simplified)LayerNormalization
(contrib.py; contract in docs/ops.md)."""

from otfuse.fusions.norm import contrib, rules
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass
from otfuse.rewriter.sites import SiteSignature


def _squared_mean(scan, node) -> bool:
    """ReduceMean(x*x) or ReduceMean(Pow(x, 2)) whose result goes through Add (eps) into Sqrt
    (or a Pow: Gemma 3n's ``pow(mean + eps, -0.5)``): the RMS of x, or the variance of a centred x."""
    square = scan.parent(node)
    if square is None or square.op_type not in ("Pow", "Mul"):
        return False
    if square.op_type == "Mul" and square.input[0] != square.input[1]:
        return False
    return scan.reaches(node, {"Sqrt", "Rsqrt", "Pow"}, {"Add", "Cast"}, upstream=False, depth=3)

FAMILY = Family(
    name="norm",
    passes=(RulePass([*rules.RULES, *contrib.RULES]),),
    emits=("RMSNorm", "AddRMSNorm", "LayerNorm", "AddLayerNorm"),
    sites=(
        SiteSignature("a normalisation op", frozenset({
            "LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
            "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})),
        SiteSignature("a mean of squares under a square root or a power (RMS or variance)", frozenset({"ReduceMean"}),
                      _squared_mean),
    ),
)
