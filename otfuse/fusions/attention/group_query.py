"""ORT's ``GroupQueryAttention`` (com.microsoft) re-targeted to ``otfuse.Attention`` where its
per-row key counts are provably otfuse's (docs/ops.md, "ONNX Runtime's contrib ops").

GroupQueryAttention reads ``seqlens_k[b] + 1`` keys for batch row ``b``: the new ones written after
``seqlens_k[b] + 1 - S`` cached ones, query row ``i`` at absolute position ``P_b + i``. otfuse's
Attention has ``P + S`` keys for every row, the past concatenated in front. The two agree exactly
when ``total_sequence_length = P + S`` and every ``seqlens_k[b] = P + S - 1`` (``P`` = past_key's
length, 0 without one): the rule proves both from the graph, ``seqlens_k`` as one value broadcast
to ``[B]`` (``Expand`` / ``Tile`` / ``Cast`` of a shape computation, what otfuse's own ``--target
ort`` writes) and both values through the dimension engine. The exporters (onnxruntime-genai,
onnxscript) build them from the attention mask's sums at run time, equal only without padding,
which nothing proves: refused with that reason.

Then: ``causal = 1`` → ``causal`` (query ``i`` sees keys ``j <= P + i``), ``local_window_size = W > 0``
→ ``window = W`` (ORT 1.32's CPU kernel keeps ``W`` keys, the query's own among them: measured,
tests/fusions/test_contrib_gqa.py);
``causal = 0`` → no mask; ``scale`` (0 = ``1/sqrt(D)``), ``softcap``; ``head_sink`` [N] → ``sinks``
(float32; a float16 / bfloat16 one widened by a Cast, exact: ORT 1.32's kernel shifts by
max(row max, sink) and adds exp(sink - max) to the denominator, measured, tests/targets/test_sinks.py);
packed QKV (no ``key``) cut
into Q, K, V by ``Slice``; ``past_*`` BNSD and ``present_*`` (their concatenation with the new
keys). Refused: ``attention_bias`` (a row it masks entirely is 0 or NaN in ORT's kernel, by code
path, also for ``finfo.min``), ``do_rotary`` (its cos/sin caches and ``position_ids``),
``smooth_softmax``, the quantised caches,
``sliding_window_cache``, the per-head Q/K norms, ``query_seqlens`` and the ``output_qk`` output.
"""

from __future__ import annotations

import math

import onnx

from otfuse import ops
from otfuse.rewriter import checks
from otfuse.rewriter.allow_list import CONTRIB_DOMAIN, OpAllowList, only, require_allowed
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Absent, Either, Match, Var, attr, op
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.rule import Fusion, RewriteContext, Rule

FAMILY = "attention"

_FORMALS = (("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
             "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
             "k_norm_weight", "query_seqlens"), ("output", "present_key", "present_value", "output_qk"))

GROUP_QUERY_ATTENTION_OP = OpAllowList(
    "GroupQueryAttention", versions=frozenset({1}),
    attributes={"num_heads": None, "kv_num_heads": None, "scale": None, "softcap": None, "causal": only(0, 1),
                "local_window_size": None, "do_rotary": only(0), "rotary_interleaved": None,
                "smooth_softmax": only(-1, 0), "qk_output": only(0), "sliding_window_cache": only(0),
                "k_quant_type": only(b"NONE", "NONE"), "v_quant_type": only(b"NONE", "NONE")},
    inputs=12,  # query .. head_sink; cos/sin/position_ids refused by the rule (do_rotary = 0 only)
    outputs=3,  # output, present_key, present_value (not output_qk)
    domain=CONTRIB_DOMAIN,
    notes={"kv_cache_bit_width": "quantised KV caches are not modelled",
           "qk_norm_epsilon": "the per-head Q/K RMS norms are not modelled",
           "q_norm_epsilon": "the per-head Q/K RMS norms are not modelled",
           "k_norm_epsilon": "the per-head Q/K RMS norms are not modelled"},
    formals=_FORMALS)

_INPUTS = ("k", "v", "past_k", "past_v", "seqlens_k", "total", "cos", "sin", "position_ids", "bias", "head_sink",
           *(f"unmodelled{i}" for i in range(12, 17)))  # k_scale .. query_seqlens: named, then refused


