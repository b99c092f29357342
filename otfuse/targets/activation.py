"""Activation-family ops in ORT's contrib ops and in standard ONNX (docs/ops.md, "Targets").

Every otfuse activation computes in float32 from its inputs widened to float32 and rounds once to
``T``; so does every emitter here: a float16 / bfloat16 input is ``Cast`` to float32 (exact), the
target ops run in float32 and one ``Cast`` rounds the result (the target ops' own float16 kernels
would round after every step).

ORT (``com.microsoft``, ORT's ContribOperators.md): ``Gelu`` ("none": ``x Phi(x)`` by erf),
``FastGelu`` ("tanh": ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``), ``QuickGelu(alpha)``
(``x sigmoid(alpha x)``; ``SiLU`` is ``alpha = 1``). ONNX: ``Gelu`` (opset 20, ``approximate``), and
``x * Sigmoid(alpha * x)`` for ``QuickGelu`` / ``SiLU`` (``Swish`` is opset 24, past the target's 23).
The gated ops are the activation of the gate times ``up`` (one ``Mul``, in float32), the halves of
one input cut by ``Slice`` at ``D / 2``. The one difference from the otfuse kernels: the target
rounds ``alpha * x`` to float32 where the contract carries it exactly (a relative change of at most
``2^-24 |alpha x|`` in the sigmoid's argument).
"""

from __future__ import annotations

import numpy as np
import onnx

from otfuse.rewriter.checks import type_name
from otfuse.targets.build import MS_DOMAIN, CannotExpress, Emitter
from otfuse.targets.call import FusedCall

_FLOAT = onnx.TensorProto.FLOAT
_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def _widened(em: Emitter, value: str) -> str:
    elem_type = em.graph.elem_type(value)
    if elem_type not in _TYPES:
        raise CannotExpress(f"{value!r} is {type_name(elem_type)}")
    return value if elem_type == _FLOAT else em.cast(value, _FLOAT)


def _narrowed(em: Emitter, wide: str, like: str, output: str) -> None:
    """``wide`` (float32) written to ``output`` in ``like``'s type: the one rounding."""
    elem_type = em.graph.elem_type(like)
    if elem_type == _FLOAT:
        em.op1("Identity", [wide], output)
    else:
        em.op1("Cast", [wide], output, to=elem_type)


def _sigmoid_product(em: Emitter, x: str, alpha: float) -> str:
    """``x * Sigmoid(alpha * x)`` (float32 ``x``)."""
    arg = x if alpha == 1.0 else em.op1("Mul", [x, em.constant(np.float32(alpha))])
    return em.op1("Mul", [x, em.op1("Sigmoid", [arg])])


def _act(target: str, op: str, attributes: dict):
    """The function writing ``op`` (Gelu / QuickGelu / SiLU with ``attributes``) of a float32 value."""
    approximate = attributes.get("approximate", "none")
    if op == "Gelu" and approximate not in ("none", "tanh"):
        raise CannotExpress(f"approximate = {approximate!r}")
    alpha = 1.0 if op == "SiLU" else float(attributes.get("alpha", 1.0))
    if op == "QuickGelu" and not np.isfinite(alpha):
        raise CannotExpress(f"alpha {alpha}")

    def ort(em: Emitter, x: str) -> str:
        if op == "Gelu":
            return em.op1("Gelu" if approximate == "none" else "FastGelu", [x], domain=MS_DOMAIN, opset=1)
        return em.op1("QuickGelu", [x], domain=MS_DOMAIN, opset=1, alpha=alpha)

    def standard(em: Emitter, x: str) -> str:
        if op == "Gelu":
            return em.op1("Gelu", [x], opset=20, approximate=approximate)
        return _sigmoid_product(em, x, alpha)

    return ort if target == "ort" else standard


def _relu_squared(em: Emitter, call: FusedCall) -> None:
    """Relu, then its square as one Mul, in float32 (exact for float16 / bfloat16 inputs); the
    same in both targets."""
    x = call.input("X")
    r = em.op1("Relu", [_widened(em, x)])
    _narrowed(em, em.op1("Mul", [r, r]), x, call.output("Y"))


def _halves(em: Emitter, a: str, gate_half: int) -> tuple[str, str]:
    """(gate, up): the halves of ``a``'s last axis (``gate_half`` says which is the gate)."""
    if gate_half not in (0, 1):
        raise CannotExpress(f"gate_half = {gate_half}")
    last = em.op1("Shape", [a])
    width = em.op1("Slice", [last, em.ints([-1]), em.ints([2**62]), em.ints([0])])
    half = em.op1("Div", [width, em.ints([2])])
    axes = em.ints([-1])
    first = em.op1("Slice", [a, em.ints([0]), half, axes])
    second = em.op1("Slice", [a, half, em.ints([2**62]), axes])
    return (first, second) if gate_half == 0 else (second, first)


def _elementwise(target: str):
    def emit(em: Emitter, call: FusedCall) -> None:
        x = call.input("X")
        y = _act(target, call.op, call.attributes)(em, _widened(em, x))
        _narrowed(em, y, x, call.output("Y"))
    return emit


def _gated(target: str, inner: str):
    def emit(em: Emitter, call: FusedCall) -> None:
        a, b = call.input("A"), call.input("B")
        act = _act(target, inner, call.attributes)
        if b:
            if call.attributes["gate_half"] != 0:
                raise CannotExpress(f"gate_half = {call.attributes['gate_half']} with two inputs")
            gate, up = _widened(em, a), _widened(em, b)
        else:
            gate, up = _halves(em, _widened(em, a), call.attributes["gate_half"])
        y = em.op1("Mul", [act(em, gate), up])
        _narrowed(em, y, a, call.output("Y"))
    return emit


ORT = {"Gelu": _elementwise("ort"), "QuickGelu": _elementwise("ort"), "SiLU": _elementwise("ort"),
       "ReluSquared": _relu_squared,
       "SwiGLU": _gated("ort", "SiLU"), "GeGLU": _gated("ort", "Gelu")}
ONNX = {"Gelu": _elementwise("onnx"), "QuickGelu": _elementwise("onnx"), "SiLU": _elementwise("onnx"),
        "ReluSquared": _relu_squared,
        "SwiGLU": _gated("onnx", "SiLU"), "GeGLU": _gated("onnx", "Gelu")}
