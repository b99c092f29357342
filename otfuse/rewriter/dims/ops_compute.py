"""Shape rules of the computing ops the families meet: MatMul / Gemm (the inner dims agree),
reductions, and the standard normalisation, rotary and attention ops (opset 17-23)."""

from __future__ import annotations

import onnx

from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.dims.engine import NodeContext, Shape, handles
from otfuse.rewriter.dims.ops_elementwise import broadcast_shapes

FLOAT = onnx.TensorProto.FLOAT
INT64 = onnx.TensorProto.INT64


def matmul_shape(ctx: NodeContext, a: Shape | None, b: Shape | None) -> Shape | None:
    """numpy matmul: a 1-D operand gains (and loses) an axis; K agrees; batch dims broadcast."""
    if a is None or b is None or not a or not b:
        return None
    a_vec, b_vec = len(a) == 1, len(b) == 1
    a2 = (E.ONE,) + tuple(a) if a_vec else tuple(a)
    b2 = tuple(b) + (E.ONE,) if b_vec else tuple(b)
    ctx.learn(a2[-1], b2[-2])
    batch = broadcast_shapes(ctx, [a2[:-2], b2[:-2]])
    out = batch + (a2[-2],) * (not a_vec) + (b2[-1],) * (not b_vec)
    return tuple(ctx.canonical(d) for d in out)


@handles("MatMul")
def _matmul(ctx: NodeContext):
    return [(ctx.elem(0), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)), None)]


@handles("Gemm")
def _gemm(ctx: NodeContext):
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return [(ctx.elem(0), None, None)]
    m, k = (a[1], a[0]) if ctx.attr("transA", 0) else (a[0], a[1])
    k2, n = (b[1], b[0]) if ctx.attr("transB", 0) else (b[0], b[1])
    ctx.learn(k, k2)
    c = ctx.shape(2)
    if c is not None:  # C broadcasts one way to [M, N]: a dim of C provably not 1 is that dim
        for have, want in zip(reversed(c), (n, m)):
            if have.never_one:
                ctx.learn(have, want)
    return [(ctx.elem(0), (ctx.canonical(m), ctx.canonical(n)), None)]


_REDUCE = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")


@handles(*_REDUCE)
def _reduce(ctx: NodeContext):
    shape = ctx.shape(0)
    elem = ctx.elem(0)
    if shape is None:
        return [(elem, None, None)]
    keep = ctx.attr("keepdims", 1)
    axes_as_input = ctx.opset >= 18 or (ctx.node.op_type == "ReduceSum" and ctx.opset >= 13)
    if axes_as_input:
        axes = ctx.ints(1) if ctx.has(1) else []
    else:
        axes = list(ctx.attr("axes", []) or [])
    if axes is None:  # axes computed at run time
        return [(elem, ctx.fresh_shape(0, len(shape)) if keep else None, None)]
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return [(elem, shape, None)]
        axes = list(range(len(shape)))
    reduced = {a % len(shape) for a in axes}
    out = tuple(E.ONE if i in reduced else d for i, d in enumerate(shape) if keep or i not in reduced)
    return [(elem, out, None)]


@handles("ArgMax", "ArgMin")
def _arg(ctx: NodeContext):
    shape = ctx.shape(0)
    if shape is None:
        return [(INT64, None, None)]
    axis = ctx.attr("axis", 0) % len(shape)
    keep = ctx.attr("keepdims", 1)
    out = tuple(E.ONE if i == axis else d for i, d in enumerate(shape) if keep or i != axis)
    return [(INT64, out, None)]


def _stats_shape(shape: Shape | None, axis: int) -> Shape | None:
    if shape is None:
        return None
    axis = axis % len(shape)
    return tuple(shape[:axis]) + (E.ONE,) * (len(shape) - axis)


@handles("LayerNormalization")
def _layer_normalization(ctx: NodeContext):
    shape = ctx.shape(0)
    stats = _stats_shape(shape, ctx.attr("axis", -1))
    stash = ctx.attr("stash_type", 1)
    return [(ctx.elem(0), shape, None), (stash, stats, None), (stash, stats, None)]


@handles("RMSNormalization", "RotaryEmbedding")
def _same_as_x(ctx: NodeContext):
    return [(ctx.elem(0), ctx.shape(0), None)]


def _heads_split(ctx: NodeContext, shape: Shape | None, heads: int) -> Shape | None:
    """A 3-D [B, S, N*D] input as [B, N, S, D]; a 4-D one as it is."""
    if shape is None:
        return None
    if len(shape) == 4:
        return tuple(shape)
    if len(shape) == 3 and heads:
        head = E.exact_div(shape[2], E.const(heads))
        return (shape[0], E.const(heads), shape[1], head if head is not None else ctx.fresh(0, 3))
    return None


@handles("Attention")
def _attention(ctx: NodeContext):
    """opset 23 Attention: Y, present_key, present_value, qk_matmul_output."""
    q_shape = ctx.shape(0)
    q = _heads_split(ctx, q_shape, ctx.attr("q_num_heads", 0))
    k = _heads_split(ctx, ctx.shape(1), ctx.attr("kv_num_heads", 0))
    v = _heads_split(ctx, ctx.shape(2), ctx.attr("kv_num_heads", 0))
    elem = ctx.elem(0)
    if q is None or k is None or v is None:
        return [(elem, None, None), (elem, None, None), (elem, None, None), (elem, None, None)]
    ctx.learn(q[3], k[3])
    ctx.learn(k[2], v[2])
    for other in (k, v):
        ctx.learn(q[0], other[0])
    ctx.learn(k[1], v[1])
    total = k[2]
    past_k = ctx.shape(4)
    if past_k is not None and len(past_k) == 4:
        total = ctx.canonical(E.add(past_k[2], k[2]))
    if len(q_shape) == 3:
        y = (q[0], q[2], ctx.canonical(E.mul(q[1], v[3])))
    else:
        y = (q[0], q[1], q[2], v[3])
    present_k = (k[0], k[1], total, k[3])
    present_v = (v[0], v[1], total, v[3])
    scores = (q[0], q[1], q[2], total)
    return [(elem, y, None), (elem, present_k, None), (elem, present_v, None), (elem, scores, None)]
