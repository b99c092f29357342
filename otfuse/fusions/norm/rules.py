"""Normalisation family: RMSNorm, LayerNorm and their residual-Add forms (docs/ops.md).

The patterns read like the PyTorch code exporters trace:

    RMSNorm:   x.float() -> pow(2) | x*x -> mean(-1, keepdim) -> + eps -> sqrt -> 1/· (or x / ·)
               -> x * · -> .to(x.dtype) -> weight * ·          (or weight * · then .to(x.dtype))
    LayerNorm: x - mean(x) -> (·)² -> mean -> + eps -> sqrt -> divide -> * scale (+ bias),
               or the ONNX LayerNormalization op.
    Add*Norm:  the same with x = a + b, whose sum may stay in use (second output).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from otfuse.rewriter import checks
from otfuse.rewriter.allow_list import OpAllowList, only, require_allowed
from otfuse.rewriter.pattern import ANY, Const, Either, Match, Op, Var, attr, op, scalar_equal
from otfuse.rewriter.rule import Replacement, RewriteContext, Rule

FLOAT = onnx.TensorProto.FLOAT
FAMILY = "norm"


def _reduce_mean(value, bind: str, axes_name: str) -> Either:
    # Opset >= 18 passes axes as an input, older opsets as an attribute.
    return Either(op.ReduceMean(value, Const(axes_name), _bind=bind), op.ReduceMean(value, _bind=bind))


def _as_float32(x) -> Either:
    return Either(op.Cast(x, to=FLOAT, _bind="cast_in"), x)


def _rms_normalized(x) -> Either:
    xf = _as_float32(x)
    square = Either(op.Pow(xf, Const("two", where=scalar_equal(2.0))), op.Mul(xf, xf))
    std = op.Sqrt(op.Add(_reduce_mean(square, "reduce", "axes"), Const("eps")))
    return Either(
        op.Mul(xf, op.Reciprocal(std)),
        op.Mul(xf, op.Div(Const("one", where=scalar_equal(1.0)), std)),
        op.Div(xf, std),
    )


def _layer_normalized(x) -> Either:
    xf = _as_float32(x)
    centered = op.Sub(xf, _reduce_mean(xf, "reduce", "axes"))
    square = Either(op.Pow(centered, Const("two", where=scalar_equal(2.0))), op.Mul(centered, centered))
    std = op.Sqrt(op.Add(_reduce_mean(square, "reduce_var", "axes_var"), Const("eps")))
    return Either(op.Div(centered, std), op.Mul(centered, op.Reciprocal(std)))


def _scale() -> Either:
    # Gemma multiplies by (1 + w): folded into one constant by the rewrite.
    return Either(op.Add(Const("one_plus", where=scalar_equal(1.0)), Const("gamma_offset"),
                         _bind="gemma_add"),
                  Var("scale"))


def _scaled(normalized, with_bias: bool) -> Either:
    """weight * normalized (+ bias), with the cast back to x's type before or after."""
    scale = _scale()
    back = Either(op.Cast(normalized, to=ANY, _bind="cast_out"), normalized)
    if not with_bias:
        return Either(op.Mul(back, scale), op.Cast(op.Mul(normalized, scale), to=ANY, _bind="cast_out"))
    return Either(
        op.Add(op.Mul(back, scale), Var("bias")),
        op.Cast(op.Add(op.Mul(normalized, scale), Var("bias")), to=ANY, _bind="cast_out"),
    )


def _residual_add() -> Op:
    return op.Add(Var("a"), Var("b"), _bind="residual")


