"""A fused node read back as its contract call (otfuse/ops.py): inputs, outputs and attributes by
contract name, defaults filled in. The node is exactly what the rule's ``Fusion`` emitted, so an
emitter reading it reads the same analysis the otfuse target wrote."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from otfuse import ops


@dataclass(frozen=True)
class FusedCall:
    op: str
    inputs: dict[str, str]  # contract name -> value ("" / missing when not given)
    outputs: dict[str, str]
    attributes: dict[str, object]
    node: onnx.NodeProto

    def input(self, name: str) -> str:
        return self.inputs.get(name, "")

    def output(self, name: str) -> str:
        return self.outputs.get(name, "")


def read_call(node: onnx.NodeProto) -> FusedCall:
    """Only for ops without variadic formals (every op a target lowers)."""
    op = ops.get(node.op_type)
    inputs = {formal.name: value for formal, value in zip(op.inputs, node.input)}
    outputs = {formal.name: value for formal, value in zip(op.outputs, node.output)}
    given = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    given = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in given.items()}
    attributes = {}
    for attribute in op.attributes:
        default = attribute.default
        if isinstance(default, ops.SameAs):
            default = given.get(default.attribute, op.default(default.attribute))
        attributes[attribute.name] = given.get(attribute.name, default)
    unknown = set(given) - set(attributes)
    if unknown:
        raise ValueError(f"{node.op_type} {node.name!r} has attributes docs/ops.md does not define: {sorted(unknown)}")
    return FusedCall(node.op_type, inputs, outputs, attributes, node)
