"""How exporters spell one ONNX operation across opsets, as sub-patterns the families share, and
the readers of what those sub-patterns bind.

Opset 13 moved the ``axes`` of Unsqueeze and the ``split`` of Split from attributes to inputs, and
Slice's ``axes`` and ``steps`` inputs are optional: each sub-pattern matches every form, and its
reader returns the same value whichever form matched. Constants are bound as ``{bind}.{input}``.
"""

from __future__ import annotations

from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Const, Either, Match, attr, op
from otfuse.rewriter.rule import Refuse


def sliced(x, bind: str) -> Either:
    """Slice(x, starts, ends[, axes[, steps]]) with constant parameters."""
    consts = [Const(f"{bind}.{part}") for part in ("starts", "ends", "axes", "steps")]
    return Either(*(op.Slice(x, *consts[:count], _bind=bind) for count in (4, 3, 2)))


def slice_params(graph: GraphIndex, match: Match, bind: str) -> tuple[int, int, int | None, int]:
    """(start, end, axis or None for 'all axes', step) of a one-axis Slice bound by ``sliced``."""
    node = match.node(bind)
    values = [graph.constant_value(name).reshape(-1) for name in node.input[1:]]
    starts, ends = values[0], values[1]
    axes = values[2] if len(values) > 2 else None
    steps = values[3] if len(values) > 3 else None
    if len(starts) != 1 or len(ends) != 1 or (axes is not None and len(axes) != 1) or \
            (steps is not None and len(steps) != 1):
        raise Refuse(f"Slice {node.name!r} cuts more than one axis")
    return (int(starts[0]), int(ends[0]), None if axes is None else int(axes[0]),
            1 if steps is None else int(steps[0]))


def split_output(x, index: int, bind: str):
    """Output ``index`` of a Split of x (sizes as input, attribute, or num_outputs)."""
    return Either(op.Split(x, Const(f"{bind}.split"), _output=index, _bind=bind),
                  op.Split(x, _output=index, _bind=bind))


def split_sizes(graph: GraphIndex, match: Match, bind: str) -> list[int] | None:
    """The sizes a Split bound by ``split_output`` states: its ``split`` input or attribute; None
    when it states none (equal parts, by the number of outputs or ``num_outputs``)."""
    if match.has(f"{bind}.split"):
        return [int(v) for v in graph.constant_value(match.value(f"{bind}.split")).reshape(-1)]
    return list(attr(match.node(bind), "split", []) or []) or None


def unsqueeze(value, bind: str) -> Either:
    """Unsqueeze(value) with constant axes (input or attribute)."""
    return Either(op.Unsqueeze(value, Const(f"{bind}.axes"), _bind=bind), op.Unsqueeze(value, _bind=bind))


def unsqueeze_axes(graph: GraphIndex, match: Match, bind: str) -> list[int]:
    """The axes of an Unsqueeze bound by ``unsqueeze``, whichever form it has."""
    if match.has(f"{bind}.axes"):
        return [int(a) for a in graph.constant_value(match.value(f"{bind}.axes")).reshape(-1)]
    return list(attr(match.node(bind), "axes", []))
