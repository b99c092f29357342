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
    """output, mean, inv_std_var, input_skip_bias_sum: the input's shape (skip has it too)."""
    shape, skip = ctx.shape(0), ctx.shape(1)
    if shape is not None and skip is not None and len(shape) == len(skip):
        for have, want in zip(shape, skip):
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
