"""Squared ReLU (HF ACT2FN "relu2": Nemotron, Arcee, Persimmon), as the exporters write it:

    Mul(r, r)     r = Relu(x)   (TorchScript: torch.square)     -> ReluSquared
    Pow(r, 2)     r = Relu(x)   (dynamo: aten.pow, exponent a constant scalar exactly 2)

Refused with the near miss: another exponent (3, 2.0001: no rounding tolerance, since the square
is exact), an exponent that is not a constant scalar. ``Mul(r, y)`` with another operand, and a
LeakyRelu / Clip in place of the Relu, are not this pattern at all. A Relu output read outside the
square is an interior value the pass refuses to drop (passes._private_value_leak).
"""

from __future__ import annotations

import numpy as np

from otfuse import ops
from otfuse.fusions.activation.spelled import FAMILY, require_activation_io
from otfuse.rewriter.pattern import Either, Match, Var, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule


def _require_square(graph, match: Match) -> None:
    """The Pow spelling's exponent: a constant with one element, exactly 2."""
    if match.tag("form") != "pow":
        return
    exponent = match.value("exponent")
    value = graph.constant_value(exponent) if graph.is_constant(exponent) else None
    if value is None or value.size != 1:
        raise Refuse(f"Pow's exponent {exponent!r} is not a constant scalar", covers=match.covered)
    number = float(np.asarray(value, dtype=np.float64).reshape(-1)[0])
    if number != 2.0:
        raise Refuse(f"Pow raises Relu's output to {number!r}, not 2", covers=match.covered)


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    _require_square(ctx.graph, match)
    x, y = match.value("x"), match.root.output[0]
    require_activation_io(ctx.graph, x, y, covers=match.covered)
    return Fusion(ops.ReluSquared(X=x, Y=y), match.covered)


_RELU = op.Relu(Var("x"), _bind="relu")  # one object at both Mul inputs: the same node
PATTERN = Either(op.Mul(_RELU, _RELU), op.Pow(_RELU, Var("exponent")), tag="form", tags=("mul", "pow"))

RULES: list[Rule] = [Rule("ReluSquared", PATTERN, _analyse, FAMILY, frozenset({"Relu"}))]
