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
from dataclasses import dataclass
from functools import partial

import numpy as np
import onnx

from otfuse import ops
from otfuse.fusions.norm import residual, wide_scale as wide
from otfuse.rewriter import checks
from otfuse.rewriter.allow_list import OpAllowList, only, require_allowed
from otfuse.rewriter.builder import Helpers, NewTensor
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import ANY, Const, Either, Match, Op, Pattern, Var, attr, attr_is, op, scalar_equal
from otfuse.rewriter.rule import Fusion, NotCandidate, Refuse, RewriteContext, Rule

FLOAT = onnx.TensorProto.FLOAT
FAMILY = "norm"


def _reduce_mean(value, bind: str, axes_name: str) -> Either:
    # Opset >= 18 passes axes as an input, older opsets as an attribute.
    return Either(op.ReduceMean(value, Const(axes_name), _bind=bind), op.ReduceMean(value, _bind=bind))


def _as_float32(x) -> Either:
    return Either(op.Cast(x, to=FLOAT, _bind="cast_in"), x)


def _plus_epsilon(mean) -> Either:
    """`mean + eps`, or the mean alone: an epsilon of 0, or one the exporter's optimiser dropped
    (dynamo with Helium's rms_norm_eps 1e-8 writes `Sqrt(ReduceMean(x²))`); fused with epsilon 0."""
    return Either(op.Add(mean, Const("eps")), mean)


def _rms_normalized(x) -> Either:
    xf = _as_float32(x)
    square = Either(op.Pow(xf, Const("two", where=scalar_equal(2.0))), op.Mul(xf, xf))
    variance = _plus_epsilon(_reduce_mean(square, "reduce", "axes"))
    std = op.Sqrt(variance)
    return Either(
        op.Mul(xf, op.Reciprocal(std), _bind="normalized"),
        op.Mul(xf, op.Div(Const("one", where=scalar_equal(1.0)), std), _bind="normalized"),
        op.Div(xf, std, _bind="normalized"),
        # Gemma 3n: x * torch.pow(mean(x²) + eps, -0.5) (a power, "over sqrt or rsqrt")
        op.Mul(xf, op.Pow(variance, Const("minus_half", where=scalar_equal(-0.5))), _bind="normalized"),
    )


def _squared(value) -> Either:
    return Either(op.Pow(value, Const("two", where=scalar_equal(2.0))), op.Mul(value, value))


def _layer_normalized(x) -> Either:
    xf = _as_float32(x)
    mean = _reduce_mean(xf, "reduce", "axes")
    centered = op.Sub(xf, mean)
    variance = Either(
        _reduce_mean(_squared(centered), "reduce_var", "axes_var"),
        # ONNX's function body of LayerNormalization: mean(x²) - mean(x)², the same biased variance
        op.Sub(_reduce_mean(_squared(xf), "reduce_var", "axes_var"), _squared(mean)))
    std = op.Sqrt(_plus_epsilon(variance), _bind="std")
    return Either(op.Div(centered, std, _bind="normalized"),
                  op.Mul(centered, op.Reciprocal(std), _bind="normalized"))


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


def _residual_add() -> Either:
    """The residual sum, or the sum through a Reshape (residual.require_rows_kept)."""
    return Either(op.Add(Var("a"), Var("b"), _bind="residual"),
                  op.Reshape(op.Add(Var("a"), Var("b"), _bind="residual"), Var("merge_shape"), _bind="merge"))


@dataclass(frozen=True)
class _Form:
    """One way a norm is written: the op it becomes, whether it starts with the residual Add,
    and the ONNX op it re-targets (None: spelled out as ReduceMean, Sqrt, ...)."""

    op: ops.Op
    residual: bool = False
    allow: OpAllowList | None = None
    # A plain form: the residual form's pattern and rule name, to report a residual Add it missed.
    downgrade_of: tuple[Pattern, str] | None = None
    unit_scale: bool = False  # no weight at all (Gemma 3n's v_norm): fused with a scale of ones


