"""Rotary embeddings written as complex products with half-width tables: the function body of the
ONNX ``RotaryEmbedding`` op as inliners write it (onnx's ``*_expanded`` forms), and any hand port
of ``(x1 + i x2) (c + i s)``::

    x1, x2 = the halves of x (Split in two, or Slices [:h], [h:])          half
           = the even and odd lanes of x (Slices 0::2, 1::2)              interleaved
    real   = x1*c - x2*s,   imag = x1*s + x2*c                            (operands in any order)
    y      = Concat(real, imag)                                           half
           = Reshape(Concat(Unsqueeze(real, -1), Unsqueeze(imag, -1)), x's shape)   interleaved
    partial: Concat(y(x[:r]), x[r:]) with x cut by a Split [r, D - r] or two Slices; ONNX's body
             writes this Concat also for r = D, with an empty pass-through part.

That is mode ``half`` / ``interleaved`` of docs/ops.md with full-width tables ``Concat(c, c)`` /
``c`` repeated lane by lane: ``cos*x + sin*(M x)`` gives ``c*x1 + s*(-x2)`` and ``c*x2 + s*x1``
on the two parts, the same products and sums. The rewrite builds the tables with one Gather of
lanes each and feeds the fused node the x the rotation cuts.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx

from otfuse import ops
from otfuse.fusions.rope.rotations import _broadcasts_over, _check_concat_last, _check_input, _expect_slice
from otfuse.rewriter import checks
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import ANY, Either, Match, Var, attr, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule
from otfuse.rewriter.spellings import slice_params, sliced, split_output, split_sizes, unsqueeze, unsqueeze_axes

FAMILY = "rope"


def _products(x1, x2):
    """(real, imag) of (x1 + i x2)(c + i s); each of x1, x2 one node read twice."""
    cos, sin = Var("cos"), Var("sin")
    real = op.Sub(op.Mul(x1, cos), op.Mul(x2, sin), _bind="real")
    imag = op.Add(op.Mul(x1, sin), op.Mul(x2, cos), _bind="imag")
    return real, imag


def _half(xr):
    first = Either(split_output(xr, 0, "halves"), sliced(xr, "first_half"))
    second = Either(split_output(xr, 1, "halves"), sliced(xr, "second_half"))
    return op.Concat(*_products(first, second), axis=ANY, _bind="rot_concat")


def _interleaved(xr):
    real, imag = _products(sliced(xr, "even"), sliced(xr, "odd"))
    stacked = op.Concat(unsqueeze(real, "unsq_real"), unsqueeze(imag, "unsq_imag"), axis=ANY, _bind="stack")
    return op.Reshape(stacked, Var("flat_shape"), _bind="flatten")


def _with_pass_through(rotate):
    """Concat(rotate(x[:r]), x[r:]), the cut by a Split in two or by two Slices."""
    x = Var("x")
    rot = Either(split_output(x, 0, "rot_split"), sliced(x, "rot_part"))
    rest = Either(split_output(x, 1, "rot_split"), sliced(x, "pass_part"))
    return op.Concat(rotate(rot), rest, axis=ANY, _bind="outer_concat")


def _rotary_width(graph: GraphIndex, match: Match, rank: int, head_dim: int) -> int:
    """r: the lanes the outer cut rotates (D without one); the rest passes through."""
    if not match.has("outer_concat"):
        return head_dim
    _check_concat_last(match, "outer_concat", rank)
    if match.has("rot_split"):
        node = match.node("rot_split")
        sizes = split_sizes(graph, match, "rot_split")
        if attr(node, "axis", 0) not in (-1, rank - 1) or sizes is None or len(sizes) != 2 or \
                sum(sizes) != head_dim or min(sizes) < 0:
            raise Refuse(f"Split {node.name!r} cuts {sizes} off axis {attr(node, 'axis', 0)}, not [r, D - r] "
                         f"of the {head_dim} lanes")
        return sizes[0]
    _, width, _, _ = slice_params(graph, match, "rot_part")
    if not 0 < width < head_dim:
        raise Refuse(f"partial rotary width {width} is not inside (0, {head_dim})")
    _expect_slice(graph, match, "rot_part", rank, head_dim, 0, 0, end_exact=width)
    _expect_slice(graph, match, "pass_part", rank, head_dim, width, head_dim)
    return width


def _check_halves(graph: GraphIndex, match: Match, rank: int, width: int) -> None:
    half = width // 2
    _check_concat_last(match, "rot_concat", rank)
    if not match.has("halves"):
        _expect_slice(graph, match, "first_half", rank, width, 0, 0, end_exact=half)
        _expect_slice(graph, match, "second_half", rank, width, half, width)
        return
    node = match.node("halves")
    sizes = split_sizes(graph, match, "halves")
    if sizes is None:
        sizes = [half, half] if attr(node, "num_outputs", len(node.output)) == 2 == len(node.output) else []
    if attr(node, "axis", 0) not in (-1, rank - 1) or sizes != [half, half]:
        raise Refuse(f"Split {node.name!r} cuts {sizes} off axis {attr(node, 'axis', 0)}, not two halves of "
                     f"{width} lanes")


def _check_pairs(graph: GraphIndex, match: Match, rank: int, width: int, xr: str) -> None:
    """Even and odd lanes out, each (real, imag) pair stacked on a new last axis and flattened
    back to x's shape (proven: nothing checks it at run time)."""
    _expect_slice(graph, match, "even", rank, width, 0, width - 1, step=2)
    _expect_slice(graph, match, "odd", rank, width, 1, width, step=2)
    for bind in ("unsq_real", "unsq_imag"):
        if unsqueeze_axes(graph, match, bind) not in ([-1], [rank]):
            raise Refuse(f"Unsqueeze {match.node(bind).name!r} does not add a new last axis")
    if attr(match.node("stack"), "axis") not in (-1, rank):
        raise Refuse(f"Concat {match.node('stack').name!r} does not stack on the new last axis")
    flat, want = graph.proven_shape(match.node("flatten").output[0]), graph.proven_shape(xr)
    if not checks.shapes_equal(flat, want):
        raise Refuse(f"Reshape {match.node('flatten').name!r} does not restore the rotated lanes' shape "
                     f"({checks.shape_mismatch(flat, want)})")


