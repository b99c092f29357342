"""Attention whose keys the graph already holds transposed ([B, Nkv, D, S]): the permute of
[B, S, Nkv, D] straight from the head split (GPT-2's eager ``_split_heads(key, k=True)``), a graph
input, or a cache kept transposed. The chain and checks are sdpa.py's with Kᵀ given; the fused
node reads the keys in BSND, or behind a Transpose to BNSD the rewrite adds.
"""

from __future__ import annotations

import onnx

from otfuse.fusions.attention.sdpa import AttentionRule, known_shape, sdpa_chain, to_bnsd
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Either, Match, Var, attr, op
from otfuse.rewriter.rule import Replacement, RewriteContext, Rule


def _keys_from_bsnd():
    """Kᵀ straight from the head split: ``key.permute(0, 2, 3, 1)`` of [B, S, Nkv, D] (GPT-2's
    eager ``_split_heads(key, k=True)``)."""
    return op.Transpose(Var("k"), perm=[0, 2, 3, 1], _bind="k_bsnd_transpose")


class KeysTransposedBSNDRule(AttentionRule):
    """q and v ``Transpose(·, [0,2,1,3])`` of [B, S, N, D] and Kᵀ the permute of [B, S, Nkv, D]:
    the fused node reads the three in BSND (layout BSND) and the three transposes disappear."""

    name = "Attention(Kᵀ from BSND)"
    exports = ()
    pattern = sdpa_chain(to_bnsd(Var("q"), "q"), None, to_bnsd(Var("v"), "v"), keys_t=_keys_from_bsnd())

    def q_value(self, match: Match) -> str:
        return match.node("q_to_bnsd").output[0]

    def keys_read(self, match: Match) -> str:
        return match.value("k")

    def values_read(self, match: Match) -> str:
        return match.node("v_to_bnsd").output[0]

    def key_dims(self, graph: GraphIndex, match: Match) -> tuple:
        batch, seq, heads, dim = known_shape(graph, match.value("k"), 4, "k")
        return batch, heads, seq, dim

    def attributes(self, graph: GraphIndex, match: Match) -> dict:
        return {**super().attributes(graph, match), "layout": "BSND"}

    def inputs(self, match: Match) -> list[str]:
        return [match.value("q"), match.value("k"), match.value("v")]


class KeysTransposedRule(AttentionRule):
    """Kᵀ that is not the transpose of a BNSD K in the graph: the permute of [B, S, Nkv, D] (with
    q or v in another layout than BSND), or a [B, Nkv, D, S] graph input or cache kept transposed.
    The rewrite puts a Transpose to BNSD in front of the fused node."""

    name = "Attention(Kᵀ given)"
    exports = ()
    pattern = sdpa_chain(Var("q"), None, Var("v"), keys_t=Either(_keys_from_bsnd(), Var("k_t")))

    def grow(self, ctx: RewriteContext, match: Match) -> Match | None:
        """Kᵀ as any value would take every right operand (a scaled Kᵀ, a wrong transpose): only a
        graph input or a cache kept transposed (Concat along the last axis) is a candidate, the
        rest silently not (the other rules report their near misses)."""
        if not match.has("k_t"):
            return match
        node = ctx.graph.producer.get(match.value("k_t"))
        if node is None:
            return match if match.value("k_t") in ctx.graph.graph_inputs else None
        return match if node.op_type == "Concat" and attr(node, "axis") in (-1, 3) else None

    def keys_read(self, match: Match) -> str:
        return match.value("k") if match.has("k_bsnd_transpose") else match.value("k_t")

    def k_new(self, match: Match) -> str:
        return self.keys_read(match)

    def key_dims(self, graph: GraphIndex, match: Match) -> tuple:
        if match.has("k_bsnd_transpose"):
            batch, seq, heads, dim = known_shape(graph, match.value("k"), 4, "k")
        else:
            batch, heads, dim, seq = known_shape(graph, match.value("k_t"), 4, "Kᵀ")
        return batch, heads, seq, dim

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        replacement = super().rewrite(ctx, match, root)
        fused = replacement.nodes[-1]
        name = ctx.unique_name(f"{root.output[0]}/k_to_bnsd")
        perm = [0, 2, 1, 3] if match.has("k_bsnd_transpose") else [0, 1, 3, 2]
        transpose = onnx.helper.make_node("Transpose", [fused.input[1]], [name], name=name, perm=perm)
        fused.input[1] = name
        return Replacement([transpose, *replacement.nodes], replacement.initializers)


RULES: list[Rule] = [KeysTransposedBSNDRule(), KeysTransposedRule()]
