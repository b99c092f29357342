"""The rope family: rotary embeddings into ``RotaryEmbedding``, then q and k of one attention
paired into ``RotaryEmbeddingQK`` (contract in docs/ops.md).

    onnx_op.py     the ONNX RotaryEmbedding op (opset 23), re-targeted
    contrib.py     ORT's RotaryEmbedding (com.microsoft), re-targeted
    half_tables.py x1*c - x2*s, x1*s + x2*c on half-width tables (the ONNX op's function body)
    lane_pairs.py  interleaved rotations on explicit [..., D/2, 2] lane pairs (Meta's LLaMA)
    scatter_pairs.py  the same pairs written back by out[..., 0::2] = ..., out[..., 1::2] = ... (Wan)
    rotations.py   x*cos + rotate(x)*sin spelled with Slice/Split, Neg, Concat (half, interleaved,
                   partial, sections)
    pair_qk.py     the pass that pairs the q and k rotations (after every rotation is fused)

Needs the ``no_ops`` canonicaliser: the dynamo exporter's unoptimised output slices x once per use
through full Slices, so the rotated and the passed-through lanes would read two values.
"""

from otfuse.canonicalise import NoOpsPass
from otfuse.fusions.rope import contrib, half_tables, lane_pairs, onnx_op, pair_qk, rotations, scatter_pairs
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

_LANE_OPS = {"Squeeze", "Gather", "Slice", "Split"}


def _pair_source(scan, node):
    """The node a lane is taken from: up through Squeeze / Gather / Slice / Split (3 steps at most)."""
    for _ in range(3):
        if node is None or node.op_type not in _LANE_OPS:
            return node
        node = scan.parent(node)
    return None


def _lane_pair_product(scan, node) -> bool:
    """``x0*c - x1*s`` with x0 and x1 lanes of one tensor (Wan's rotation, written back into the
    even / odd lanes by ScatterND): two products each reading a lane, the lanes from one node."""
    products = scan.parents(node)
    if len(products) != 2 or any(p.op_type != "Mul" for p in products):
        return False
    sources = []
    for product in products:
        lanes = [p for p in scan.parents(product) if p.op_type in _LANE_OPS]
        sources.append({id(src) for src in map(lambda lane: _pair_source(scan, lane), lanes) if src is not None})
    return bool(sources[0] & sources[1])


FAMILY = Family(
    name="rope",
    passes=(RulePass([*onnx_op.RULES, *contrib.RULES]), RulePass(lane_pairs.RULES), RulePass(scatter_pairs.RULES), RulePass(half_tables.RULES), RulePass(rotations.RULES), pair_qk.PairQKPass()),
    emits=("RotaryEmbedding", "RotaryEmbeddingQK"),
    canonicalise=(NoOpsPass(),),
    sites=(
        SiteSignature("a rotary embedding op", frozenset({"RotaryEmbedding"})),
        SiteSignature("rotate_half (Neg -> Concat -> * sin)", frozenset({"Neg"}), _rotate_half),
        SiteSignature("a rotation of lane pairs (x0*c - x1*s, x0 and x1 lanes of one tensor)", frozenset({"Sub"}),
                      _lane_pair_product),
    ),
)
