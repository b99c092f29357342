"""The ONNX ``RotaryEmbedding`` op (opset 23) re-targeted to ``otfuse.RotaryEmbedding``.

ONNX's op takes half-width tables: ``cos_cache`` ``[max_pos, r/2]`` indexed by ``position_ids``,
or ``[B, S, r/2]`` without them; its ``X`` is BNSD ``[B, N, S, D]`` or ``[B, S, N*D]`` with the
``num_heads`` attribute. Per the ONNX reference, with ``c``/``s`` the half tables:

    half:        y[:h]      = c*x[:h] - s*x[h:r],     y[h:r]     = s*x[:h] + c*x[h:r]
    interleaved: y[2j]      = c*x[2j] - s*x[2j+1],    y[2j+1]    = s*x[2j] + c*x[2j+1]

which is ``cos*x + sin*(M x)`` (docs/ops.md) with full-width tables ``Concat(c, c)`` (half) or
``c`` repeated pairwise (interleaved). The rewrite builds those [B, S, r] tables with plain nodes
(a Gather of lanes, a Gather by position ids, an Unsqueeze of the head axis) and leaves lanes
r..D untouched, as both ops do. A 3-D ``X`` is viewed as [B, S, N, D] around the fused node.
"""

from __future__ import annotations

import numpy as np
import onnx

from otfuse import ops
from otfuse.rewriter import checks
from otfuse.rewriter.allow_list import OpAllowList, only, require_allowed
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Either, Match, Var, attr, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule

FAMILY = "rope"

# Everything of ONNX RotaryEmbedding-23 this rule translates; anything else is refused.
ROTARY_OP = OpAllowList(
    "RotaryEmbedding", versions=frozenset({23}),
    attributes={"interleaved": only(0, 1), "num_heads": None, "rotary_embedding_dim": None},
    inputs=4,  # X, cos_cache, sin_cache, position_ids
    outputs=1,
)


def _geometry(graph: GraphIndex, match: Match) -> dict:
    """Head size D, rotary width r and how the tables are indexed; refuses what is not the spec."""
    node = match.node("rope")
    require_allowed(graph, node, ROTARY_OP)
    x, y = match.value("x"), node.output[0]
    checks.require_float_io(graph, x, y)
    shape = graph.shape(x)
    if shape is None or len(shape) not in (3, 4):
        raise Refuse(f"X {x!r} must have a known rank 3 or 4, has {shape}")
    heads = attr(node, "num_heads", 0)
    if len(shape) == 4:
        head_dim = shape[3]
        if not isinstance(head_dim, int):
            raise Refuse("the head size of X is not static")
    else:
        hidden = shape[2]
        if not heads or not isinstance(hidden, int) or hidden % heads:
            raise Refuse(f"3-D X {list(shape)} needs num_heads ({heads}) dividing a static hidden size")
        head_dim = hidden // heads
    width = attr(node, "rotary_embedding_dim", 0) or head_dim
    if width % 2 or not 0 < width <= head_dim:
        raise Refuse(f"rotary_embedding_dim {width} is not even and within the head size {head_dim}")
    interleaved = attr(node, "interleaved", 0)
    if interleaved not in (0, 1):
        raise Refuse(f"interleaved is {interleaved}")
    with_ids = match.has("position_ids")
    cos, sin = match.value("cos"), match.value("sin")
    table_rank = 2 if with_ids else 3
    for table in (cos, sin):
        table_shape = graph.shape(table)
        if table_shape is None or len(table_shape) != table_rank or table_shape[-1] != width // 2:
            raise Refuse(f"{table!r} has shape {table_shape}, expected rank {table_rank} with "
                          f"{width // 2} lanes (rotary width {width})")
        if graph.elem_type(table) not in (graph.elem_type(x), onnx.TensorProto.FLOAT):
            raise Refuse(f"{table!r} has type {checks.type_name(graph.elem_type(table))}")
    if graph.elem_type(cos) != graph.elem_type(sin):
        raise Refuse("cos_cache and sin_cache have different types")
    if with_ids:
        ids = match.value("position_ids")
        if graph.rank(ids) != 2 or graph.elem_type(ids) != onnx.TensorProto.INT64:
            raise Refuse(f"position_ids {ids!r} is not a 2-D int64 tensor")
    return {"rank": len(shape), "heads": heads, "head_dim": head_dim, "width": width,
            "mode": "interleaved" if interleaved else "half"}


def _full_table(helpers: Helpers, match: Match, name: str, geometry: dict, bnsd: bool):
    """[.., r/2] -> [.., r] by one Gather of lanes (c, c for half; each lane twice for
    interleaved), by position ids when given (ORT folds the lane Gather of a constant cache),
    then [B, 1, S, r] (BNSD) or [B, S, 1, r]. Few levels, so the q and k tables compare equal
    and the two rotations pair."""
    width = geometry["width"]
    lanes = np.arange(width) // 2 if geometry["mode"] == "interleaved" else np.arange(width) % (width // 2)
    table = helpers.node("Gather", [match.value(name), helpers.ints(lanes.tolist())], axis=-1)
    if match.has("position_ids"):
        table = helpers.node("Gather", [table, match.value("position_ids")], axis=0)
    return helpers.node("Unsqueeze", [table, helpers.ints([1 if bnsd else 2])])


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    geometry = _geometry(ctx.graph, match)
    root = match.root
    helpers = Helpers(root)
    bnsd = geometry["rank"] == 4
    tables = [_full_table(helpers, match, name, geometry, bnsd) for name in ("cos", "sin")]
    x, y = match.value("x"), root.output[0]
    if not bnsd:  # [B, S, N*D] viewed as [B, S, N, D]
        x = helpers.node("Reshape", [x, helpers.ints([0, 0, geometry["heads"], geometry["head_dim"]])])
        y = helpers.fresh(f"{root.output[0]}/heads")
        hidden = geometry["heads"] * geometry["head_dim"]  # not -1: an empty B or S stays valid
        helpers.node("Reshape", [y, helpers.ints([0, 0, hidden])], output=root.output[0])
    width = geometry["width"]
    call = ops.RotaryEmbedding(X=x, cos=tables[0], sin=tables[1], Y=y, mode=geometry["mode"],
                               rotary_dim=0 if width == geometry["head_dim"] else width)
    return Fusion(call, match.covered, helpers)


ROTARY_EMBEDDING_OP = Rule(
    "RotaryEmbedding(ONNX op)",
    Either(op.RotaryEmbedding(Var("x"), Var("cos"), Var("sin"), Var("position_ids"), _bind="rope"),
           op.RotaryEmbedding(Var("x"), Var("cos"), Var("sin"), _bind="rope")),
    _analyse, FAMILY, frozenset({"RotaryEmbedding"}))

RULES: list[Rule] = [ROTARY_EMBEDDING_OP]
