"""Norm + Linear family: an otfuse norm node and the projections that read its output, in one node
(RMSNormLinear, AddRMSNormLinear, LayerNormLinear, AddLayerNormLinear; docs/ops.md).

The norm family runs first, so the pattern is the fused norm node itself; the rule's ``grow``
then walks its consumers (a fan-out the single-root matcher cannot spell) and takes each one that
is a projection with a constant weight:

    MatMul(Y, W) [+ Add(·, b)]                    W constant [K, N], or Transpose(W') of a constant
    Reshape(Y, [..., K]) -> MatMul / Gemm [+ b]   (GPT-2: Reshape -> Gemm -> Reshape; lm_head)
    Gemm(·, W, b, transB=0|1)                     alpha = beta = 1, transA = 0

Consumers that are not such projections (``W @ Y``, a non-constant or mismatched weight, any
other op) keep reading the normalised tensor, which the fused node then outputs as well. The
pass's leak check runs on the grown match, so no value computed inside it can escape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from otfuse.rewriter import checks
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Either, Match, Op, Var, attr
from otfuse.rewriter.rule import Replacement, RewriteContext, Rule

FAMILY = "norm_linear"
OTFUSE = "otfuse"


@dataclass
class Projection:
    weight: str
    transposed: bool
    n: int
    bias: str | None
    output: str  # the value the projection produced in the original graph
    nodes: list[onnx.NodeProto]
    reshape: onnx.NodeProto | None = None  # Reshape(Y, [..., K]) in front of it, if any


@dataclass
class Analysis:
    k: int
    projections: list[Projection] = field(default_factory=list)
    keep_normalized: bool = False
    reasons: list[str] = field(default_factory=list)
    tried: bool = False  # some consumer was a MatMul / Gemm (worth a near miss if none fits)


def _label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} {node.name or node.output[0]!r}"


def _std(node: onnx.NodeProto, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def _only_user(graph: GraphIndex, value: str) -> onnx.NodeProto | None:
    users = graph.uses(value)
    if len(users) == 1 and not graph.is_graph_output(value):
        return users[0]
    return None


def _weight(graph: GraphIndex, name: str, transposed: bool, k: int, elem: int) -> tuple[str, bool, int] | str:
    """(constant weight, stored transposed?, N), reading through a Transpose of a constant."""
    producer = graph.producer.get(name)
    if not graph.is_constant(name) and producer is not None and _std(producer, "Transpose") \
            and list(attr(producer, "perm", [1, 0])) == [1, 0] and graph.is_constant(producer.input[0]):
        name, transposed = producer.input[0], not transposed
    if not graph.is_constant(name):
        return f"weight {name!r} is not a constant"
    shape = graph.constant_shape(name)
    if shape is None or len(shape) != 2:
        return f"weight {name!r} is not a matrix (shape {shape})"
    k_w, n = (shape[1], shape[0]) if transposed else (shape[0], shape[1])
    if k_w != k:
        return f"weight {name!r} has K = {k_w} but the normalised rows have {k}"
    if n <= 0:
        return f"weight {name!r} has no columns"
    if graph.elem_type(name) != elem:
        return f"weight {name!r} has type {checks.type_name(graph.elem_type(name))}, not the norm's"
    return name, transposed, n


def _bias(graph: GraphIndex, name: str, n: int, elem: int, max_rank: int) -> str | None:
    """Whether ``name`` is a constant bias of exactly N values on the last axis."""
    if not graph.is_constant(name) or graph.elem_type(name) != elem:
        return None
    shape = graph.constant_shape(name)
    if not shape or shape[-1] != n or any(d != 1 for d in shape[:-1]) or len(shape) > max_rank:
        return None
    return name


def _projection(graph: GraphIndex, node: onnx.NodeProto, a: str, k: int, elem: int,
                rank: int) -> Projection | str | None:
    """The projection ``node`` computes from ``a`` (Y or its Reshape), a reason, or None."""
    if _std(node, "MatMul"):
        if node.input[0] != a:
            return f"{_label(node)} reads the normalised value as its second operand (W @ x)"
        if node.input[1] == a:
            return f"{_label(node)} multiplies the normalised value by itself"
        found = _weight(graph, node.input[1], False, k, elem)
        if isinstance(found, str):
            return f"{_label(node)}: {found}"
        weight, transposed, n = found
        projection = Projection(weight, transposed, n, None, node.output[0], [node])
        add = _only_user(graph, node.output[0])
        if add is not None and _std(add, "Add"):
            other = add.input[1] if add.input[0] == node.output[0] else add.input[0]
            if add.input[0] != add.input[1] and _bias(graph, other, n, elem, rank):
                projection.bias, projection.output = other, add.output[0]
                projection.nodes.append(add)
        return projection
    if _std(node, "Gemm"):
        if node.input[0] != a:
            return f"{_label(node)} reads the normalised value as its second operand"
        if attr(node, "transA", 0) != 0 or attr(node, "alpha", 1.0) != 1.0 or attr(node, "beta", 1.0) != 1.0:
            return f"{_label(node)}: transA / alpha / beta are not 0 / 1 / 1"
        found = _weight(graph, node.input[1], attr(node, "transB", 0) == 1, k, elem)
        if isinstance(found, str):
            return f"{_label(node)}: {found}"
        weight, transposed, n = found
        bias = None
        if len(node.input) > 2 and node.input[2]:
            bias = _bias(graph, node.input[2], n, elem, 2)
            if bias is None:
                return f"{_label(node)}: C is not a constant bias of {n} values"
        return Projection(weight, transposed, n, bias, node.output[0], [node])
    return None


def _reshape_keeps_k(graph: GraphIndex, node: onnx.NodeProto, k: int, downstream: set[str]) -> bool:
    """Reshape(Y, shape) whose shape provably ends in K: rows are unchanged, only regrouped."""
    shape = node.input[1]
    if graph.is_constant(shape):
        value = graph.constant_value(shape)
        return value is not None and value.ndim == 1 and value.size >= 1 and int(value[-1]) == k
    concat = graph.producer.get(shape)
    if concat is None or not _std(concat, "Concat") or not concat.input:
        return False
    last = concat.input[-1]
    if not graph.is_constant(last):
        return False
    value = graph.constant_value(last)
    if value is None or value.ndim != 1 or value.size < 1 or int(value[-1]) != k:
        return False
    # The fused node's Reshape back reads the other pieces: none may depend on the norm.
    return not any(piece in downstream for piece in concat.input[:-1])


def _downstream(graph: GraphIndex, node: onnx.NodeProto) -> set[str]:
    """Every value computed from ``node``'s outputs."""
    seen: set[str] = set()
    stack = [out for out in node.output if out]
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        for user in graph.uses(value):
            stack.extend(out for out in user.output if out and out not in seen)
    return seen


