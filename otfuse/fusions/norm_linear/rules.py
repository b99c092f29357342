"""Norm + Linear family: an otfuse norm node and the projections that read its output, in one node
(RMSNormLinear, AddRMSNormLinear, LayerNormLinear, AddLayerNormLinear; docs/ops.md).

The norm family runs first, so the pattern is the fused norm node itself; the rule's ``analyse``
then walks its consumers (a fan-out the single-root matcher cannot spell) and takes each one that
is a projection with a constant weight:

    MatMul(Y, W) [+ Add(·, b)]                    W constant [K, N], or Transpose(W') of a constant
    Reshape(Y, [..., K]) -> MatMul / Gemm [+ b]   (GPT-2: Reshape -> Gemm -> Reshape; lm_head)
                                                  (reshaped back, unless it keeps Y's shape)
    Gemm(·, W, b, transB=0|1)                     alpha = beta = 1, transA = 0

Consumers that are not such projections (``W @ Y``, a non-constant or mismatched weight, any
other op) keep reading the normalised tensor, which the fused node then outputs as well. The
pass's leak check runs on the grown match, so no value computed inside it can escape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import onnx

from otfuse import ops
from otfuse.rewriter import checks
from otfuse.rewriter.builder import Fresh, Helpers, NewTensor, OutputName, Value
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Either, Match, Op, Var, attr
from otfuse.rewriter.rule import Fusion, NotCandidate, Refuse, RewriteContext, Rule

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


def _weight(graph: GraphIndex, name: str, transposed: bool, k: int, elem: int) -> tuple[str, bool, int]:
    """(constant weight, stored transposed?, N), reading through a Transpose of a constant."""
    producer = graph.producer.get(name)
    if not graph.is_constant(name) and producer is not None and _std(producer, "Transpose") \
            and list(attr(producer, "perm", [1, 0])) == [1, 0] and graph.is_constant(producer.input[0]):
        name, transposed = producer.input[0], not transposed
    if not graph.is_constant(name):
        raise Refuse(f"weight {name!r} is not a constant")
    shape = graph.constant_shape(name)
    if shape is None or len(shape) != 2:
        raise Refuse(f"weight {name!r} is not a matrix (shape {shape})")
    k_w, n = (shape[1], shape[0]) if transposed else (shape[0], shape[1])
    if k_w != k:
        raise Refuse(f"weight {name!r} has K = {k_w} but the normalised rows have {k}")
    if n <= 0:
        raise Refuse(f"weight {name!r} has no columns")
    if graph.elem_type(name) != elem:
        raise Refuse(f"weight {name!r} has type {checks.type_name(graph.elem_type(name))}, not the norm's")
    return name, transposed, n


def _is_bias(graph: GraphIndex, name: str, n: int, elem: int, max_rank: int) -> bool:
    """Whether ``name`` is a constant bias of exactly N values on the last axis."""
    if not graph.is_constant(name) or graph.elem_type(name) != elem:
        return False
    shape = graph.constant_shape(name)
    return bool(shape) and shape[-1] == n and all(d == 1 for d in shape[:-1]) and len(shape) <= max_rank


def _projection(graph: GraphIndex, node: onnx.NodeProto, a: str, k: int, elem: int,
                rank: int) -> Projection | None:
    """The projection ``node`` computes from ``a`` (Y or its Reshape); None when ``node`` is no
    MatMul / Gemm. Refuses a MatMul / Gemm that is not such a projection."""
    if _std(node, "MatMul"):
        if node.input[0] != a:
            raise Refuse(f"{_label(node)} reads the normalised value as its second operand (W @ x)")
        if node.input[1] == a:
            raise Refuse(f"{_label(node)} multiplies the normalised value by itself")
        weight, transposed, n = _weight_of(graph, node, node.input[1], False, k, elem)
        projection = Projection(weight, transposed, n, None, node.output[0], [node])
        add = _only_user(graph, node.output[0])
        if add is not None and _std(add, "Add"):
            other = add.input[1] if add.input[0] == node.output[0] else add.input[0]
            if add.input[0] != add.input[1] and _is_bias(graph, other, n, elem, rank):
                projection.bias, projection.output = other, add.output[0]
                projection.nodes.append(add)
        return projection
    if _std(node, "Gemm"):
        if node.input[0] != a:
            raise Refuse(f"{_label(node)} reads the normalised value as its second operand")
        if attr(node, "transA", 0) != 0 or attr(node, "alpha", 1.0) != 1.0 or attr(node, "beta", 1.0) != 1.0:
            raise Refuse(f"{_label(node)}: transA / alpha / beta are not 0 / 1 / 1")
        weight, transposed, n = _weight_of(graph, node, node.input[1], attr(node, "transB", 0) == 1, k, elem)
        bias = None
        if len(node.input) > 2 and node.input[2]:
            if not _is_bias(graph, node.input[2], n, elem, 2):
                raise Refuse(f"{_label(node)}: C is not a constant bias of {n} values")
            bias = node.input[2]
        return Projection(weight, transposed, n, bias, node.output[0], [node])
    return None


def _weight_of(graph: GraphIndex, node: onnx.NodeProto, name: str, transposed: bool, k: int, elem: int):
    try:
        return _weight(graph, name, transposed, k, elem)
    except Refuse as refusal:
        raise Refuse(f"{_label(node)}: {refusal}") from None


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


def _consumers(graph: GraphIndex, norm: onnx.NodeProto, scale: str) -> Analysis:
    """Which consumers of the norm's output become projections of the fused node."""
    y = norm.output[0]
    scale_shape = graph.constant_shape(scale) if graph.is_constant(scale) else graph.shape(scale)
    if not scale_shape or not isinstance(scale_shape[-1], int) or len(scale_shape) != 1:
        raise Refuse("the norm's scale is not a vector of static length")
    k = int(scale_shape[-1])
    elem = graph.elem_type(norm.input[0])
    if elem not in checks.FLOAT_TYPES:
        raise Refuse(f"the norm's input has type {checks.type_name(elem)}")
    rank = graph.rank(norm.input[0]) or 8
    analysis = Analysis(k, keep_normalized=graph.is_graph_output(y))
    downstream: set[str] | None = None
    for user in graph.uses(y):
        if _std(user, "Reshape") and user.input[0] == y and len(user.input) == 2:
            if downstream is None:
                downstream = _downstream(graph, norm)
            _read_reshaped(graph, user, k, elem, rank, downstream, analysis)
            continue
        try:
            found = _projection(graph, user, y, k, elem, rank)
        except Refuse as refusal:  # noted: the other consumers may still fit
            analysis.reasons.append(str(refusal))
            analysis.tried = analysis.keep_normalized = True
            continue
        if found is not None:
            analysis.projections.append(found)
            analysis.tried = True
            continue
        analysis.keep_normalized = True
    return analysis


