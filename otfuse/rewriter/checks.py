"""Checks and small rewrites shared by the pattern families.

Every check returns ``None`` when the match is acceptable, or a sentence saying why it is not;
that sentence is what the report shows as a near miss.
"""

from __future__ import annotations

import onnx

from otfuse.rewriter.dims import same_dim
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Match, attr
from otfuse.rewriter.rule import RewriteContext

FLOAT_TYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
}


def type_name(elem_type: int) -> str:
    if not elem_type:
        return "unknown"
    return onnx.helper.tensor_dtype_to_string(elem_type).replace("TensorProto.", "").lower()


def check_float_io(graph: GraphIndex, x: str, y: str) -> str | None:
    """The fused op keeps the input's float type: ``y`` must have ``x``'s type."""
    tx, ty = graph.elem_type(x), graph.elem_type(y)
    if tx not in FLOAT_TYPES:
        return f"input {x!r} has type {type_name(tx)}, not float32/float16/bfloat16"
    if ty != tx:
        return f"output {y!r} has type {type_name(ty)} but the input is {type_name(tx)}"
    return None


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


def not_static(**dims) -> str | None:
    """Which of the named dims is not a number, for a refusal; None when all are."""
    loose = [f"{name} {_dim_text(dim)}" for name, dim in dims.items() if not isinstance(dim, int)]
    return ", ".join(loose) + " not static" if loose else None


def _dim_text(dim) -> str:
    return "?" if dim is None else str(dim)


def check_same_shape(graph: GraphIndex, a: str, b: str, total: str) -> str | None:
    """The residual Add must not broadcast: both operands have the sum's shape and type, proven
    (the fused op does not broadcast, so the exporters' convention that dynamic dims meeting in a
    broadcast are equal is not enough here)."""
    if graph.elem_type(a) != graph.elem_type(b):
        return f"residual operands have different types ({type_name(graph.elem_type(a))}, " \
               f"{type_name(graph.elem_type(b))})"
    shape_a, shape_b = graph.proven_shape(a), graph.proven_shape(b)
    if not shapes_equal(shape_a, shape_b):
        return (f"residual Add may broadcast: operand shapes {_fmt(shape_a)} and {_fmt(shape_b)} "
                f"({shape_mismatch(shape_a, shape_b)})")
    return None


def _fmt(shape) -> str:
    return "unknown" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def reduce_axes(graph: GraphIndex, match: Match, bind: str, axes_const: str) -> list[int] | str:
    """The axes of a matched ReduceMean (attribute or constant input), which must keep dims."""
    node = match.node(bind)
    if attr(node, "keepdims", 1) != 1:
        return "ReduceMean drops the reduced axes (keepdims=0)"
    if match.has(axes_const) and len(node.input) > 1:
        value = graph.constant_value(match.value(axes_const))
        axes = [int(a) for a in value.reshape(-1)]
    else:
        axes = list(attr(node, "axes", []) or [])
    if not axes:
        return "ReduceMean reduces over every axis"
    return axes


def trailing_axis(axes: list[int], rank: int | None) -> int | str:
    """The first normalised axis (negative) when ``axes`` are exactly the trailing axes."""
    if rank is not None:
        if any(a < -rank or a >= rank for a in axes):
            return f"axes {axes} are out of range for rank {rank}"
        positive = sorted({a % rank for a in axes})
        if positive != list(range(rank - len(positive), rank)):
            return f"axes {axes} are not the trailing axes of a rank-{rank} input"
        return -len(positive)
    negative = sorted(set(axes))
    if negative != list(range(-len(negative), 0)):
        return f"axes {axes} are not provably the trailing axes (input rank unknown)"
    return -len(negative)


def row_shape(graph: GraphIndex, x: str, axis: int) -> list[int] | None:
    shape = graph.shape(x)
    if shape is None or -axis > len(shape):
        return None
    dims = list(shape[axis:])
    return dims if all(isinstance(d, int) for d in dims) else None


def check_row_parameter(graph: GraphIndex, value: str, x: str, axis: int, what: str) -> str | None:
    """A per-row parameter (scale, bias) must have exactly the normalised dims' shape.

    Leading 1s are allowed only on a constant (the rewrite drops them); anything that broadcasts
    differently from "one value per normalised element" is refused.
    """
    dims = row_shape(graph, x, axis)
    if dims is None:
        return f"the normalised dims of {x!r} are not static, so the {what} shape cannot be proven"
    shape = graph.constant_shape(value) if graph.is_constant(value) else graph.shape(value)
    if shape is None or any(not isinstance(d, int) for d in shape):
        return f"the {what} {value!r} has an unknown shape"
    shape = list(shape)
    x_rank = graph.rank(x)
    if len(shape) < len(dims) or shape[len(shape) - len(dims):] != dims:
        return f"the {what} shape {shape} does not match the normalised dims {dims}"
    leading = shape[: len(shape) - len(dims)]
    if any(d != 1 for d in leading) or (x_rank is not None and len(shape) > x_rank):
        return f"the {what} shape {shape} broadcasts beyond the normalised dims {dims}"
    if leading and not graph.is_constant(value):
        return f"the {what} {value!r} has leading broadcast dims and is not a constant"
    tx, tp = graph.elem_type(x), graph.elem_type(value)
    if tp not in (tx, onnx.TensorProto.FLOAT):
        return f"the {what} has type {type_name(tp)}; expected {type_name(tx)} or float32"
    return None


def row_parameter(ctx: RewriteContext, value: str, x: str, axis: int) -> tuple[str, list]:
    """``value`` reshaped to exactly the normalised dims (same bytes, new dims), if needed."""
    graph = ctx.graph
    dims = row_shape(graph, x, axis)
    shape = graph.constant_shape(value) if graph.is_constant(value) else graph.shape(value)
    if list(shape) == dims:
        return value, []
    tensor = graph.constant_tensor(value)
    if tensor is not None:
        reshaped = onnx.TensorProto()
        reshaped.CopyFrom(tensor)  # an external tensor keeps pointing at the same bytes
        reshaped.name = ctx.unique_name(f"{value}_row")
        del reshaped.dims[:]
        reshaped.dims.extend(dims)
        return reshaped.name, [reshaped]
    array = graph.constant_value(value).reshape(dims)
    new = ctx.constant(f"{value}_row", array)
    return new.name, [new]


def reshaped_dims(graph: GraphIndex, node: onnx.NodeProto):
    """The output dims of a Reshape (the dimension engine solves its 0 and -1 entries)."""
    return graph.shape(node.output[0])
