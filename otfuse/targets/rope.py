"""Rope-family ops as ORT's ``com.microsoft.RotaryEmbedding`` and ONNX's ``RotaryEmbedding`` (opset 23).

Both take half-width tables (``r/2`` lanes) where the otfuse op takes the full-width ones the graph
multiplied by, so a site is expressible only when the full table is provably two copies of one
half-width table: halves equal (``half``: lane ``i`` = lane ``i + r/2``) or pairs equal
(``interleaved``: lane ``2j`` = lane ``2j + 1``). ``_duplicated`` proves it from the table's
computation (``Concat(f, f)`` under Cos/Sin/Cast/Mul..., a ``Gather`` of lanes ``0, 0, 1, 1, ...``,
or the constant's values); otherwise the site is not expressible. The tables must vary along batch
and sequence only (not heads), and have the input's type.

ONNX's op takes ``[B, S, r/2]`` tables without position ids: the half-width lanes of ``cos``,
expanded over the batch. ORT's wants ``[max_pos, r/2]`` with ``position_ids``: the same rows
flattened, read by position ids ``0 .. B*S-1``. A BSND input ``[B, S, N, D]`` is given to both as
``[B, S, N*D]`` with ``num_heads = N``.
"""

from __future__ import annotations

import numpy as np
import onnx

from otfuse.rewriter.checks import dims_equal, type_name
from otfuse.targets.build import MS_DOMAIN, CannotExpress, Emitter
from otfuse.targets.call import FusedCall

_UNARY = {"Cos", "Sin", "Cast", "Neg", "Identity", "Sqrt", "Exp", "Reciprocal", "Abs", "CastLike"}
_BINARY = {"Mul", "Add", "Sub", "Div"}
_KEEPS_LANES = {"Unsqueeze", "Squeeze", "Reshape", "Expand", "Transpose", "Gather", "Slice", "Tile"}


