"""The attention family: scaled dot-product attention into ``Attention``, and ``RopeAttention``
when the rope family's q/k rotation feeds only that attention (contract in docs/ops.md).

    sdpa.py             the chain as exporters write it (dynamo, TorchScript, eager), with RoPE
                        folded in when the pattern reads RotaryEmbeddingQK
    flat_heads.py       heads merged into the batch with an ALiBi bias (BLOOM)
    keys_transposed.py  keys the graph holds transposed (GPT-2's permute, inputs, caches)
    onnx_op.py          the ONNX Attention op (opset 23), re-targeted
    fold_rope.py        the pass that folds a rotation into any Attention that reads it
    masks.py            which masks are causal / window / padding, proven by running them

Needs the ``shape_reads`` canonicaliser: TorchScript's Shape reads of the rotated q and the
repeated v would otherwise keep those interior values alive. It runs after the rope family, whose
rotations it reads through.
"""

from otfuse.canonicalise import ShapeReadsPass
from otfuse.fusions.attention import flat_heads, fold_rope, keys_transposed, onnx_op, sdpa
from otfuse.rewriter.family import Family
from otfuse.rewriter.passes import RulePass

FAMILY = Family(
    name="attention",
    passes=(RulePass([*sdpa.RULES, *flat_heads.RULES, *keys_transposed.RULES]), RulePass(onnx_op.RULES),
            RulePass(fold_rope.RULES)),
    emits=("Attention", "RopeAttention"),
    canonicalise=(ShapeReadsPass(),),
)
