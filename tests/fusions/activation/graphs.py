"""Hand-built MLP activations, spelled the ways exporters write them, with knobs to mutate them.

The element-wise builders add the activation of x to a GraphBuilder and return its output;
``mlp_model`` wraps one into a model (x a graph input [B, S, 16], y the output). ``gated_model``
takes the projections as inputs: two of [B, S, H], or one of [B, S, 2H]."""

from __future__ import annotations

import math

import numpy as np
import onnx
from graphs import F32, GraphBuilder

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
SHAPE = ["batch", "seq", 16]


def const(g: GraphBuilder, value: float, dtype=np.float32) -> str:
    return g.const(np.array(value, dtype=dtype))


def cube(g: GraphBuilder, x: str, spelling: str) -> str:
    if spelling == "pow":
        return g.node("Pow", [x, const(g, 3.0)])
    if spelling == "mul_mul":
        return g.node("Mul", [g.node("Mul", [x, x]), x])
    return g.node("Mul", [x, g.node("Pow", [x, const(g, 2.0)])])  # x * x^2


def gelu_tanh(g: GraphBuilder, x: str, spelling: str = "gpt2", c: float = SQRT_2_OVER_PI, k: float = 0.044715,
              half: float = 0.5, c_as_sqrt: bool = False, cube_spelling: str = "pow", dtype=np.float32) -> str:
    """0.5 x (1 + tanh(c (x + k x^3))) in one of its spellings."""
    c_value = g.node("Sqrt", [const(g, c * c, dtype)]) if c_as_sqrt else const(g, c, dtype)
    if spelling == "gpt2":  # NewGELU: (x * 0.5) * (1 + tanh((x + k * x^3) * c))
        inner = g.node("Mul", [g.node("Add", [x, g.node("Mul", [cube(g, x, cube_spelling), const(g, k, dtype)])]),
                               c_value])
        t = g.node("Tanh", [inner])
        return g.node("Mul", [g.node("Mul", [x, const(g, half, dtype)]), g.node("Add", [t, const(g, 1.0, dtype)])])
    if spelling == "bloom":  # x * 0.5 * (1 + tanh(c * x * (1 + k * x * x)))
        kxx = g.node("Mul", [g.node("Mul", [x, const(g, k, dtype)]), x])
        inner = g.node("Mul", [g.node("Mul", [x, c_value]), g.node("Add", [kxx, const(g, 1.0, dtype)])])
        t = g.node("Tanh", [inner])
        return g.node("Mul", [g.node("Mul", [x, const(g, half, dtype)]), g.node("Add", [t, const(g, 1.0, dtype)])])
    if spelling == "torchscript":  # x * (0.5 * (1 + tanh(...))), the cube as x*x*x, 1 + t written first
        inner = g.node("Mul", [c_value, g.node("Add", [x, g.node("Mul", [const(g, k, dtype),
                                                                          cube(g, x, "mul_mul")])])])
        t = g.node("Tanh", [inner])
        return g.node("Mul", [x, g.node("Mul", [const(g, half, dtype), g.node("Add", [const(g, 1.0, dtype), t])])])
    if spelling == "sigmoid":  # x * sigmoid(2c (x + k x^3))
        inner = g.node("Mul", [g.node("Add", [x, g.node("Mul", [cube(g, x, cube_spelling), const(g, k, dtype)])]),
                               const(g, 2 * c, dtype)])
        return g.node("Mul", [x, g.node("Sigmoid", [inner])])
    raise ValueError(spelling)


def gelu_erf(g: GraphBuilder, x: str, spelling: str = "div", scale: float = math.sqrt(2.0), half: float = 0.5,
             dtype=np.float32) -> str:
    """0.5 x (1 + erf(x / sqrt2)) in one of its spellings."""
    if spelling == "div":  # TorchScript F.gelu: (x * (erf(x / 1.4142) + 1)) * 0.5
        e = g.node("Erf", [g.node("Div", [x, const(g, scale, dtype)])])
        return g.node("Mul", [g.node("Mul", [x, g.node("Add", [e, const(g, 1.0, dtype)])]), const(g, half, dtype)])
    if spelling == "mul":  # 0.5 * x * (1 + erf(x * 0.7071))
        e = g.node("Erf", [g.node("Mul", [x, const(g, 1.0 / scale, dtype)])])
        return g.node("Mul", [g.node("Mul", [const(g, half, dtype), x]), g.node("Add", [const(g, 1.0, dtype), e])])
    if spelling == "div_two":  # x * (1 + erf(x / sqrt2)) / 2
        e = g.node("Erf", [g.node("Div", [x, const(g, scale, dtype)])])
        return g.node("Div", [g.node("Mul", [x, g.node("Add", [e, const(g, 1.0, dtype)])]), const(g, 1.0 / half, dtype)])
    raise ValueError(spelling)


