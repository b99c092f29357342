"""ORT's ``RotaryEmbedding`` (com.microsoft) re-targeted to ``otfuse.RotaryEmbedding``.

What ORT's transformers optimizer and onnxruntime-genai's builder write: inputs ``input``,
``position_ids``, ``cos_cache``, ``sin_cache`` (in that order, unlike ONNX's op). Per its schema
(ORT 1.32): ``input`` is 3-D ``[B, S, N*D]`` or 4-D ``[B, N, S, D]``; the caches are half width,
``[max_pos, r/2]``, indexed by 2-D ``position_ids`` ``[B, S]``; ``interleaved`` picks the lane pairs;
the first ``r = rotary_embedding_dim`` lanes (default: the head size) rotate, the rest pass
through; ``num_heads`` (3-D only; 0: the head size is the caches' width times 2). That is the
ONNX op's math (onnx_op.py), whose emit this rule shares.

Refused (``CONTRIB_ROTARY_OP``): ``scale`` other than 1, ``is_packed_batching``, a 1-D
``position_ids`` (one start offset for every row).
"""

from __future__ import annotations

import onnx

from otfuse.fusions.rope.onnx_op import rotation_fusion
from otfuse.rewriter import checks
from otfuse.rewriter.allow_list import CONTRIB_DOMAIN, OpAllowList, only, require_allowed
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Match, Var, attr, op
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule

FAMILY = "rope"

CONTRIB_ROTARY_OP = OpAllowList(
    "RotaryEmbedding", versions=frozenset({1}),
    attributes={"interleaved": only(0, 1), "num_heads": None, "rotary_embedding_dim": None,
                "scale": only(1.0), "is_packed_batching": only(0)},
    inputs=4, outputs=1, domain=CONTRIB_DOMAIN,
    formals=(("input", "position_ids", "cos_cache", "sin_cache"), ("output",)))


def _head_geometry(graph: GraphIndex, node, x: str, cos: str) -> tuple[int, int, int]:
    """(rank, heads, head size) of the input; heads 0 for 4-D (read from the shape)."""
    shape, table = graph.shape(x), graph.shape(cos)
    if shape is None or len(shape) not in (3, 4):
        raise Refuse(f"input {x!r} must have a known rank 3 or 4, has {shape}")
    if len(shape) == 4:
        if not isinstance(shape[3], int):
            raise Refuse("the head size of the input is not static")
        stated = attr(node, "num_heads", 0)
        if stated and stated != shape[1]:
            raise Refuse(f"num_heads {stated} contradicts the input's {shape[1]} heads")
        return 4, 0, shape[3]
    heads, hidden = attr(node, "num_heads", 0), shape[2]
    if not isinstance(hidden, int):
        raise Refuse("the hidden size of the 3-D input is not static")
    if not heads:  # ORT: the head size is the caches' width times 2
        if attr(node, "rotary_embedding_dim", 0):
            raise Refuse("rotary_embedding_dim without num_heads (ORT requires both)")
        if table is None or len(table) != 2 or not isinstance(table[1], int) or hidden % (2 * table[1]):
            raise Refuse(f"num_heads 0 needs a cache of static width dividing the hidden size {hidden}")
        heads = hidden // (2 * table[1])
    if hidden % heads:
        raise Refuse(f"3-D input {list(shape)} does not split into num_heads {heads}")
    return 3, heads, hidden // heads


def _geometry(graph: GraphIndex, match: Match) -> dict:
    node = match.node("rope")
    require_allowed(graph, node, CONTRIB_ROTARY_OP)
    x, cos, sin, ids = match.value("x"), match.value("cos"), match.value("sin"), match.value("position_ids")
    checks.require_float_io(graph, x, node.output[0])
    rank, heads, head_dim = _head_geometry(graph, node, x, cos)
    width = attr(node, "rotary_embedding_dim", 0) or head_dim
    if width % 2 or not 0 < width <= head_dim:
        raise Refuse(f"rotary_embedding_dim {width} is not even and within the head size {head_dim}")
    for table in (cos, sin):
        shape = graph.shape(table)
        if shape is None or len(shape) != 2 or shape[1] != width // 2:
            raise Refuse(f"{table!r} has shape {shape}, expected [max_pos, {width // 2}] (rotary width {width})")
        if graph.elem_type(table) != graph.elem_type(x):
            raise Refuse(f"{table!r} has type {checks.type_name(graph.elem_type(table))}, not the input's")
    if graph.rank(ids) != 2 or graph.elem_type(ids) != onnx.TensorProto.INT64:
        raise Refuse(f"position_ids {ids!r} is not a 2-D int64 tensor (a 1-D start offset is not modelled)")
    return {"rank": rank, "heads": heads, "head_dim": head_dim, "width": width,
            "mode": "interleaved" if attr(node, "interleaved", 0) else "half"}


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    return rotation_fusion(match, _geometry(ctx.graph, match))


CONTRIB_ROTARY = Rule(
    "RotaryEmbedding(com.microsoft)",
    op.RotaryEmbedding(Var("x"), Var("position_ids"), Var("cos"), Var("sin"), _domain=CONTRIB_DOMAIN, _bind="rope"),
    _analyse, FAMILY, frozenset({"RotaryEmbedding"}), fused_op="RotaryEmbedding")

RULES: list[Rule] = [CONTRIB_ROTARY]
