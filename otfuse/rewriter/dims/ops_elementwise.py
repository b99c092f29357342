"""Shape rules of element-wise ops (numpy broadcasting), casts and comparisons, with the symbolic
values of small integer tensors carried through (``Where(shape == -1, 1, shape)``, ``Max``)."""

from __future__ import annotations

import onnx

from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.dims import values as V
from otfuse.rewriter.dims.engine import NodeContext, Shape, handles

BOOL = onnx.TensorProto.BOOL

_SAME = ("Identity", "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tan",
         "Softmax", "LogSoftmax", "Hardmax", "Gelu", "FastGelu", "QuickGelu", "LeakyRelu", "Elu", "Selu", "Celu",
         "Softplus", "Softsign", "HardSigmoid", "HardSwish", "Mish", "Round", "Sign", "Clip", "Trilu",
         "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Shrink", "ThresholdedRelu",
         "BitwiseNot", "LpNormalization", "MeanVarianceNormalization", "InstanceNormalization")


def broadcast_shapes(ctx: NodeContext, shapes: list[Shape | None]) -> Shape | None:
    """numpy broadcasting of ``shapes``. Two dims of one axis that are both provably not 1 must be
    equal (learned); two that may be 1 are assumed equal (the exporters' convention: a dynamic dim
    that broadcasts is not 1), in the assumed view only. The result is the dim provably not 1, or
    broadcast(a, b), which the assumed view reads as a."""
    if any(s is None for s in shapes):
        return None
    if all(s == shapes[0] for s in shapes[1:]):
        return shapes[0]
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        strong = [d for d in dims if d.never_one]
        for d in strong[1:]:
            ctx.learn(strong[0], d)
        dims = [ctx.canonical(d) for d in dims]
        others = [d for d in dict.fromkeys(dims) if d != E.ONE]
        for d in others[1:]:
            ctx.assume(others[0], d)
        out.append(ctx.canonical(E.broadcast(*dims)))
    return tuple(out)


@handles(*_SAME)
def _same(ctx: NodeContext):
    value = ctx.value(0) if ctx.node.op_type == "Identity" else None
    return [(ctx.elem(0), ctx.shape(0), value)]


@handles("Dropout")
def _dropout(ctx: NodeContext):
    return [(ctx.elem(0), ctx.shape(0), None), (BOOL, ctx.shape(0), None)]


@handles("IsNaN", "IsInf")
def _is_special(ctx: NodeContext):
    return [(BOOL, ctx.shape(0), None)]


@handles("Not")
def _not(ctx: NodeContext):
    value = ctx.value(0)
    if value is not None:
        value = V.unary(lambda x: None if x.value is None else (E.ZERO if x.value else E.ONE), value)
    return [(BOOL, ctx.shape(0), value)]


@handles("Neg", "Abs", "Floor", "Ceil")
def _integral_unary(ctx: NodeContext):
    value = ctx.value(0)
    op = ctx.node.op_type
    if value is not None:
        if op == "Neg":
            value = V.unary(E.neg, value)
        elif op == "Abs":
            value = V.unary(lambda x: x if x.nonneg else (E.const(abs(x.value)) if x.value is not None else None),
                            value)
        # Floor/Ceil keep whole numbers: symbolic values are whole
    return [(ctx.elem(0), ctx.shape(0), value)]


@handles("Cast")
def _cast(ctx: NodeContext):
    to = ctx.attr("to", 0)
    value = ctx.value(0)
    if value is not None:
        if to == BOOL:
            value = V.unary(V.as_bool, value)
        elif ctx.elem(0) == BOOL or to in V.INT_TYPES or to in V.FLOAT_TYPES:
            pass  # whole numbers stay the same numbers (int64 dims fit every type they are cast to here)
        else:
            value = None
    return [(to, ctx.shape(0), value)]


@handles("CastLike")
def _cast_like(ctx: NodeContext):
    to = ctx.elem(1)
    value = ctx.value(0)
    if value is not None and to == BOOL:
        value = V.unary(V.as_bool, value)
    return [(to, ctx.shape(0), value)]


_ARITHMETIC = ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "BitShift", "PRelu", "BitwiseAnd", "BitwiseOr",
               "BitwiseXor")
_COMPARISONS = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor")


def _binary_value(ctx: NodeContext, op: str):
    if op not in V.BINARY:
        return None
    a, b = ctx.value(0), ctx.value(1)
    if a is None or b is None:
        return None
    if op in ("Div", "Mod") and (ctx.elem(0) in V.FLOAT_TYPES):
        return None  # true division: whole only by chance; float Mod: not integer arithmetic
    return V.binary(op, a, b)


@handles(*_ARITHMETIC)
def _arithmetic(ctx: NodeContext):
    shape = broadcast_shapes(ctx, [ctx.shape(0), ctx.shape(1)])
    return [(ctx.elem(0), shape, _binary_value(ctx, ctx.node.op_type))]


@handles(*_COMPARISONS)
def _comparison(ctx: NodeContext):
    shape = broadcast_shapes(ctx, [ctx.shape(0), ctx.shape(1)])
    return [(BOOL, shape, _binary_value(ctx, ctx.node.op_type))]


@handles("Max", "Min", "Sum", "Mean")
def _variadic(ctx: NodeContext):
    present = [i for i in range(ctx.inputs) if ctx.has(i)]
    shape = broadcast_shapes(ctx, [ctx.shape(i) for i in present])
    value = None
    op = {"Max": "Max", "Min": "Min", "Sum": "Add"}.get(ctx.node.op_type)
    if op is not None and present:
        value = ctx.value(present[0])
        for i in present[1:]:
            other = ctx.value(i)
            value = None if value is None or other is None else V.binary(op, value, other)
    return [(ctx.elem(present[0]) if present else 0, shape, value)]


@handles("Where")
def _where(ctx: NodeContext):
    shape = broadcast_shapes(ctx, [ctx.shape(0), ctx.shape(1), ctx.shape(2)])
    cond, x, y = ctx.value(0), ctx.value(1), ctx.value(2)
    value = V.where(cond, x, y) if cond is not None and x is not None and y is not None else None
    return [(ctx.elem(1) or ctx.elem(2), shape, value)]
