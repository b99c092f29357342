"""Canonicalisation: see through small computations whose result is known before run time.

TorchScript exports compute split points and scales from shapes at run time
(``Shape(x) -> Gather(3) -> Div(2) -> Cast -> Unsqueeze`` feeding a Slice, or
``Sqrt(Cast(Shape(q)[-1:]))`` for the attention scale). When ``x``'s shape is static these are
constants; patterns then treat them as such. Nothing in the graph changes: the values are known
to the index only, and the nodes that computed them become dead (and are removed) only if a
fusion consumes their result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx


# Never fold anything bigger: this is about shapes, scales and small tables, not weights.
MAX_FOLDED_ELEMENTS = 16384

Lookup = Callable[[str], np.ndarray | None]


def attr(node: onnx.NodeProto, name: str, default=None):
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return (np.trunc(a / b)).astype(a.dtype)  # ONNX Div truncates integers toward zero
    return (a / b).astype(a.dtype)


def _slice(node, values) -> np.ndarray:
    data, starts, ends = values[0], values[1], values[2]
    axes = values[3] if len(values) > 3 and values[3] is not None else np.arange(len(starts))
    steps = values[4] if len(values) > 4 and values[4] is not None else np.ones(len(starts), np.int64)
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[int(axis)] = slice(int(start), int(end), int(step))
    return data[tuple(index)]


def _range(node, values) -> np.ndarray:
    """Range(start, limit, delta) of scalars (torch's slice_scatter writes its lane indices as
    ``Range(0, Shape(x)[-1], 1)`` sliced by a step); refused (ValueError) when over the size cap."""
    start, limit, delta = (v.reshape(-1) for v in values[:3])
    if start.size != 1 or limit.size != 1 or delta.size != 1 or delta[0] == 0:
        raise ValueError("Range needs scalar start, limit and a non-zero delta")
    count = max(int(np.ceil((float(limit[0]) - float(start[0])) / float(delta[0]))), 0)
    if count > MAX_FOLDED_ELEMENTS:
        raise ValueError("Range too long to fold")
    return (start[0] + np.arange(count, dtype=values[0].dtype) * delta[0]).astype(values[0].dtype)


def _axes(node, values, position: int) -> list[int]:
    if len(values) > position and values[position] is not None:
        return [int(a) for a in values[position].reshape(-1)]
    return list(attr(node, "axes", []))


_FOLDERS: dict[str, Callable] = {
    "Identity": lambda node, v: v[0],
    "Cast": lambda node, v: v[0].astype(onnx.helper.tensor_dtype_to_np_dtype(attr(node, "to"))),
    "Gather": lambda node, v: np.take(v[0], v[1].astype(np.int64), axis=attr(node, "axis", 0)),
    "Slice": _slice,
    "Unsqueeze": lambda node, v: np.expand_dims(v[0], tuple(sorted(a % (v[0].ndim + len(_axes(node, v, 1)))
                                                                   for a in _axes(node, v, 1)))),
    "Squeeze": lambda node, v: np.squeeze(v[0], tuple(_axes(node, v, 1)) or None),
    "Concat": lambda node, v: np.concatenate(v, axis=attr(node, "axis")),
    "Reshape": lambda node, v: v[0].reshape([int(d) if d != 0 else v[0].shape[i]
                                             for i, d in enumerate(v[1])]),
    "Add": lambda node, v: (v[0] + v[1]).astype(v[0].dtype),
    "Sub": lambda node, v: (v[0] - v[1]).astype(v[0].dtype),
    "Mul": lambda node, v: (v[0] * v[1]).astype(v[0].dtype),
    "Div": lambda node, v: _int_div(v[0], v[1]),
    "Sqrt": lambda node, v: np.sqrt(v[0]).astype(v[0].dtype),
    "Reciprocal": lambda node, v: (1 / v[0]).astype(v[0].dtype),
    "Range": _range,
    "Floor": lambda node, v: np.floor(v[0]),
    "Ceil": lambda node, v: np.ceil(v[0]),
}


def fold_static_values(nodes: list[onnx.NodeProto], constant: Lookup, known: Lookup,
                       is_constant: Callable[[str], bool],
                       elem_type: Callable[[str], int] = lambda name: 0) -> dict[str, np.ndarray]:
    """Values computable now: what the dimension engine knows as numbers (``known``: Shape of
    static dims, static dims picked out of a partly known shape, shape arithmetic), and outputs of
    foldable nodes whose inputs are constants or folded (float scales: ``Sqrt(Cast(...))``); a
    constant is read (``constant``) only when every input is one (``is_constant``).
    ``CastLike(c, x)`` (onnxscript's unoptimised constants) needs only ``c`` and x's type."""
    folded: dict[str, np.ndarray] = {}

    def value_of(name: str) -> np.ndarray | None:
        if not name:
            return None
        return folded[name] if name in folded else constant(name)

    for node in nodes:
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            continue
        result = known(node.output[0])
        if result is None and node.op_type == "CastLike" and len(node.input) == 2:
            target = elem_type(node.input[1])
            if target and (node.input[0] in folded or is_constant(node.input[0])):
                value = value_of(node.input[0])
                if value is not None and value.size <= MAX_FOLDED_ELEMENTS:
                    folded[node.output[0]] = value.astype(onnx.helper.tensor_dtype_to_np_dtype(target))
            continue
        required = node.input if node.op_type != "Slice" else node.input[:3]
        if result is None and node.op_type in _FOLDERS and \
                all(name in folded or is_constant(name) for name in required):  # read nothing otherwise
            values = [value_of(name) for name in node.input]
            if not values or any(v is None for v in (values if node.op_type != "Slice" else values[:3])):
                continue
            if any(v.size > MAX_FOLDED_ELEMENTS for v in values if v is not None):
                continue
            try:
                result = np.asarray(_FOLDERS[node.op_type](node, values))
            except (ValueError, IndexError, TypeError, ZeroDivisionError, FloatingPointError):
                continue  # not foldable as written: leave it to run time
        if result is not None and result.size <= MAX_FOLDED_ELEMENTS:
            folded[node.output[0]] = result
    return folded
