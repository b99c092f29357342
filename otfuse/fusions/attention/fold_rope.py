"""Fold a q/k rotation into the attention that reads it: ``otfuse.Attention`` whose Q and K are
the two outputs of one ``otfuse.RotaryEmbeddingQK`` used by nothing else becomes
``otfuse.RopeAttention`` (docs/ops.md: bit for bit the pair followed by the attention).

Generic over where the two nodes came from (the ONNX ops re-targeted by rope/onnx_op.py and
attention/onnx_op.py, or any other rule), so no source needs a second pattern with the rotation in
it. The rotation's X must have the attention's Q/K rank 4 (a 3-D Q is [B, S, N*D]: the rotation
would then span all heads' lanes, not each head's)."""

from __future__ import annotations

from otfuse import ops
from otfuse.domain import OP_DOMAIN
from otfuse.rewriter.pattern import Absent, Either, Match, Var, attributes, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule

FAMILY = "attention"


def _pair_output(index: int, role: str):
    return op.RotaryEmbeddingQK(Var("x0"), Var("x1"), Var("cos"), Var("sin"), _domain=OP_DOMAIN,
                                _output=index, _bind="rope", _as=role)


def _folded(q_index: int):
    """otfuse.Attention reading the pair's q and k, with any of its optional inputs."""
    optional = [Either(Var(name), Absent()) for name in ("attn_bias", "key_padding_mask", "past_key", "past_value")]
    return op.Attention(_pair_output(q_index, "q_rot"), _pair_output(1 - q_index, "k_rot"), Var("v"), *optional,
                        _domain=OP_DOMAIN, _bind="attention", _optional_tail=True)


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    graph = ctx.graph
    for role in ("q_rot", "k_rot"):
        if graph.rank(match.value(role)) != 4:
            raise Refuse(f"the rotated {role[0]} is not rank 4 (the attention reads it as [B, S, N*D])")
    attention, rope = match.node("attention"), match.node("rope")
    foreign = sorted(set(attributes(attention)) - {a.name for a in ops.Attention.attributes})
    if foreign:
        raise Refuse(f"the Attention node has attributes docs/ops.md does not define: {foreign}")
    q = list(rope.output).index(match.value("q_rot"))
    rotary = attributes(rope)
    named = {name: match.value(name) for name in ("attn_bias", "key_padding_mask", "past_key", "past_value")
             if match.has(name)}
    outputs = dict(zip(ops.RopeAttention.output_names(), attention.output))
    extra = {"rotary_sections": list(rotary["sections"])} if rotary.get("sections") else {}
    call = ops.RopeAttention(Q=rope.input[q], K=rope.input[1 - q], V=attention.input[2], cos=rope.input[2],
                             sin=rope.input[3], **named, **outputs, **attributes(attention),
                             rotary_mode=rotary.get("mode", "half"), rotary_dim=rotary.get("rotary_dim", 0), **extra)
    # The rotated q/k are interior: the pass refuses the fold when anything else reads them.
    return Fusion(call, match.covered)


ROPE_ATTENTION_FOLD = Rule("RopeAttention(fold)", Either(_folded(0), _folded(1)), _analyse, FAMILY,
                           frozenset({"RotaryEmbeddingQK"}), fused_op="RopeAttention",
                           kept_when_refused="RotaryEmbeddingQK + Attention")

RULES: list[Rule] = [ROPE_ATTENTION_FOLD]
