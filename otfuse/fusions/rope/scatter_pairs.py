"""Interleaved rotary embeddings whose rotated pairs are written back lane by lane (Wan's
``WanAttnProcessor``)::

    x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c

The dynamo exporter writes each strided assignment as ``slice_scatter``: the lane axis moved to
the front by a ``Transpose``, a ``ScatterND`` of the lane indices (``[[0], [2], ...]``, a
constant or ``Range(0, D)`` sliced by 2), moved back; the last move may be merged with the head
transpose that follows (``perm [3, 2, 1, 0]``)::

    even = ScatterND(Transpose(base, P), even_lanes, Transpose(real, P))
    odd  = ScatterND(Transpose(Transpose(even, P'), P), odd_lanes, Transpose(imag, P))
    y    = Transpose(odd, Q)

with ``P`` putting the last axis first and ``P'`` undoing it. The two scatters write every lane
once (the indices are proven: all even, then all odd lanes of D), so ``base`` (``empty_like``) is
never read, and ``Transpose(odd, Q)`` is ``Transpose(z, P∘Q)`` of the interleaved result ``z``.
That is mode ``interleaved`` with full-width tables ``cos[2j] = cos[2j+1] = c[j]`` (``sin`` the
same), built as in lane_pairs.py; the rewrite transposes the fused node's output by ``P∘Q``
(nothing when that is the identity, ``[0, 2, 1, 3]`` after the merged head transpose).
"""

from __future__ import annotations

import numpy as np
import onnx

from otfuse import ops
from otfuse.fusions.rope.lane_pairs import _broadcasts_over_shape, _depends_on
from otfuse.fusions.rope.rotations import _check_unbound_lane, _unbound_lane
from otfuse.rewriter import checks
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import ANY, Either, Match, Var, attr, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule

FAMILY = "rope"


def _pattern():
    pairs = op.Reshape(Var("x"), Var("pairs_shape"), _bind="pairs")
    x0, x1 = _unbound_lane(pairs, 0), _unbound_lane(pairs, 1)  # each one node, read twice
    cos, sin = Var("cos"), Var("sin")
    real = op.Sub(op.Mul(x0, cos), op.Mul(x1, sin), _bind="real")
    imag = op.Add(op.Mul(x0, sin), op.Mul(x1, cos), _bind="imag")
    # With static shapes the exporter's optimizer folds Transpose(empty_like) into a constant
    # already lanes first, and the Transpose pair between the scatters into an Identity.
    base = Either(op.Transpose(Var("base"), perm=ANY, _bind="to_lanes_base"), Var("base_lanes_first"))
    even = op.ScatterND(base, Var("even_lanes"), op.Transpose(real, perm=ANY, _bind="to_lanes_real"),
                        _bind="scatter_even")
    again = Either(op.Transpose(op.Transpose(even, perm=ANY, _bind="from_lanes_even"), perm=ANY,
                                _bind="to_lanes_again"),
                   op.Identity(even, _bind="again_identity"), even)
    odd = op.ScatterND(again, Var("odd_lanes"), op.Transpose(imag, perm=ANY, _bind="to_lanes_imag"),
                       _bind="scatter_odd")
    return op.Transpose(odd, perm=ANY, _bind="out")


def _perm(match: Match, bind: str) -> list[int]:
    return [int(p) for p in attr(match.node(bind), "perm", [])]


def _lane_indices(graph: GraphIndex, match: Match, name: str, first: int, width: int) -> None:
    """The ScatterND indices are exactly lanes first, first + 2, ... of width (as [width/2, 1])."""
    value = graph.constant_value(match.value(name))
    want = np.arange(first, width, 2).reshape(-1, 1)
    if value is None:
        raise Refuse(f"the lane indices {match.value(name)!r} are not known before run time")
    if value.shape != want.shape or not np.array_equal(value.astype(np.int64), want):
        shown = value.reshape(-1)[:8].tolist()
        raise Refuse(f"the lane indices {match.value(name)!r} are {shown}..., not lanes {first}, {first + 2}, ... of {width}")


