"""Checks and small rewrites shared by the fusion families.

Every ``require_*`` check returns when the match is acceptable and raises ``Refuse`` with a
sentence saying why it is not; that sentence is what the report shows as a near miss.
"""

from __future__ import annotations

import ast

import numpy as np
import onnx

from otfuse.rewriter.builder import NewTensor, Value
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


def _canonical_dim(dim):
    """Symbolic sums from shape inference in one spelling: 'past_seq + seq' == 'seq + past_seq'."""
    if isinstance(dim, str) and "+" in dim and not any(c in dim for c in "*/()-"):
        return "+".join(sorted(term.strip() for term in dim.split("+")))
    return dim


def dims_equal(a, b) -> bool:
    """Known and equal: the same number, or symbolic expressions that agree. The exporters'
    symbolic dims are integer polynomials with floor division ('4*batch', '((seq**2)//seq)');
    two such expressions are taken as equal when they agree at several sizes."""
    if a is None or b is None:
        return False
    if _canonical_dim(a) == _canonical_dim(b):
        return True
    return _same_expression(str(a), str(b))


_PROBE_SIZES = (3, 7, 64, 1031)


def _same_expression(a: str, b: str) -> bool:
    try:
        trees = [ast.parse(text, mode="eval").body for text in (a, b)]
    except SyntaxError:
        return False
    names = sorted({node.id for tree in trees for node in ast.walk(tree) if isinstance(node, ast.Name)})
    if not names:
        return False
    for seed, size in enumerate(_PROBE_SIZES):
        env = {name: size + 2 * i + seed for i, name in enumerate(names)}
        values = [_evaluate(tree, env) for tree in trees]
        if None in values or values[0] != values[1]:
            return False
    return True


_OPERATORS = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y,
              ast.FloorDiv: lambda x, y: x // y if y else None, ast.Pow: lambda x, y: x ** y if 0 <= y < 8 else None}


def _evaluate(node, env):
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left, env), _evaluate(node.right, env)
        return None if left is None or right is None else _OPERATORS[type(node.op)](left, right)
    return None


def shapes_equal(a, b) -> bool:
    """Equal when every dim is known and equal (same number, or same symbolic name)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(dims_equal(x, y) for x, y in zip(a, b))


def require_same_shape(graph: GraphIndex, a: str, b: str) -> None:
    """The residual Add must not broadcast: both operands have one shape and type."""
    if graph.elem_type(a) != graph.elem_type(b):
        raise Refuse(f"residual operands have different types ({type_name(graph.elem_type(a))}, "
                     f"{type_name(graph.elem_type(b))})")
    shape_a, shape_b = graph.shape(a), graph.shape(b)
    if not shapes_equal(shape_a, shape_b):
        raise Refuse(f"residual Add may broadcast: operand shapes {_fmt(shape_a)} and {_fmt(shape_b)}")


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
    """The output dims of a Reshape: inferred ones when all are known, else worked out from a
    constant target shape (0 copies the input dim, -1 takes what is left) with symbolic dims
    cancelled as factors: [B, 2, 2, S, 8] -> [0, 4, -1, 8] gives [B, 4, S, 8]."""
    inferred = graph.shape(node.output[0])
    if inferred is not None and all(d is not None for d in inferred):
        return inferred
    source = graph.shape(node.input[0])
    if source is None or not graph.is_constant(node.input[1]) or any(d is None for d in source):
        return inferred
    target = [int(d) for d in graph.constant_value(node.input[1]).reshape(-1)]
    if attr(node, "allowzero", 0):
        return inferred
    dims = [source[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 not in dims:
        return tuple(dims)
    symbols = [d for d in source if isinstance(d, str)]
    number = int(np.prod([d for d in source if isinstance(d, int)], dtype=np.int64))
    for d in dims:
        if d == -1:
            continue
        if isinstance(d, str):
            if d not in symbols:
                return inferred
            symbols.remove(d)
        else:
            if d == 0 or number % d:
                return inferred
            number //= d
    if len(symbols) == 1 and number == 1:
        rest = symbols[0]
    elif not symbols:
        rest = number
    else:
        return inferred
    return tuple(rest if d == -1 else d for d in dims)
