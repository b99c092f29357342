"""Norms whose scale varies along axes they do not normalise (Cohere's q/k norm: a LayerNorm over
head_dim of `[B, S, N, D]` with a `[N, D]` weight, `CohereLayerNorm((heads, head_dim))`).

The norm ops take one scale value per normalised element (`X.shape[axis:]`), so such a scale is no
input of theirs. What they can take is the normalisation itself: the fused node normalises the
value the spelled-out chain normalised (x, or its Cast to float32) with a unit scale, and the
scale `Mul` (and bias `Add`, Cast back) stay as they were, reading the fused node's output in the
chain's own type. The values are those of the chain (the same float32 math, no extra rounding);
the report lists the kept scale as a downgrade.
"""

from __future__ import annotations

import numpy as np
import onnx

from otfuse.rewriter import checks
from otfuse.rewriter.builder import Helpers, NewTensor
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Match
from otfuse.rewriter.rule import Fusion, Refuse

_NUMPY = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16}


def _broadcasts_along_rows(shape, x_shape, dims) -> bool:
    """`shape` ends with the normalised `dims`, and its leading dims are 1 or x's own dims there
    (one value per head, say), never more dims than x has."""
    if shape is None or x_shape is None or len(shape) > len(x_shape) or len(shape) <= len(dims):
        return False
    if list(shape[len(shape) - len(dims):]) != dims:
        return False
    leading = shape[: len(shape) - len(dims)]
    aligned = x_shape[len(x_shape) - len(shape): len(x_shape) - len(dims)]
    return any(d != 1 for d in leading) and all(d == 1 or d == a for d, a in zip(leading, aligned))


def is_wide_scale(graph: GraphIndex, form, match: Match, x: str, axis: int) -> bool:
    """A plain spelled-out norm (not an ONNX op, not the residual form) whose constant scale has
    the normalised dims and, before them, dims of x that it is not normalised along."""
    if form.allow is not None or form.residual or not match.has("scale") or match.has("gamma_offset"):
        return False
    if match.has("flatten") or not match.has("normalized"):
        return False
    scale = match.value("scale")
    dims = checks.row_shape(graph, x, axis)
    if dims is None or not graph.is_constant(scale):
        return False
    # proven_shape: a batch dim the scale broadcast against is not taken as the scale's own dim
    return _broadcasts_along_rows(graph.constant_shape(scale), graph.proven_shape(x), dims)


def is_modulation(graph: GraphIndex, form, match: Match, x: str, axis: int) -> bool:
    """A plain spelled-out norm without a weight of its own whose output is multiplied by a
    computed value that is not one per normalised element: DiT's adaptive modulation
    `norm(x) * (1 + scale[b])` (LTX-Video's `RMSNorm(elementwise_affine=False)`), matched by the
    pattern as the scale. The fused node normalises; the Mul (and the shift Add) stay."""
    if form.allow is not None or not match.has("scale") or match.has("gamma_offset"):
        return False
    if match.has("flatten") or not match.has("normalized") or graph.is_constant(match.value("scale")):
        return False
    if form.residual and (match.has("cast_in") or match.has("merge")):
        return False  # the sum normalised in another type or shape than the Add's: not AddRMSNorm's S
    dims = checks.row_shape(graph, x, axis)
    shape = graph.shape(match.value("scale"))
    return dims is not None and (shape is None or list(shape) != dims)


def _upstream_of(match: Match, value: str) -> list[onnx.NodeProto]:
    """The matched nodes that compute `value` (the normalisation), `value`'s producer first."""
    by_output = {out: node for node in match.covered for out in node.output}
    found, stack, seen = [], [value], set()
    while stack:
        node = by_output.get(stack.pop())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        found.append(node)
        stack.extend(node.input)
    return found


def normalisation_only(graph: GraphIndex, fused_op, match: Match, x: str, axis: int, epsilon: float,
                       residual: dict | None = None) -> Fusion:
    """The fused node computes the chain's `normalized` value with a unit scale: of x (X), or of
    the residual sum (`residual` = the A, B, S of an Add* op, the sum computed in its own type)."""
    normalized = match.node("normalized")
    xf = match.node("cast_in").output[0] if match.has("cast_in") else x  # the value the chain normalises
    covers = [node for node in _upstream_of(match, normalized.output[0])
              if not (match.has("cast_in") and node is match.node("cast_in"))]
    dims = checks.row_shape(graph, x, axis)
    dtype = _NUMPY.get(graph.elem_type(xf))
    if dtype is None:
        raise Refuse("a scale along un-normalised dims on a value that is not float32 or float16")
    ones = NewTensor(f"{match.value('scale')}_unit", value=np.ones(dims, dtype=dtype))
    inputs = residual if residual is not None else dict(X=xf)
    call = fused_op(**inputs, scale=ones, Y=normalized.output[0], epsilon=epsilon, axis=axis)
    scale = match.value("scale")
    if graph.is_constant(scale):
        shape = list(graph.constant_shape(scale))
        why = f"the scale {scale!r} {shape} varies along dims of {x!r} that are not normalised (normalised dims {dims})"
    else:
        shape = graph.shape(scale)
        why = (f"the norm is multiplied by the computed {scale!r} {list(shape) if shape is not None else '(shape unknown)'}, "
               f"not one weight per normalised element {dims} (an adaptive modulation)")
    partial = (("scale", f"{why}: the fused node normalises with a unit scale and the scale Mul stays after it"),)
    return Fusion(call, tuple(covers), Helpers(normalized), partial=partial)
