"""ORT's ``MultiHeadAttention`` (com.microsoft) re-targeted to ``otfuse.Attention`` (docs/ops.md);
``GroupQueryAttention`` in group_query.py, the packed ``Attention`` (BERT's) in packed.py.

What onnxscript's ``optimize_for_ort`` and ORT's transformers optimizer write: 3-D ``query``,
``key``, ``value`` ``[B, S, N*D]`` (otfuse's 3-D BSND form, ``kv_num_heads = num_heads``), the
projections' ``bias`` (``[N*D + N*D + N*Dv]``, added to Q, K, V: plain ``Add`` nodes in front),
``attention_bias`` added to the scaled scores (``attn_bias``, first offered to masks.py),
``past_key``/``past_value`` BNSD and ``present_key``/``present_value`` their concatenation with the
new keys, ``scale`` (absent or 0 = ``1/sqrt(D)``, as ours); or ``key``/``value`` 4-D BNSD with no
bias, past or present (ORT's BSNH_BNSH_BNSH form, onnxscript's where the rotated keys are a graph
output: transposed to BSND for the op).

Refused (``MULTI_HEAD_ATTENTION_OP``): ``key_padding_mask`` and ``unidirectional = 1`` (ORT adds
``mask_filter_value``, -10000 by default, to the masked scores: a fully padded row is then
``softmax(s)``, not otfuse's 0), packed QKV / KV (5-D), a 4-D ``key`` with bias, past or
present, ``past_sequence_length`` / ``cache_indirection`` (shared buffers, beam search) and the
``qk`` output.
"""

from __future__ import annotations

import math

import onnx

from otfuse import ops
from otfuse.fusions.attention import chain_checks as chain
from otfuse.fusions.attention import group_query, packed
from otfuse.rewriter import checks
from otfuse.rewriter.allow_list import CONTRIB_DOMAIN, OpAllowList, only, require_allowed
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Absent, Either, Match, Var, attr, op
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.rule import Fusion, RewriteContext, Rule

FAMILY = "attention"

MULTI_HEAD_ATTENTION_OP = OpAllowList(
    "MultiHeadAttention", versions=frozenset({1}),
    attributes={"num_heads": None, "scale": None, "mask_filter_value": None, "unidirectional": only(0)},
    inputs=8,  # query .. past_value (key_padding_mask refused by the rule); not past_sequence_length, cache_indirection
    outputs=3,  # output, present_key, present_value (not qk)
    domain=CONTRIB_DOMAIN,
    notes={"unidirectional": "ORT adds mask_filter_value to the causally masked scores, otfuse masks them"},
    formals=(("query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key", "past_value",
              "past_sequence_length", "cache_indirection"), ("output", "present_key", "present_value", "qk")))

_INPUTS = ("k", "v", "bias", "key_padding_mask", "mask", "past_k", "past_v", "past_sequence_length",
           "cache_indirection")


def _mha_pattern():
    optional = [Either(Var(name), Absent()) for name in _INPUTS]
    return op.MultiHeadAttention(Var("q"), *optional, _domain=CONTRIB_DOMAIN, _bind="attention", _optional_tail=True)


def _hidden(graph: GraphIndex, value: str, what: str) -> tuple:
    shape = graph.shape(value)
    if shape is None or len(shape) != 3:
        raise Refuse(f"{what} {value!r} has shape {shape}: only 3-D [B, S, N*D] is modelled "
                     f"(not packed QKV/KV nor BNSD keys)")
    return shape


def _bnsd_keys(graph: GraphIndex, match: Match, node, heads: int) -> tuple | None:
    """(k, v) as [B, L, N*D] / [B, L, N*Dv] views when ORT's MHA gets them 4-D BNSD
    (``kv_format`` BSNH_BNSH_BNSH: used as they are; onnxscript writes it where the rotated keys are
    also a graph output), else None. Only without bias, past and present (what ORT then does with
    them is not modelled); N must be num_heads."""
    k, v = (graph.shape(match.value(n)) for n in ("k", "v"))
    if k is None or v is None or len(k) != 4 or len(v) != 4:
        return None
    if match.has("bias") or match.has("past_k") or match.has("past_v") or any(node.output[1:3]):
        raise Refuse("4-D BNSD key / value with bias, past or present outputs are not modelled")
    if heads and (k[1] != heads or v[1] != heads):
        raise Refuse(f"BNSD key / value heads {k[1]} / {v[1]} are not num_heads {heads}")
    return (k[0], k[2], _product(k[1], k[3])), (v[0], v[2], _product(v[1], v[3]))


def _product(a, b):
    return a * b if isinstance(a, int) and isinstance(b, int) else None