class _NormRule(Rule):
    """Shared checks and rewrite; subclasses pick the pattern and the fused op."""

    family = FAMILY
    anchor_ops = frozenset({"ReduceMean", "LayerNormalization", "RMSNormalization"})
    fused_op = ""
    residual = False
    default_epsilon = 1e-6

    def x_value(self, match: Match) -> str:
        return match.node("residual").output[0] if self.residual else match.value("x")

    def check(self, ctx: RewriteContext, match: Match) -> str | None:
        graph = ctx.graph
        x = self.x_value(match)
        reason = checks.check_float_io(graph, x, self.root_value(match))
        if reason:
            return reason
        if self.residual:
            reason = checks.check_same_shape(graph, match.value("a"), match.value("b"), x)
            if reason:
                return reason
        axis = self.normalised_axis(graph, match)
        if isinstance(axis, str):
            return axis
        reason = self.check_epsilon(graph, match)
        if reason:
            return reason
        for name in ("scale", "bias"):
            if match.has(name):
                reason = checks.check_row_parameter(graph, match.value(name), x, axis, name)
                if reason:
                    return reason
        if match.has("gamma_offset"):
            reason = checks.check_row_parameter(graph, match.value("gamma_offset"), x, axis, "scale")
            if reason:
                return reason
        if self._cast_sum_readers(graph, match) and graph.elem_type(x) != FLOAT:
            return "the float32 copy of the residual sum is also used elsewhere"
        return None

    def _cast_sum_readers(self, graph, match: Match) -> list:
        """Readers outside the match of the residual sum's Cast to float32 (TorchScript: the next
        residual Add reads it); when the sum is already float32 that Cast is the sum itself."""
        if not self.residual or not match.has("cast_in"):
            return []
        inside = {id(node) for node in match.covered}
        return [user for user in graph.uses(match.node("cast_in").output[0]) if id(user) not in inside]

    def root_value(self, match: Match) -> str:
        return match.covered[0].output[0]

    def normalised_axis(self, graph, match: Match) -> int | str:
        x = self.x_value(match)
        axes = [checks.reduce_axes(graph, match, "reduce", "axes")]
        if match.has("reduce_var"):
            axes.append(checks.reduce_axes(graph, match, "reduce_var", "axes_var"))
        for found in axes:
            if isinstance(found, str):
                return found
        if len(axes) == 2 and axes[0] != axes[1]:
            return f"the two ReduceMean nodes use different axes ({axes[0]} vs {axes[1]})"
        return checks.trailing_axis(axes[0], graph.rank(x))

    def check_epsilon(self, graph, match: Match) -> str | None:
        eps = graph.scalar_value(match.value("eps"))
        if eps is None:
            return "epsilon must be a single-element constant"
        if not math.isfinite(eps) or eps < 0:
            return f"epsilon {eps} is not a finite value >= 0"
        return None

    def epsilon(self, graph, match: Match) -> float:
        return graph.scalar_value(match.value("eps"))

    def scale_input(self, ctx: RewriteContext, match: Match, x: str, axis: int) -> tuple[str, list]:
        """The scale (and bias) as the fused op wants them: exactly X.shape[axis:]."""
        if match.has("gamma_offset"):
            offset = ctx.graph.constant_value(match.value("gamma_offset"))
            folded = (offset.astype(np.float32) + np.float32(1.0)).astype(offset.dtype)
            folded = folded.reshape(checks.row_shape(ctx.graph, x, axis))
            tensor = ctx.constant(f"{match.value('gamma_offset')}_plus_one", folded)
            return tensor.name, [tensor]
        return checks.row_parameter(ctx, match.value("scale"), x, axis)

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        graph = ctx.graph
        x = self.x_value(match)
        axis = self.normalised_axis(graph, match)
        scale, initializers = self.scale_input(ctx, match, x, axis)
        inputs = [match.value("a"), match.value("b")] if self.residual else [x]
        inputs.append(scale)
        if match.has("bias"):
            bias, more = checks.row_parameter(ctx, match.value("bias"), x, axis)
            inputs.append(bias)
            initializers += more
        outputs = [root.output[0]]
        if self.residual:
            outputs.append(x)
        node = ctx.fused_node(self.fused_op, inputs, outputs, root,
                              epsilon=self.epsilon(graph, match), axis=axis)
        nodes = [node]
        if self._cast_sum_readers(graph, match):  # the identity Cast's readers now read the sum
            cast = match.node("cast_in")
            nodes.append(onnx.helper.make_node("Identity", [x], [cast.output[0]],
                                               name=ctx.unique_name(f"{cast.name or cast.output[0]}/sum")))
        return Replacement(nodes, initializers)


class RMSNormRule(_NormRule):
    name = "RMSNorm"
    fused_op = "RMSNorm"
    pattern = _scaled(_rms_normalized(Var("x")), with_bias=False)


class AddRMSNormRule(_NormRule):
    name = "AddRMSNorm"
    fused_op = "AddRMSNorm"
    residual = True
    exports = ("residual", "cast_in")  # cast_in: only an identity Cast's (check)
    pattern = _scaled(_rms_normalized(_residual_add()), with_bias=False)