def _read_reshaped(graph: GraphIndex, reshape: onnx.NodeProto, k: int, elem: int, rank: int,
                   downstream: set[str], analysis: Analysis) -> None:
    """A Reshape of Y: its consumers become projections when all of them are and it keeps K."""
    users = graph.uses(reshape.output[0])
    found, reasons = [], []
    for user in users:
        try:
            found.append(_projection(graph, user, reshape.output[0], k, elem, rank))
        except Refuse as refusal:
            reasons.append(str(refusal))
    analysis.tried |= bool(reasons) or any(f is not None for f in found)
    if (_reshape_keeps_k(graph, reshape, k, downstream) and users and not graph.is_graph_output(reshape.output[0])
            and not reasons and all(f is not None for f in found)):
        for projection in found:
            projection.reshape = reshape
            analysis.projections.append(projection)
        return
    analysis.reasons += reasons or [f"{_label(reshape)} does not provably keep the last dim {k}, or feeds other ops"]
    analysis.keep_normalized = True


def _norm_pattern(op_type: str, add: bool, bias: bool) -> Op:
    inputs = [Var("a"), Var("b")] if add else [Var("x")]
    inputs.append(Var("scale"))
    if bias:
        inputs.append(Var("norm_bias"))
    return Op(op_type, tuple(inputs), {}, "norm", OTFUSE)


def _grown(ctx: RewriteContext, match: Match) -> Analysis:
    """The consumers the fused node takes; not a candidate when none is a projection."""
    graph, norm = ctx.graph, match.node("norm")
    try:
        axis = checks.first_axis(attr(norm, "axis", -1), graph.rank(norm.input[0]))  # otfuse norms: [axis, rank)
    except Refuse:
        axis = None
    if axis != -1:
        raise NotCandidate("normalises more than the last axis: not a row-wise projection input")
    try:
        analysis = _consumers(graph, norm, match.value("scale"))
    except Refuse:
        if any(_std(u, "MatMul") or _std(u, "Gemm") for u in graph.uses(norm.output[0])):
            raise
        raise NotCandidate("no projection reads the norm") from None
    if not analysis.projections:
        if analysis.tried and analysis.reasons:
            raise Refuse("; ".join(analysis.reasons))
        raise NotCandidate("no projection reads the norm")
    return analysis