def _x_value(form: _Form, match: Match) -> str:
    """The normalised value: the residual sum (or its reshaped view), or x."""
    if not form.residual:
        return match.value("x")
    return match.node("merge" if match.has("merge") else "residual").output[0]


def _cast_sum_read_elsewhere(form: _Form, graph: GraphIndex, match: Match) -> bool:
    """Whether the residual sum's Cast to float32 is read outside the match (TorchScript: the next
    residual Add reads it; a graph output); when the sum is already float32 that Cast is the sum."""
    if not form.residual or not match.has("cast_in"):
        return False
    inside = {id(node) for node in match.covered}
    copy = match.node("cast_in").output[0]
    return graph.is_graph_output(copy) or any(id(user) not in inside for user in graph.uses(copy))


def _normalised_axis(form: _Form, graph: GraphIndex, match: Match) -> int:
    x = match.node("flatten").output[0] if match.has("flatten") else _x_value(form, match)
    if form.allow is not None:
        return checks.first_axis(attr(match.node("norm"), "axis", -1), graph.rank(x))
    axes = [checks.reduce_axes(graph, match, "reduce", "axes")]
    if match.has("reduce_var"):
        axes.append(checks.reduce_axes(graph, match, "reduce_var", "axes_var"))
    if len(axes) == 2 and axes[0] != axes[1]:
        raise Refuse(f"the two ReduceMean nodes use different axes ({axes[0]} vs {axes[1]})")
    return checks.trailing_axis(axes[0], graph.rank(x))


def _require_not_function_body_inside(graph: GraphIndex, match: Match) -> None:
    """The 2-D norm inside ONNX's function body (x and scale flattened) is that rule's site, not
    this one's: reported once, by LayerNorm(function body)."""
    if match.has("flatten") or not match.has("scale"):
        return
    def producer(value: str):
        node = graph.producer.get(value)
        while node is not None and node.op_type == "Cast":  # x, or x taken as its float32 Cast
            node = graph.producer.get(node.input[0])
        return node

    flattened = [producer(match.value(name)) for name in ("x", "scale") if match.has(name)]
    if len(flattened) == 2 and all(node is not None and node.op_type == "Flatten" for node in flattened):
        raise NotCandidate()


def _unflattened_axis(graph: GraphIndex, match: Match, axis: int) -> int:
    """ONNX's function body normalises the last axis of Flatten(X, axis) and reshapes back: the
    norm of X over [axis, rank). Its Mean / InvStdDev outputs are not something our ops output."""
    if axis != -1:
        raise Refuse(f"the flattened input is normalised over axis {axis}, not its last axis")
    inside = {id(node) for node in match.covered}
    for bind, what in (("reduce", "Mean"), ("std", "InvStdDev")):
        value = match.node(bind).output[0]
        if graph.is_graph_output(value) or any(id(user) not in inside for user in graph.uses(value)):
            raise Refuse(f"LayerNormalization's {what} output ({value!r}) is read: otfuse's norm ops do not "
                         f"output training statistics")
    return checks.first_axis(attr(match.node("flatten"), "axis", 1), graph.rank(match.value("x")))


def _epsilon(form: _Form, graph: GraphIndex, match: Match) -> float:
    if form.allow is not None:  # the ONNX ops' epsilon, default 1e-5 for both
        eps = float(attr(match.node("norm"), "epsilon", ONNX_DEFAULT_EPSILON))
        if not (math.isfinite(eps) and eps >= 0):
            raise Refuse(f"epsilon {eps} is not >= 0")
        return eps
    if not match.has("eps"):
        return 0.0  # no Add before the Sqrt (_plus_epsilon)
    eps = graph.scalar_value(match.value("eps"))
    if eps is None:
        raise Refuse("epsilon must be a single-element constant")
    if not math.isfinite(eps) or eps < 0:
        raise Refuse(f"epsilon {eps} is not a finite value >= 0")
    return eps


