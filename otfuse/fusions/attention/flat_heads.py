"""Eager attention on [B*N, S, D] tensors with an ALiBi bias (BLOOM's ``baddbmm``): the heads are
merged into the batch for the two bmm, the bias is added to the [B*N, Sq, Skv] scores, and the
padding/causal mask after splitting the heads again. Fused into ``Attention`` with the ALiBi bias
(viewed as [B, N, 1, Skv]) plus the mask as ``attn_bias``, the checks and mask claim of sdpa.py.
"""

from __future__ import annotations

import onnx

from otfuse.fusions.attention.sdpa import AttentionRule, BiasBuilder, known_shape, scaled
from otfuse.rewriter import checks
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Either, Match, Var, op
from otfuse.rewriter.rule import Refuse, Replacement, RewriteContext, Rule


def _merged_heads(tag: str):
    """[B, N, S, D] reshaped to [B*N, S, D]."""
    return op.Reshape(Var(tag), Var(f"{tag}_flat_shape"), _bind=f"{tag}_flat")


def _flat_attention():
    keys_t = op.Transpose(_merged_heads("k"), perm=[0, 2, 1], _bind="k_transpose3")
    scores = scaled(op.MatMul(scaled(_merged_heads("q"), "q"), keys_t, _bind="qk"), "scores")
    biased = Either(op.Add(scores, Var("alibi")), scores)
    scores4 = op.Reshape(biased, Var("scores_shape"), _bind="scores_unflat")
    probs = op.Softmax(Either(op.Add(scores4, Var("mask")), scores4), _bind="softmax")
    probs3 = op.Reshape(probs, Var("probs_shape"), _bind="probs_flat")
    out = op.Reshape(op.MatMul(probs3, _merged_heads("v"), _bind="pv"), Var("out_shape"), _bind="out_unflat")
    return Either(op.Transpose(out, perm=[0, 2, 1, 3], _bind="out_transpose"), out)


class FlatHeadsAttentionRule(AttentionRule):
    """BLOOM-style eager attention: heads merged into the batch for bmm, an ALiBi bias added to
    the [B*N, Sq, Skv] scores, the padding/causal mask added after splitting heads again."""

    name = "Attention(flat heads, ALiBi)"
    exports = ()
    pattern = _flat_attention()

    def attributes(self, graph: GraphIndex, match: Match) -> dict:
        q, k, v = match.value("q"), match.value("k"), match.value("v")
        batch, heads, q_len, head_dim = known_shape(graph, q, 4, "q")
        _, kv_heads, kv_len, k_dim = known_shape(graph, k, 4, "k")
        _, v_heads, v_len, v_dim = known_shape(graph, v, 4, "v")
        loose = checks.not_static(heads=heads, head_size=head_dim, kv_heads=kv_heads, v_head_size=v_dim)
        if loose:
            raise Refuse(f"head counts and head sizes must be static: {loose}")
        if kv_heads != heads or v_heads != heads or k_dim != head_dim:
            raise Refuse("flat-heads attention needs q, k and v with the same heads")
        elem = graph.elem_type(q)
        if elem not in checks.FLOAT_TYPES or graph.elem_type(k) != elem or graph.elem_type(v) != elem:
            raise Refuse("q, k and v must share one float type")
        for tag in ("q", "k", "v"):  # [B, N, S, D] -> [B*N, S, D]: only the two leading dims merge
            source = graph.shape(match.value(tag))
            flat = checks.reshaped_dims(graph, match.node(f"{tag}_flat"))
            if flat is None or len(flat) != 3 or not checks.shapes_equal(flat[1:], source[2:]):
                raise Refuse(f"{tag} is reshaped to {flat}, not [B*N, S, D] "
                             f"({checks.shape_mismatch(None if flat is None else flat[1:], source[2:])})")
        expected = {"scores_unflat": (4, [batch, heads, q_len, None]),
                    "out_unflat": (4, [batch, heads, q_len, v_dim])}
        for bind, (rank, dims) in expected.items():
            got = checks.reshaped_dims(graph, match.node(bind))
            if got is None or len(got) != rank or not all(
                    want is None or checks.dims_equal(have, want) for have, want in zip(got, dims)):
                raise Refuse(f"{bind} reshapes to {got}, not {dims}")
        probs_flat = checks.reshaped_dims(graph, match.node("probs_flat"))
        if probs_flat is None or len(probs_flat) != 3 or not checks.dims_equal(probs_flat[1], q_len):
            raise Refuse(f"the probabilities are reshaped to {probs_flat}, not [B*N, Sq, Skv]")
        self._check_softmax(graph, match)
        if match.has("alibi"):
            alibi = graph.shape(match.value("alibi"))
            if alibi is None or len(alibi) != 3 or alibi[1] != 1:
                raise Refuse(f"the ALiBi bias has shape {alibi}, not [B*N, 1, Skv]")
        if match.has("mask"):
            self._check_mask(graph, match.value("mask"), (batch, heads, q_len, kv_len))
        return {"num_heads": heads, "kv_num_heads": heads, "scale": self._scale(graph, match),
                "layout": "BNSD", "output_layout": "BSND" if match.has("out_transpose") else "BNSD"}

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        """attn_bias = ALiBi as [B, N, 1, Skv] (+ the mask): one bias, as the graph added both."""
        attributes = self.attributes(ctx.graph, match)
        bias = BiasBuilder(ctx, root)
        if match.has("alibi"):
            alibi = match.value("alibi")  # [B*N, 1, Skv] -> [B, N, 1, Skv]
            tail = bias.node("Slice", [bias.node("Shape", [alibi]), bias.ints([1]), bias.ints([3])])
            shape = bias.node("Concat", [bias.ints([-1, attributes["num_heads"]]), tail], axis=0)
            bias.value = bias.node("Reshape", [alibi, shape])
        mask, padding = self.mask_inputs(ctx, match, attributes)
        if mask:
            bias.value = bias.node("Add", [bias.value, mask]) if bias.value else mask
        inputs = [match.value("q"), match.value("k"), match.value("v"), bias.value or "", padding]
        while inputs and not inputs[-1]:
            inputs.pop()
        fused = ctx.fused_node("Attention", inputs, [root.output[0]], root, **attributes)
        return bias.replacement(fused)


RULES: list[Rule] = [FlatHeadsAttentionRule()]
