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
- ``Dropout`` at inference: no ``training_mode`` input (or a constant false one), its mask output
  absent or unread (from opset 7 on, where an absent training mode means inference; onnxscript's
  own test models and older dynamo exports write ``Dropout(p, 0.0)`` after the attention Softmax).

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


def _unread(graph: GraphIndex, name: str) -> bool:
    return not name or (not graph.is_graph_output(name) and not graph.uses(name))


def _is_inference_dropout(graph: GraphIndex, node: onnx.NodeProto, opset: int) -> bool:
    """Dropout returns its input unchanged unless training: opset >= 7 (before, ``is_test`` 0 by
    default meant training), no attribute but ``seed`` / ``ratio`` (neither matters at inference),
    the training mode absent or a constant false, and the mask output nobody reads."""
    if opset < 7 or {a.name for a in node.attribute} - {"seed", "ratio"}:
        return False
    if len(node.output) > 2 or (len(node.output) == 2 and not _unread(graph, node.output[1])):
        return False
    training = node.input[2] if len(node.input) > 2 else ""
    if not training:
        return True
    value = graph.constant_value(training) if graph.is_constant(training) else None
    return value is not None and value.size == 1 and not bool(value.reshape(-1)[0])


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _droppable(graph: GraphIndex, node: onnx.NodeProto, opset: int) -> bool:
    outputs = 2 if node.op_type == "Dropout" else 1  # Dropout's mask: checked below
    if node.domain not in ("", "ai.onnx") or not 1 <= len(node.output) <= outputs:
        return False
    if not node.input or not node.input[0]:
        return False
    out = node.output[0]
    if graph.is_graph_output(out) or any(out not in reader.input or _has_subgraph(reader) for reader in graph.uses(out)):
        return False
    if node.op_type == "Identity":
        return True
    if node.op_type == "Cast":
        return _is_noop_cast(graph, node)
    if node.op_type == "CastLike":
        return _is_noop_cast_like(graph, node)
    if node.op_type == "Slice":
        return _is_full_slice(graph, node)
    if node.op_type == "Dropout":
        return _is_inference_dropout(graph, node, opset)
    return False


@dataclass(frozen=True)
class NoOpsPass:
    """Drops Identity, Casts to the input's own type, Slices that keep every element and inference
    Dropouts (see above)."""

    def run(self, model: onnx.ModelProto, base_dir: Path | None) -> PassResult:
        graph = index_for(model, base_dir)
        opset = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), 0)
        renamed: dict[str, str] = {}
        gone: set[str] = set()  # unread second outputs (Dropout's mask)
        kept = []
        for node in model.graph.node:
            for i, name in enumerate(node.input):
                if name in renamed:
                    node.input[i] = renamed[name]
            if _droppable(graph, node, opset):
                renamed[node.output[0]] = node.input[0]
                gone.update(name for name in node.output[1:] if name)
            else:
                kept.append(node)
        if renamed:
            del model.graph.node[:]
            model.graph.node.extend(kept)
            stale = [v for v in model.graph.value_info if v.name in renamed or v.name in gone]
            for value in stale:
                model.graph.value_info.remove(value)
        return PassResult(fusions=Counter())
