"""The builder of small hand-built ONNX graphs. Each family's builders, which spell its subgraphs
the way exporters do with knobs to mutate them, are in tests/fusions/<family>/graphs.py. The
real-export tests use models/fixtures; these make every mutation explicit."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
OPSET = 18


class GraphBuilder:
    def __init__(self, opset: int = OPSET):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.opset = opset
        self._count = 0

    def name(self, base: str) -> str:
        self._count += 1
        return f"{base}_{self._count}"

    def input(self, name: str, elem: int, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, name: str, elem: int, shape) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    def const(self, value, base: str = "c") -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op_type: str, inputs, base: str | None = None, outputs: int = 1, **attrs):
        outs = [self.name(base or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.name(op_type), **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "g", self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 9
        return onnx.shape_inference.infer_shapes(model)


def retyped(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy typed afresh: value_info dropped, strict shape inference, every graph output declared
    with the type and shape it inferred."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.value_info[:]
    for output in copy.graph.output:
        output.ClearField("type")
    inferred = onnx.shape_inference.infer_shapes(copy, strict_mode=True)
    known = {v.name: v.type for v in inferred.graph.value_info}
    for output in inferred.graph.output:
        if not output.type.tensor_type.elem_type and output.name in known:
            output.type.CopyFrom(known[output.name])
    return inferred


def read_elsewhere(model: onnx.ModelProto, value: str, op: str = "Identity",
                   elem: int = TensorProto.FLOAT) -> None:
    """Mutation: ``value`` (an interior value of a subgraph a rule matches) gains a reader outside
    the match, ``op`` into a new graph output, so fusing the subgraph would drop a value the model
    still needs."""
    out = f"{value}_read_elsewhere"
    model.graph.node.append(helper.make_node(op, [value], [out]))
    model.graph.output.append(helper.make_tensor_value_info(out, elem, None))