def _scale_input(graph: GraphIndex, match: Match, x: str, axis: int):
    """The scale as the fused op wants it, exactly X.shape[axis:] (Gemma's 1 + w folded)."""
    if match.has("gamma_offset"):
        offset_name = match.value("gamma_offset")
        offset = graph.constant_value(offset_name)
        folded = (offset.astype(np.float32) + np.float32(1.0)).astype(offset.dtype)
        return NewTensor(f"{offset_name}_plus_one", value=folded.reshape(checks.row_shape(graph, x, axis)))
    return checks.row_parameter(graph, match.value("scale"), x, axis)


def _require_residual(graph: GraphIndex, a: str, b: str) -> None:
    """A residual Add of two values of one shape. An Add of a constant that broadcasts (the bias
    of the norm before, BLOOM TorchScript's embedding LayerNorm) is no residual: not a candidate,
    rather than a refused (and reported) one."""
    if (graph.is_constant(a) or graph.is_constant(b)) and graph.rank(a) != graph.rank(b):
        raise NotCandidate("an Add of a broadcast constant (a bias), not a residual")
    if residual.is_rotation_sum(graph, a, b):
        raise NotCandidate("a rotary embedding's x*cos + rotate(x)*sin, not a residual: the rope family's")
    checks.require_same_shape(graph, a, b)


def _analyse(form: _Form, ctx: RewriteContext, match: Match) -> Fusion:
    graph, root = ctx.graph, match.root
    if form.allow is not None:
        require_allowed(graph, match.node("norm"), form.allow)
    x = _x_value(form, match)
    checks.require_float_io(graph, x, root.output[0])
    if form.residual:
        _require_residual(graph, match.value("a"), match.value("b"))
    _require_not_function_body_inside(graph, match)
    axis = _normalised_axis(form, graph, match)
    if match.has("flatten"):
        axis = _unflattened_axis(graph, match, axis)
    if match.has("merge"):
        residual.require_rows_kept(graph, match.node("merge"), axis)
    epsilon = _epsilon(form, graph, match)
    if form.unit_scale:
        return _unscaled(graph, form, match, x, axis, epsilon)
    if wide.is_wide_scale(graph, form, match, x, axis):
        return wide.normalisation_only(graph, form.op, match, x, axis, epsilon)
    if wide.is_modulation(graph, form, match, x, axis):
        summed = dict(A=match.value("a"), B=match.value("b"), S=match.node("residual").output[0]) \
            if form.residual else None
        return wide.normalisation_only(graph, form.op, match, x, axis, epsilon, summed)
    for name in ("scale", "bias"):
        if match.has(name):
            checks.require_row_parameter(graph, match.value(name), x, axis, name)
    if match.has("gamma_offset"):
        checks.require_row_parameter(graph, match.value("gamma_offset"), x, axis, "scale")
    cast_readers = _cast_sum_read_elsewhere(form, graph, match)
    if cast_readers and graph.elem_type(x) != FLOAT:
        raise Refuse("the float32 copy of the residual sum is also used elsewhere")
    helpers = Helpers(root)
    if cast_readers:  # the identity Cast's readers now read the sum
        cast = match.node("cast_in")
        helpers.node("Identity", [x], cast.output[0], name=f"{cast.name or cast.output[0]}/sum", after=True)
    covers, y = match.covered, root.output[0]
    if match.has("merge"):  # normalise the sum in its own shape, reshape the result
        merge = match.node("merge")
        if residual.merge_stays(graph, match, cast_readers):
            covers = tuple(node for node in covers if node is not merge)
        y = residual.reshaped_output(helpers, merge, y)
    named = dict(A=match.value("a"), B=match.value("b"), S=match.node("residual").output[0]) \
        if form.residual else dict(X=x)
    if match.has("bias"):
        named["bias"] = checks.row_parameter(graph, match.value("bias"), x, axis)
    call = form.op(**named, scale=_scale_input(graph, match, x, axis), Y=y, epsilon=epsilon, axis=axis)
    partial = residual.unabsorbed_residual(graph, x, root, *form.downgrade_of) if form.downgrade_of else ()
    return Fusion(call, covers, helpers, partial=partial)