def silu(g: GraphBuilder, x: str, sigmoid_of: str | None = None) -> str:
    return g.node("Mul", [x, g.node("Sigmoid", [sigmoid_of or x])])


def quick_gelu(g: GraphBuilder, x: str, alpha=1.702, alpha_first: bool = False) -> str:
    scaled = g.node("Mul", [const(g, alpha), x] if alpha_first else [x, g.const(np.asarray(alpha, np.float32))])
    return g.node("Mul", [g.node("Sigmoid", [scaled]), x])


def mlp_model(build, elem=F32, opset: int = 18, also_output=None):
    """x -> build(g, x) -> y. ``also_output(g)`` names an interior value to make a graph output too
    (an extra reader the fusion must refuse)."""
    g = GraphBuilder(opset)
    x = g.input("x", elem, SHAPE)
    build(g, x)
    g.nodes[-1].output[0] = "y"
    g.output("y", elem, SHAPE)
    if also_output is not None:
        g.output(also_output(g), elem, None)
    return g.model()


def gated_model(act: str = "silu", form: str = "two", gate_first: bool = True, swap_product: bool = False,
                split_spelling: str = "split", act_kwargs: dict | None = None, width: int = 16,
                mutate: str | None = None, opset: int = 18):
    """act(gate) * up: two projections (form "two"), or one [.., 2H] value split in halves."""
    g = GraphBuilder(opset)
    act_kwargs = act_kwargs or {}
    if form == "two":
        gate = g.input("gate", F32, ["batch", "seq", width])
        up = g.input("up", F32, ["batch", "seq", width])
    else:
        x = g.input("x", F32, ["batch", "seq", 2 * width])
        if split_spelling == "split":  # torch.chunk (dynamo): Split(x, [H, H]) on the last axis
            first, second = g.node("Split", [x, g.const(np.array([width, width], np.int64))], outputs=2, axis=-1)
        elif split_spelling == "num_outputs":
            first, second = g.node("Split", [x], outputs=2, axis=2, num_outputs=2)
        else:  # x[..., :H], x[..., H:]
            ints = lambda *v: g.const(np.array(v, np.int64))  # noqa: E731
            first = g.node("Slice", [x, ints(0), ints(width), ints(-1), ints(1)])
            second = g.node("Slice", [x, ints(width), ints(2**62), ints(-1)])
        gate, up = (first, second) if gate_first else (second, first)
        if mutate == "halves_swapped_in_product":  # act(gate) * gate: not a gated activation
            up = gate
    if mutate == "sigmoid_of_up":  # gate * sigmoid(up) * up: the roles mixed up
        activated = g.node("Mul", [gate, g.node("Sigmoid", [up])])
    elif act == "silu":
        activated = silu(g, gate)
    elif act == "gelu_op":
        activated = g.node("Gelu", [gate], approximate=act_kwargs.get("approximate", "none"))
    elif act == "gelu_erf":
        activated = gelu_erf(g, gate, **act_kwargs)
    else:
        activated = gelu_tanh(g, gate, **act_kwargs)
    g.node("Mul", [up, activated] if swap_product else [activated, up])
    g.nodes[-1].output[0] = "y"
    g.output("y", F32, ["batch", "seq", width])
    if mutate == "gate_read_outside":
        g.output(activated, F32, None)
    if mutate == "half_read_outside":
        g.output(gate, F32, None)
    return g.model()


def contrib_model(op_type: str, bias_shape=None, bias_type=np.float32, ms_opset: int = 1, **attributes):
    """x (+ a constant bias) -> com.microsoft ``op_type`` -> y, as ORT's optimiser writes it."""
    g = GraphBuilder()
    x = g.input("x", F32, SHAPE)
    inputs = [x] if bias_shape is None else [x, g.const(np.linspace(-1, 1, math.prod(bias_shape))
                                                         .astype(bias_type).reshape(bias_shape), "bias")]
    g.nodes.append(onnx.helper.make_node(op_type, inputs, ["y"], name=op_type, domain="com.microsoft",
                                         **attributes))
    g.output("y", F32, SHAPE)
    graph = onnx.helper.make_graph(g.nodes, "g", g.inputs, g.outputs, g.inits)
    return onnx.helper.make_model(graph, ir_version=9, opset_imports=[
        onnx.helper.make_opsetid("", g.opset), onnx.helper.make_opsetid("com.microsoft", ms_opset)])