def analyse(graph: GraphIndex, norm: onnx.NodeProto, scale: str) -> Analysis | str:
    """Which consumers of the norm's output become projections of the fused node."""
    y = norm.output[0]
    scale_shape = graph.constant_shape(scale) if graph.is_constant(scale) else graph.shape(scale)
    if not scale_shape or not isinstance(scale_shape[-1], int) or len(scale_shape) != 1:
        return "the norm's scale is not a vector of static length"
    k = int(scale_shape[-1])
    elem = graph.elem_type(norm.input[0])
    if elem not in checks.FLOAT_TYPES:
        return f"the norm's input has type {checks.type_name(elem)}"
    rank = graph.rank(norm.input[0]) or 8
    analysis = Analysis(k, keep_normalized=graph.is_graph_output(y))
    downstream: set[str] | None = None
    for user in graph.uses(y):
        if _std(user, "Reshape") and user.input[0] == y and len(user.input) == 2:
            if downstream is None:
                downstream = _downstream(graph, norm)
            users = graph.uses(user.output[0])
            found = [_projection(graph, u, user.output[0], k, elem, rank) for u in users]
            analysis.tried |= any(f is not None for f in found)
            if (_reshape_keeps_k(graph, user, k, downstream) and users and not graph.is_graph_output(user.output[0])
                    and all(isinstance(f, Projection) for f in found)):
                for projection in found:
                    projection.reshape = user
                    analysis.projections.append(projection)
                continue
            analysis.reasons += [f for f in found if isinstance(f, str)] or \
                [f"{_label(user)} does not provably keep the last dim {k}, or feeds other ops"]
            analysis.keep_normalized = True
            continue
        found = _projection(graph, user, y, k, elem, rank)
        if isinstance(found, Projection):
            analysis.projections.append(found)
            analysis.tried = True
            continue
        if isinstance(found, str):
            analysis.reasons.append(found)
            analysis.tried = True
        analysis.keep_normalized = True
    return analysis


