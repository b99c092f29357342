"""The standard ONNX activations re-targeted to the otfuse ops, each by an allow-list
(rewriter/allow_list.py: the op versions, every attribute, the inputs and outputs modelled;
anything else is refused with a near miss naming it):

    Gelu-20 (approximate "none" | "tanh")        -> Gelu
    Swish-24 (alpha; x * sigmoid(alpha * x))     -> SiLU when alpha = 1, else QuickGelu(alpha)

and ONNX Runtime's contrib ops (com.microsoft, domain opset 1; ORT's optimiser writes them), as
their spec (onnxruntime docs/ContribOperators.md) defines them:

    QuickGelu (alpha, default 1.702)             -> SiLU when alpha = 1, else QuickGelu(alpha)
    Gelu                                         -> Gelu("none")
    FastGelu (X[, bias]): the tanh form of X + bias   -> [Add] + Gelu("tanh")
    BiasGelu (A, B): the erf form of A + B            -> Add + Gelu("none")

A bias is one value per element of x's last axis (a 1-D tensor of its size); the Add stays a
plain ONNX node in front of the fused Gelu.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import onnx

from otfuse import ops
from otfuse.fusions.activation.spelled import FAMILY, require_activation_io
from otfuse.rewriter import checks
from otfuse.rewriter.allow_list import OpAllowList, only, require_allowed
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Absent, Either, Match, Pattern, Var, attr, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule

MS = "com.microsoft"
Translation = tuple[ops.Op, dict]  # the otfuse op and its attributes


def _gelu_approximate(node: onnx.NodeProto) -> Translation:
    approximate = attr(node, "approximate", b"none")
    return ops.Gelu, {"approximate": approximate.decode() if isinstance(approximate, bytes) else approximate}


def _swish_like(default_alpha: float, node: onnx.NodeProto) -> Translation:
    """x * sigmoid(alpha * x): SiLU when alpha = 1, else QuickGelu(alpha)."""
    alpha = float(attr(node, "alpha", default_alpha))
    if not math.isfinite(alpha):
        raise Refuse(f"{node.op_type} alpha is {alpha}")
    return (ops.SiLU, {}) if alpha == 1.0 else (ops.QuickGelu, {"alpha": alpha})


def _fixed_gelu(approximate: str, node: onnx.NodeProto) -> Translation:
    return ops.Gelu, {"approximate": approximate}


@dataclass(frozen=True)
class _Standard:
    """One existing op: what it may state (``allow``), what it becomes, and its bias input
    ("none", "optional" or "required": added to x before the activation)."""

    allow: OpAllowList
    translate: Callable[[onnx.NodeProto], Translation]
    bias: str = "none"

    @property
    def pattern(self) -> Pattern:
        x = Var("x")
        bias = {"none": None, "optional": Either(Var("bias"), Absent()), "required": Var("bias")}[self.bias]
        inputs = (x,) if bias is None else (x, bias)
        return getattr(op, self.allow.op_type)(*inputs, _bind="act", _domain=self.allow.domain,
                                               _optional_tail=self.bias == "optional")


def _require_bias(graph: GraphIndex, x: str, bias: str) -> None:
    """One value per element of x's last axis, of x's type (what ORT's kernels take)."""
    if graph.elem_type(bias) != graph.elem_type(x):
        raise Refuse(f"the bias {bias!r} has type {checks.type_name(graph.elem_type(bias))}, "
                     f"x {checks.type_name(graph.elem_type(x))}")
    shape_x, shape_b = graph.proven_shape(x), graph.proven_shape(bias)
    if not shape_x or shape_b is None or len(shape_b) != 1 or not checks.dims_equal(shape_b[0], shape_x[-1]):
        raise Refuse(f"the bias {bias!r} is not one value per element of x's last axis "
                     f"(shapes {shape_b}, {shape_x})")


def _analyse_standard(form: _Standard, ctx: RewriteContext, match: Match) -> Fusion:
    graph, node = ctx.graph, match.node("act")
    require_allowed(graph, node, form.allow)
    fused_op, attributes = form.translate(node)
    x, y = match.value("x"), node.output[0]
    require_activation_io(graph, x, y)
    helpers = Helpers(node)
    if match.has("bias"):
        _require_bias(graph, x, match.value("bias"))
        x = helpers.node("Add", [x, match.value("bias")])
    return Fusion(fused_op(X=x, Y=y, **attributes), match.covered, helpers)


def _rule(name: str, form: _Standard) -> Rule:
    return Rule(name, form.pattern, partial(_analyse_standard, form), FAMILY, frozenset({form.allow.op_type}))


GELU_OP = OpAllowList("Gelu", versions=frozenset({20}), attributes={"approximate": only(b"none", b"tanh")},
                      inputs=1, outputs=1)
SWISH_OP = OpAllowList("Swish", versions=frozenset({24}), attributes={"alpha": None}, inputs=1, outputs=1)
MS_QUICK_GELU_OP = OpAllowList("QuickGelu", versions=frozenset({1}), attributes={"alpha": None}, inputs=1,
                               outputs=1, domain=MS)
MS_GELU_OP = OpAllowList("Gelu", versions=frozenset({1}), attributes={}, inputs=1, outputs=1, domain=MS)
MS_FAST_GELU_OP = OpAllowList("FastGelu", versions=frozenset({1}), attributes={}, inputs=2, outputs=1, domain=MS)
MS_BIAS_GELU_OP = OpAllowList("BiasGelu", versions=frozenset({1}), attributes={}, inputs=2, outputs=1, domain=MS)

RULES: list[Rule] = [
    _rule("GeluOp", _Standard(GELU_OP, _gelu_approximate)),
    _rule("SwishOp", _Standard(SWISH_OP, partial(_swish_like, 1.0))),
    _rule("MsQuickGelu", _Standard(MS_QUICK_GELU_OP, partial(_swish_like, 1.702))),
    _rule("MsGelu", _Standard(MS_GELU_OP, partial(_fixed_gelu, "none"))),
    _rule("MsFastGelu", _Standard(MS_FAST_GELU_OP, partial(_fixed_gelu, "tanh"), bias="optional")),
    _rule("MsBiasGelu", _Standard(MS_BIAS_GELU_OP, partial(_fixed_gelu, "none"), bias="required")),
]