def _unscaled(graph: GraphIndex, form: _Form, match: Match, x: str, axis: int, epsilon: float) -> Fusion:
    """A norm with no weight (``RMSNorm(with_scale=False)``): the fused node's scale is ones. A
    normalised value that a Mul reads is left to the scaled rules (they ran first at that Mul: a
    refusal of theirs is the report's, not a reason to drop the scale)."""
    root = match.root
    readers = list(graph.uses(root.output[0]))
    readers += [after for cast in readers if cast.op_type == "Cast" for after in graph.uses(cast.output[0])]
    if any(user.op_type in ("Mul", "Add") for user in readers):
        raise NotCandidate("the normalised value is scaled or shifted: the scaled forms' site")
    if graph.elem_type(root.output[0]) != graph.elem_type(x):
        raise NotCandidate("the chain's value before its Cast back: the Cast is the norm's output")
    dims = checks.row_shape(graph, x, axis)
    if dims is None:
        raise Refuse(f"the normalised dims of {x!r} are not static: no scale of ones to give the fused node")
    ones = NewTensor(f"{root.output[0]}/unit_scale", value=np.ones(dims, dtype=np.float32))
    call = form.op(X=x, scale=ones, Y=root.output[0], epsilon=epsilon, axis=axis)
    return Fusion(call, match.covered, Helpers(root), partial=_scale_after_view(graph, root.output[0]))


def _scale_after_view(graph: GraphIndex, y: str) -> tuple[tuple[str, str], ...]:
    """A weight applied after the normalised groups are viewed back (Mamba2's grouped gated
    RMSNorm: ``weight * y_groups.view(..., hidden)``): reported, the Mul stays after the node."""
    for user in graph.uses(y):
        if user.op_type not in ("Reshape", "Cast"):
            continue
        for scaled in graph.uses(user.output[0]):
            if scaled.op_type == "Mul":
                return (("scale", f"the weight {scaled.name or scaled.output[0]!r} multiplies the normalised "
                                  f"value after the {user.op_type} {user.name or user.output[0]!r} (normalised "
                                  f"in groups, scaled whole): the fused node normalises with a unit scale and "
                                  f"that Mul stays after it"),)
    return ()


def _rule(name: str, form: _Form, pattern) -> Rule:
    return Rule(name, pattern, partial(_analyse, form), FAMILY,
                frozenset({"ReduceMean", "LayerNormalization", "RMSNormalization"}), fused_op=form.op.name)


def _rule_pair(name: str, plain: _Form, residual_form: _Form, spelled, residual_input=_residual_add) -> tuple[Rule, Rule]:
    """The residual rule (``spelled`` of the residual Add) and the plain one (``spelled`` of x),
    which reports a residual Add in front of it that the residual rule did not match."""
    residual_pattern = spelled(residual_input())
    plain = _Form(plain.op, allow=plain.allow, downgrade_of=(residual_pattern, f"Add{name}"))
    return _rule(f"Add{name}", residual_form, residual_pattern), _rule(name, plain, spelled(Var("x")))


def _rms_spelled(x) -> Either:
    return _scaled(_rms_normalized(x), with_bias=False)


def _layer_spelled(x) -> Either:
    return Either(_scaled(_layer_normalized(x), with_bias=True), _scaled(_layer_normalized(x), with_bias=False))


def _function_body(x) -> Either:
    """ONNX's function body of LayerNormalization (what inlining tools and onnx's ``*_expanded``
    test models write): X flattened to 2-D at ``axis``, normalised over its last axis, scaled by
    ``Flatten(W, 0)`` (``+ Flatten(B, 0)``), reshaped back to ``Shape(X)``."""
    normalized = _layer_normalized(op.Flatten(x, axis=ANY, _bind="flatten"))
    back = Either(op.Cast(normalized, to=ANY, _bind="cast_out"), normalized)
    scaled = op.Mul(back, op.Flatten(Var("scale"), axis=0))
    x_shape = op.Shape(x, start=attr_is(0, 0), end=attr_is(None))
    return Either(op.Reshape(op.Add(scaled, op.Flatten(Var("bias"), axis=0)), x_shape), op.Reshape(scaled, x_shape))


