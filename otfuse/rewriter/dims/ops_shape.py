"""Shape rules of the ops that read, build or move shapes: Shape, Size, Range, ConstantOfShape,
Reshape (0 and -1 solved from the element count), (Un)Squeeze, Flatten, Transpose, Expand, Tile,
Concat, Split, Slice, Gather*, Pad, CumSum; with the symbolic values of small integer tensors
carried through (``Concat(Unsqueeze(Shape(x)[0]), [-1], [64])`` is ``[batch, -1, 64]``)."""

from __future__ import annotations

import numpy as np
import onnx

from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.dims import values as V
from otfuse.rewriter.dims.engine import NodeContext, handles
from otfuse.rewriter.dims.expr import Expr
from otfuse.rewriter.dims.ops_elementwise import broadcast_shapes

INT64 = onnx.TensorProto.INT64
_HUGE = 2**31  # a Slice bound at least this large means "to the end"


def _axes(ctx: NodeContext, position: int, attr_before: int) -> list[int] | None:
    """Axes from input ``position`` (opsets >= ``attr_before``) or the ``axes`` attribute."""
    if ctx.opset >= attr_before:
        return ctx.ints(position) if ctx.has(position) else []
    return list(ctx.attr("axes", []) or [])


def _fill(ctx: NodeContext, dims: list, output: int = 0) -> tuple:
    return tuple(d if d is not None else ctx.fresh(output, axis) for axis, d in enumerate(dims))


@handles("Shape")
def _shape(ctx: NodeContext):
    shape = ctx.shape(0)
    if shape is None:
        return [(INT64, None, None)]
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    dims = list(shape)[slice(start, end)]
    return [(INT64, (E.const(len(dims)),), V.of_items(dims))]


@handles("Size")
def _size(ctx: NodeContext):
    shape = ctx.shape(0)
    value = None if shape is None else V.of_items([ctx.canonical(E.product(shape))], ())
    return [(INT64, (), value)]


@handles("ConstantOfShape")
def _constant_of_shape(ctx: NodeContext):
    items = ctx.items(0)
    fill = ctx.attr("value")
    array = onnx.numpy_helper.to_array(fill) if fill is not None else np.zeros(1, np.float32)
    elem = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    if items is None:
        return [(elem, None, None)]
    dims = _fill(ctx, items)
    value = None
    sizes = [d.value for d in dims]
    if None not in sizes and int(np.prod(sizes)) <= V.MAX_ITEMS:
        value = V.from_numbers(np.full(sizes, array.reshape(-1)[0], dtype=array.dtype))
    return [(elem, dims, value)]


