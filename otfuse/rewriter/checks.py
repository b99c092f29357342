"""Checks and small rewrites shared by the fusion families.

Every ``require_*`` check returns when the match is acceptable and raises ``Refuse`` with a
sentence saying why it is not; that sentence is what the report shows as a near miss.
"""

from __future__ import annotations

import onnx

from otfuse.rewriter.builder import NewTensor, Value
from otfuse.rewriter.dims import same_dim
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Match, attr
from otfuse.rewriter.refuse import Refuse

FLOAT_TYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
}


def type_name(elem_type: int) -> str:
    if not elem_type:
        return "unknown"
    return onnx.helper.tensor_dtype_to_string(elem_type).replace("TensorProto.", "").lower()


def require_float_io(graph: GraphIndex, x: str, y: str) -> None:
    """The fused op keeps the input's float type: ``y`` must have ``x``'s type."""
    tx, ty = graph.elem_type(x), graph.elem_type(y)
    if tx not in FLOAT_TYPES:
        raise Refuse(f"input {x!r} has type {type_name(tx)}, not float32/float16/bfloat16")
    if ty != tx:
        raise Refuse(f"output {y!r} has type {type_name(ty)} but the input is {type_name(tx)}")


def dims_equal(a, b) -> bool:
    """Provably equal dims: the dimension engine's canonical forms agree (otfuse/rewriter/dims).
    Dims from ``graph.shape`` are canonical for their graph; text is parsed as an expression."""
    return same_dim(a, b)


def shapes_equal(a, b) -> bool:
    """Equal when every dim is provably equal."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(dims_equal(x, y) for x, y in zip(a, b))


def shape_mismatch(a, b) -> str:
    """Which dims of two shapes are not proven equal, for a refusal: "dim 1: seq vs x.dim1"."""
    if a is None or b is None:
        return "a shape is unknown"
    if len(a) != len(b):
        return f"ranks {len(a)} and {len(b)} differ"
    for axis, (x, y) in enumerate(zip(a, b)):
        if not dims_equal(x, y):
            return f"dim {axis}: {_dim_text(x)} vs {_dim_text(y)} not proven equal"
    return "equal"


def broadcast_mismatch(shape, target) -> str:
    """The first dim of ``shape`` (aligned right) that is neither 1 nor proven to be ``target``'s."""
    for axis, (dim, want) in enumerate(zip(reversed(list(shape)), reversed(list(target)))):
        if dim != 1 and not dims_equal(dim, want):
            return f"dim -{axis + 1}: {_dim_text(dim)} vs {_dim_text(want)} not proven equal"
    return "broadcasts"


def require_static(**dims) -> None:
    """Head counts and sizes the fused op needs as numbers; the refusal names those that are not."""
    loose = [f"{name} {_dim_text(dim)}" for name, dim in dims.items() if not isinstance(dim, int)]
    if loose:
        raise Refuse(f"head counts and head sizes must be static: {', '.join(loose)} not static")


def _dim_text(dim) -> str:
    return "?" if dim is None else str(dim)


def require_same_shape(graph: GraphIndex, a: str, b: str) -> None:
    """The residual Add must not broadcast: both operands have one shape and type, proven (the
    fused op does not broadcast, so the exporters' convention that dynamic dims meeting in a
    broadcast are equal is not enough here)."""
    if graph.elem_type(a) != graph.elem_type(b):
        raise Refuse(f"residual operands have different types ({type_name(graph.elem_type(a))}, "
                     f"{type_name(graph.elem_type(b))})")
    shape_a, shape_b = graph.proven_shape(a), graph.proven_shape(b)
    if not shapes_equal(shape_a, shape_b):
        raise Refuse(f"residual Add may broadcast: operand shapes {_fmt(shape_a)} and {_fmt(shape_b)} "
                     f"({shape_mismatch(shape_a, shape_b)})")