def _check_scatters(graph: GraphIndex, match: Match, rank: int, width: int) -> list[int]:
    """The two scatters write the even then the odd lanes of one tensor of x's shape, moved to the
    front and back; returns the permutation from the interleaved result to the output."""
    perm = _perm(match, "to_lanes_real")
    if sorted(perm) != list(range(rank)) or perm[0] != rank - 1:
        raise Refuse(f"Transpose {match.node('to_lanes_real').name!r} (perm {perm}) does not bring the lanes first")
    for bind in ("to_lanes_base", "to_lanes_again", "to_lanes_imag"):
        if match.has(bind) and _perm(match, bind) != perm:
            raise Refuse(f"Transpose {match.node(bind).name!r} has perm {_perm(match, bind)}, not {perm}")
    if match.has("from_lanes_even"):
        undo = _perm(match, "from_lanes_even")
        if sorted(undo) != list(range(rank)) or [perm[undo[i]] for i in range(rank)] != list(range(rank)):
            raise Refuse(f"Transpose {match.node('from_lanes_even').name!r} (perm {undo}) does not undo {perm}")
    for bind in ("scatter_even", "scatter_odd"):
        reduction = attr(match.node(bind), "reduction", b"none")
        if reduction not in (b"none", "none"):
            raise Refuse(f"ScatterND {match.node(bind).name!r} has reduction {reduction!r}")
    _lane_indices(graph, match, "even_lanes", 0, width)
    _lane_indices(graph, match, "odd_lanes", 1, width)
    # Every element is written: the base's values are never read, only its shape must be the
    # result's, the pairs' with each pair's two lanes side by side.
    pairs = graph.proven_shape(match.node("pairs").output[0])
    x = list(pairs[:-2]) + [width]
    if match.has("base"):
        base, want = graph.proven_shape(match.value("base")), x
    else:
        base = graph.proven_shape(match.value("base_lanes_first"))
        want = None if x is None else [x[p] for p in perm]
    if not checks.shapes_equal(base, want):
        raise Refuse(f"the scattered-into tensor {base} does not have x's shape {want} "
                     f"({checks.shape_mismatch(base, want)})")
    out = _perm(match, "out")
    if sorted(out) != list(range(rank)):
        raise Refuse(f"Transpose {match.node('out').name!r} has perm {out}")
    return [perm[q] for q in out]


def _check_tables(graph: GraphIndex, match: Match, lane_shape: list, half: int) -> None:
    covered = {id(n) for n in match.covered}
    for table in ("cos", "sin"):
        name = match.value(table)
        if _depends_on(graph, name, covered):
            raise Refuse(f"{table} {name!r} is computed from values inside the rotation")
        _broadcasts_over_shape(name, graph.shape(name), lane_shape, half)
        if graph.elem_type(name) not in (graph.elem_type(match.value("x")), onnx.TensorProto.FLOAT):
            raise Refuse(f"{table} has type {checks.type_name(graph.elem_type(name))}")
    if graph.shape(match.value("cos")) != graph.shape(match.value("sin")):
        raise Refuse("cos and sin have different shapes")
    if graph.elem_type(match.value("cos")) != graph.elem_type(match.value("sin")):
        raise Refuse("cos and sin have different types")


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    graph, root = ctx.graph, match.root
    x, pairs = match.value("x"), match.node("pairs")
    checks.require_float_io(graph, x, root.output[0])
    shape = graph.proven_shape(pairs.output[0])
    if shape is None or len(shape) < 3 or shape[-1] != 2 or not isinstance(shape[-2], int):
        raise Refuse(f"Reshape {pairs.name!r} gives {shape}, not [..., D/2, 2] with a static D/2")
    if _depends_on(graph, match.value("pairs_shape"), {id(n) for n in match.covered}):
        raise Refuse(f"the shape of Reshape {pairs.name!r} is computed from values inside the rotation")
    rank, width = len(shape) - 1, 2 * shape[-2]  # the lanes' rank; the result is pairs[:-2] + [D]
    for index in (0, 1):
        _check_unbound_lane(graph, match, index, rank)
    lane_shape = list(shape[:-1])
    _check_tables(graph, match, lane_shape, width // 2)
    to_output = _check_scatters(graph, match, rank, width)
    helpers = Helpers(root)
    # X: x when it has the result's shape; else the pairs (a copy of the graph's Reshape of x,
    # which may also split the heads off) with each pair's lanes side by side again.
    if not checks.shapes_equal(graph.proven_shape(x), list(shape[:-2]) + [width]):
        again = helpers.node("Reshape", [x, match.value("pairs_shape")], allowzero=attr(pairs, "allowzero", 0))
        x = helpers.node("Reshape", [again, helpers.ints([0] * (rank - 1) + [width])])
    lanes = (np.arange(width) // 2).tolist()  # pair j's table entry on lanes 2j, 2j+1
    tables = [helpers.node("Gather", [match.value(name), helpers.ints(lanes)], axis=-1) for name in ("cos", "sin")]
    y = root.output[0]
    if to_output != list(range(rank)):
        y = helpers.fresh(f"{root.output[0]}/interleaved")
        helpers.node("Transpose", [y], output=root.output[0], perm=to_output)
    call = ops.RotaryEmbedding(X=x, cos=tables[0], sin=tables[1], Y=y, mode="interleaved", rotary_dim=0)
    return Fusion(call, match.covered, helpers)


# Anchored at the rotation's Sub: any other slice_scatter (CogVideoX writes q[:, :, text:] back)
# is no candidate worth reporting.
SCATTERED_PAIRS = Rule("RotaryEmbedding(interleaved, pairs scattered back)", _pattern(), _analyse, FAMILY,
                       frozenset({"Sub"}))

RULES: list[Rule] = [SCATTERED_PAIRS]
