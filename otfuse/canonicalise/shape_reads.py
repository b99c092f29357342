"""Canonicalise: a ``Shape`` read of a value is served by an earlier value with the same dims where
they are read, so fusing what computed the later value does not have to keep it alive.

The TorchScript exporter takes the sizes of its output ``Reshape`` from the tensors attention
works on: ``Shape(q_rot)[2]`` (the sequence, from the rotated q) and ``Shape(repeat_kv(v))[3]``
(the head size, from the repeated values). Both tensors are interior to a fused attention (the
rotation folds in, repeat_kv is read as ``kv_num_heads``), so these reads blocked the fusion.
Here each such ``Shape`` is moved to the nearest ancestor along the data path (the unrotated q,
the unrepeated v) whose dims at every position its readers pick are provably the same (the
same number, or the same symbolic name). Exact: only which tensor's shape is read changes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx

from otfuse.domain import OP_DOMAIN
from otfuse.rewriter.graph import GraphIndex, index_for
from otfuse.rewriter.passes import PassResult
from otfuse.rewriter.pattern import attr

_MAX_HOPS = 4  # repeat_kv is Unsqueeze -> Expand -> Reshape: three hops back to v
# Hops that carry the same tensor, rearranged (repeat_kv) or rotated: never past a computation
# whose result a fusion keeps (moving the attention output's read onto its probabilities would pin them).
_REARRANGING = {"Reshape", "Expand", "Unsqueeze"}
_ROTATIONS = {"RotaryEmbedding", "RotaryEmbeddingQK"}  # output i has input i's shape (docs/ops.md)


def _picked_dims(graph: GraphIndex, shape_node: onnx.NodeProto, rank: int) -> set[int] | None:
    """Axes of the Shape's input that its readers use: each reader must be Gather(axis 0) with
    constant indices (the exporter's ``size(i)``); None if any reader does something else."""
    if attr(shape_node, "start") is not None or attr(shape_node, "end") is not None:
        return None
    readers = graph.uses(shape_node.output[0])
    if not readers or graph.is_graph_output(shape_node.output[0]):
        return None
    picked: set[int] = set()
    for reader in readers:
        if reader.op_type != "Gather" or reader.input[0] != shape_node.output[0] or attr(reader, "axis", 0) != 0 \
                or not graph.is_constant(reader.input[1]):
            return None
        for index in graph.constant_value(reader.input[1]).reshape(-1):
            if not -rank <= int(index) < rank:
                return None
            picked.add(int(index) % rank)
    return picked


def _same_dim(a, b) -> bool:
    return a is not None and b is not None and a == b


def _source(graph: GraphIndex, value: str) -> str | None:
    """The tensor ``value`` rearranges or rotates, if its producer is such a hop."""
    node = graph.producer.get(value)
    if node is None:
        return None
    if node.domain == OP_DOMAIN and node.op_type in _ROTATIONS:
        return node.input[list(node.output).index(value)] or None
    if node.domain in ("", "ai.onnx") and node.op_type in _REARRANGING:
        return node.input[0] or None
    return None


def _stand_in(graph: GraphIndex, value: str, picked: set[int]) -> str | None:
    """The nearest source (up to _MAX_HOPS) with the same rank and dims at ``picked``."""
    shape = graph.proven_shape(value)  # the read's value changes unless the dims are equal in every run
    if shape is None:
        return None
    current = value
    for _ in range(_MAX_HOPS):
        current = _source(graph, current)
        if current is None:
            return None
        other = graph.proven_shape(current)
        if other is not None and len(other) == len(shape) and all(_same_dim(shape[i], other[i]) for i in picked):
            return current
    return None


@dataclass(frozen=True)
class ShapeReadsPass:
    """Moves the ``Shape`` reads of rank-4 tensors to equal-dimensioned ancestors (see above)."""

    def run(self, model: onnx.ModelProto, base_dir: Path | None) -> PassResult:
        graph = index_for(model, base_dir)
        for node in model.graph.node:
            if node.op_type != "Shape" or node.domain not in ("", "ai.onnx") or graph.rank(node.input[0]) != 4:
                continue
            picked = _picked_dims(graph, node, 4)
            stand_in = _stand_in(graph, node.input[0], picked) if picked else None
            if stand_in is not None:
                node.input[0] = stand_in
        return PassResult(fusions=Counter())