def _rotated(match: Match) -> str:
    if match.has("rot_split"):
        return match.node("rot_split").output[0]
    return match.node("rot_part").output[0] if match.has("rot_part") else match.value("x")


def _analyse(mode: str, ctx: RewriteContext, match: Match) -> Fusion:
    graph = ctx.graph
    rank, head_dim = _check_input(graph, match)
    width = _rotary_width(graph, match, rank, head_dim)
    if width <= 0 or width % 2:
        raise Refuse(f"rotary width {width} is not even and positive")
    xr = _rotated(match)
    if mode == "half":
        _check_halves(graph, match, rank, width)
    else:
        _check_pairs(graph, match, rank, width, xr)
    for table in ("cos", "sin"):
        _broadcasts_over(graph, match.value(table), xr, width // 2)
        if graph.elem_type(match.value(table)) not in (graph.elem_type(match.value("x")), onnx.TensorProto.FLOAT):
            raise Refuse(f"{table} has type {checks.type_name(graph.elem_type(match.value(table)))}")
    if graph.shape(match.value("cos")) != graph.shape(match.value("sin")) or \
            graph.elem_type(match.value("cos")) != graph.elem_type(match.value("sin")):
        raise Refuse("cos and sin have different shapes or types")
    helpers = Helpers(match.root)
    lanes = np.arange(width) // 2 if mode == "interleaved" else np.arange(width) % (width // 2)
    tables = [helpers.node("Gather", [match.value(name), helpers.ints(lanes.tolist())], axis=-1)
              for name in ("cos", "sin")]
    call = ops.RotaryEmbedding(X=match.value("x"), cos=tables[0], sin=tables[1], Y=match.root.output[0], mode=mode,
                               rotary_dim=0 if width == head_dim else width)
    return Fusion(call, match.covered, helpers)


def _rule(name: str, mode: str, pattern) -> Rule:
    return Rule(name, pattern, partial(_analyse, mode), FAMILY, frozenset({"Sub"}))


RULES: list[Rule] = [
    _rule("RotaryEmbedding(half tables, partial)", "half", _with_pass_through(_half)),
    _rule("RotaryEmbedding(half tables)", "half", _half(Var("x"))),
    _rule("RotaryEmbedding(interleaved, half tables, partial)", "interleaved", _with_pass_through(_interleaved)),
    _rule("RotaryEmbedding(interleaved, half tables)", "interleaved", _interleaved(Var("x"))),
]
