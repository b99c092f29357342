"""The residual Add in front of a norm: through a Reshape that keeps the normalised dims (OPT views
its hidden states as ``(-1, hidden)`` around the residual Adds), and the report of a plain norm
fused where a residual Add in front of it was not absorbed."""

from __future__ import annotations

import onnx

from otfuse.rewriter import checks
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Match, Matcher, Pattern
from otfuse.rewriter.rule import Refuse

# Ops an exporter puts between a residual Add and its norm that only move or retype values; a
# plain norm whose input comes from a residual Add through these is a downgrade.
_VIEWS = frozenset({"Reshape", "Cast", "Identity", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand"})
_VIEW_DEPTH = 3


def _label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} {node.name or node.output[0]!r}"


def require_rows_kept(graph: GraphIndex, merge: onnx.NodeProto, axis: int) -> None:
    """The Reshape between the sum and the norm must keep the normalised dims (it merges or
    splits only the leading ones): each row of its output is then a row of its input, in order,
    and the norm of the reshaped sum is the reshaped norm of the sum."""
    before, after = graph.proven_shape(merge.input[0]), graph.proven_shape(merge.output[0])
    if before is None or after is None:
        raise Refuse(f"the {_label(merge)} between the residual Add and the norm: shapes unknown")
    if len(before) < -axis or len(after) < -axis:
        raise Refuse(f"the {_label(merge)} between the residual Add and the norm changes the rank "
                     f"below the {-axis} normalised dims")
    kept, made = list(before[axis:]), list(after[axis:])
    if not checks.shapes_equal(kept, made):
        raise Refuse(f"the {_label(merge)} between the residual Add and the norm changes the normalised "
                     f"dims from {_dims(kept)} to {_dims(made)}")


def _dims(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def merge_stays(graph: GraphIndex, match: Match, cast_readers: bool) -> bool:
    """Whether the Reshape's output is needed outside the match (OPT's next residual Add reads
    it): the Reshape then stays, reading the fused node's sum."""
    reshaped = match.node("merge").output[0]
    inside = {id(node) for node in match.covered}
    return cast_readers or graph.is_graph_output(reshaped) or any(
        id(user) not in inside for user in graph.uses(reshaped))


def reshaped_output(helpers: Helpers, merge: onnx.NodeProto, y: str):
    """The fused node normalises the sum in its own shape; ``y`` is that result through a copy of
    the Reshape (same shape input and attributes, so the same output shape)."""
    unmerged = helpers.fresh(f"{y}/unmerged")
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in merge.attribute}
    helpers.node("Reshape", [unmerged, merge.input[1]], y, name=f"{merge.name or y}/norm", after=True,
                 **attributes)
    return unmerged


def _rotated_half(graph: GraphIndex, value: str) -> bool:
    """``value`` is a rotate_half / rotate_every_two: a Concat (through a Reshape: the interleaved
    stack) with a Neg among its inputs (through an Unsqueeze)."""
    node = graph.producer.get(value)
    if node is not None and node.op_type == "Reshape":
        node = graph.producer.get(node.input[0])
    if node is None or node.op_type != "Concat":
        return False
    for name in node.input:
        part = graph.producer.get(name)
        if part is not None and part.op_type == "Unsqueeze":
            part = graph.producer.get(part.input[0])
        if part is not None and part.op_type == "Neg":
            return True
    return False


def is_rotation_sum(graph: GraphIndex, a: str, b: str) -> bool:
    """``a + b`` is a rotary embedding's ``x*cos + rotate(x)*sin``: one operand a product of a
    rotated x (HunYuan normalises the rotated q and k per head: that sum is no residual, and
    absorbing it would leave the rotation unfused)."""
    for value in (a, b):
        product = graph.producer.get(value)
        if product is not None and product.op_type == "Mul" and any(
                _rotated_half(graph, name) for name in product.input):
            return True
    return False


def _residual_add(graph: GraphIndex, x: str) -> tuple[onnx.NodeProto, list[onnx.NodeProto]] | None:
    """The Add of two computed values that ``x`` is, or comes from through view ops, and those ops."""
    path: list[onnx.NodeProto] = []
    node = graph.producer.get(x)
    while node is not None and len(path) <= _VIEW_DEPTH:
        if node.op_type == "Add" and len(node.input) == 2:
            if any(not name or graph.is_constant(name) for name in node.input):
                return None  # a bias, not a residual
            if is_rotation_sum(graph, node.input[0], node.input[1]):
                return None  # a rotation's sum, not a residual
            return node, path
        if node.op_type not in _VIEWS or not node.input:
            return None
        path.append(node)
        node = graph.producer.get(node.input[0])
    return None


def unabsorbed_residual(graph: GraphIndex, x: str, root: onnx.NodeProto, residual: Pattern,
                        residual_rule: str) -> tuple[tuple[str, str], ...]:
    """For a plain norm about to be fused: the downgrade to report when ``x`` is a residual sum
    that the residual form (``residual``, rule ``residual_rule``) did not take. When that
    pattern matches here its refusal is already the report's downgrade (passes._downgrade)."""
    found = _residual_add(graph, x)
    if found is None:
        return ()
    matcher = Matcher(graph)
    if next(iter(matcher.matches(residual, root.output[0])), None) is not None:
        return ()
    add, path = found
    if path:
        how = f"reaches the norm through {' -> '.join(_label(node) for node in reversed(path))}, which no residual rule models"
    else:
        why = f" ({matcher.best_failure.reason})" if matcher.best_failure else ""
        how = f"feeds the norm, but the residual rule's spelling does not match{why}"
    return (("residual Add", f"{residual_rule} not matched: the residual {_label(add)} {how}"),)
