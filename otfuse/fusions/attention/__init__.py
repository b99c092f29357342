"""The attention family: scaled dot-product attention into ``Attention``, and ``RopeAttention``
when the rope family's q/k rotation feeds only that attention (contract in docs/ops.md).

    chain.py            the chain as exporters write it (dynamo, TorchScript, eager), as patterns
    chain_checks.py     what its pieces must satisfy, the scale, softcap and mask inputs
    sdpa.py             one Layout per spelling and the analyse they share; RoPE folded in when
                        the pattern reads RotaryEmbeddingQK
    keys_transposed.py  layouts of keys the graph holds transposed (GPT-2's permute, inputs, caches)
    flat_heads.py       heads merged into the batch with an ALiBi bias (BLOOM)
    onnx_op.py          the ONNX Attention op (opset 23), re-targeted
    contrib.py          ORT's MultiHeadAttention (com.microsoft), re-targeted
    fused_matmul.py     ORT's FusedMatMul as the chain's scores (alpha joins the scale)
    fold_rope.py        the pass that folds a rotation into any Attention that reads it
    masks.py            which masks are causal / window / padding: read from their form, proven
                        by running them
    opaque_masks.py     the same claim for a mask of no form masks.py reads, from running it alone
    mask_probes.py      running a mask's (or ALiBi's) own subgraph at several sizes and paddings

Needs the ``shape_reads`` canonicaliser: TorchScript's Shape reads of the rotated q and the
repeated v would otherwise keep those interior values alive. It runs after the rope family, whose
rotations it reads through. And ``no_ops``: GPT-J's eager attention casts q, k and the
probabilities to float32, copies in a float32 model.
"""

from otfuse.canonicalise import NoOpsPass, ShapeReadsPass
from otfuse.fusions.attention import contrib, flat_heads, fold_rope, keys_transposed, onnx_op, sdpa
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass
from otfuse.rewriter.sites import SiteSignature

_SCORE_OPS = {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Tanh", "Reshape", "Transpose", "Expand"}


def _scores_softmax(scan, node) -> bool:
    """Softmax over scores from a MatMul, whose probabilities (through Cast / Dropout) multiply V."""
    return (scan.reaches(node, {"MatMul", "FusedMatMul", "Gemm"}, _SCORE_OPS, upstream=True) and
            scan.reaches(node, {"MatMul"}, {"Cast", "Dropout", "Reshape", "Identity"}, upstream=False, depth=5))

def _sink_softmax(scan, node) -> bool:
    """gpt-oss's attention sinks: Softmax over Concat(scores, a per-head logit) (through the max
    subtraction), the last column dropped by a Slice before the probabilities multiply V. Fused
    with the op's ``sinks`` input when chain_checks.sinks proves it; a site left is reported."""
    concat = scan.parent(node)
    for _ in range(3):  # Sub(·, ReduceMax(·)), Cast
        if concat is None or concat.op_type not in ("Sub", "Cast"):
            break
        concat = scan.parent(concat)
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
        return False
    if not scan.reaches(concat, {"MatMul", "FusedMatMul", "Gemm"}, _SCORE_OPS, upstream=True):
        return False
    return any(user.op_type == "Slice" or (user.op_type == "Cast" and any(
        u.op_type == "Slice" for u in scan.readers(user))) for user in scan.readers(node)) and scan.reaches(
        node, {"MatMul"}, {"Cast", "Dropout", "Reshape", "Identity", "Slice"}, upstream=False, depth=5)


FAMILY = Family(
    name="attention",
    passes=(RulePass([*sdpa.RULES, *flat_heads.RULES, *keys_transposed.RULES]), RulePass([*onnx_op.RULES, *contrib.RULES]),
            RulePass(fold_rope.RULES)),
    emits=("Attention", "RopeAttention"),
    canonicalise=(NoOpsPass(), ShapeReadsPass()),
    sites=(
        SiteSignature("an attention op", frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention"})),
        SiteSignature("MatMul -> Softmax -> MatMul", frozenset({"Softmax"}), _scores_softmax),
        SiteSignature("attention with sinks (Softmax over Concat(scores, per-head sink logits), the sink "
                      "column sliced off before the MatMul with V)", frozenset({"Softmax"}), _sink_softmax),
    ),
)