class LayerNormRule(_NormRule):
    name = "LayerNorm"
    fused_op = "LayerNorm"
    pattern = Either(_scaled(_layer_normalized(Var("x")), with_bias=True),
                     _scaled(_layer_normalized(Var("x")), with_bias=False))


class AddLayerNormRule(_NormRule):
    name = "AddLayerNorm"
    fused_op = "AddLayerNorm"
    residual = True
    exports = ("residual", "cast_in")  # cast_in: only an identity Cast's (check)
    pattern = Either(_scaled(_layer_normalized(_residual_add()), with_bias=True),
                     _scaled(_layer_normalized(_residual_add()), with_bias=False))


# Everything of the standard norm ops these rules translate; anything else is refused.
_NORM_ATTRIBUTES = {"axis": None, "epsilon": None, "stash_type": only(1)}
LAYER_NORMALIZATION_OP = OpAllowList(
    "LayerNormalization", versions=frozenset({17}), attributes=_NORM_ATTRIBUTES,
    inputs=3, outputs=1,  # X, Scale, B -> Y (not Mean, InvStdDev)
    ort_builtin_below=17,  # ORT's own LayerNormalization of the default domain: the same attributes and math
)
RMS_NORMALIZATION_OP = OpAllowList(
    "RMSNormalization", versions=frozenset({23}), attributes=_NORM_ATTRIBUTES, inputs=2, outputs=1)


class _StandardOpRule(_NormRule):
    """The ONNX LayerNormalization / RMSNormalization ops, re-targeted to our kernels."""

    allow: OpAllowList
    default_epsilon = 1e-5

    def check(self, ctx: RewriteContext, match: Match) -> str | None:
        require_allowed(ctx.graph, match.node("norm"), self.allow)
        return super().check(ctx, match)

    def normalised_axis(self, graph, match: Match) -> int | str:
        node = match.node("norm")
        return checks.trailing_axis([attr(node, "axis", -1)], graph.rank(self.x_value(match)))

    def check_epsilon(self, graph, match: Match) -> str | None:
        eps = self.epsilon(graph, match)
        return None if math.isfinite(eps) and eps >= 0 else f"epsilon {eps} is not >= 0"

    def epsilon(self, graph, match: Match) -> float:
        return float(attr(match.node("norm"), "epsilon", self.default_epsilon))


def _standard_op(onnx_op: str, x, with_bias: bool) -> Op:
    inputs = (x, Var("scale"), Var("bias")) if with_bias else (x, Var("scale"))
    return Op(onnx_op, inputs, {}, "norm")


class LayerNormalizationOpRule(_StandardOpRule):
    allow = LAYER_NORMALIZATION_OP
    name = "LayerNormalization"
    fused_op = "LayerNorm"
    pattern = Either(_standard_op("LayerNormalization", Var("x"), True),
                     _standard_op("LayerNormalization", Var("x"), False))


class AddLayerNormalizationOpRule(_StandardOpRule):
    allow = LAYER_NORMALIZATION_OP
    name = "AddLayerNormalization"
    fused_op = "AddLayerNorm"
    residual = True
    exports = ("residual",)
    pattern = Either(_standard_op("LayerNormalization", _residual_add(), True),
                     _standard_op("LayerNormalization", _residual_add(), False))


class RMSNormalizationOpRule(_StandardOpRule):
    allow = RMS_NORMALIZATION_OP
    name = "RMSNormalization"
    fused_op = "RMSNorm"
    pattern = _standard_op("RMSNormalization", Var("x"), False)


class AddRMSNormalizationOpRule(_StandardOpRule):
    allow = RMS_NORMALIZATION_OP
    name = "AddRMSNormalization"
    fused_op = "AddRMSNorm"
    residual = True
    exports = ("residual",)
    pattern = _standard_op("RMSNormalization", _residual_add(), False)


# At one root the residual forms are tried first: they absorb the Add as well.
RULES: list[Rule] = [
    AddRMSNormRule(),
    RMSNormRule(),
    AddLayerNormRule(),
    LayerNormRule(),
    AddLayerNormalizationOpRule(),
    LayerNormalizationOpRule(),
    AddRMSNormalizationOpRule(),
    RMSNormalizationOpRule(),
]