LAYER_NORM_FUNCTION_BODY = _rule("LayerNorm(function body)", _Form(ops.LayerNorm), _function_body(Var("x")))
ADD_RMS_NORM, RMS_NORM = _rule_pair("RMSNorm", _Form(ops.RMSNorm), _Form(ops.AddRMSNorm, residual=True),
                                    _rms_spelled)
RMS_NORM_UNSCALED = _rule("RMSNorm(no scale)", _Form(ops.RMSNorm, unit_scale=True),
                          Either(op.Cast(_rms_normalized(Var("x")), to=ANY, _bind="cast_out"),
                                 _rms_normalized(Var("x"))))
ADD_LAYER_NORM, LAYER_NORM = _rule_pair("LayerNorm", _Form(ops.LayerNorm), _Form(ops.AddLayerNorm, residual=True),
                                        _layer_spelled)


# Everything of the standard norm ops these rules translate; anything else is refused.
_NORM_ATTRIBUTES = {"axis": None, "epsilon": None, "stash_type": only(1)}
LAYER_NORMALIZATION_OP = OpAllowList(
    "LayerNormalization", versions=frozenset({17}), attributes=_NORM_ATTRIBUTES,
    inputs=3, outputs=1,  # X, Scale, B -> Y (not Mean, InvStdDev)
    ort_builtin_below=17,  # ORT's own LayerNormalization of the default domain: the same attributes and math
)
RMS_NORMALIZATION_OP = OpAllowList(
    "RMSNormalization", versions=frozenset({23}), attributes=_NORM_ATTRIBUTES, inputs=2, outputs=1)


# The ONNX ops' own default (LayerNormalization-17, RMSNormalization-23), not otfuse's.
ONNX_DEFAULT_EPSILON = 1e-5


def _float32_sum() -> Either:
    """The residual sum, or its Cast to float32 (TorchScript's OLMo: ``F.layer_norm(h.to(float32))``
    exported as Add -> Cast -> LayerNormalization, the next residual Add reading the Cast)."""
    return _as_float32(_residual_add())


def _standard_op(onnx_op: str, x, with_bias: bool) -> Op:
    inputs = (x, Var("scale"), Var("bias")) if with_bias else (x, Var("scale"))
    return Op(onnx_op, inputs, {}, "norm")


def _standard_op_either_bias(onnx_op: str, x) -> Either:
    return Either(_standard_op(onnx_op, x, True), _standard_op(onnx_op, x, False))


ADD_LAYER_NORMALIZATION, LAYER_NORMALIZATION = _rule_pair(
    "LayerNormalization", _Form(ops.LayerNorm, allow=LAYER_NORMALIZATION_OP),
    _Form(ops.AddLayerNorm, residual=True, allow=LAYER_NORMALIZATION_OP),
    partial(_standard_op_either_bias, "LayerNormalization"), _float32_sum)
ADD_RMS_NORMALIZATION, RMS_NORMALIZATION = _rule_pair(
    "RMSNormalization", _Form(ops.RMSNorm, allow=RMS_NORMALIZATION_OP),
    _Form(ops.AddRMSNorm, residual=True, allow=RMS_NORMALIZATION_OP),
    lambda x: _standard_op("RMSNormalization", x, False), _float32_sum)


# At one root the residual forms are tried first: they absorb the Add as well.
RULES: list[Rule] = [
    ADD_RMS_NORM,
    RMS_NORM,
    RMS_NORM_UNSCALED,
    ADD_LAYER_NORM,
    LAYER_NORM,
    LAYER_NORM_FUNCTION_BODY,
    ADD_LAYER_NORMALIZATION,
    LAYER_NORMALIZATION,
    ADD_RMS_NORMALIZATION,
    RMS_NORMALIZATION,
]
