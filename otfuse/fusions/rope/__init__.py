"""The rope family: rotary embeddings into ``RotaryEmbedding``, then q and k of one attention
paired into ``RotaryEmbeddingQK`` (contract in docs/ops.md).

    onnx_op.py     the ONNX RotaryEmbedding op (opset 23), re-targeted
    contrib.py     ORT's RotaryEmbedding (com.microsoft), re-targeted
    half_tables.py x1*c - x2*s, x1*s + x2*c on half-width tables (the ONNX op's function body)
    lane_pairs.py  interleaved rotations on explicit [..., D/2, 2] lane pairs (Meta's LLaMA)
    rotations.py   x*cos + rotate(x)*sin spelled with Slice/Split, Neg, Concat (half, interleaved,
                   partial, sections)
    pair_qk.py     the pass that pairs the q and k rotations (after every rotation is fused)

Needs the ``no_ops`` canonicaliser: the dynamo exporter's unoptimised output slices x once per use
through full Slices, so the rotated and the passed-through lanes would read two values.
"""

from otfuse.canonicalise import NoOpsPass
from otfuse.fusions.rope import contrib, half_tables, lane_pairs, onnx_op, pair_qk, rotations
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass
from otfuse.rewriter.sites import SiteSignature


def _rotate_half(scan, node) -> bool:
    """Neg of a half of x, concatenated back (directly or as a stacked pair) and multiplied by sin."""
    for concat in scan.readers(node):
        if concat.op_type == "Unsqueeze":
            concat = next((user for user in scan.readers(concat) if user.op_type == "Concat"), concat)
        if concat.op_type == "Concat" and scan.reaches(concat, {"Mul"}, {"Reshape", "Cast"}, upstream=False, depth=2):
            return True
    return False

FAMILY = Family(
    name="rope",
    passes=(RulePass([*onnx_op.RULES, *contrib.RULES]), RulePass(lane_pairs.RULES), RulePass(half_tables.RULES), RulePass(rotations.RULES), pair_qk.PairQKPass()),
    emits=("RotaryEmbedding", "RotaryEmbeddingQK"),
    canonicalise=(NoOpsPass(),),
    sites=(
        SiteSignature("a rotary embedding op", frozenset({"RotaryEmbedding"})),
        SiteSignature("rotate_half (Neg -> Concat -> * sin)", frozenset({"Neg"}), _rotate_half),
    ),
)
