"""Shape reads of a match's interior values, rebuilt from the fused node's own inputs.

Exporters size masks and slices from whatever tensor is at hand: optimum's BLOOM slices the causal
mask to ``Shape(Kᵀ)[2]`` where Kᵀ is computed inside the attention match, Meta's rotary reads
``Shape(transpose(q_rot))``. The fused node would then read a value computed from its own
interior (a cycle), although only a *shape* crosses the boundary. When the dimension engine proves
that each dim read equals a dim of a value the fused node reads from outside the match (or is a
constant), the ``Shape`` node (or each ``Gather`` of it) is rebuilt from that outside value and
taken into the fusion: the same numbers, no tie to the interior left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from otfuse.rewriter.checks import dims_equal
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.rule import Replacement

_ALL = 2**63 - 1
# (value, axis) of an outside value, or an int: where each dim of a shape read comes from.
Source = tuple[str, int] | int


def rebase_shape_reads(graph: GraphIndex, covers: Sequence[onnx.NodeProto], produces: frozenset[str],
                       replacement: Replacement, upstream: Callable[[str, set[int]], set[str]],
                       unique_name: Callable[[str], str]) -> tuple[onnx.NodeProto, ...]:
    """Rebuild the ``Shape`` reads of interior values that the replacement's inputs depend on.
    ``upstream(name, covered)`` gives the values ``name`` depends on outside ``covered``. Adds the
    rebuilt nodes to ``replacement`` and returns the nodes they replace (to be covered), or ()."""
    covered = {id(node) for node in covers}
    interior = {out for node in covers for out in node.output if out and out not in produces}
    made = {out for node in replacement.nodes for out in node.output if out}
    inputs = [name for node in replacement.nodes for name in node.input if name and name not in made]
    outside = [name for name in dict.fromkeys(inputs) if not (upstream(name, covered) & interior)]
    taken: list[onnx.NodeProto] = []
    for name in dict.fromkeys(inputs):
        for value in upstream(name, covered):
            reader = graph.producer.get(value)
            if reader is None or reader in taken or not _is_plain_shape(reader) or reader.input[0] not in interior:
                continue
            rebuilt = _rebuild(graph, reader, outside, unique_name)
            if rebuilt is None:
                continue
            nodes, initializers, replaced = rebuilt
            replacement.nodes.extend(nodes)
            replacement.initializers.extend(initializers)
            taken.extend(replaced)
    return tuple(taken)


def _is_plain_shape(node: onnx.NodeProto) -> bool:
    return node.op_type == "Shape" and node.domain in ("", "ai.onnx")


def _rebuild(graph: GraphIndex, shape_node: onnx.NodeProto, outside: list[str], unique_name):
    """(nodes, initializers, replaced nodes) computing the Shape node's output, or the outputs of
    its Gather readers, from ``outside`` values; None when a dim read is not proven equal to one."""
    dims = graph.proven_shape(shape_node.input[0])
    if dims is None:
        return None
    start, end = _attr(shape_node, "start", 0), _attr(shape_node, "end", _ALL)
    read = list(range(len(dims)))[slice(start, end)]
    builder = _Builder(unique_name)
    sources = [_source(graph, dims[axis], outside) for axis in read]
    if all(source is not None for source in sources):
        builder.shape(sources, shape_node.output[0])
        return builder.nodes, builder.initializers, [shape_node]
    gathers = graph.uses(shape_node.output[0])
    if graph.is_graph_output(shape_node.output[0]) or not gathers:
        return None
    for gather in gathers:
        indices = _gather_indices(graph, gather, shape_node.output[0])
        if indices is None:
            return None
        picked = [_source(graph, dims[read[i]], outside) if -len(read) <= i < len(read) else None
                  for i in indices.reshape(-1)]
        if any(source is None for source in picked):
            return None
        builder.shape(picked, gather.output[0], scalar=indices.ndim == 0)
    return builder.nodes, builder.initializers, [shape_node, *gathers]


def _gather_indices(graph: GraphIndex, node: onnx.NodeProto, data: str) -> np.ndarray | None:
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.input[0] != data:
        return None
    if _attr(node, "axis", 0) != 0 or not graph.is_constant(node.input[1]):
        return None
    indices = graph.constant_value(node.input[1])
    return None if indices is None or indices.ndim > 1 else indices.astype(np.int64)


def _source(graph: GraphIndex, dim, outside: list[str]) -> Source | None:
    if isinstance(dim, (int, np.integer)):
        return int(dim)
    for name in outside:
        shape = graph.proven_shape(name)
        for axis, other in enumerate(shape or ()):
            if not isinstance(other, (int, np.integer)) and dims_equal(other, dim):
                return name, axis
    return None


class _Builder:
    """Shape / Gather / Concat nodes and int64 constants with fresh names."""

    def __init__(self, unique_name):
        self.unique_name = unique_name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._shapes: dict[str, str] = {}

    def shape(self, sources: list[Source], output: str, scalar: bool = False) -> None:
        pieces = [self._piece(source, scalar) for source in sources]
        if scalar or len(pieces) == 1:
            self._node("Identity", pieces, output)
        else:
            self._node("Concat", pieces, output, axis=0)

    def _piece(self, source: Source, scalar: bool) -> str:
        if isinstance(source, int):
            return self._ints(source if scalar else [source])
        name, axis = source
        if name not in self._shapes:
            self._shapes[name] = self._node("Shape", [name], self.unique_name(f"{name}_shape"))
        return self._node("Gather", [self._shapes[name], self._ints(axis if scalar else [axis])],
                          self.unique_name(f"{name}_dim{axis}"), axis=0)

    def _ints(self, value) -> str:
        tensor = numpy_helper.from_array(np.array(value, dtype=np.int64), self.unique_name("shape_read_const"))
        self.initializers.append(tensor)
        return tensor.name

    def _node(self, op_type: str, inputs: list[str], output: str, **attributes) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=self.unique_name(output), **attributes))
        return output


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return attribute.i
    return default