def _range_count(start: Expr, limit: Expr, delta: int) -> Expr | None:
    span = E.sub(limit, start) if delta > 0 else E.sub(start, limit)
    step = abs(delta)
    if span.value is not None:
        return E.const(max(0, -(-span.value // step)))
    if not span.nonneg:
        span = E.maximum(span, E.ZERO)
    return span if step == 1 else E.floordiv(E.add(span, E.const(step - 1)), E.const(step))


@handles("Range")
def _range(ctx: NodeContext):
    items = [ctx.value(i) for i in range(3)]
    elem = ctx.elem(0)
    if any(v is None or v.size != 1 for v in items):
        return [(elem, (ctx.fresh(0, 0),), None)]
    start, limit, delta = (v.reshape(-1)[0] for v in items)
    count = None
    if delta is not None and delta.value and start is not None and limit is not None:
        count = _range_count(start, limit, delta.value)
    count = ctx.canonical(count) if count is not None else ctx.fresh(0, 0)
    value = None
    if count.value is not None and count.value <= V.MAX_ITEMS and start.value is not None:
        value = V.of_items([E.const(start.value + i * delta.value) for i in range(count.value)])
    return [(elem, (count,), value)]


@handles("NonZero")
def _nonzero(ctx: NodeContext):
    rank = ctx.rank(0)
    return [(INT64, None if rank is None else (E.const(rank), ctx.fresh(0, 1)), None)]


@handles("Reshape")
def _reshape(ctx: NodeContext):
    target = ctx.items(1)
    elem = ctx.elem(0)
    if target is None:
        return [(elem, None, None)]
    source = ctx.shape(0)
    allow_zero = ctx.attr("allowzero", 0)
    dims: list[Expr | None] = []
    holes = []  # positions whose dim follows from the element count
    for i, t in enumerate(target):
        if t is not None and t.value == 0 and not allow_zero:
            t = source[i] if source is not None and i < len(source) else None
            if t is None:
                holes.append(i)
        elif t is None or t.value == -1:
            holes.append(i)
            t = None
        elif t.value is not None and t.value < 0:
            return [(elem, None, None)]  # not a valid target
        dims.append(t)
    solved = False
    if source is not None and len(holes) == 1:
        known = E.product(d for d in dims if d is not None)
        dims[holes[0]] = E.floordiv(E.product(source), known)
        solved = dims[holes[0]] is not None
    out = _fill(ctx, [None if d is None else ctx.canonical(d) for d in dims])
    if source is not None and not solved:
        ctx.learn(E.product(source), E.product(out))  # the element count is kept
    return [(elem, out, _reshaped_value(ctx, out))]


def _reshaped_value(ctx: NodeContext, dims: tuple, position: int = 0) -> np.ndarray | None:
    value = ctx.value(position)
    sizes = [d.value for d in dims]
    if value is None or None in sizes or int(np.prod(sizes, dtype=np.int64)) != value.size:
        return None
    return value.reshape(sizes)


@handles("Flatten")
def _flatten(ctx: NodeContext):
    shape = ctx.shape(0)
    if shape is None:
        return [(ctx.elem(0), None, None)]
    axis = ctx.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    out = (ctx.canonical(E.product(shape[:axis])), ctx.canonical(E.product(shape[axis:])))
    return [(ctx.elem(0), out, _reshaped_value(ctx, out))]


def _shape_and_axes(ctx: NodeContext):
    """(Un)Squeeze's input shape and axes (input 1 from opset 13, else the attribute), or None."""
    shape, axes = ctx.shape(0), _axes(ctx, 1, 13)
    return None if shape is None or axes is None else (shape, axes)


@handles("Squeeze")
def _squeeze(ctx: NodeContext):
    found = _shape_and_axes(ctx)
    if found is None:
        return [(ctx.elem(0), None, None)]
    shape, axes = found
    rank = len(shape)
    if not axes:
        if any(d.value is None for d in shape):
            return [(ctx.elem(0), None, None)]  # which dims are 1 is known at run time only
        keep = [d for d in shape if d.value != 1]
    else:
        drop = {a % rank for a in axes}
        for a in drop:
            ctx.learn(shape[a], E.ONE)
        keep = [d for i, d in enumerate(shape) if i not in drop]
    out = tuple(keep)
    return [(ctx.elem(0), out, _reshaped_value(ctx, out))]


@handles("Unsqueeze")
def _unsqueeze(ctx: NodeContext):
    found = _shape_and_axes(ctx)
    if found is None:
        return [(ctx.elem(0), None, None)]
    shape, axes = found
    rank = len(shape) + len(axes)
    inserted = {a % rank for a in axes}
    rest = iter(shape)
    out = tuple(E.ONE if i in inserted else next(rest) for i in range(rank))
    return [(ctx.elem(0), out, _reshaped_value(ctx, out))]


@handles("Transpose")
def _transpose(ctx: NodeContext):
    shape = ctx.shape(0)
    if shape is None:
        return [(ctx.elem(0), None, None)]
    perm = ctx.attr("perm") or list(range(len(shape)))[::-1]
    out = tuple(shape[p] for p in perm)
    value = ctx.value(0)
    value = value.transpose(perm) if value is not None and value.ndim == len(perm) else None
    return [(ctx.elem(0), out, value)]


@handles("Expand")
def _expand(ctx: NodeContext):
    shape, target = ctx.shape(0), ctx.items(1)
    if shape is None or target is None:
        return [(ctx.elem(0), None, None)]
    rank = max(len(shape), len(target))
    source = [E.ONE] * (rank - len(shape)) + list(shape)
    wanted = [E.ONE] * (rank - len(target)) + list(target)
    dims: list[Expr | None] = []
    for have, want in zip(source, wanted):
        if want is None:
            dims.append(have if have.never_one else None)  # want is 1 or have when have != 1
        else:
            dims.append(broadcast_shapes(ctx, [(have,), (want,)])[0])
    out = _fill(ctx, dims)
    value, sizes = ctx.value(0), [d.value for d in out]
    if value is not None and None not in sizes and int(np.prod(sizes, dtype=np.int64)) <= V.MAX_ITEMS:
        value = np.broadcast_to(value, sizes).copy()
    else:
        value = None
    return [(ctx.elem(0), out, value)]


@handles("Tile")
def _tile(ctx: NodeContext):
    shape, repeats = ctx.shape(0), ctx.items(1)
    if shape is None or repeats is None or len(repeats) != len(shape):
        return [(ctx.elem(0), None, None)]
    out = _fill(ctx, [None if r is None else ctx.canonical(E.mul(d, r)) for d, r in zip(shape, repeats)])
    value, counts = ctx.value(0), [None if r is None else r.value for r in repeats]
    if value is not None and None not in counts and value.size * int(np.prod(counts)) <= V.MAX_ITEMS:
        value = np.tile(value, counts)
    else:
        value = None
    return [(ctx.elem(0), out, value)]


@handles("Concat")
def _concat(ctx: NodeContext):
    present = [i for i in range(ctx.inputs) if ctx.has(i)]
    shapes = [ctx.shape(i) for i in present]
    known = [s for s in shapes if s is not None]
    elem = next((ctx.elem(i) for i in present if ctx.elem(i)), 0)
    if not known:
        return [(elem, None, None)]
    rank = len(known[0])
    axis = ctx.attr("axis", 0) % rank
    out: list[Expr | None] = []
    for a in range(rank):
        dims = [s[a] for s in known if len(s) == rank]
        if a == axis:
            out.append(ctx.canonical(E.add(E.ZERO, sum(dims[1:], dims[0]))) if len(dims) == len(shapes) else None)
        else:
            for d in dims[1:]:
                ctx.learn(dims[0], d)  # Concat needs every other axis equal
            out.append(ctx.canonical(dims[0]))
    return [(elem, _fill(ctx, out), _concat_value(ctx, present, axis, rank))]


def _concat_value(ctx: NodeContext, present: list[int], axis: int, rank: int) -> np.ndarray | None:
    if rank == 1:  # shape vectors: unknown pieces of known length become unknown items
        pieces = [ctx.items(i) for i in present]
        if any(p is None for p in pieces):
            return None
        items = [item for piece in pieces for item in piece]
        return V.of_items(items) if len(items) <= V.MAX_ITEMS else None
    values = [ctx.value(i) for i in present]
    if any(v is None or v.ndim != rank for v in values):
        return None
    try:
        value = np.concatenate(values, axis=axis)
    except ValueError:
        return None
    return value if value.size <= V.MAX_ITEMS else None


@handles("Split")
def _split(ctx: NodeContext):
    shape = ctx.shape(0)
    count = len(ctx.node.output)
    elem = ctx.elem(0)
    if shape is None:
        return [(elem, None, None)] * count
    axis = ctx.attr("axis", 0) % len(shape)
    sizes = ctx.ints(1) if ctx.opset >= 13 and ctx.has(1) else ctx.attr("split")
    dim = shape[axis]
    if sizes:
        parts = [E.const(s) for s in sizes]
        ctx.learn(dim, E.const(sum(sizes)))
    elif dim.value is not None:
        chunk = -(-dim.value // count)
        parts = [E.const(min(chunk, max(dim.value - i * chunk, 0))) for i in range(count)]
    else:
        even = E.exact_div(dim, E.const(count))
        parts = [even] * count
    outs = []
    offset = 0
    value = ctx.value(0)
    for index, part in enumerate(parts):
        dims = list(shape)
        dims[axis] = part
        piece = None
        if value is not None and part is not None and part.value is not None and value.ndim == len(shape):
            piece = np.take(value, range(offset, offset + part.value), axis=axis)
            offset += part.value
        outs.append((elem, _fill(ctx, dims, index), piece))
    return outs


def _clamped(index: Expr, dim: Expr) -> Expr | None:
    """A Slice bound for a positive step: negative counts from the end; clamped to [0, dim]."""
    v = index.value
    if v is None:
        return E.minimum(index, dim) if index.nonneg else None
    if v >= _HUGE:
        return dim
    if v < 0:
        return E.maximum(E.add(dim, index), E.ZERO) if v > -_HUGE else E.ZERO
    return E.minimum(index, dim)


def slice_length(dim: Expr, start: Expr, end: Expr, step: int) -> Expr | None:
    """Length of ``x[start:end:step]`` along a dim of ``dim`` (ONNX clamps like Python)."""
    if dim.value is not None and start.value is not None and end.value is not None:
        s = max(min(start.value, 2**62), -(2**62))
        e = max(min(end.value, 2**62), -(2**62))
        return E.const(len(range(*slice(s, e, step).indices(dim.value))))
    if step <= 0:
        return None
    if start.value is not None and (end.value or 0) >= _HUGE:
        if start.value >= 0:  # x[k:]
            return E.maximum(E.sub(dim, start), E.ZERO) if start.value else dim
        if start.value > -_HUGE:  # x[-k:]
            return E.minimum(E.const(-start.value), dim)
    lo, hi = _clamped(start, dim), _clamped(end, dim)
    if lo is None or hi is None:
        return None
    span = E.sub(hi, lo)
    if not span.nonneg:
        span = E.maximum(span, E.ZERO)
    return span if step == 1 else E.floordiv(E.add(span, E.const(step - 1)), E.const(step))


def _slice_params(ctx: NodeContext, rank: int):
    """(starts, ends, axes, steps) as lists of expressions (bounds) and ints (axes, steps)."""
    if ctx.opset < 10:
        starts = [E.const(s) for s in ctx.attr("starts", [])]
        ends = [E.const(e) for e in ctx.attr("ends", [])]
        axes = list(ctx.attr("axes", None) or range(len(starts)))
        return starts, ends, axes, [1] * len(starts)
    starts, ends = ctx.items(1), ctx.items(2)
    if starts is None or ends is None:
        return None
    axes = ctx.ints(3) if ctx.has(3) else list(range(len(starts)))
    steps = ctx.ints(4) if ctx.has(4) else [1] * len(starts)
    if axes is None or steps is None:
        return None
    return starts, ends, [a % rank for a in axes], steps


@handles("Slice")
def _slice(ctx: NodeContext):
    shape = ctx.shape(0)
    elem = ctx.elem(0)
    if shape is None:
        return [(elem, None, None)]
    params = _slice_params(ctx, len(shape))
    if params is None:
        return [(elem, _fill(ctx, [None] * len(shape)), None)]
    dims: list[Expr | None] = list(shape)
    index = [slice(None)] * len(shape)
    for start, end, axis, step in zip(*params):
        if start is None or end is None:
            dims[axis] = None
            index = None
            continue
        length = slice_length(shape[axis], start, end, step)
        dims[axis] = None if length is None else ctx.canonical(length)
        if index is not None and start.value is not None and end.value is not None:
            index[axis] = slice(start.value, end.value, step)
        else:
            index = None
    value = ctx.value(0)
    value = value[tuple(index)] if value is not None and index is not None and value.ndim == len(shape) else None
    return [(elem, _fill(ctx, dims), value)]


@handles("Gather")
def _gather(ctx: NodeContext):
    data, indices = ctx.shape(0), ctx.shape(1)
    elem = ctx.elem(0)
    if data is None or indices is None:
        return [(elem, None, None)]
    axis = ctx.attr("axis", 0) % len(data)
    out = tuple(data[:axis]) + tuple(indices) + tuple(data[axis + 1:])
    value, picks = ctx.value(0), ctx.value(1)
    numbers = V.numbers(picks)
    if value is not None and numbers is not None and value.ndim == len(data):
        size = value.shape[axis]
        if all(-size <= n < size for n in numbers):
            taken = np.array([n % size for n in numbers], dtype=np.int64).reshape(picks.shape)
            value = np.take(value, taken, axis=axis)
        else:
            value = None
    else:
        value = None
    return [(elem, out, value)]


@handles("GatherElements")
def _gather_elements(ctx: NodeContext):
    return [(ctx.elem(0), ctx.shape(1), None)]


@handles("GatherND")
def _gather_nd(ctx: NodeContext):
    data, indices = ctx.shape(0), ctx.shape(1)
    if data is None or indices is None or not indices or indices[-1].value is None:
        return [(ctx.elem(0), None, None)]
    batch = ctx.attr("batch_dims", 0)
    return [(ctx.elem(0), tuple(indices[:-1]) + tuple(data[batch + indices[-1].value:]), None)]


@handles("ScatterND", "ScatterElements", "Scatter")
def _scatter(ctx: NodeContext):
    return [(ctx.elem(0), ctx.shape(0), None)]


@handles("Pad")
def _pad(ctx: NodeContext):
    shape = ctx.shape(0)
    if shape is None:
        return [(ctx.elem(0), None, None)]
    pads = ctx.ints(1) if ctx.opset >= 11 else ctx.attr("pads")
    axes = (ctx.ints(3) if ctx.has(3) else list(range(len(shape)))) if ctx.opset >= 18 else list(range(len(shape)))
    if pads is None or axes is None or len(pads) != 2 * len(axes):
        return [(ctx.elem(0), _fill(ctx, [None] * len(shape)), None)]
    dims = list(shape)
    for i, axis in enumerate(axes):
        dims[axis % len(shape)] = ctx.canonical(E.add(dims[axis % len(shape)], E.const(pads[i] + pads[i + len(axes)])))
    return [(ctx.elem(0), tuple(dims), None)]


@handles("CumSum")
def _cumsum(ctx: NodeContext):
    value = ctx.value(0)
    if value is not None and value.ndim == 1 and not ctx.attr("reverse", 0):
        running, items = E.ZERO, []
        for item in value:
            if item is None:
                items = None
                break
            items.append(running if ctx.attr("exclusive", 0) else E.add(running, item))
            running = E.add(running, item)
        value = V.of_items(items) if items is not None else None
    else:
        value = None
    return [(ctx.elem(0), ctx.shape(0), value)]