def _lanes_equal(values: np.ndarray, mode: str, r: int) -> bool:
    if values.ndim == 0 or values.shape[-1] == 1:
        return True
    if values.shape[-1] != r:
        return False
    if mode == "half":
        return bool(np.array_equal(values[..., : r // 2], values[..., r // 2:]))
    return bool(np.array_equal(values[..., 0::2], values[..., 1::2]))


def _last_axis(node: onnx.NodeProto, rank: int | None, default: int = 0) -> bool:
    axis = next((a.i for a in node.attribute if a.name == "axis"), default)
    return axis == -1 or (rank is not None and axis == rank - 1)


def _keeps_last_axis(graph, node: onnx.NodeProto) -> bool:
    """The node moves whole rows of the last axis (never mixes or reorders lanes)."""
    source, out = graph.shape(node.input[0]), graph.shape(node.output[0])
    if source is None or out is None or not source or not out or not dims_equal(source[-1], out[-1]):
        return False
    if node.op_type == "Transpose":
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        return perm is not None and perm[-1] == len(perm) - 1
    if node.op_type == "Gather":
        return not _last_axis(node, len(source))
    if node.op_type == "Slice":
        axes = graph.constant_value(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        return axes is not None and all(int(a) not in (-1, len(source) - 1) for a in np.ravel(axes))
    return True


def _duplicated(graph, value: str, mode: str, r: int, depth: int = 16) -> bool:
    """``value``'s last axis is two copies of a half-width table (per ``mode``)."""
    constant = graph.constant_value(value)
    if constant is not None:
        return _lanes_equal(np.asarray(constant), mode, r)
    node = graph.producer.get(value)
    if node is None or depth == 0:
        return False
    op = node.op_type
    if op in _UNARY:
        return _duplicated(graph, node.input[0], mode, r, depth - 1)
    if op in _BINARY:
        return all(_broadcast_lanes(graph, name) or _duplicated(graph, name, mode, r, depth - 1) for name in node.input)
    if op == "Concat" and _last_axis(node, graph.rank(value)):
        return mode == "half" and len(node.input) == 2 and node.input[0] == node.input[1]
    if op == "Gather" and _last_axis(node, graph.rank(node.input[0])):
        indices = graph.constant_value(node.input[1])
        return indices is not None and np.ndim(indices) == 1 and _lanes_equal(np.asarray(indices), mode, r)
    if op == "Reshape" and _merges_copies(graph, node, mode, r):
        return True
    if op in _KEEPS_LANES and _keeps_last_axis(graph, node):
        return _duplicated(graph, node.input[0], mode, r, depth - 1)
    return False


def _merges_copies(graph, node: onnx.NodeProto, mode: str, r: int) -> bool:
    """``Reshape`` of ``[..., r/2, 2]`` (interleaved) or ``[..., 2, r/2]`` (half) into ``[..., r]``,
    whose axis of 2 is an ``Expand`` or ``Tile`` of 1: torch's ``repeat_interleave`` of a table
    (dynamo: Expand; TorchScript: Tile)."""
    source, out = graph.shape(node.input[0]), graph.shape(node.output[0])
    if not source or not out or len(source) < 2 or out[-1] != r:
        return False
    axis = -1 if mode == "interleaved" else -2
    if source[axis] != 2 or source[-1 - (axis == -1)] * 2 != r:
        return False
    expand = graph.producer.get(node.input[0])  # Expand or Tile of an axis of 1: copies
    if expand is None or expand.op_type not in ("Expand", "Tile"):
        return False
    inner = graph.shape(expand.input[0])
    return inner is not None and len(inner) >= -axis and inner[axis] == 1


def _broadcast_lanes(graph, name: str) -> bool:
    shape = graph.shape(name)
    return shape is not None and (len(shape) == 0 or shape[-1] == 1)


def _layout(em: Emitter, x: str, tables: tuple[str, str]) -> str:
    """"BNSD" or "BSND" (rank 4: which axis the tables vary along besides the batch), "BSD" (rank 3)."""
    xs = em.graph.shape(x)
    if xs is None or len(xs) not in (3, 4):
        raise CannotExpress(f"the input {x!r} is not rank 3 or 4")
    if len(xs) == 3:
        return "BSD"
    varying = set()
    for table in tables:
        shape = em.graph.shape(table)
        if shape is None or len(shape) > 4:
            raise CannotExpress(f"the table {table!r} has no known shape of rank <= 4")
        padded = (1,) * (4 - len(shape)) + tuple(shape)
        varying |= {axis for axis in range(3) if padded[axis] != 1}
    if 1 not in varying:
        return "BNSD"
    if 2 not in varying:
        return "BSND"
    raise CannotExpress("the tables vary along both the axis 1 and 2 of the input (heads and positions)")


def _half_table(em: Emitter, table: str, mode: str, r: int, layout: str, x: str) -> str:
    """``[B, S, r/2]``: the table's half-width lanes, expanded over the batch."""
    h = r // 2
    half = (em.op1("Slice", [table, em.ints([0]), em.ints([h]), em.ints([-1])]) if mode == "half" else
            em.op1("Slice", [table, em.ints([0]), em.ints([r]), em.ints([-1]), em.ints([2])]))
    rank = len(em.graph.shape(table))
    full_rank = 3 if layout == "BSD" else 4
    if rank < full_rank:
        half = em.op1("Unsqueeze", [half, em.ints(list(range(full_rank - rank)))])
    if layout == "BSD":
        return em.op1("Expand", [half, em.op1("Concat", [em.dim_range(x, 0, 2), em.ints([h])], axis=0)])
    if layout == "BNSD":
        target = em.op1("Concat", [em.dim_range(x, 0, 1), em.ints([1]), em.dim_range(x, 2, 3), em.ints([h])], axis=0)
        squeeze = 1
    else:
        target = em.op1("Concat", [em.dim_range(x, 0, 2), em.ints([1, h])], axis=0)
        squeeze = 2
    return em.op1("Squeeze", [em.op1("Expand", [half, target]), em.ints([squeeze])])


def _check_types(em: Emitter, call: FusedCall, x: str) -> int:
    """The static head size of ``x``, after checking the tables have ``x``'s type."""
    xs = em.graph.shape(x)
    d = xs[-1] if xs else None
    if not isinstance(d, int):
        raise CannotExpress(f"the head size of {x!r} is not static")
    tx = em.graph.elem_type(x)
    for table in (call.input("cos"), call.input("sin")):
        if em.graph.elem_type(table) != tx:
            raise CannotExpress(f"the table {table!r} is {type_name(em.graph.elem_type(table))}, the input "
                                f"{type_name(tx)} (the target op takes tables of the input's type)")
    return d


def _require_duplicated(em: Emitter, table: str, mode: str, r: int, proven: bool | None = None) -> None:
    if not (_duplicated(em.graph, table, mode, r) if proven is None else proven):
        lanes = "halves" if mode == "half" else "lane pairs"
        raise CannotExpress(f"the table {table!r} is not provably two equal {lanes} (the target op takes "
                            f"the half-width table)")


def _rotate(em: Emitter, call: FusedCall, x: str, y: str, target: str) -> None:
    a = call.attributes
    d = _check_types(em, call, x)
    r = a["rotary_dim"] or d
    if a["sections"] and a["mode"] == "half":
        _rotate_sections(em, call, x, y, target, d)
        return
    for table in (call.input("cos"), call.input("sin")):
        _require_duplicated(em, table, a["mode"], r)
    _apply(em, x, x, y, (call.input("cos"), call.input("sin")), a["mode"], r, d, target)


def _section_tables(em: Emitter, table: str, sections) -> list[tuple[str, bool]]:
    """(table of section i, whether its halves are proven equal): the inputs of the Concat that
    built the table by sections (rope/rotations.py), or slices of a constant table."""
    node = em.graph.producer.get(table)
    widths = [em.graph.shape(i)[-1] if em.graph.shape(i) else None for i in node.input] if node is not None else []
    if node is not None and node.op_type == "Concat" and _last_axis(node, em.graph.rank(table)) and widths == list(sections):
        return [(name, _duplicated(em.graph, name, "half", w)) for name, w in zip(node.input, sections)]
    values = em.graph.constant_value(table)
    if values is None:
        raise CannotExpress(f"the table {table!r} is neither a constant nor a concatenation of per-section tables")
    parts, offset = [], 0
    for w in sections:
        piece = em.op1("Slice", [table, em.ints([offset]), em.ints([offset + w]), em.ints([-1])])
        parts.append((piece, _lanes_equal(np.asarray(values)[..., offset:offset + w], "half", w)))
        offset += w
    return parts


def _rotate_sections(em: Emitter, call: FusedCall, x: str, y: str, target: str, d: int) -> None:
    """Multi-axis RoPE: each section of lanes is a half rotation of its own (docs/ops.md), one
    target op per section on that slice of ``x``, concatenated with the pass-through lanes."""
    sections = list(call.attributes["sections"])
    cos, sin = (_section_tables(em, call.input(t), sections) for t in ("cos", "sin"))
    outputs, offset = [], 0
    for w, (c, c_ok), (s_, s_ok) in zip(sections, cos, sin):
        _require_duplicated(em, c, "half", w, c_ok)
        _require_duplicated(em, s_, "half", w, s_ok)
        part = em.op1("Slice", [x, em.ints([offset]), em.ints([offset + w]), em.ints([-1])])
        rotated = em.fresh(f"{x}/section{len(outputs)}")
        _apply(em, part, x, rotated, (c, s_), "half", w, w, target)
        outputs.append(rotated)
        offset += w
    if offset < d:
        outputs.append(em.op1("Slice", [x, em.ints([offset]), em.ints([d]), em.ints([-1])]))
    em.op1("Concat", outputs, y, axis=-1)


def _apply(em: Emitter, x: str, like: str, y: str, tables: tuple[str, str], mode: str, r: int, d: int,
           target: str) -> None:
    """The target op rotating ``x`` (shaped as ``like`` but for a head size ``d``) into ``y``."""
    layout = _layout(em, like, tables)
    xs = em.graph.shape(like)
    heads = 1 if layout == "BSD" else xs[2] if layout == "BSND" else xs[1]
    attributes = {"interleaved": int(mode == "interleaved"),
                  "rotary_embedding_dim": r if r != d else None,
                  "num_heads": heads if layout != "BNSD" or r != d else None}
    if attributes["num_heads"] is not None and not isinstance(attributes["num_heads"], int):
        raise CannotExpress(f"the head count of {like!r} is not static")
    cos, sin = (_half_table(em, t, mode, r, layout, x) for t in tables)
    flat = em.op1("Reshape", [x, em.ints([0, 0, -1])]) if layout == "BSND" else x
    out = y if layout != "BSND" else None
    if target == "onnx":
        rotated = em.op1("RotaryEmbedding", [flat, cos, sin], out, opset=23, **attributes)
    else:
        rows = em.dim_range(cos, 0, 2)
        count = em.op1("ReduceProd", [rows], keepdims=0)
        positions = em.op1("Reshape", [em.op1("Range", [em.constant(np.int64(0)), count, em.constant(np.int64(1))]), rows])
        cos2, sin2 = (em.op1("Reshape", [t, em.ints([-1, r // 2])]) for t in (cos, sin))
        rotated = em.op1("RotaryEmbedding", [flat, positions, cos2, sin2], out, domain=MS_DOMAIN, opset=1, **attributes)
    if layout == "BSND":
        em.op1("Reshape", [rotated, em.op1("Shape", [x])], y)


def _single(target: str):
    def emit(em: Emitter, call: FusedCall) -> None:
        _rotate(em, call, call.input("X"), call.output("Y"), target)
    return emit


def _pair(target: str):
    def emit(em: Emitter, call: FusedCall) -> None:
        _rotate(em, call, call.input("Q"), call.output("Q_out"), target)
        _rotate(em, call, call.input("K"), call.output("K_out"), target)
    return emit


def rotate(em: Emitter, call: FusedCall, x: str, target: str) -> str:
    """``x`` rotated by ``call``'s tables (RopeAttention's q and k): a fresh value."""
    y = em.fresh(f"{x}/rotated")
    _rotate(em, call, x, y, target)
    return y


ORT = {"RotaryEmbedding": _single("ort"), "RotaryEmbeddingQK": _pair("ort")}
ONNX = {"RotaryEmbedding": _single("onnx"), "RotaryEmbeddingQK": _pair("onnx")}
