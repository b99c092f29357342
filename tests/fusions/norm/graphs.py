"""Norm subgraphs as exporters spell them (RMSNorm, decomposed LayerNorm), with knobs to mutate them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphs import F32, OPSET, GraphBuilder


def rms_norm(b: GraphBuilder, x: str, hidden: int, *, eps=1e-6, weight=None, dtype=np.float32,
             cast=False, square="pow", inverse="reciprocal", axes=(-1,), axes_as_input=True,
             weight_first=True, keepdims=1, exponent=2.0, eps_const=True, weight_before_reduce=False,
             gemma=False, power=-0.5, scaled=True) -> str:
    """weight * (x / sqrt(mean(x^2) + eps)), spelled with the chosen ops (inverse "pow": Gemma 3n's
    x * pow(mean + eps, power); scaled=False: no weight at all)."""
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
    variance = b.node("Add", [ms, eps_name])
    std = b.node("Sqrt", [variance]) if inverse != "pow" else None
    if inverse == "pow":
        normed = b.node("Mul", [xf, b.node("Pow", [variance, b.const(np.float32(power))])])
    elif inverse == "reciprocal":
        normed = b.node("Mul", [xf, b.node("Reciprocal", [std])])
    elif inverse == "div_one":
        normed = b.node("Mul", [xf, b.node("Div", [b.const(np.float32(1.0)), std])])
    else:
        normed = b.node("Div", [xf, std])
    if cast:
        normed = b.node("Cast", [normed], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    if not scaled:
        return normed
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


def layer_norm_op(b: GraphBuilder, x: str, hidden: int, *, eps=1e-5, axis=-1, row=None) -> str:
    """The ONNX LayerNormalization op with scale and bias of shape ``row`` (default ``(hidden,)``)."""
    rng = np.random.default_rng(2)
    row = (hidden,) if row is None else row
    scale = b.const((1 + 0.1 * rng.standard_normal(row)).astype(np.float32), "scale")
    bias = b.const((0.1 * rng.standard_normal(row)).astype(np.float32), "bias")
    return b.node("LayerNormalization", [x, scale, bias], epsilon=eps, axis=axis)


def _norm(b: GraphBuilder, kind: str, x: str, hidden: int) -> str:
    if kind == "op":
        return layer_norm_op(b, x, hidden)
    if kind == "rms":
        return rms_norm(b, x, hidden)
    return layer_norm_decomposed(b, x, hidden)


def reshaped_residual_model(norm: str = "op", *, hidden: int = 16, form: str = "merge", shape_from_sum=False,
                            reshaped_read=True, sum_read=False, view: str = "Reshape",
                            r_shape=None) -> onnx.ModelProto:
    """OPT's residual: ``s = x + r`` -> ``Reshape`` -> norm -> y, the reshaped sum also read by
    the next residual Add (``reshaped_read``: an output ``reshaped``), the sum itself by others
    (``sum_read``: an output ``sum``).

    ``form``: "merge" ``[batch, seq, H]`` -> ``(-1, H)``; "split" ``[rows, H]`` -> ``(2, -1, H)``;
    "narrow" (a mutation) ``(-1, H / 2)``, which changes the normalised dim. ``shape_from_sum``:
    the target's H read from ``Shape(s)`` (as OPT's ``reshape(-1, hidden_states.size(-1))``).
    ``view``: "Transpose" puts a Transpose there instead (no rule models it). ``r_shape``: r's
    declared shape (a broadcasting residual when it differs from x's)."""
    b = GraphBuilder()
    x_shape = ["rows", hidden] if form == "split" else ["batch", "seq", hidden]
    x = b.input("x", F32, x_shape)
    r = b.input("r", F32, r_shape or x_shape)
    s = b.node("Add", [x, r], base="sum")
    width = hidden // 2 if form == "narrow" else hidden
    if view == "Transpose":
        reshaped, width = b.node("Transpose", [s], perm=[1, 0, 2]), hidden
    else:
        last = b.node("Shape", [s], start=-1) if shape_from_sum else b.const(np.array([width], dtype=np.int64))
        lead = [2, -1] if form == "split" else [-1]
        target = b.node("Concat", [b.const(np.array(lead, dtype=np.int64)), last], axis=0)
        reshaped = b.node("Reshape", [s, target])
    _norm(b, norm, reshaped, width)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, None)
    for wanted, value, name in ((reshaped_read, reshaped, "reshaped"), (sum_read, s, "sum_out")):
        if wanted:
            b.nodes.append(helper.make_node("Neg", [value], [name]))
            b.output(name, F32, None)
    return b.model()


def olmo_torchscript_model(dtype=np.float32, hidden: int = 16) -> onnx.ModelProto:
    """OLMo's weightless LayerNorm as TorchScript exports it at opsets 17 / 20:
    ``F.layer_norm(h.to(float32), (H,), None, None)`` -> Add -> Cast -> LayerNormalization(ones,
    zeros) -> Cast back; the next residual Add reads the float32 Cast of the sum, not the sum."""
    b = GraphBuilder(opset=17)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x, r = b.input("x", elem, ["batch", "seq", hidden]), b.input("r", elem, ["batch", "seq", hidden])
    weight = (0.2 * np.random.default_rng(3).standard_normal((hidden, hidden))).astype(dtype)
    h = b.node("Add", [x, r])
    outputs = []
    for layer in range(2):
        h32 = b.node("Cast", [h], to=F32)
        normed = b.node("LayerNormalization", [h32, b.const(np.ones(hidden, np.float32)),
                                               b.const(np.zeros(hidden, np.float32))], epsilon=1e-5, axis=-1)
        y = b.node("Cast", [normed], to=elem, base=f"y{layer}")
        outputs.append(y)
        h = b.node("Add", [h32 if dtype == np.float32 else h, b.node("MatMul", [y, b.const(weight)])])
    for name in outputs + [h]:
        b.output(name, elem, None)
    return b.model()
