"""ONNX Runtime's norm ops, as other tools write them (ORT's transformers optimizer and offline
``extended`` optimisation, onnxscript's ``optimize_for_ort``, onnxruntime-genai's builder),
re-targeted to the otfuse norm ops (docs/ops.md, "Re-targeted ops"):

    SkipLayerNormalization (com.microsoft)            -> AddLayerNorm  (bias: a plain Add in front)
    SkipSimplifiedLayerNormalization (com.microsoft)  -> AddRMSNorm
    SimplifiedLayerNormalization (ORT's, default domain) -> RMSNorm, or AddRMSNorm with the
                                                            residual Add in front of it

Per ORT's schemas (ORT 1.32): the Skip ops normalise ``input + skip (+ bias)`` over the last axis,
epsilon defaulting to 1e-12; output 3 (``input_skip_bias_sum``) is that sum, outputs 1 and 2 are
training statistics (not modelled). ``SimplifiedLayerNormalization`` is RMSNorm over
``[axis, rank)`` with epsilon defaulting to 1e-5 and output 1 the inverse RMS (not modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import onnx

from otfuse import ops
from otfuse.fusions.norm import residual
from otfuse.rewriter import checks
from otfuse.rewriter.allow_list import CONTRIB_DOMAIN, OpAllowList, only, require_allowed
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.pattern import Absent, Either, Match, Var, attr, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule

FAMILY = "norm"
ORT_SKIP_EPSILON = 1e-12  # the contrib schemas' default
ORT_SIMPLIFIED_EPSILON = 1e-5  # SimplifiedLayerNormalization's default

SKIP_LAYER_NORMALIZATION_OP = OpAllowList(
    "SkipLayerNormalization", versions=frozenset({1}), attributes={"epsilon": None},
    inputs=5,  # input, skip, gamma, beta, bias
    outputs=4,  # output, (mean, inv_std_var: refused when used), input_skip_bias_sum
    domain=CONTRIB_DOMAIN,
    formals=(("input", "skip", "gamma", "beta", "bias"), ("output", "mean", "inv_std_var", "input_skip_bias_sum")))
SKIP_SIMPLIFIED_LAYER_NORMALIZATION_OP = OpAllowList(
    "SkipSimplifiedLayerNormalization", versions=frozenset({1}), attributes={"epsilon": None},
    inputs=3,  # input, skip, gamma (not bias: ORT's doc and kernels disagree on whether it is added)
    outputs=4, domain=CONTRIB_DOMAIN,
    formals=(("input", "skip", "gamma", "bias"), ("output", "mean", "inv_std_var", "input_skip_bias_sum")))
SIMPLIFIED_LAYER_NORMALIZATION_OP = OpAllowList(
    "SimplifiedLayerNormalization", versions=frozenset(),
    attributes={"axis": None, "epsilon": None, "stash_type": only(1)},
    inputs=2, outputs=1,  # X, scale -> Y (not inv_std_var)
    # ORT registers it in the default domain at every opset; ONNX has no op of that name.
    ort_builtin_below=onnx.defs.onnx_opset_version() + 1,
    formals=(("X", "scale"), ("Y", "inv_std_var")))

_STATISTICS = (1, 2)  # mean, inv_std_var of the Skip ops
_SUM = 3  # input_skip_bias_sum


@dataclass(frozen=True)
class _ContribForm:
    op: ops.Op
    allow: OpAllowList
    default_epsilon: float
    skip: bool  # input + skip (a residual form)


def _used(graph, name: str) -> bool:
    return bool(name) and (bool(graph.uses(name)) or graph.is_graph_output(name))


def _epsilon(node, default: float) -> float:
    eps = float(attr(node, "epsilon", default))
    if not (math.isfinite(eps) and eps >= 0):
        raise Refuse(f"epsilon {eps} is not a finite value >= 0")
    return eps


def _analyse(form: _ContribForm, ctx: RewriteContext, match: Match) -> Fusion:
    graph, node = ctx.graph, match.node("norm")
    require_allowed(graph, node, form.allow)
    y = node.output[0]
    x = match.value("x")
    checks.require_float_io(graph, x, y)
    helpers = Helpers(node)
    epsilon = _epsilon(node, form.default_epsilon)
    if not form.skip:
        axis = checks.first_axis(attr(node, "axis", -1), graph.rank(x))
        checks.require_row_parameter(graph, match.value("scale"), x, axis, "scale")
        named = {"X": x}
        if match.has("residual"):  # Add(a, b) -> SimplifiedLayerNormalization: AddRMSNorm, the sum as S
            checks.require_same_shape(graph, match.value("a"), match.value("b"))
            named = {"A": match.value("a"), "B": match.value("b"), "S": x}
        call = form.op(**named, scale=checks.row_parameter(graph, match.value("scale"), x, axis), Y=y,
                       epsilon=epsilon, axis=axis)
        partial = () if match.has("residual") else residual.unabsorbed_residual(
            graph, x, node, _ADD_SIMPLIFIED, "AddRMSNorm(SimplifiedLayerNormalization)")
        return Fusion(call, match.covered, helpers, partial=partial)
    for position in _STATISTICS:
        if position < len(node.output) and _used(graph, node.output[position]):
            raise Refuse(f"{node.op_type} output {form.allow.formals[1][position]} ({node.output[position]!r}) "
                         f"is used: otfuse's norm ops do not output training statistics")
    skip = match.value("skip")
    checks.require_same_shape(graph, x, skip)  # ORT broadcasts a (1, S, H) or (S, H) skip; otfuse does not
    named = {"B": skip}
    for name in ("scale", "bias", "residual_bias"):
        if match.has(name):
            checks.require_row_parameter(graph, match.value(name), x, -1, name)
    named["A"] = x
    if match.has("residual_bias"):  # input + bias, then + skip in the fused node
        named["A"] = helpers.node("Add", [x, checks.row_parameter(graph, match.value("residual_bias"), x, -1)])
    named["scale"] = checks.row_parameter(graph, match.value("scale"), x, -1)
    if match.has("bias"):
        named["bias"] = checks.row_parameter(graph, match.value("bias"), x, -1)
    if len(node.output) > _SUM and _used(graph, node.output[_SUM]):
        named["S"] = node.output[_SUM]
    call = form.op(**named, Y=y, epsilon=epsilon, axis=-1)
    return Fusion(call, match.covered, helpers)


def _optional(name: str):
    return Either(Var(name), Absent())


_SKIP_LAYER_NORM = op.SkipLayerNormalization(Var("x"), Var("skip"), Var("scale"), _optional("bias"),
                                             _optional("residual_bias"), _domain=CONTRIB_DOMAIN, _bind="norm",
                                             _optional_tail=True)
_SKIP_SIMPLIFIED = op.SkipSimplifiedLayerNormalization(Var("x"), Var("skip"), Var("scale"), _optional("residual_bias"),
                                                       _domain=CONTRIB_DOMAIN, _bind="norm", _optional_tail=True)
_SIMPLIFIED = op.SimplifiedLayerNormalization(Var("x"), Var("scale"), _bind="norm")
# ORT leaves the residual Add in front when its sum is read elsewhere (no SkipSimplified then).
_ADD_SIMPLIFIED = op.SimplifiedLayerNormalization(op.Add(Var("a"), Var("b"), _bind="residual", _as="x"), Var("scale"),
                                                  _bind="norm")


def _rule(name: str, form: _ContribForm, pattern) -> Rule:
    return Rule(name, pattern, partial(_analyse, form), FAMILY, frozenset({form.allow.op_type}),
                fused_op=form.op.name)


RULES: list[Rule] = [
    _rule("AddLayerNorm(SkipLayerNormalization)",
          _ContribForm(ops.AddLayerNorm, SKIP_LAYER_NORMALIZATION_OP, ORT_SKIP_EPSILON, skip=True), _SKIP_LAYER_NORM),
    _rule("AddRMSNorm(SkipSimplifiedLayerNormalization)",
          _ContribForm(ops.AddRMSNorm, SKIP_SIMPLIFIED_LAYER_NORMALIZATION_OP, ORT_SKIP_EPSILON, skip=True),
          _SKIP_SIMPLIFIED),
    _rule("AddRMSNorm(SimplifiedLayerNormalization)",
          _ContribForm(ops.AddRMSNorm, SIMPLIFIED_LAYER_NORMALIZATION_OP, ORT_SIMPLIFIED_EPSILON, skip=False),
          _ADD_SIMPLIFIED),
    _rule("RMSNorm(SimplifiedLayerNormalization)",
          _ContribForm(ops.RMSNorm, SIMPLIFIED_LAYER_NORMALIZATION_OP, ORT_SIMPLIFIED_EPSILON, skip=False),
          _SIMPLIFIED),
]
