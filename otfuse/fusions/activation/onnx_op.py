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

import onnx

from otfuse.fusions.activation.spelled import FAMILY, check_activation_io
from otfuse.rewriter.allow_list import OpAllowList, only, require_allowed
from otfuse.rewriter import checks
from otfuse.rewriter.builder import PlainNodes
from otfuse.rewriter.pattern import Either, Match, Op, Var, attr
from otfuse.rewriter.rule import Refuse, Replacement, RewriteContext, Rule

GELU_OP = OpAllowList("Gelu", versions=frozenset({20}), attributes={"approximate": only(b"none", b"tanh")},
                      inputs=1, outputs=1)
SWISH_OP = OpAllowList("Swish", versions=frozenset({24}), attributes={"alpha": None}, inputs=1, outputs=1)


class _StandardActivationRule(Rule):
    family = FAMILY
    allow: OpAllowList

    def check(self, ctx: RewriteContext, match: Match) -> str | None:
        require_allowed(ctx.graph, match.node("act"), self.allow)
        self.translated(match.node("act"))  # refuses what it cannot translate
        return check_activation_io(ctx.graph, match.value("x"), match.node("act").output[0])

    def translated(self, node: onnx.NodeProto) -> tuple[str, dict]:
        raise NotImplementedError

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        op_type, attributes = self.translated(match.node("act"))
        return Replacement([ctx.fused_node(op_type, [match.value("x")], [root.output[0]], root, **attributes)])


class GeluOpRule(_StandardActivationRule):
    name = "GeluOp"
    allow = GELU_OP
    anchor_ops = frozenset({"Gelu"})
    pattern = Op("Gelu", (Var("x"),), {}, "act")

    def translated(self, node):
        approximate = attr(node, "approximate", b"none")
        return "Gelu", {"approximate": approximate.decode() if isinstance(approximate, bytes) else approximate}


class SwishOpRule(_StandardActivationRule):
    name = "SwishOp"
    allow = SWISH_OP
    anchor_ops = frozenset({"Swish"})
    pattern = Op("Swish", (Var("x"),), {}, "act")

    def translated(self, node):
        alpha = float(attr(node, "alpha", 1.0))
        if not math.isfinite(alpha):
            raise Refuse(f"Swish alpha is {alpha}")
        return ("SiLU", {}) if alpha == 1.0 else ("QuickGelu", {"alpha": alpha})


MS = "com.microsoft"
MS_QUICK_GELU_OP = OpAllowList("QuickGelu", versions=frozenset({1}), attributes={"alpha": None}, inputs=1,
                               outputs=1, domain=MS)
MS_GELU_OP = OpAllowList("Gelu", versions=frozenset({1}), attributes={}, inputs=1, outputs=1, domain=MS)
MS_FAST_GELU_OP = OpAllowList("FastGelu", versions=frozenset({1}), attributes={}, inputs=2, outputs=1, domain=MS)
MS_BIAS_GELU_OP = OpAllowList("BiasGelu", versions=frozenset({1}), attributes={}, inputs=2, outputs=1, domain=MS)


class MsQuickGeluRule(SwishOpRule):
    name = "MsQuickGelu"
    allow = MS_QUICK_GELU_OP
    anchor_ops = frozenset({"QuickGelu"})
    pattern = Op("QuickGelu", (Var("x"),), {}, "act", MS)

    def translated(self, node):
        alpha = float(attr(node, "alpha", 1.702))
        if not math.isfinite(alpha):
            raise Refuse(f"QuickGelu alpha is {alpha}")
        return ("SiLU", {}) if alpha == 1.0 else ("QuickGelu", {"alpha": alpha})


class MsGeluRule(_StandardActivationRule):
    """com.microsoft Gelu, FastGelu and BiasGelu: a GELU of x (+ a bias over its last axis)."""

    anchor_ops = frozenset({"Gelu", "FastGelu", "BiasGelu"})

    def __init__(self, op_type: str, allow: OpAllowList, approximate: str, bias: str):
        self.name, self.allow, self.approximate = f"Ms{op_type}", allow, approximate
        x = Var("x")
        forms = {"none": [(x,)], "optional": [(x,), (x, Var("bias"))], "required": [(x, Var("bias"))]}[bias]
        self.pattern = Either(*(Op(op_type, inputs, {}, "act", MS) for inputs in forms))

    def translated(self, node):
        return "Gelu", {"approximate": self.approximate}

    def check(self, ctx: RewriteContext, match: Match) -> str | None:
        reason = super().check(ctx, match)
        if reason or not match.has("bias"):
            return reason
        graph, x, bias = ctx.graph, match.value("x"), match.value("bias")
        shape_x, shape_b = graph.proven_shape(x), graph.proven_shape(bias)
        if graph.elem_type(bias) != graph.elem_type(x):
            return f"the bias {bias!r} has type {checks.type_name(graph.elem_type(bias))}, x {checks.type_name(graph.elem_type(x))}"
        if not shape_x or shape_b is None or len(shape_b) != 1 or not checks.dims_equal(shape_b[0], shape_x[-1]):
            return f"the bias {bias!r} is not one value per element of x's last axis (shapes {shape_b}, {shape_x})"
        return None

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        if not match.has("bias"):
            return super().rewrite(ctx, match, root)
        plain = PlainNodes(ctx, root)
        total = plain.node("Add", [match.value("x"), match.value("bias")])
        return plain.replacement(ctx.fused_node("Gelu", [total], [root.output[0]], root, approximate=self.approximate))


RULES: list[Rule] = [GeluOpRule(), SwishOpRule(), MsQuickGeluRule(),
                     MsGeluRule("Gelu", MS_GELU_OP, "none", "none"),
                     MsGeluRule("FastGelu", MS_FAST_GELU_OP, "tanh", "optional"),
                     MsGeluRule("BiasGelu", MS_BIAS_GELU_OP, "none", "required")]