def _norm_pattern(op_type: str, add: bool, bias: bool) -> Op:
    inputs = [Var("a"), Var("b")] if add else [Var("x")]
    inputs.append(Var("scale"))
    if bias:
        inputs.append(Var("norm_bias"))
    return Op(op_type, tuple(inputs), {}, "norm", OTFUSE)


class _NormLinearRule(Rule):
    family = FAMILY
    anchor_ops = frozenset({"RMSNorm", "AddRMSNorm", "LayerNorm", "AddLayerNorm"})
    fused_op = ""
    add = False

    def grow(self, ctx: RewriteContext, match: Match) -> Match | str | None:
        norm = match.node("norm")
        if checks.trailing_axis([attr(norm, "axis", -1)], ctx.graph.rank(norm.input[0])) != -1:
            return None  # normalises more than the last axis: not a row-wise projection input
        analysis = analyse(ctx.graph, norm, match.value("scale"))
        if isinstance(analysis, str):
            return analysis if any(_std(u, "MatMul") or _std(u, "Gemm") for u in ctx.graph.uses(norm.output[0])) else None
        if not analysis.projections:
            return "; ".join(analysis.reasons) if analysis.tried and analysis.reasons else None
        nodes: list[onnx.NodeProto] = []
        for projection in analysis.projections:
            if projection.reshape is not None:
                nodes.append(projection.reshape)
            nodes.extend(projection.nodes)
        return match.grown(tuple(nodes))

    def produced_values(self, graph: GraphIndex, match: Match, root_value: str) -> set[str] | None:
        norm = match.node("norm")
        analysis = analyse(graph, norm, match.value("scale"))
        values = {p.output for p in analysis.projections}
        if self.add and len(norm.output) > 1 and norm.output[1]:
            values.add(norm.output[1])
        if analysis.keep_normalized:
            values.add(root_value)
        return values

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        graph = ctx.graph
        norm = match.node("norm")
        analysis = analyse(graph, norm, match.value("scale"))
        inputs = list(norm.input)
        if "LayerNorm" in self.fused_op and not match.has("norm_bias"):
            inputs.append("")  # the optional norm bias, before the variadic tail
        initializers: list[onnx.TensorProto] = []
        helpers: list[onnx.NodeProto] = []
        outputs: list[str] = []
        biases: list[str] = []
        for projection in analysis.projections:
            inputs.append(projection.weight)
            if projection.bias is not None:
                bias, more = _as_vector(ctx, projection.bias, projection.n)
                biases.append(bias)
                initializers += more
            if projection.reshape is None:
                outputs.append(projection.output)
                continue
            rows = ctx.unique_name(f"{projection.output}_rows")
            outputs.append(rows)
            shape, more_nodes, more_inits = _shape_back(ctx, projection.reshape, projection.n)
            helpers += more_nodes
            initializers += more_inits
            helpers.append(onnx.helper.make_node(
                "Reshape", [rows, shape], [projection.output], name=ctx.unique_name(f"{projection.output}/reshape_back"),
                allowzero=attr(projection.reshape, "allowzero", 0)))
        inputs += biases
        if self.add:
            outputs.append(norm.output[1] if len(norm.output) > 1 and norm.output[1]
                           else ctx.unique_name(f"{norm.output[0]}_sum"))
        if analysis.keep_normalized:
            outputs.append(norm.output[0])
        epsilon = attr(norm, "epsilon")
        extra = {} if epsilon is None else {"epsilon": float(epsilon)}
        fused = ctx.fused_node(self.fused_op, inputs, outputs, root, axis=-1,
                               out_features=[p.n for p in analysis.projections],
                               transposed=[int(p.transposed) for p in analysis.projections],
                               has_bias=[int(p.bias is not None) for p in analysis.projections], **extra)
        return Replacement([fused] + helpers, initializers)


