"""Gated MLP activations, over what the first pass fused (spelled.py, onnx_op.py):

    SiLU(gate) * up   -> SwiGLU        Gelu(gate) * up  -> GeGLU (the Gelu's approximate)

gate and up as two values (two MatMuls, in either order of the product), or as the two halves of
one value's last axis (one MatMul, then ``Split`` into two, ``chunk``, or two ``Slice``s), the gate
in either half: ``gate_half`` says which.
"""

from __future__ import annotations

import onnx

from otfuse.domain import OP_DOMAIN
from otfuse.fusions.activation.spelled import FAMILY
from otfuse.rewriter import checks, spellings
from otfuse.rewriter.pattern import Either, Match, Op, Pattern, Var, attr, op
from otfuse.rewriter.rule import Refuse, Replacement, RewriteContext, Rule

_FUSED = {"SiLU": "SwiGLU", "Gelu": "GeGLU"}


def _act(act_op: str, gate: Pattern) -> Op:
    return Op(act_op, (gate,), {}, "act", OP_DOMAIN)


class _GatedRule(Rule):
    family = FAMILY
    act_op = ""
    anchor_ops = frozenset({"SiLU", "Gelu"})

    def attributes(self, match: Match) -> dict:
        if self.act_op != "Gelu":
            return {}
        approximate = attr(match.node("act"), "approximate", "none")
        return {"approximate": approximate.decode() if isinstance(approximate, bytes) else approximate}

    def check(self, ctx: RewriteContext, match: Match) -> str | None:
        return checks.check_float_io(ctx.graph, match.node("act").input[0], match.node("mul").output[0])


class TwoInputsRule(_GatedRule):
    """act(gate) * up, gate and up of one shape (the product must not broadcast)."""

    def __init__(self, act_op: str):
        self.act_op = act_op
        self.name = f"{_FUSED[act_op]}TwoInputs"
        self.pattern = op.Mul(_act(act_op, Var("gate")), Var("up"), _bind="mul")

    def check(self, ctx: RewriteContext, match: Match) -> str | None:
        graph = ctx.graph
        gate, up = match.value("gate"), match.value("up")
        if graph.elem_type(gate) != graph.elem_type(up):
            return (f"gate {gate!r} and up {up!r} have types {checks.type_name(graph.elem_type(gate))} and "
                    f"{checks.type_name(graph.elem_type(up))}")
        if not checks.shapes_equal(graph.proven_shape(gate), graph.proven_shape(up)):
            return f"the product may broadcast: gate {gate!r} and up {up!r} are not proven to have one shape"
        return super().check(ctx, match)

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        inputs = [match.value("gate"), match.value("up")]
        return Replacement([ctx.fused_node(_FUSED[self.act_op], inputs, [root.output[0]], root,
                                           **self.attributes(match))])


class _OneInputRule(_GatedRule):
    """act(half of x) * (the other half of x), the halves of x's last axis."""

    def gate_half(self, graph, match: Match) -> int:
        raise NotImplementedError

    def check(self, ctx: RewriteContext, match: Match) -> str | None:
        self.gate_half(ctx.graph, match)  # refuses what is not two halves of the last axis
        return super().check(ctx, match)

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        gate_half = self.gate_half(ctx.graph, match)
        return Replacement([ctx.fused_node(_FUSED[self.act_op], [match.value("x")], [root.output[0]], root,
                                           gate_half=gate_half, **self.attributes(match))])


def _last_axis(graph, x: str, axis: int | None, what: str) -> None:
    rank = graph.rank(x)
    if rank is None:
        raise Refuse(f"{what}: the rank of {x!r} is unknown, so its axis cannot be proven the last")
    if axis is None or not -rank <= axis < rank or axis % rank != rank - 1:
        raise Refuse(f"{what} cuts axis {axis} of the rank-{rank} {x!r}, not its last axis")


class SplitHalvesRule(_OneInputRule):
    """Split(x, 2 parts, last axis) -> act(part g) * part (1 - g)."""

    def __init__(self, act_op: str):
        self.act_op = act_op
        self.name = f"{_FUSED[act_op]}SplitHalves"
        x = Var("x")
        self.pattern = Either(*(op.Mul(_act(act_op, spellings.split_output(x, g, "split")),
                                       spellings.split_output(x, 1 - g, "split"), _bind="mul") for g in (0, 1)))

    def gate_half(self, graph, match: Match) -> int:
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


class SliceHalvesRule(_OneInputRule):
    """Slice(x, [0, D/2)) and Slice(x, [D/2, D)) on the last axis, in either role."""

    def __init__(self, act_op: str):
        self.act_op = act_op
        self.name = f"{_FUSED[act_op]}SliceHalves"
        x = Var("x")
        self.pattern = op.Mul(_act(act_op, spellings.sliced(x, "gate_slice")), spellings.sliced(x, "up_slice"),
                              _bind="mul")

    def gate_half(self, graph, match: Match) -> int:
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


# At one root the one-input forms come first: they absorb the Split / Slices as well.
RULES: list[Rule] = [cls(act) for act in ("SiLU", "Gelu") for cls in (SplitHalvesRule, SliceHalvesRule, TwoInputsRule)]
