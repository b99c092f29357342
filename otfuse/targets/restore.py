"""Put a site back as the original graph wrote it.

A fused node keeps the names of the values it replaced (docs/ops.md), so the original nodes of a
site are the original graph's producers of the fused node's outputs, followed upstream until a
value the lowered graph still has. Every site restored in one lowering is sliced at once (one site
may read another's outputs), and the original initializers the slice reads come back with it.
"""

from __future__ import annotations

import onnx


class RestoreError(Exception):
    """The original graph does not hold the site (a name clash): a bug, never a user's input."""


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output if out}


def reads(node: onnx.NodeProto) -> list[str]:
    names = [name for name in node.input if name]
    for attribute in node.attribute:
        for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
            inner_made = {out for inner in sub.node for out in inner.output}
            inner_made |= {i.name for i in sub.input} | {t.name for t in sub.initializer}
            names += [name for inner in sub.node for name in reads(inner) if name not in inner_made]
    return names


def restore_sites(graph: onnx.GraphProto, original: onnx.GraphProto, outputs: set[str],
                  available: set[str]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The original nodes (in their original order) and initializers that compute ``outputs``
    from ``available`` (the values the lowered graph keeps)."""
    producers = _producers(original)
    initializers = {t.name: t for t in original.initializer}
    taken_nodes: dict[int, onnx.NodeProto] = {}
    tensors: dict[str, onnx.TensorProto] = {}
    pending = list(outputs)
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or (name in available and name not in outputs):
            continue
        seen.add(name)
        if name in initializers:
            tensors[name] = initializers[name]
            continue
        node = producers.get(name)
        if node is None:
            raise RestoreError(f"the original graph does not compute {name!r}")
        if id(node) not in taken_nodes:
            taken_nodes[id(node)] = node
            pending += reads(node)
    clash = sorted(out for node in taken_nodes.values() for out in node.output if out in available and out not in outputs)
    if clash:
        raise RestoreError(f"restoring the original nodes would compute {clash[:3]} twice")
    order = {id(node): index for index, node in enumerate(original.node)}
    nodes = []
    for node in sorted(taken_nodes.values(), key=lambda n: order[id(n)]):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        nodes.append(copy)
    kept = []
    for tensor in tensors.values():
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        kept.append(copy)
    return nodes, kept