def _fmt(shape) -> str:
    return "unknown" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def reduce_axes(graph: GraphIndex, match: Match, bind: str, axes_const: str) -> list[int]:
    """The axes of a matched ReduceMean (attribute or constant input), which must keep dims."""
    node = match.node(bind)
    if attr(node, "keepdims", 1) != 1:
        raise Refuse("ReduceMean drops the reduced axes (keepdims=0)")
    if match.has(axes_const) and len(node.input) > 1:
        value = graph.constant_value(match.value(axes_const))
        axes = [int(a) for a in value.reshape(-1)]
    else:
        axes = list(attr(node, "axes", []) or [])
    if not axes:
        raise Refuse("ReduceMean reduces over every axis")
    return axes


def trailing_axis(axes: list[int], rank: int | None) -> int:
    """The first normalised axis (negative) when ``axes`` are exactly the trailing axes."""
    if rank is not None:
        if any(a < -rank or a >= rank for a in axes):
            raise Refuse(f"axes {axes} are out of range for rank {rank}")
        positive = sorted({a % rank for a in axes})
        if positive != list(range(rank - len(positive), rank)):
            raise Refuse(f"axes {axes} are not the trailing axes of a rank-{rank} input")
        return -len(positive)
    negative = sorted(set(axes))
    if negative != list(range(-len(negative), 0)):
        raise Refuse(f"axes {axes} are not provably the trailing axes (input rank unknown)")
    return -len(negative)


def first_axis(axis: int, rank: int | None) -> int:
    """The first normalised axis (negative) of an op that normalises ``[axis, rank)``
    (LayerNormalization's and RMSNormalization's ``axis``, otfuse's norm ops)."""
    if rank is None:
        if axis < 0:
            return axis
        raise Refuse(f"axis {axis} counts from the first axis, but the input's rank is unknown")
    if not -rank <= axis < rank:
        raise Refuse(f"axis {axis} is out of range for a rank-{rank} input")
    return axis - rank if axis >= 0 else axis


def row_shape(graph: GraphIndex, x: str, axis: int) -> list[int] | None:
    shape = graph.shape(x)
    if shape is None or -axis > len(shape):
        return None
    dims = list(shape[axis:])
    return dims if all(isinstance(d, int) for d in dims) else None


def require_row_parameter(graph: GraphIndex, value: str, x: str, axis: int, what: str) -> None:
    """A per-row parameter (scale, bias) must have exactly the normalised dims' shape.

    Leading 1s are allowed only on a constant (``row_parameter`` drops them); anything that
    broadcasts differently from "one value per normalised element" is refused.
    """
    dims = row_shape(graph, x, axis)
    if dims is None:
        raise Refuse(f"the normalised dims of {x!r} are not static, so the {what} shape cannot be proven")
    shape = graph.constant_shape(value) if graph.is_constant(value) else graph.shape(value)
    if shape is None or any(not isinstance(d, int) for d in shape):
        raise Refuse(f"the {what} {value!r} has an unknown shape")
    shape = list(shape)
    x_rank = graph.rank(x)
    if len(shape) < len(dims) or shape[len(shape) - len(dims):] != dims:
        raise Refuse(f"the {what} shape {shape} does not match the normalised dims {dims}")
    leading = shape[: len(shape) - len(dims)]
    if any(d != 1 for d in leading) or (x_rank is not None and len(shape) > x_rank):
        raise Refuse(f"the {what} shape {shape} broadcasts beyond the normalised dims {dims}")
    if leading and not graph.is_constant(value):
        raise Refuse(f"the {what} {value!r} has leading broadcast dims and is not a constant")
    tx, tp = graph.elem_type(x), graph.elem_type(value)
    if tp not in (tx, onnx.TensorProto.FLOAT):
        raise Refuse(f"the {what} has type {type_name(tp)}; expected {type_name(tx)} or float32")


def row_parameter(graph: GraphIndex, value: str, x: str, axis: int) -> Value:
    """``value`` with exactly the normalised dims: itself, or a new initializer with its bytes and
    those dims (``require_row_parameter`` proved it a constant then)."""
    dims = row_shape(graph, x, axis)
    shape = graph.constant_shape(value) if graph.is_constant(value) else graph.shape(value)
    if list(shape) == dims:
        return value
    return NewTensor(f"{value}_row", source=value, dims=tuple(dims))


def reshaped_dims(graph: GraphIndex, node: onnx.NodeProto):
    """The output dims of a Reshape (the dimension engine solves its 0 and -1 entries)."""
    return graph.shape(node.output[0])
