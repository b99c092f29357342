"""Shape rules of the ONNX Runtime contrib ops an offline-optimised model holds (``com.microsoft``;
``SimplifiedLayerNormalization`` also in the default domain, as ORT writes it), so the values
behind them keep their shapes."""

from __future__ import annotations

from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.dims.engine import NodeContext, handles
from otfuse.rewriter.dims.ops_compute import matmul_shape
from otfuse.rewriter.dims.ops_elementwise import broadcast_shapes

MS = "com.microsoft"


def _swap_last(shape):
    if shape is None or len(shape) < 2:
        return shape
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


@handles("FusedMatMul", domain=MS)
def _fused_matmul(ctx: NodeContext):
    """alpha * op(A) @ op(B); op transposes the last two axes (transA / transB)."""
    if ctx.attr("transBatchA", 0) or ctx.attr("transBatchB", 0):
        return None
    a, b = ctx.shape(0), ctx.shape(1)
    a = _swap_last(a) if ctx.attr("transA", 0) else a
    b = _swap_last(b) if ctx.attr("transB", 0) else b
    return [(ctx.elem(0), matmul_shape(ctx, a, b), None)]


@handles("FastGelu", "BiasGelu", "Gelu", "QuickGelu", "BiasAdd", domain=MS)
def _biased_elementwise(ctx: NodeContext):
    present = [ctx.shape(i) for i in range(ctx.inputs) if ctx.has(i)]
    return [(ctx.elem(0), broadcast_shapes(ctx, present), None)]


def _norm_stats(shape, axis: int):
    if shape is None:
        return None
    axis = axis % len(shape)
    return tuple(shape[:axis]) + (E.ONE,) * (len(shape) - axis)


@handles("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", domain=MS)
def _skip_layer_norm(ctx: NodeContext):
    """output, mean, inv_std_var, input_skip_bias_sum: the input's shape. ORT broadcasts a skip
    of (1, S, H) or (S, H) over the batch, so only the skip's dims that are not 1 equal the input's."""
    shape, skip = ctx.shape(0), ctx.shape(1)
    if shape is not None and skip is not None and len(shape) == len(skip):
        for have, want in zip(shape, skip):
            if want != E.ONE:
                ctx.learn(have, want)
    stats = _norm_stats(shape, -1)
    return [(ctx.elem(0), shape, None), (1, stats, None), (1, stats, None), (ctx.elem(0), shape, None)]


@handles("SimplifiedLayerNormalization", domain=MS)
@handles("SimplifiedLayerNormalization")
def _simplified_layer_norm(ctx: NodeContext):
    shape = ctx.shape(0)
    stats = _norm_stats(shape, ctx.attr("axis", -1))
    return [(ctx.elem(0), shape, None), (1, stats, None)]


@handles("RotaryEmbedding", domain=MS)
def _rotary(ctx: NodeContext):
    return [(ctx.elem(0), ctx.shape(0), None)]


@handles("MultiHeadAttention", domain=MS)
def _multi_head_attention(ctx: NodeContext):
    """3-D query [B, S, N*D] and value [B, L, N*Dv]: output [B, S, N*Dv]; present_key/value BNSD
    (their lengths not followed); the packed forms are left unknown."""
    query, value = ctx.shape(0), ctx.shape(2) if ctx.has(2) else None
    out = None
    if query is not None and value is not None and len(query) == 3 and len(value) == 3:
        out = (query[0], query[1], value[2])
    return [(ctx.elem(0), out, None), (ctx.elem(0), None, None), (ctx.elem(0), None, None)]


@handles("GroupQueryAttention", domain=MS)
def _group_query_attention(ctx: NodeContext):
    """output [B, S, N*D]: the query's shape when key and value are given (else packed QKV, whose
    last dim is (N + 2 Nkv) * D)."""
    query = ctx.shape(0)
    heads, kv_heads = ctx.attr("num_heads", 0), ctx.attr("kv_num_heads", 0)
    out = None
    if query is not None and len(query) == 3:
        if ctx.has(1):
            out = query
        elif heads and kv_heads and query[2].is_const and query[2].value % (heads + 2 * kv_heads) == 0:
            out = (query[0], query[1], E.const(query[2].value // (heads + 2 * kv_heads) * heads))
    return [(ctx.elem(0), out, None), (ctx.elem(0), None, None), (ctx.elem(0), None, None)]


@handles("EmbedLayerNormalization", domain=MS)
def _embed_layer_norm(ctx: NodeContext):
    """output and embedding_sum [B, S, H] (input_ids [B, S], word_embedding [vocab, H]); mask_index [B]."""
    ids, words = ctx.shape(0), ctx.shape(2)
    out = None
    if ids is not None and words is not None and len(ids) == 2 and len(words) == 2:
        out = (ids[0], ids[1], words[1])
    mask_index = (ids[0],) if ids is not None and len(ids) == 2 else None
    int32 = 6  # TensorProto.INT32
    return [(ctx.elem(2), out, None), (int32, mask_index, None), (ctx.elem(2), out, None)]