def _pattern():
    optional = [Either(Var(name), Absent()) for name in _INPUTS]
    return op.GroupQueryAttention(Var("q"), *optional, _domain=CONTRIB_DOMAIN, _bind="attention",
                                  _optional_tail=True)


_BROADCASTS = {"Cast", "Expand", "Tile", "Identity", "Reshape", "Squeeze", "Unsqueeze"}


def _broadcast_value(graph: GraphIndex, name: str) -> E.Expr | None:
    """The one value every item of ``name`` holds, when ``name`` is a scalar (or a tensor of equal
    items) broadcast by ``_BROADCASTS`` nodes: its symbolic value from the dimension engine."""
    for _ in range(16):
        items = graph.dims.value(name)
        if items is not None and items.size >= 1:
            flat = [item for item in items.reshape(-1)]
            if all(item is not None and item == flat[0] for item in flat):
                return flat[0]
        node = graph.producer.get(name)
        if node is None or node.op_type not in _BROADCASTS or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Cast" and attr(node, "to", 0) not in (onnx.TensorProto.INT32, onnx.TensorProto.INT64):
            return None
        name = node.input[0]
    return None


def _require_full_lengths(graph: GraphIndex, match: Match, past_len, new_len) -> None:
    """``total_sequence_length = P + S`` and every ``seqlens_k[b] = P + S - 1``, proven."""
    past, new = graph.dims.dim_expr(past_len), graph.dims.dim_expr(new_len)
    want = E.add(past, new) if past is not None and new is not None else None
    total = graph.dims.value(match.value("total"))
    total = total.reshape(-1)[0] if total is not None and total.size == 1 else None
    lengths = _broadcast_value(graph, match.value("seqlens_k"))
    why = ("GroupQueryAttention's seqlens_k / total_sequence_length give per-row key counts at run time "
           "(the exporters' ReduceSum of the attention mask), equal to otfuse's past + new keys only without "
           "padding")
    if want is None or total is None or total != want:
        raise Refuse(f"{why}: total_sequence_length is not provably past + new keys ({want})")
    if lengths is None or lengths != E.sub(want, E.const(1)):
        raise Refuse(f"{why}: seqlens_k is not provably past + new keys - 1 for every row")


def _heads(node) -> tuple[int, int]:
    heads, kv_heads = attr(node, "num_heads", 0), attr(node, "kv_num_heads", 0)
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        raise Refuse(f"num_heads {heads} is not a multiple of kv_num_heads {kv_heads}")
    return heads, kv_heads


def _qkv(graph: GraphIndex, match: Match, heads: int, kv_heads: int, helpers: Helpers) -> tuple:
    """(Q, K, V [B, S, N*D / Nkv*D], head size, S): packed QKV cut by Slice on the last axis."""
    q = match.value("q")
    shape = graph.shape(q)
    if shape is None or len(shape) != 3 or not isinstance(shape[2], int):
        raise Refuse(f"query {q!r} has shape {shape}: only 3-D [B, S, hidden] with a static hidden size")
    if match.has("k") != match.has("v"):
        raise Refuse("only one of key and value is given")
    if not match.has("k"):
        if shape[2] % (heads + 2 * kv_heads):
            raise Refuse(f"packed QKV width {shape[2]} does not split into {heads} + 2 x {kv_heads} heads")
        d = shape[2] // (heads + 2 * kv_heads)
        bounds = [0, heads * d, (heads + kv_heads) * d, (heads + 2 * kv_heads) * d]
        parts = [helpers.node("Slice", [q, helpers.ints([lo]), helpers.ints([hi]), helpers.ints([-1])])
                 for lo, hi in zip(bounds, bounds[1:])]
        return parts[0], parts[1], parts[2], d, shape[1]
    k, v = (graph.shape(match.value(n)) for n in ("k", "v"))
    if shape[2] % heads:
        raise Refuse(f"query width {shape[2]} does not split into {heads} heads")
    d = shape[2] // heads
    for s, what in ((k, "key"), (v, "value")):
        if s is None or len(s) != 3 or s[2] != kv_heads * d or not graph.dims.same(s[1], shape[1]):
            raise Refuse(f"{what} has shape {s}, not [B, S, {kv_heads} x {d}] with the query's S")
    return q, match.value("k"), match.value("v"), d, shape[1]


