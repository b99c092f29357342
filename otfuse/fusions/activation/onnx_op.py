"""The standard ONNX activations re-targeted to the otfuse ops, each by an allow-list
(rewriter/allow_list.py: the op versions, every attribute, the inputs and outputs modelled;
anything else is refused with a near miss naming it):

    Gelu-20 (approximate "none" | "tanh")        -> Gelu
    Swish-24 (alpha; x * sigmoid(alpha * x))     -> SiLU when alpha = 1, else QuickGelu(alpha)
"""

from __future__ import annotations

import math

import onnx

from otfuse.fusions.activation.spelled import FAMILY, check_activation_io
from otfuse.rewriter.allow_list import OpAllowList, only, require_allowed
from otfuse.rewriter.pattern import Match, Op, Var, attr
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


RULES: list[Rule] = [GeluOpRule(), SwishOpRule()]
