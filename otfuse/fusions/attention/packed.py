"""ORT's packed ``Attention`` (com.microsoft: the q/k/v projections inside the op, what onnxscript's
``optimize_for_ort`` and ORT's transformers optimizer write for BERT) re-targeted to
``otfuse.Attention`` (docs/ops.md, "ONNX Runtime's contrib ops").

``Attention(input, weights, bias, mask_index, past, attention_bias)`` computes
``input @ weights + bias`` (``[B, S, Hq + Hk + Hv]``, cut at ``qkv_hidden_sizes``, equal thirds by
default), then multi-head attention over ``num_heads`` heads of ``Hq / N`` (``Hv / N`` for V),
``scale`` (0 = ``1/sqrt(Hq / N)``) and ``attention_bias`` added to the scaled scores. Here: one
plain ``MatMul`` and ``Add`` in front (the weights read where the model keeps them, no copy), three
``Slice``s, and ``Attention`` on the 3-D BSND form with ``kv_num_heads = num_heads``; the bias as the
mask input, first offered to masks.py (as MultiHeadAttention's). ORT's GEMM starts its sums from the
bias (one rounding), the plain ``MatMul`` + ``Add`` round twice: within float32's tolerance.

Refused (``PACKED_ATTENTION_OP``): ``mask_index`` (ORT adds ``mask_filter_value``, -10000, to the
masked scores, a fully masked row then being ``softmax(s)``), ``unidirectional = 1`` (the same
filter value), ``past`` / ``present`` / ``past_sequence_length`` / ``past_present_share_buffer``
(the packed ``[2, B, N, P, D]`` cache), ``do_rotary`` / ``rotary_embedding_dim``.
"""

from __future__ import annotations

import math

from otfuse import ops
from otfuse.fusions.attention import chain_checks as chain
from otfuse.rewriter import checks
from otfuse.rewriter.allow_list import CONTRIB_DOMAIN, OpAllowList, only, require_allowed
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.pattern import Absent, Either, Match, Var, attr, op
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.rule import Fusion, RewriteContext, Rule

FAMILY = "attention"

PACKED_ATTENTION_OP = OpAllowList(
    "Attention", versions=frozenset({1}),
    attributes={"num_heads": None, "qkv_hidden_sizes": None, "scale": None, "unidirectional": only(0),
                "do_rotary": only(0), "past_present_share_buffer": only(0), "mask_filter_value": None},
    inputs=6,  # input .. attention_bias (mask_index, past refused by the rule); not past_sequence_length
    outputs=1,  # output (not present)
    domain=CONTRIB_DOMAIN,
    notes={"unidirectional": "ORT adds mask_filter_value to the causally masked scores, otfuse masks them",
           "rotary_embedding_dim": "the rotation inside the op is not modelled"},
    formals=(("input", "weights", "bias", "mask_index", "past", "attention_bias", "past_sequence_length"),
             ("output", "present")))


def _pattern():
    optional = [Either(Var(name), Absent()) for name in ("bias", "mask_index", "past", "mask", "past_sequence_length")]
    return op.Attention(Var("x"), Var("w"), *optional, _domain=CONTRIB_DOMAIN, _bind="attention", _optional_tail=True)


def _sizes(graph, match: Match, node, heads: int) -> tuple[int, int, int]:
    w = graph.shape(match.value("w"))
    if w is None or len(w) != 2 or not isinstance(w[1], int):
        raise Refuse(f"weights {match.value('w')!r} have shape {w}, not [H_in, static width]")
    sizes = tuple(attr(node, "qkv_hidden_sizes", ()) or ())
    if not sizes:
        if w[1] % 3:
            raise Refuse(f"weights width {w[1]} is not three equal parts")
        sizes = (w[1] // 3,) * 3
    if len(sizes) != 3 or sum(sizes) != w[1] or sizes[0] != sizes[1] or any(s <= 0 or s % heads for s in sizes):
        raise Refuse(f"qkv_hidden_sizes {list(sizes)} do not split width {w[1]} into {heads} heads with Hq = Hk")
    return sizes


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    graph, node = ctx.graph, match.node("attention")
    require_allowed(graph, node, PACKED_ATTENTION_OP)
    for name, why in (("mask_index", "ORT adds mask_filter_value to the masked scores (a fully masked row is "
                                     "softmax(s)), otfuse masks them"),
                      ("past", "the packed [2, B, N, P, D] cache is not modelled")):
        if match.has(name):
            raise Refuse(f"{name}: {why}")
    heads = attr(node, "num_heads", 0)
    if heads <= 0:
        raise Refuse(f"num_heads {heads}")
    x = match.value("x")
    shape, elem = graph.shape(x), graph.elem_type(x)
    if shape is None or len(shape) != 3:
        raise Refuse(f"input {x!r} has shape {shape}, not [B, S, H_in]")
    if elem not in checks.FLOAT_TYPES or any(graph.elem_type(v) != elem for v in
                                             (match.value("w"), node.output[0])):
        raise Refuse("input, weights and output must share one float type")
    sizes = _sizes(graph, match, node, heads)
    helpers = Helpers(match.root)
    qkv = helpers.node("MatMul", [x, match.value("w")])
    if match.has("bias"):
        bias = graph.shape(match.value("bias"))
        if bias is None or tuple(bias) != (sum(sizes),) or graph.elem_type(match.value("bias")) != elem:
            raise Refuse(f"bias {match.value('bias')!r} is not [{sum(sizes)}] of the input's type")
        qkv = helpers.node("Add", [qkv, match.value("bias")])
    bounds = [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
    q, k, v = (helpers.node("Slice", [qkv, helpers.ints([lo]), helpers.ints([hi]), helpers.ints([-1])])
               for lo, hi in zip(bounds, bounds[1:]))
    attributes = {"num_heads": heads, "kv_num_heads": heads, "layout": "BSND", "output_layout": "BSND"}
    scale = float(attr(node, "scale", 0.0))
    if not math.isfinite(scale) or scale < 0:
        raise Refuse(f"scale {scale}")
    if scale:
        attributes["scale"] = scale
    scores = (shape[0], heads, shape[1], shape[1])
    if match.has("mask"):
        chain.require_mask(graph, match.value("mask"), scores)
    bias_input, padding = chain.mask_inputs(ctx, match, attributes, helpers, scores)
    call = ops.Attention(Q=q, K=k, V=v, attn_bias=bias_input, key_padding_mask=padding, Y=node.output[0],
                         **attributes)
    return Fusion(call, match.covered, helpers)


PACKED_ATTENTION = Rule("Attention(packed Attention)", _pattern(), _analyse, FAMILY, frozenset({"Attention"}),
                        fused_op="Attention")

RULES: list[Rule] = [PACKED_ATTENTION]
