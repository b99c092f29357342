"""Fold a q/k rotation into the attention that reads it: ``otfuse.Attention`` whose Q and K are
the two outputs of one ``otfuse.RotaryEmbeddingQK`` used by nothing else becomes
``otfuse.RopeAttention`` (docs/ops.md: bit for bit the pair followed by the attention).

Generic over where the two nodes came from (the ONNX ops re-targeted by rope/onnx_op.py and
attention/onnx_op.py, or any other rule), so no source needs a second pattern with the rotation in
it. The rotation's X must have the attention's Q/K rank 4 (a 3-D Q is [B, S, N*D]: the rotation
would then span all heads' lanes, not each head's)."""

from __future__ import annotations

import onnx

from otfuse.domain import OP_DOMAIN
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Absent, Either, Match, Var, op
from otfuse.rewriter.rule import Replacement, RewriteContext, Rule

FAMILY = "attention"
_MAX_INPUTS = 7  # Q, K, V, attn_bias, key_padding_mask, past_key, past_value


def _pair_output(index: int, role: str):
    return op.RotaryEmbeddingQK(Var("x0"), Var("x1"), Var("cos"), Var("sin"), _domain=OP_DOMAIN,
                                _output=index, _bind="rope", _as=role)


def _folded(q_index: int, count: int):
    rest = [Either(Var(f"in{i}"), Absent()) for i in range(3, count)]
    return op.Attention(_pair_output(q_index, "q_rot"), _pair_output(1 - q_index, "k_rot"), Var("in2"), *rest,
                        _domain=OP_DOMAIN, _bind="attention")


class RopeAttentionFoldRule(Rule):
    name = "RopeAttention(fold)"
    family = FAMILY
    anchor_ops = frozenset({"RotaryEmbeddingQK"})
    fused_op = "RopeAttention"
    kept_when_refused = "RotaryEmbeddingQK + Attention"
    pattern = Either(*(_folded(q, count) for q in (0, 1) for count in range(_MAX_INPUTS, 2, -1)))

    def produced_values(self, graph: GraphIndex, match: Match, root_value: str) -> set[str] | None:
        # The rotated q/k are interior: the pass refuses the fold when anything else reads them.
        return {name for name in match.node("attention").output if name}

    def check(self, ctx: RewriteContext, match: Match) -> str | None:
        graph = ctx.graph
        for role in ("q_rot", "k_rot"):
            if graph.rank(match.value(role)) != 4:
                return f"the rotated {role[0]} is not rank 4 (the attention reads it as [B, S, N*D])"
        return None

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        attention, rope = match.node("attention"), match.node("rope")
        q = list(rope.output).index(match.value("q_rot"))
        rotary = {a.name: onnx.helper.get_attribute_value(a) for a in rope.attribute}
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in attention.attribute}
        attributes.update(rotary_mode=rotary.get("mode", b"half").decode(), rotary_dim=rotary.get("rotary_dim", 0))
        if rotary.get("sections"):
            attributes["rotary_sections"] = list(rotary["sections"])
        inputs = [rope.input[q], rope.input[1 - q], attention.input[2], rope.input[2], rope.input[3],
                  *attention.input[3:]]
        node = ctx.fused_node("RopeAttention", inputs, list(attention.output), root, **attributes)
        return Replacement([node])


RULES: list[Rule] = [RopeAttentionFoldRule()]