def _past_length(graph: GraphIndex, match: Match, kv_heads: int, d: int):
    if match.has("past_k") != match.has("past_v"):
        raise Refuse("only one of past_key and past_value is given")
    if not match.has("past_k"):
        return 0
    shapes = [graph.shape(match.value(n)) for n in ("past_k", "past_v")]
    for s, what in zip(shapes, ("past_key", "past_value")):
        if s is None or len(s) != 4 or s[1] != kv_heads or s[3] != d:
            raise Refuse(f"{what} has shape {s}, not [B, {kv_heads}, P, {d}]")
    if not graph.dims.same(shapes[0][2], shapes[1][2]):
        raise Refuse("past_key and past_value have different lengths")
    return shapes[0][2]


def _sinks(graph: GraphIndex, head_sink: str, heads: int, elem: int, helpers: Helpers):
    """``head_sink`` ``[N]`` in the query's type as the op's float32 ``sinks`` (widened exactly)."""
    shape = graph.shape(head_sink)
    if shape is None or len(shape) != 1 or shape[0] != heads or graph.elem_type(head_sink) != elem:
        raise Refuse(f"head_sink {head_sink!r} has shape {shape}, not [{heads}] in the query's type")
    if elem == onnx.TensorProto.FLOAT:
        return head_sink
    return helpers.node("Cast", [head_sink], to=onnx.TensorProto.FLOAT)


def _mask_attributes(node) -> dict:
    causal, window = attr(node, "causal", 1), attr(node, "local_window_size", -1)
    if causal == 0:
        if window != -1:
            raise Refuse(f"local_window_size {window} with causal = 0")
        return {}
    if window == -1:
        return {"causal": 1}
    if window <= 0:
        raise Refuse(f"local_window_size {window} (modelled: -1, or > 0 keys up to the query's own)")
    return {"causal": 1, "window": window}


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    graph, node = ctx.graph, match.node("attention")
    require_allowed(graph, node, GROUP_QUERY_ATTENTION_OP)
    for name, what in (("cos", "cos_cache"), ("sin", "sin_cache"), ("position_ids", "position_ids")):
        if match.has(name):
            raise Refuse(f"{what}: the rotation (do_rotary) is not modelled")
    heads, kv_heads = _heads(node)
    helpers = Helpers(match.root)
    q, k, v, d, new_len = _qkv(graph, match, heads, kv_heads, helpers)
    elem = graph.elem_type(match.value("q"))
    if elem not in checks.FLOAT_TYPES or graph.elem_type(node.output[0]) != elem:
        raise Refuse("query and output must share one float type")
    past_len = _past_length(graph, match, kv_heads, d)
    _require_full_lengths(graph, match, past_len, new_len)
    attributes = {"num_heads": heads, "kv_num_heads": kv_heads, "layout": "BSND", "output_layout": "BSND",
                  **_mask_attributes(node)}
    for name in ("scale", "softcap"):
        value = float(attr(node, name, 0.0))
        if not math.isfinite(value) or value < 0:
            raise Refuse(f"{name} {value}")
        if value:
            attributes[name] = value
    if match.has("bias"):
        raise Refuse("attention_bias: ORT's kernel outputs 0 or NaN (by code path) for a query row the bias "
                     "masks entirely, also with finfo.min, where otfuse's op averages (measured with ORT 1.32)")
    past = {"past_key": match.value("past_k"), "past_value": match.value("past_v")} if match.has("past_k") else {}
    if match.has("head_sink"):
        past["sinks"] = _sinks(graph, match.value("head_sink"), heads, elem, helpers)
    present = dict(zip(("present_key", "present_value"), node.output[1:3]))
    call = ops.Attention(Q=q, K=k, V=v, **past, Y=node.output[0], **present, **attributes)
    return Fusion(call, match.covered, helpers)


GROUP_QUERY_ATTENTION = Rule("Attention(GroupQueryAttention)", _pattern(), _analyse, FAMILY,
                             frozenset({"GroupQueryAttention"}), fused_op="Attention")

RULES: list[Rule] = [GROUP_QUERY_ATTENTION]