def _as_vector(ctx: RewriteContext, name: str, n: int) -> tuple[str, list[onnx.TensorProto]]:
    """A bias constant as exactly [N] (same bytes, new dims; external data keeps its reference)."""
    shape = ctx.graph.constant_shape(name)
    if list(shape) == [n]:
        return name, []
    tensor = ctx.graph.constant_tensor(name)
    if tensor is not None:
        reshaped = onnx.TensorProto()
        reshaped.CopyFrom(tensor)
        reshaped.name = ctx.unique_name(f"{name}_vector")
        del reshaped.dims[:]
        reshaped.dims.append(n)
        return reshaped.name, [reshaped]
    new = ctx.constant(f"{name}_vector", np.asarray(ctx.graph.constant_value(name)).reshape(n))
    return new.name, [new]


def _shape_back(ctx: RewriteContext, reshape: onnx.NodeProto, n: int):
    """The Reshape target that gives the projection its original output shape: the Reshape of Y's
    target with the last entry K replaced by N."""
    graph = ctx.graph
    shape = reshape.input[1]
    if graph.is_constant(shape):
        value = np.array(graph.constant_value(shape), dtype=np.int64)
        value[-1] = n
        tensor = ctx.constant(f"{shape}_n{n}", value)
        return tensor.name, [], [tensor]
    concat = graph.producer[shape]
    last = np.array(graph.constant_value(concat.input[-1]), dtype=np.int64)
    last[-1] = n
    tensor = ctx.constant(f"{concat.input[-1]}_n{n}", last)
    out = ctx.unique_name(f"{shape}_n{n}")
    node = onnx.helper.make_node("Concat", list(concat.input[:-1]) + [tensor.name], [out],
                                 name=ctx.unique_name(f"{out}/concat"), axis=attr(concat, "axis", 0))
    return out, [node], [tensor]


class RMSNormLinearRule(_NormLinearRule):
    name = "RMSNormLinear"
    fused_op = "RMSNormLinear"
    pattern = _norm_pattern("RMSNorm", False, False)


class AddRMSNormLinearRule(_NormLinearRule):
    name = "AddRMSNormLinear"
    fused_op = "AddRMSNormLinear"
    add = True
    pattern = _norm_pattern("AddRMSNorm", True, False)


class LayerNormLinearRule(_NormLinearRule):
    name = "LayerNormLinear"
    fused_op = "LayerNormLinear"
    pattern = Either(_norm_pattern("LayerNorm", False, True), _norm_pattern("LayerNorm", False, False))


class AddLayerNormLinearRule(_NormLinearRule):
    name = "AddLayerNormLinear"
    fused_op = "AddLayerNormLinear"
    add = True
    pattern = Either(_norm_pattern("AddLayerNorm", True, True), _norm_pattern("AddLayerNorm", True, False))


RULES: list[Rule] = [RMSNormLinearRule(), AddRMSNormLinearRule(), LayerNormLinearRule(), AddLayerNormLinearRule()]
