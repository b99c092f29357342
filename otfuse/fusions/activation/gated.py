"""Gated MLP activations, over what the first pass fused (spelled.py, onnx_op.py):

    SiLU(gate) * up   -> SwiGLU        Gelu(gate) * up  -> GeGLU (the Gelu's approximate)

gate and up as two values (two MatMuls, in either order of the product), or as the two halves of
one value's last axis (one MatMul, then ``Split`` into two, ``chunk``, or two ``Slice``s), the gate
in either half: ``gate_half`` says which.
"""

from __future__ import annotations

from functools import partial

from otfuse import ops
from otfuse.domain import OP_DOMAIN
from otfuse.fusions.activation.spelled import FAMILY
from otfuse.rewriter import checks, spellings
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Either, Match, Op, Pattern, Var, attr, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule

_FUSED = {"SiLU": ops.SwiGLU, "Gelu": ops.GeGLU}


def _act(act_op: str, gate: Pattern) -> Op:
    return Op(act_op, (gate,), {}, "act", OP_DOMAIN)


def _attributes(act_op: str, match: Match) -> dict:
    if act_op != "Gelu":
        return {}
    approximate = attr(match.node("act"), "approximate", "none")
    return {"approximate": approximate.decode() if isinstance(approximate, bytes) else approximate}


def _gated(act_op: str, ctx: RewriteContext, match: Match, **inputs) -> Fusion:
    """The gated op over ``inputs`` (A, B or A and gate_half), its output the product's."""
    y = match.root.output[0]
    checks.require_float_io(ctx.graph, match.node("act").input[0], y)
    return Fusion(_FUSED[act_op](**inputs, Y=y, **_attributes(act_op, match)), match.covered)


def _analyse_two_inputs(act_op: str, ctx: RewriteContext, match: Match) -> Fusion:
    """act(gate) * up, gate and up of one shape (the product must not broadcast)."""
    graph = ctx.graph
    gate, up = match.value("gate"), match.value("up")
    if graph.elem_type(gate) != graph.elem_type(up):
        raise Refuse(f"gate {gate!r} and up {up!r} have types {checks.type_name(graph.elem_type(gate))} and "
                     f"{checks.type_name(graph.elem_type(up))}")
    if not checks.shapes_equal(graph.proven_shape(gate), graph.proven_shape(up)):
        raise Refuse(f"the product may broadcast: gate {gate!r} and up {up!r} are not proven to have one shape")
    return _gated(act_op, ctx, match, A=gate, B=up)


def _last_axis(graph: GraphIndex, x: str, axis: int | None, what: str) -> None:
    rank = graph.rank(x)
    if rank is None:
        raise Refuse(f"{what}: the rank of {x!r} is unknown, so its axis cannot be proven the last")
    if axis is None or not -rank <= axis < rank or axis % rank != rank - 1:
        raise Refuse(f"{what} cuts axis {axis} of the rank-{rank} {x!r}, not its last axis")


def _split_gate_half(graph: GraphIndex, match: Match) -> int:
    """Split(x, 2 parts, last axis) -> act(part g) * part (1 - g): g."""
    split = match.node("split")
    x = match.value("x")
    if len([name for name in split.output if name]) != 2 or len(split.output) != 2:
        raise Refuse(f"Split {split.name!r} has {len(split.output)} outputs, not the two halves")
    _last_axis(graph, x, attr(split, "axis", 0), f"Split {split.name!r}")
    halves = [graph.proven_shape(name) for name in split.output]
    if not checks.shapes_equal(*halves):
        raise Refuse(f"Split {split.name!r}: its two parts are not proven equal halves "
                     f"(sizes {spellings.split_sizes(graph, match, 'split')})")
    return list(split.output).index(match.node("act").input[0])


def _slice_gate_half(graph: GraphIndex, match: Match) -> int:
    """Slice(x, [0, D/2)) and Slice(x, [D/2, D)) on the last axis, in either role."""
    x = match.value("x")
    shape = graph.proven_shape(x)
    if not shape or not isinstance(shape[-1], int):
        raise Refuse(f"the last dim of {x!r} is not static, so the Slices cannot be proven its halves")
    width = shape[-1]
    ranges = []
    for bind in ("gate_slice", "up_slice"):
        start, end, axis, step = spellings.slice_params(graph, match, bind)
        _last_axis(graph, x, axis if axis is not None else (0 if len(shape) == 1 else None),
                   f"Slice {match.node(bind).name!r}")
        if step != 1:
            raise Refuse(f"Slice {match.node(bind).name!r} has step {step}")
        ranges.append(tuple(min(max(v + width if v < 0 else v, 0), width) for v in (start, end)))
    half = width // 2
    if width % 2 or sorted(ranges) != [(0, half), (half, width)]:
        raise Refuse(f"the Slices take {ranges[0]} (gate) and {ranges[1]} (up) of a last dim of {width}, "
                     f"not its two halves")
    return 0 if ranges[0] == (0, half) else 1


def _analyse_halves(act_op: str, gate_half, ctx: RewriteContext, match: Match) -> Fusion:
    """act(half of x) * (the other half of x), the halves of x's last axis."""
    half = gate_half(ctx.graph, match)  # refuses what is not two halves of the last axis
    return _gated(act_op, ctx, match, A=match.value("x"), gate_half=half)


def _rules(act_op: str) -> list[Rule]:
    fused, x = _FUSED[act_op].name, Var("x")
    split = Either(*(op.Mul(_act(act_op, spellings.split_output(x, g, "split")),
                            spellings.split_output(x, 1 - g, "split")) for g in (0, 1)))
    sliced = op.Mul(_act(act_op, spellings.sliced(x, "gate_slice")), spellings.sliced(x, "up_slice"))
    two = op.Mul(_act(act_op, Var("gate")), Var("up"))
    anchors = frozenset({"SiLU", "Gelu"})
    return [Rule(f"{fused}SplitHalves", split, partial(_analyse_halves, act_op, _split_gate_half), FAMILY, anchors),
            Rule(f"{fused}SliceHalves", sliced, partial(_analyse_halves, act_op, _slice_gate_half), FAMILY, anchors),
            Rule(f"{fused}TwoInputs", two, partial(_analyse_two_inputs, act_op), FAMILY, anchors)]


# At one root the one-input forms come first: they absorb the Split / Slices as well.
RULES: list[Rule] = [rule for act_op in ("SiLU", "Gelu") for rule in _rules(act_op)]
