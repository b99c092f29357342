"""Norm subgraphs as exporters spell them (RMSNorm, decomposed LayerNorm), with knobs to mutate them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphs import F32, OPSET, GraphBuilder


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
        rms_norm(b, x, hidden, dtype=dtype, **kwargs)
    else:
        layer_norm_decomposed(b, x, hidden, **kwargs)
    b.nodes[-1].output[0] = "y"
    b.output("y", elem, ["batch", "seq", hidden])
    if residual and sum_used:
        b.node("Identity", [x], base="sum_out")
        b.nodes[-1].output[0] = "sum_out"
        b.output("sum_out", elem, ["batch", "seq", hidden])
    return b.model()
