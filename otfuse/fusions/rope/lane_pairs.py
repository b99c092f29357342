"""Interleaved rotary embeddings written on explicit lane pairs (Meta's reference LLaMA
``view_as_complex(x.reshape(..., D/2, 2)) * freqs_cis``, or its complex-free hand port)::

    p  = Reshape(x, [..., D/2, 2])
    x0 = lane 0 of p, x1 = lane 1 of p          (Gather index 0/1, Slice 0:1/1:2, or Split [1, 1])
    y  = Reshape(stack(x0*c - x1*s, x1*c + x0*s), [..., D])   (Concat of the two, after an
                                                                Unsqueeze each when the lane axis
                                                                was dropped)

This is mode ``interleaved`` of docs/ops.md with full-width tables ``cos[2j] = cos[2j+1] = c[j]``
(same for sin). The rewrite builds those with plain nodes (a Squeeze of a kept lane axis, one
Gather of lanes; constant for a constant table, so ORT folds them) and feeds the fused node
``Reshape(p, the output Reshape's shape)``, which is exactly the output's shape: the stacked
pairs have p's shape (checked), and the shape operand and attributes are the same.
"""

from __future__ import annotations

import numpy as np
import onnx

from otfuse import ops
from otfuse.rewriter import checks
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import ANY, Const, Either, Match, Var, attr, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule
from otfuse.rewriter.spellings import slice_params, sliced, split_output, split_sizes, unsqueeze, unsqueeze_axes

FAMILY = "rope"


def _lane(pairs, index: int) -> Either:
    bind = f"lane{index}"
    return Either(op.Gather(pairs, Const(f"{bind}.index"), _bind=bind), sliced(pairs, bind),
                  split_output(pairs, index, bind))


def _pair_rotation() -> object:
    pairs = Var("pairs")
    x0, x1 = _lane(pairs, 0), _lane(pairs, 1)  # each object used twice: one node per lane
    cos, sin = Var("cos"), Var("sin")
    real = op.Sub(op.Mul(x0, cos), op.Mul(x1, sin), _bind="real")
    imag = op.Add(op.Mul(x1, cos), op.Mul(x0, sin), _bind="imag")
    stacked = Either(op.Concat(real, imag, axis=ANY, _bind="stack"),
                     op.Concat(unsqueeze(real, "unsq_real"), unsqueeze(imag, "unsq_imag"),
                               axis=ANY, _bind="stack"))
    return op.Reshape(stacked, Var("flat_shape"), _bind="flatten")


def _lane_index(graph: GraphIndex, match: Match, index: int) -> bool:
    """Whether lane ``index``'s node takes exactly lane ``index`` of the last (size 2) axis; True
    when it keeps that axis (size 1), False when it drops it (Gather of a scalar index)."""
    bind = f"lane{index}"
    node = match.node(bind)
    rank = graph.rank(match.value("pairs"))
    if node.op_type == "Gather":
        if attr(node, "axis", 0) not in (-1, rank - 1):
            raise Refuse(f"Gather {node.name!r} picks along axis {attr(node, 'axis', 0)}, not the pair axis")
        picked = graph.constant_value(match.value(f"{bind}.index"))
        if picked.size != 1 or picked.ndim > 1 or int(picked.reshape(-1)[0]) not in (index, index - 2):
            raise Refuse(f"Gather {node.name!r} picks lane {picked.reshape(-1).tolist()}, expected {index}")
        return picked.ndim == 1
    if node.op_type == "Split":
        axis = attr(node, "axis", 0)
        if axis not in (-1, rank - 1):
            raise Refuse(f"Split {node.name!r} splits axis {axis}, not the pair axis")
        sizes = split_sizes(graph, match, bind)
        if sizes is None:
            sizes = [1, 1] if len(node.output) == 2 else []
        if sizes != [1, 1]:
            raise Refuse(f"Split {node.name!r} cuts {sizes}, not the two lanes of a pair")
        return True
    start, end, axis, step = slice_params(graph, match, bind)
    if axis not in (-1, rank - 1) or step != 1:
        raise Refuse(f"Slice {node.name!r} is not a unit-step cut of the pair axis")
    start, end = start + 2 if start < 0 else start, min(end + 2 if end < 0 else end, 2)
    if (start, end) != (index, index + 1):
        raise Refuse(f"Slice {node.name!r} takes lanes [{start}:{end}] of a pair, expected [{index}:{index + 1}]")
    return True


