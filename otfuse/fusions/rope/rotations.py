"""Rotary embedding family: every exported spelling of ``x*cos + rotate(x)*sin`` (docs/ops.md).

    half:         Concat(-x[h:], x[:h])                    (Slice or Split; LLaMA, Qwen, Mistral)
    interleaved:  Reshape(Concat(Unsqueeze(-x[1::2]), Unsqueeze(x[0::2])))    (GPT-J stack/flatten)
    partial:      Concat(rope(x[:r]), x[r:])               (GPT-NeoX rotary_pct, Phi)
    empty tail:   Concat(rope(x), x[D:])                   (TorchScript's Phi-3: full rotary)

(interleaved on explicit [..., D/2, 2] lane pairs, Meta's view_as_complex: lane_pairs.py)

cos and sin are whatever the graph multiplies by (computed once per model and shared by all
layers); the checks prove they broadcast over x without widening it and cover the rotary lanes.
A later pass (pair_qk.py) pairs the q and k rotations of one attention into ``RotaryEmbeddingQK``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import onnx

from otfuse import ops
from otfuse.rewriter import checks
from otfuse.rewriter.builder import Fresh, Helpers
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import ANY, Const, Either, Match, Var, attr, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule
from otfuse.rewriter.spellings import slice_params, sliced, split_output, split_sizes, unsqueeze, unsqueeze_axes

FAMILY = "rope"
INT64_MAX = 2**63 - 1


def _rotate_half(x, tag: str = "") -> Either:
    """Concat(-x2, x1) of the two halves of x; bind names end in ``tag`` (one per section)."""
    by_slices = op.Concat(op.Neg(sliced(x, f"second_half{tag}")), sliced(x, f"first_half{tag}"),
                          axis=ANY, _bind=f"rot_concat{tag}")
    by_split = op.Concat(op.Neg(split_output(x, 1, f"halves{tag}")), split_output(x, 0, f"halves{tag}"),
                         axis=ANY, _bind=f"rot_concat{tag}")
    return Either(by_slices, by_split)


def _unbound_lane(pairs, index: int) -> Either:
    """Lane ``index`` of the pair axis of ``pairs``, that axis dropped: ``unbind(-1)[index]`` as
    the exporters write it (a ``Slice`` ``index:index+1`` or a two-way ``Split``, then a
    ``Squeeze``; or a ``Gather`` of a scalar index)."""
    bind = f"lane{index}"
    kept = Either(sliced(pairs, bind), split_output(pairs, index, bind))
    return Either(op.Squeeze(kept, Const(f"squeeze{index}.axes"), _bind=f"squeeze{index}"),
                  op.Squeeze(kept, _bind=f"squeeze{index}"),
                  op.Gather(pairs, Const(f"{bind}.index"), _bind=bind))


def _rotate_interleaved(x):
    """``Reshape(stack([-x_odd, x_even], -1))`` with the lanes taken as ``x[1::2]`` / ``x[0::2]``
    (GPT-J's rotate_every_two), or as ``x.unflatten(-1, (-1, 2)).unbind(-1)`` (diffusers'
    ``apply_rotary_emb``: Flux, CogVideoX, HunyuanVideo, LTX-Video); the one ``pairs`` Reshape
    feeds both lanes."""
    pairs = op.Reshape(x, Var("pairs_shape"), _bind="pairs")
    strided = op.Concat(unsqueeze(op.Neg(sliced(x, "odd")), "unsq_odd"),
                        unsqueeze(sliced(x, "even"), "unsq_even"), axis=ANY, _bind="stack")
    unbound = op.Concat(unsqueeze(op.Neg(_unbound_lane(pairs, 1)), "unsq_odd"),
                        unsqueeze(_unbound_lane(pairs, 0), "unsq_even"), axis=ANY, _bind="stack")
    return op.Reshape(Either(strided, unbound), Var("flat_shape"), _bind="flatten")


def _rope(x, rotate, tag: str = "") -> object:
    return op.Add(op.Mul(x, Var(f"cos{tag}")), op.Mul(rotate(x, tag) if tag else rotate(x), Var(f"sin{tag}")),
                  _bind=f"rope_add{tag}")


def _partial(rotate) -> object:
    x_rot = sliced(Var("x"), "rot_part")
    return op.Concat(_rope(x_rot, rotate), sliced(Var("x"), "pass_part"), axis=ANY, _bind="outer_concat")


def _empty_tail(rotate) -> object:
    """The partial spelling with every lane rotated: TorchScript's Phi-3 writes
    cat([rope(x[..., :cos.shape[-1]]), x[..., cos.shape[-1]:]]) with cos D wide. The full Slice
    is canonicalised away (canonicalise/no_ops.py), the empty one stays in front of the attention."""
    return op.Concat(_rope(Var("x"), rotate), sliced(Var("x"), "pass_part"), axis=ANY, _bind="outer_concat")


# -- checks -------------------------------------------------------------------------------------
def _is_last_axis(axis: int | None, rank: int, what: str) -> None:
    if axis is None and rank == 1:
        return
    if axis is None or axis not in (-1, rank - 1):
        raise Refuse(f"{what} works on axis {axis}, not the last axis")


def _expect_slice(graph, match, bind, rank, width, start, end_at_least, step=1, end_exact=None):
    s_start, s_end, s_axis, s_step = slice_params(graph, match, bind)
    _is_last_axis(s_axis, rank, f"Slice {match.node(bind).name!r}")
    if s_step != step:
        raise Refuse(f"Slice {match.node(bind).name!r} has step {s_step}, expected {step}")
    end_ok = s_end == end_exact if end_exact is not None else s_end >= end_at_least
    if s_start != start or not end_ok:
        wanted = f"[{start}:{end_exact if end_exact is not None else ''}]"
        raise Refuse(f"Slice {match.node(bind).name!r} takes [{s_start}:{s_end}] of {width} lanes, "
                      f"expected {wanted}")


def _check_concat_last(match: Match, bind: str, rank: int) -> None:
    node = match.node(bind)
    axis = attr(node, "axis")
    if axis not in (-1, rank - 1):
        raise Refuse(f"Concat {node.name!r} joins axis {axis}, not the last axis")


def _broadcasts_over(graph: GraphIndex, table: str, x: str, width: int) -> None:
    """cos/sin broadcast to x.shape[:-1] + [width] without widening x (docs/ops.md)."""
    shape, x_shape = graph.shape(table), graph.shape(x)
    if shape is None or x_shape is None:
        raise Refuse(f"shape of {table!r} or {x!r} is unknown")
    if len(shape) > len(x_shape) or not shape:
        raise Refuse(f"{table!r} has rank {len(shape)}, more than x's {len(x_shape)}")
    if shape[-1] != width:
        raise Refuse(f"{table!r} has {shape[-1]} lanes, the rotation needs {width}")
    for dim, x_dim in zip(reversed(shape[:-1]), reversed(x_shape[:-1])):
        if dim != 1 and (dim is None or not checks.dims_equal(dim, x_dim)):
            raise Refuse(f"{table!r} shape {list(shape)} does not broadcast over x {list(x_shape)} "
                         f"({checks.broadcast_mismatch(shape[:-1], x_shape[:-1])})")


def _check_input(graph: GraphIndex, match: Match) -> tuple[int, int]:
    """x is a float tensor of known rank >= 2 with a static head dim; the output keeps its type."""
    x, root = match.value("x"), match.root.output[0]
    checks.require_float_io(graph, x, root)
    shape = graph.shape(x)
    if shape is None or len(shape) < 2 or not isinstance(shape[-1], int):
        raise Refuse(f"x {x!r} needs a known rank >= 2 and a static last dim")
    return len(shape), shape[-1]


@dataclass(frozen=True)
class _Spelling:
    """How one rule writes the rotation: the mode, and whether only the leading lanes rotate."""

    mode: str = "half"
    partial: bool = False
    empty_tail: bool = False  # Concat(rope(x), x[..., D:]): full rotary (_empty_tail)


def _rotated_value(spelling: _Spelling, match: Match) -> str:
    """The tensor whose lanes are rotated (x itself, or its leading slice when partial)."""
    return match.node("rot_part").output[0] if spelling.partial else match.value("x")


def _check_half_rotation(graph, match, xr, rank, width, tag: str = "") -> None:
    half = width // 2
    _check_concat_last(match, f"rot_concat{tag}", rank)
    if match.has(f"halves{tag}"):
        node = match.node(f"halves{tag}")
        axis = attr(node, "axis", 0)
        if axis not in (-1, rank - 1):
            raise Refuse(f"Split {node.name!r} splits axis {axis}, not the last axis")
        sizes = split_sizes(graph, match, f"halves{tag}")
        if sizes is None:
            sizes = [half, half] if attr(node, "num_outputs", len(node.output)) == 2 == len(node.output) else []
        if sizes != [half, half]:
            raise Refuse(f"Split {node.name!r} cuts {sizes}, not two halves of {width}")
        return
    _expect_slice(graph, match, f"first_half{tag}", rank, width, 0, 0, end_exact=half)
    _expect_slice(graph, match, f"second_half{tag}", rank, width, half, width)


def _check_unbound_lane(graph: GraphIndex, match: Match, index: int, rank: int) -> None:
    """Lane ``index`` of the pair axis (the last of ``pairs``, rank ``rank + 1``), that axis
    dropped: exactly ``pairs[..., index]``."""
    bind, pair_axes = f"lane{index}", (-1, rank)
    node = match.node(bind)
    if node.op_type == "Gather":
        picked = graph.constant_value(match.value(f"{bind}.index"))
        if attr(node, "axis", 0) not in pair_axes:
            raise Refuse(f"Gather {node.name!r} picks along axis {attr(node, 'axis', 0)}, not the pair axis")
        if picked.ndim != 0 or int(picked) not in (index, index - 2):
            raise Refuse(f"Gather {node.name!r} picks {picked.tolist()}, expected the scalar lane {index}")
        return
    if node.op_type == "Split":
        sizes = split_sizes(graph, match, bind)
        if sizes is None and len(node.output) == 2:
            sizes = [1, 1]
        if attr(node, "axis", 0) not in pair_axes or sizes != [1, 1]:
            raise Refuse(f"Split {node.name!r} does not cut the pair axis into its two lanes")
    else:
        start, end, axis, step = slice_params(graph, match, bind)
        start, end = start + 2 if start < 0 else start, min(end + 2 if end < 0 else end, 2)
        if axis not in pair_axes or step != 1 or (start, end) != (index, index + 1):
            raise Refuse(f"Slice {node.name!r} does not take lane {index} of the pair axis")
    squeeze = match.node(f"squeeze{index}")
    axes = ([int(a) for a in graph.constant_value(match.value(f"squeeze{index}.axes")).reshape(-1)]
            if match.has(f"squeeze{index}.axes") else list(attr(squeeze, "axes", [])))
    if axes not in ([-1], [rank]):  # no axes: every dim of size 1, maybe a batch or head of 1
        raise Refuse(f"Squeeze {squeeze.name!r} drops axes {axes}, not just the pair axis")


def _check_unbound_pairs(graph: GraphIndex, match: Match, xr: str, rank: int, width: int) -> None:
    """``pairs = Reshape(x, [..., D/2, 2])``: only the last axis of x is cut, into pairs."""
    pairs = match.node("pairs").output[0]
    x_shape, pairs_shape = graph.proven_shape(xr), graph.proven_shape(pairs)
    want = None if x_shape is None else list(x_shape[:-1]) + [width // 2, 2]
    if want is None or not checks.shapes_equal(pairs_shape, want):
        raise Refuse(f"Reshape {match.node('pairs').name!r} gives {pairs_shape}, not x's lanes in pairs {want} "
                     f"({checks.shape_mismatch(pairs_shape, want)})")
    for index in (0, 1):
        _check_unbound_lane(graph, match, index, rank)


def _check_interleaved_rotation(graph, match, xr, rank, width) -> None:
    if match.has("pairs"):
        _check_unbound_pairs(graph, match, xr, rank, width)
    else:
        _expect_slice(graph, match, "even", rank, width, 0, width - 1, step=2)
        _expect_slice(graph, match, "odd", rank, width, 1, width, step=2)
    for bind in ("unsq_odd", "unsq_even"):
        node = match.node(bind)
        axes = unsqueeze_axes(graph, match, bind)
        if axes not in ([-1], [rank]):
            raise Refuse(f"Unsqueeze {node.name!r} adds axis {axes}, not a new last axis")
    stack = match.node("stack")
    if attr(stack, "axis") not in (-1, rank):
        raise Refuse(f"Concat {stack.name!r} does not stack on the new last axis")
    stacked_shape = graph.shape(stack.output[0])
    if stacked_shape is None or list(stacked_shape[-2:]) != [width // 2, 2]:
        raise Refuse(f"the stacked pairs have shape {stacked_shape}, expected [..., {width // 2}, 2]")
    shape_source = graph.producer.get(match.value("flat_shape"))
    restores_by_construction = (shape_source is not None and shape_source.op_type == "Shape"
                                and list(shape_source.input) == [xr] and not shape_source.attribute)
    # The fused op gives x's shape: proven, not by the broadcast convention (nothing checks it at run time).
    flat_proven, x_proven = graph.proven_shape(match.node("flatten").output[0]), graph.proven_shape(xr)
    if not restores_by_construction and not checks.shapes_equal(flat_proven, x_proven):
        raise Refuse(f"Reshape {match.node('flatten').name!r} does not restore x's shape "
                     f"({checks.shape_mismatch(flat_proven, x_proven)})")


def _analyse_rotation(spelling: _Spelling, ctx: RewriteContext, match: Match) -> Fusion:
    graph = ctx.graph
    x, xr = match.value("x"), _rotated_value(spelling, match)
    rank, head_dim = _check_input(graph, match)
    width = head_dim
    if spelling.partial:
        _, width, _, _ = slice_params(graph, match, "rot_part")
        if not 0 < width < head_dim:
            raise Refuse(f"partial rotary width {width} is not inside (0, {head_dim})")
        _expect_slice(graph, match, "rot_part", rank, head_dim, 0, 0, end_exact=width)
        _expect_slice(graph, match, "pass_part", rank, head_dim, width, head_dim)
        _check_concat_last(match, "outer_concat", rank)
    if spelling.empty_tail:
        _expect_slice(graph, match, "pass_part", rank, head_dim, head_dim, head_dim)
        _check_concat_last(match, "outer_concat", rank)
    if width % 2:
        raise Refuse(f"rotary width {width} is odd")
    check = _check_interleaved_rotation if spelling.mode == "interleaved" else _check_half_rotation
    check(graph, match, xr, rank, width)
    for table in ("cos", "sin"):
        _broadcasts_over(graph, match.value(table), xr, width)
        if graph.elem_type(match.value(table)) not in (graph.elem_type(x), onnx.TensorProto.FLOAT):
            raise Refuse(f"{table} has type {checks.type_name(graph.elem_type(match.value(table)))}")
    if graph.shape(match.value("cos")) != graph.shape(match.value("sin")):
        raise Refuse("cos and sin have different shapes")
    table_width = graph.shape(match.value("cos"))[-1]
    call = ops.RotaryEmbedding(X=x, cos=match.value("cos"), sin=match.value("sin"), Y=match.root.output[0],
                               mode=spelling.mode, rotary_dim=0 if table_width == head_dim else table_width)
    return Fusion(call, match.covered)


def _rotation_rule(name: str, spelling: _Spelling, pattern) -> Rule:
    # Refused, the empty-tail form leaves the rotation fused alone and its Concat in front of the
    # attention (no RopeAttention): reported as that downgrade.
    kept = "RotaryEmbedding" if spelling.empty_tail else None
    return Rule(name, pattern, partial(_analyse_rotation, spelling), FAMILY, frozenset({"Neg"}),
                kept_when_refused=kept)


ROTATE_HALF = _rotation_rule("RotaryEmbedding(half)", _Spelling(), _rope(Var("x"), _rotate_half))
PARTIAL_ROTATE_HALF = _rotation_rule("RotaryEmbedding(half, partial)", _Spelling(partial=True),
                                     _partial(_rotate_half))
INTERLEAVED = _rotation_rule("RotaryEmbedding(interleaved)", _Spelling("interleaved"),
                             _rope(Var("x"), _rotate_interleaved))
PARTIAL_INTERLEAVED = _rotation_rule("RotaryEmbedding(interleaved, partial)", _Spelling("interleaved", True),
                                     _partial(_rotate_interleaved))
EMPTY_TAIL_HALF = _rotation_rule("RotaryEmbedding(half, empty pass-through)", _Spelling(empty_tail=True),
                                 _empty_tail(_rotate_half))
EMPTY_TAIL_INTERLEAVED = _rotation_rule("RotaryEmbedding(interleaved, empty pass-through)",
                                        _Spelling("interleaved", empty_tail=True), _empty_tail(_rotate_interleaved))


def _sections(count: int):
    """Concat over sections of x, each rotated (rotate_half) with its own cos/sin."""
    def section(i: int):
        return Either(sliced(Var("x"), f"section{i}"), split_output(Var("x"), i, "section_split"))
    return op.Concat(*(_rope(section(i), _rotate_half, tag=str(i)) for i in range(count)), axis=ANY,
                     _bind="outer_concat")


def _section_widths(graph: GraphIndex, match: Match, count: int, head_dim: int, rank: int) -> list[int]:
    if match.has("section_split"):
        node = match.node("section_split")
        if attr(node, "axis", 0) not in (-1, rank - 1):
            raise Refuse(f"Split {node.name!r} does not cut the last axis")
        sizes = split_sizes(graph, match, "section_split")
        if sizes is None:
            raise Refuse(f"Split {node.name!r} has no explicit section sizes")
        return sizes
    widths, position = [], 0
    for i in range(count):
        start, end, axis, step = slice_params(graph, match, f"section{i}")
        _is_last_axis(axis, rank, f"section Slice {match.node(f'section{i}').name!r}")
        last = i == count - 1
        if step != 1 or start != position or (end < head_dim if last else end <= start):
            raise Refuse(f"section {i} takes [{start}:{end}], expected to start at {position}")
        end = head_dim if last else end
        widths.append(end - start)
        position = end
    return widths


def _section_input(match: Match, i: int) -> str:
    if match.has("section_split"):
        return match.node("section_split").output[i]
    return match.node(f"section{i}").output[0]


def _analyse_sections(count: int, ctx: RewriteContext, match: Match) -> Fusion:
    """Multi-axis RoPE (video/image DiTs): head_dim cut into sections rotated on their own; the
    fused node reads the sections' tables concatenated."""
    graph, root = ctx.graph, match.root
    rank, head_dim = _check_input(graph, match)
    _check_concat_last(match, "outer_concat", rank)
    widths = _section_widths(graph, match, count, head_dim, rank)
    if len(widths) != count or sum(widths) != head_dim or any(w <= 0 or w % 2 for w in widths):
        raise Refuse(f"sections {widths} are not even widths covering {head_dim} lanes")
    leading = None
    for i, width in enumerate(widths):
        rotated = _section_input(match, i)
        _check_half_rotation(graph, match, rotated, rank, width, tag=str(i))
        for table in (f"cos{i}", f"sin{i}"):
            _broadcasts_over(graph, match.value(table), rotated, width)
            table_shape = graph.shape(match.value(table))
            if leading is None:
                leading = table_shape[:-1]
            elif table_shape[:-1] != leading or len(table_shape) != len(leading) + 1:
                raise Refuse("the sections' cos/sin tables differ in their leading dims")
    helpers = Helpers(root)
    joined = [helpers.node("Concat", [match.value(f"{table}{i}") for i in range(count)],
                           Fresh(f"{root.output[0]}/{table}_sections"),
                           name=f"{root.name or root.output[0]}/concat_{table}", axis=-1) for table in ("cos", "sin")]
    call = ops.RotaryEmbedding(X=match.value("x"), cos=joined[0], sin=joined[1], Y=root.output[0], mode="half",
                               rotary_dim=0, sections=widths)
    return Fusion(call, match.covered, helpers)


def _sections_rule(count: int) -> Rule:
    return Rule(f"RotaryEmbedding({count} sections)", _sections(count), partial(_analyse_sections, count),
                FAMILY, frozenset({"Neg"}))


RULES: list[Rule] = [PARTIAL_ROTATE_HALF, EMPTY_TAIL_HALF, ROTATE_HALF, PARTIAL_INTERLEAVED, EMPTY_TAIL_INTERLEAVED,
                     INTERLEAVED,
                     _sections_rule(4), _sections_rule(3), _sections_rule(2)]