def _analyse(op: ops.Op, ctx: RewriteContext, match: Match) -> Fusion:
    norm = match.node("norm")
    analysis = _grown(ctx, match)
    helpers = Helpers(norm)
    named = dict(zip((i.name for i in ops.get(norm.op_type).inputs), norm.input))
    if "bias" in named:
        named["norm_bias"] = named.pop("bias")
    weights, biases, outputs = [], [], []
    for projection in analysis.projections:
        weights.append(projection.weight)
        if projection.bias is not None:
            biases.append(_as_vector(ctx.graph, helpers, projection.bias, projection.n))
        if projection.reshape is None or _keeps_shape(ctx.graph, projection.reshape):
            outputs.append(projection.output)
            continue
        rows = helpers.fresh(f"{projection.output}_rows")
        outputs.append(rows)
        shape = _shape_back(ctx.graph, helpers, projection.reshape, projection.n)
        helpers.node("Reshape", [rows, shape], projection.output, name=f"{projection.output}/reshape_back",
                     after=True, allowzero=attr(projection.reshape, "allowzero", 0))
    if "S" in op.output_names():
        named["S"] = norm.output[1] if len(norm.output) > 1 and norm.output[1] else \
            helpers.fresh(f"{norm.output[0]}_sum")
    epsilon = attr(norm, "epsilon")
    shared = [int(_gathered(ctx.graph, p.weight)) for p in analysis.projections]
    call = op(**named, W=weights, bias=biases, Y=outputs, Yn=norm.output[0] if analysis.keep_normalized else "",
              axis=-1, out_features=[p.n for p in analysis.projections],
              transposed=[int(p.transposed) for p in analysis.projections],
              has_bias=[int(p.bias is not None) for p in analysis.projections],
              shared_weight=shared if any(shared) else None,
              epsilon=None if epsilon is None else float(epsilon))
    nodes: list[onnx.NodeProto] = []
    for projection in analysis.projections:
        if projection.reshape is not None and not any(projection.reshape is n for n in nodes):
            nodes.append(projection.reshape)
        nodes.extend(projection.nodes)
    return Fusion(call, (*match.covered, *nodes), helpers)


def _gathered(graph: GraphIndex, weight: str) -> bool:
    """Whether a Gather of this graph reads the weight as its data (a tied embedding table: GPT-2's
    wte, Qwen2-0.5B's embed_tokens): ORT then keeps the initializer for the session whatever the
    fused node does, and the unfused session holds it beside MLAS's packed copy of the projection,
    so the custom-op kernel may pack it once without holding more than the unfused model
    (``shared_weight``, docs/ops.md; measured: bench/README.md, "LM heads, session 17"). Any other
    reader proves nothing (a MatMul would pack it and let ORT free it), nor does a Gather in a
    subgraph, which this graph's index does not see."""
    return graph.is_constant(weight) and weight in graph.initializers and any(
        _std(user, "Gather") and user.input[0] == weight for user in graph.uses(weight))


def _keeps_shape(graph: GraphIndex, reshape: onnx.NodeProto) -> bool:
    """Reshape(Y) to Y's own shape (GPT-2's lm_head reads ln_f through a view to [1, seq, hidden]):
    the fused node's output already has the projection's shape, so no Reshape back, which on an
    LM head's graph output was a copy of the logits (17 of 303 ms at 512 rows, bench/README.md
    "norm_linear default, session 15")."""
    return checks.shapes_equal(graph.proven_shape(reshape.output[0]), graph.proven_shape(reshape.input[0]))


def _as_vector(graph: GraphIndex, helpers: Helpers, name: str, n: int) -> Value:
    """A bias constant as exactly [N] (same bytes, new dims; external data keeps its reference)."""
    if list(graph.constant_shape(name)) == [n]:
        return name
    return helpers.add(NewTensor(f"{name}_vector", source=name, dims=(n,)))


def _shape_back(graph: GraphIndex, helpers: Helpers, reshape: onnx.NodeProto, n: int) -> Value:
    """The Reshape target that gives the projection its original output shape: the Reshape of Y's
    target with the last entry K replaced by N."""
    shape = reshape.input[1]
    if graph.is_constant(shape):
        value = np.array(graph.constant_value(shape), dtype=np.int64)
        value[-1] = n
        return helpers.constant(value, f"{shape}_n{n}")
    concat = graph.producer[shape]
    last = np.array(graph.constant_value(concat.input[-1]), dtype=np.int64)
    last[-1] = n
    tail = helpers.constant(last, f"{concat.input[-1]}_n{n}")
    return helpers.node("Concat", [*concat.input[:-1], tail], Fresh(f"{shape}_n{n}"), name=OutputName("/concat"),
                        after=True, axis=attr(concat, "axis", 0))


def _rule(name: str, op: ops.Op, pattern) -> Rule:
    return Rule(name, pattern, partial(_analyse, op), FAMILY,
                frozenset({"RMSNorm", "AddRMSNorm", "LayerNorm", "AddLayerNorm"}), fused_op=op.name)


RULES: list[Rule] = [
    _rule("RMSNormLinear", ops.RMSNormLinear, _norm_pattern("RMSNorm", False, False)),
    _rule("AddRMSNormLinear", ops.AddRMSNormLinear, _norm_pattern("AddRMSNorm", True, False)),
    _rule("LayerNormLinear", ops.LayerNormLinear,
          Either(_norm_pattern("LayerNorm", False, True), _norm_pattern("LayerNorm", False, False))),
    _rule("AddLayerNormLinear", ops.AddLayerNormLinear,
          Either(_norm_pattern("AddLayerNorm", True, True), _norm_pattern("AddLayerNorm", True, False))),
]