def _geometry(graph: GraphIndex, match: Match) -> dict:
    """Half width and whether the lanes keep the pair axis; refuses anything not interleaved."""
    pairs, root = match.value("pairs"), match.node("flatten").output[0]
    checks.require_float_io(graph, pairs, root)
    shape = graph.shape(pairs)
    if shape is None or len(shape) < 3 or shape[-1] != 2 or not isinstance(shape[-2], int):
        raise Refuse(f"{pairs!r} has shape {shape}, not [..., D/2, 2] with a static D/2")
    half = shape[-2]
    kept = {_lane_index(graph, match, 0), _lane_index(graph, match, 1)}
    if len(kept) != 1:
        raise Refuse("one lane keeps the pair axis and the other drops it")
    kept = kept.pop()
    stack = match.node("stack")
    if attr(stack, "axis") not in (-1, len(shape) - 1):
        raise Refuse(f"Concat {stack.name!r} does not join the pair axis")
    if match.has("unsq_real") == kept:
        raise Refuse("the lanes are joined back on another axis than the one they were taken from")
    for bind in ("unsq_real", "unsq_imag"):
        if not match.has(bind):
            continue
        node = match.node(bind)
        axes = unsqueeze_axes(graph, match, bind)
        if axes not in ([-1], [len(shape) - 1]):
            raise Refuse(f"Unsqueeze {node.name!r} adds axis {axes}, not a new last axis")
    # The stacked pairs have p's shape and the output is p.shape[:-2] + [D]: what the rewrite's
    # Reshape(p, [0, .., 0, D]) gives, so X and Y line up lane for lane (proven: nothing checks it
    # at run time).
    stacked, pairs_shape = graph.proven_shape(stack.output[0]), graph.proven_shape(pairs)
    if not checks.shapes_equal(stacked, pairs_shape):
        raise Refuse(f"the stacked pairs {stacked} do not have the shape of {pairs!r} {pairs_shape} "
                     f"({checks.shape_mismatch(stacked, pairs_shape)})")
    flat, want = graph.proven_shape(root), list(pairs_shape[:-2]) + [2 * half]
    if flat is None or not checks.shapes_equal(list(flat), want):
        raise Refuse(f"Reshape {match.node('flatten').name!r} gives {flat}, not {want} "
                     f"({checks.shape_mismatch(flat, want)})")
    lane_shape = list(shape[:-1]) + ([1] if kept else [])
    covered = {id(n) for n in match.covered}
    for table in ("cos", "sin"):
        name = match.value(table)
        if _depends_on(graph, name, covered):  # e.g. TorchScript's view of the table by Shape(x0)
            raise Refuse(f"{table} {name!r} is computed from values inside the rotation")
        table_shape = graph.shape(name)
        width = 1 if kept else half
        _broadcasts_over_shape(name, table_shape, lane_shape, width)
        if kept and (len(table_shape) < 2 or table_shape[-2] != half):
            raise Refuse(f"{table} {name!r} has shape {table_shape}, expected [..., {half}, 1]")
        if graph.elem_type(name) not in (graph.elem_type(pairs), onnx.TensorProto.FLOAT):
            raise Refuse(f"{table} has type {checks.type_name(graph.elem_type(name))}")
    if graph.shape(match.value("cos")) != graph.shape(match.value("sin")):
        raise Refuse("cos and sin have different shapes")
    if graph.elem_type(match.value("cos")) != graph.elem_type(match.value("sin")):
        raise Refuse("cos and sin have different types")
    return {"half": half, "kept": kept}


def _depends_on(graph: GraphIndex, value: str, nodes: set[int]) -> bool:
    """Whether ``value`` is computed (at any depth) from an output of one of ``nodes`` (by id):
    the fused rotation removes them, so a table read from them would lose its input."""
    stack, seen = [value], set()
    while stack:
        producer = graph.producer.get(stack.pop())
        if producer is None or id(producer) in seen:
            continue
        if id(producer) in nodes:
            return True
        seen.add(id(producer))
        stack.extend(name for name in producer.input if name)
    return False


def _broadcasts_over_shape(table: str, shape, x_shape, width: int) -> None:
    """``_broadcasts_over`` on shapes: the table neither widens the lane tensor nor lacks lanes."""
    if shape is None:
        raise Refuse(f"shape of {table!r} is unknown")
    if not shape or len(shape) > len(x_shape):
        raise Refuse(f"{table!r} has rank {len(shape)}, more than the lanes' {len(x_shape)}")
    if shape[-1] != width:
        raise Refuse(f"{table!r} has {shape[-1]} lanes, the rotation needs {width}")
    for dim, x_dim in zip(reversed(shape[:-1]), reversed(x_shape[:-1])):
        if dim != 1 and (dim is None or not checks.dims_equal(dim, x_dim)):
            raise Refuse(f"{table!r} shape {list(shape)} does not broadcast over the lanes {list(x_shape)} "
                         f"({checks.broadcast_mismatch(shape[:-1], x_shape[:-1])})")


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    geometry = _geometry(ctx.graph, match)
    root = match.root
    helpers = Helpers(root)
    # [..., D/2, 2] -> [..., D] by a shape of our own (0 copies a leading dim): the graph's
    # may be computed from the rotation's own values (TorchScript reads Shape(stack)).
    rank = ctx.graph.rank(match.value("pairs"))
    x = helpers.node("Reshape", [match.value("pairs"), helpers.ints([0] * (rank - 2) + [2 * geometry["half"]])])
    lanes = (np.arange(2 * geometry["half"]) // 2).tolist()  # pair j's table entry on lanes 2j, 2j+1
    tables = []
    for name in ("cos", "sin"):
        table = match.value(name)
        if geometry["kept"]:
            table = helpers.node("Squeeze", [table, helpers.ints([-1])])
        tables.append(helpers.node("Gather", [table, helpers.ints(lanes)], axis=-1))
    call = ops.RotaryEmbedding(X=x, cos=tables[0], sin=tables[1], Y=root.output[0], mode="interleaved", rotary_dim=0)
    return Fusion(call, match.covered, helpers)


PAIR_LANES = Rule("RotaryEmbedding(interleaved, lane pairs)", _pair_rotation(), _analyse, FAMILY, frozenset({"Sub"}))

RULES: list[Rule] = [PAIR_LANES]