def _geometry(graph: GraphIndex, match: Match, node) -> dict:
    heads = attr(node, "num_heads", 0)
    if not match.has("k") or not match.has("v"):
        raise Refuse("packed QKV (no key / value input) is not modelled")
    bnsd = _bnsd_keys(graph, match, node, heads)
    q = _hidden(graph, match.value("q"), "Q")
    k, v = bnsd if bnsd else (_hidden(graph, match.value(n), n.upper()) for n in ("k", "v"))
    elem = graph.elem_type(match.value("q"))
    if elem not in checks.FLOAT_TYPES or any(graph.elem_type(x) != elem for x in
                                             (match.value("k"), match.value("v"), node.output[0])):
        raise Refuse("query, key, value and output must share one float type")
    checks.require_static(heads=heads or None, q_hidden=q[2], k_hidden=k[2], v_hidden=v[2])
    if q[2] % heads or k[2] != q[2] or v[2] % heads:
        raise Refuse(f"hidden sizes {q[2]}/{k[2]}/{v[2]} do not split into {heads} heads of one size for Q and K")
    return {"heads": heads, "head_dim": q[2] // heads, "v_dim": v[2] // heads, "batch": q[0], "q_len": q[1],
            "kv_len": k[1], "hidden": (q[2], k[2], v[2]), "elem": elem, "kv_bnsd": bnsd is not None}


def _check_past(graph: GraphIndex, match: Match, g: dict):
    """past_key / past_value BNSD [B, N, P, D / Dv], both or neither; the total key length."""
    if match.has("past_k") != match.has("past_v"):
        raise Refuse("only one of past_key and past_value is given")
    if not match.has("past_k"):
        return g["kv_len"]
    pk, pv = graph.shape(match.value("past_k")), graph.shape(match.value("past_v"))
    want_k, want_v = [g["batch"], g["heads"], None, g["head_dim"]], [g["batch"], g["heads"], None, g["v_dim"]]
    for shape, want, what in ((pk, want_k, "past_key"), (pv, want_v, "past_value")):
        if shape is None or len(shape) != 4 or shape[1] != want[1] or shape[3] != want[3]:
            raise Refuse(f"{what} has shape {shape}, not [B, {want[1]}, P, {want[3]}]")
    if any(graph.elem_type(match.value(n)) != g["elem"] for n in ("past_k", "past_v")):
        raise Refuse("the past has another type than the query")
    return None  # P + L: the mask check then needs only to broadcast


def _bias_inputs(graph: GraphIndex, match: Match, g: dict, helpers: Helpers) -> list:
    """Q, K, V with the projections' bias added (a constant [Hq + Hk + Hv], split at build)."""
    values = [match.value(n) for n in ("q", "k", "v")]
    if not match.has("bias"):
        return values
    bias = graph.constant_value(match.value("bias")) if graph.is_constant(match.value("bias")) else None
    total = sum(g["hidden"])
    if bias is None or bias.ndim != 1 or bias.shape[0] != total:
        raise Refuse(f"bias {match.value('bias')!r} is not a constant of shape [{total}]")
    if onnx.helper.np_dtype_to_tensor_dtype(bias.dtype) != g["elem"]:
        raise Refuse("bias has another type than the query")
    out, start = [], 0
    for value, width in zip(values, g["hidden"]):
        part = helpers.constant(bias[start:start + width].copy(), base=f"{match.value('bias')}/{len(out)}")
        out.append(helpers.node("Add", [value, part]))
        start += width
    return out


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    graph, node = ctx.graph, match.node("attention")
    require_allowed(graph, node, MULTI_HEAD_ATTENTION_OP)
    if match.has("key_padding_mask"):
        raise Refuse("key_padding_mask: ORT adds mask_filter_value to padded keys (a fully padded row is "
                     "softmax(s)), otfuse masks them")
    g = _geometry(graph, match, node)
    total = _check_past(graph, match, g)
    attributes = {"num_heads": g["heads"], "kv_num_heads": g["heads"], "layout": "BSND", "output_layout": "BSND"}
    scale = float(attr(node, "scale", 0.0))
    if not math.isfinite(scale):
        raise Refuse(f"scale {scale}")
    if scale:
        attributes["scale"] = scale
    scores = (g["batch"], g["heads"], g["q_len"], total)
    if match.has("mask"):
        chain.require_mask(graph, match.value("mask"), scores)
    helpers = Helpers(match.root)
    q, k, v = _bias_inputs(graph, match, g, helpers)
    if g["kv_bnsd"]:  # to the BSND of the 3-D query (the op reads Q, K and V in one layout)
        k, v = (helpers.node("Transpose", [x], perm=[0, 2, 1, 3]) for x in (k, v))
    bias, padding = chain.mask_inputs(ctx, match, attributes, helpers, scores)
    past = {"past_key": match.value("past_k"), "past_value": match.value("past_v")} if match.has("past_k") else {}
    present = dict(zip(("present_key", "present_value"), node.output[1:3]))
    call = ops.Attention(Q=q, K=k, V=v, attn_bias=bias, key_padding_mask=padding, **past, Y=node.output[0],
                         **present, **attributes)
    return Fusion(call, match.covered, helpers)


MULTI_HEAD_ATTENTION = Rule("Attention(MultiHeadAttention)", _mha_pattern(), _analyse, FAMILY,
                            frozenset({"MultiHeadAttention"}), fused_op="Attention")

RULES: list[Rule] = [MULTI_HEAD_ATTENTION, *group_query.RULES, *packed.RULES]
