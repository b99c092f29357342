"""Canonicalise: nodes that provably return their input unchanged are dropped, their readers
reading the input instead, so that one tensor is one value again for the patterns.

- ``Cast`` to the element type its input already has (GPT-J's eager attention casts q, k and the
  probabilities ``.to(float32)``; in a float32 model these are copies), and ``CastLike`` to a
  tensor of that type (ONNX function bodies: ``CastLike(mask, bias)``).
- ``Identity`` (ONNX function bodies inlined: ``QReshaped = Identity(Q)`` for 4-D inputs).
- ``Slice`` that keeps every element: start 0, step 1 and an end at or past the axis (the dynamo
  exporter's unoptimised output writes ``x[:, :, :, :r]`` as a full Slice of each leading axis,
  once per use: the rotated and the passed-through lanes of one x then hang off two different,
  equal values).

- ``Concat`` of one value and parts proven empty along the joined axis (TorchScript's Phi-3 writes
  its rotary as ``cat([rope(x[..., :r]), x[..., r:]])`` with ``r = D``: the pass-through part has
  0 lanes, and the rotation left behind that Concat is no longer what the attention reads).

Exact: the dropped node's output equals its input in every run. A node whose output is a graph
output, or is read inside a subgraph, is kept (its name is part of the interface).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx

from otfuse.rewriter.graph import GraphIndex, index_for
from otfuse.rewriter.passes import PassResult
from otfuse.rewriter.pattern import attr

_END_OF_ANY_AXIS = 2**62  # torch writes INT64_MAX for an open end; no tensor has an axis this long


def _is_noop_cast(graph: GraphIndex, node: onnx.NodeProto) -> bool:
    # saturate / round_mode act on float8 / float4 targets only: a cast to the same type ignores them
    if {a.name for a in node.attribute} - {"to", "saturate", "round_mode"}:
        return False
    source = graph.elem_type(node.input[0])
    return bool(source) and attr(node, "to") == source


def _is_noop_cast_like(graph: GraphIndex, node: onnx.NodeProto) -> bool:
    if {a.name for a in node.attribute} - {"saturate", "round_mode"} or len(node.input) != 2:
        return False
    source, like = graph.elem_type(node.input[0]), graph.elem_type(node.input[1])
    return bool(source) and source == like


def _full_axis(dims, start: int, end: int, axis: int, step: int) -> bool:
    if step != 1 or start != 0:
        return False
    if end >= _END_OF_ANY_AXIS:
        return True
    dim = dims[axis] if dims is not None and -len(dims) <= axis < len(dims) else None
    return isinstance(dim, int) and end >= dim


def _is_full_slice(graph: GraphIndex, node: onnx.NodeProto) -> bool:
    """Opset >= 10 Slice with constant starts/ends/axes/steps that keeps every element."""
    if node.attribute or len(node.input) < 3 or not all(graph.is_constant(name) for name in node.input[1:] if name):
        return False
    values = [graph.constant_value(name).reshape(-1).tolist() if name else None for name in node.input[1:]]
    starts, ends = values[0], values[1]
    axes = values[2] if len(values) > 2 and values[2] is not None else list(range(len(starts)))
    steps = values[3] if len(values) > 3 and values[3] is not None else [1] * len(starts)
    if not (len(starts) == len(ends) == len(axes) == len(steps)) or not starts:
        return False
    dims = graph.shape(node.input[0])
    return all(_full_axis(dims, *params) for params in zip(starts, ends, axes, steps))


def _concat_of_one(graph: GraphIndex, node: onnx.NodeProto) -> str | None:
    """The one input of a Concat whose other inputs have a proven 0 extent along its axis."""
    if [a.name for a in node.attribute] != ["axis"] or len(node.input) < 2 or not all(node.input):
        return None
    axis = attr(node, "axis")
    shapes = [graph.proven_shape(name) for name in node.input]
    if any(shape is None or not -len(shape) <= axis < len(shape) for shape in shapes):
        return None
    kept = [name for name, shape in zip(node.input, shapes) if shape[axis] != 0]
    return kept[0] if len(kept) == 1 else None


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _droppable(graph: GraphIndex, node: onnx.NodeProto) -> str | None:
    """The input that the node's output equals, when the node can be dropped."""
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1 or not node.input or not node.input[0]:
        return None
    out = node.output[0]
    if graph.is_graph_output(out) or any(out not in reader.input or _has_subgraph(reader) for reader in graph.uses(out)):
        return None
    if node.op_type == "Concat":
        return _concat_of_one(graph, node)
    same = {"Identity": lambda: True, "Cast": lambda: _is_noop_cast(graph, node),
            "CastLike": lambda: _is_noop_cast_like(graph, node),
            "Slice": lambda: _is_full_slice(graph, node)}.get(node.op_type)
    return node.input[0] if same is not None and same() else None


@dataclass(frozen=True)
class NoOpsPass:
    """Drops Identity, Casts to the input's own type, Slices that keep every element and Concats
    of one non-empty part (see above)."""

    def run(self, model: onnx.ModelProto, base_dir: Path | None) -> PassResult:
        graph = index_for(model, base_dir)
        renamed: dict[str, str] = {}
        kept = []
        for node in model.graph.node:
            for i, name in enumerate(node.input):
                if name in renamed:
                    node.input[i] = renamed[name]
            source = _droppable(graph, node)
            if source is not None:
                renamed[node.output[0]] = renamed.get(source, source)
            else:
                kept.append(node)
        if renamed:
            del model.graph.node[:]
            model.graph.node.extend(kept)
            stale = [v for v in model.graph.value_info if v.name in renamed]
            for value in stale:
                model.graph.value_info.remove(value)
        return PassResult(fusions=Counter())
