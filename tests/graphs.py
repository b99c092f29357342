"""Small hand-built ONNX graphs that spell subgraphs the way exporters do, with knobs to mutate
them. The real-export tests use models/fixtures; these make every mutation explicit."""

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


def rms_norm(b: GraphBuilder, x: str, hidden: int, *, eps=1e-6, weight=None, dtype=np.float32,
             cast=False, square="pow", inverse="reciprocal", axes=(-1,), axes_as_input=True,
             weight_first=True, keepdims=1, exponent=2.0, eps_const=True, weight_before_reduce=False,
             gemma=False) -> str:
    """weight * (x / sqrt(mean(x^2) + eps)), spelled with the chosen ops."""
    rng = np.random.default_rng(0)
    weight = weight if weight is not None else (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
    w = b.const(weight, "weight")
    xf = b.node("Cast", [x], to=F32) if cast else x
    # The mutation "weight applied before the reduction": the squared value is not x.
    xs = b.node("Mul", [xf, b.const(np.float32(1.5))]) if weight_before_reduce else xf
    sq = b.node("Pow", [xs, b.const(np.float32(exponent))]) if square == "pow" else b.node("Mul", [xs, xs])
    if axes_as_input:
        ms = b.node("ReduceMean", [sq, b.const(np.array(axes, dtype=np.int64))], keepdims=keepdims)
    else:
        ms = b.node("ReduceMean", [sq], axes=list(axes), keepdims=keepdims)
    eps_name = b.const(np.float32(eps), "eps") if eps_const else b.input("eps_in", F32, [])
    std = b.node("Sqrt", [b.node("Add", [ms, eps_name])])
    if inverse == "reciprocal":
        normed = b.node("Mul", [xf, b.node("Reciprocal", [std])])
    elif inverse == "div_one":
        normed = b.node("Mul", [xf, b.node("Div", [b.const(np.float32(1.0)), std])])
    else:
        normed = b.node("Div", [xf, std])
    if cast:
        normed = b.node("Cast", [normed], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    if gemma:
        w = b.node("Add", [b.const(np.asarray(1.0, dtype=dtype)), w])
    return b.node("Mul", [w, normed] if weight_first else [normed, w])


def layer_norm_decomposed(b: GraphBuilder, x: str, hidden: int, *, eps=1e-5, bias=True,
                          square="pow", axes=(-1,)) -> str:
    rng = np.random.default_rng(1)
    mean = b.node("ReduceMean", [x, b.const(np.array(axes, dtype=np.int64))], keepdims=1)
    centered = b.node("Sub", [x, mean])
    sq = (b.node("Pow", [centered, b.const(np.float32(2.0))]) if square == "pow"
          else b.node("Mul", [centered, centered]))
    var = b.node("ReduceMean", [sq, b.const(np.array(axes, dtype=np.int64))], keepdims=1)
    std = b.node("Sqrt", [b.node("Add", [var, b.const(np.float32(eps))])])
    normed = b.node("Div", [centered, std])
    out = b.node("Mul", [normed, b.const((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))])
    if bias:
        out = b.node("Add", [out, b.const((0.1 * rng.standard_normal(hidden)).astype(np.float32))])
    return out


def single_norm_model(kind: str = "rms", hidden: int = 16, dtype=np.float32, residual=False,
                      sum_used=True, **kwargs) -> onnx.ModelProto:
    """x [batch, seq, hidden] -> norm -> y (and the residual sum as a second output if used)."""
    # ReduceMean takes axes as an attribute before opset 18.
    b = GraphBuilder(opset=OPSET if kwargs.get("axes_as_input", True) else 17)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x = b.input("x", elem, ["batch", "seq", hidden])
    if residual:
        r = b.input("r", elem, ["batch", "seq", hidden])
        x = b.node("Add", [x, r], base="sum")
    if kind == "rms":
        y = rms_norm(b, x, hidden, dtype=dtype, **kwargs)
    else:
        y = layer_norm_decomposed(b, x, hidden, **kwargs)
    b.nodes[-1].output[0] = "y"
    b.output("y", elem, ["batch", "seq", hidden])
    if residual and sum_used:
        b.node("Identity", [x], base="sum_out")
        b.nodes[-1].output[0] = "sum_out"
        b.output("sum_out", elem, ["batch", "seq", hidden])
    return b.model()
