"""Eager attention on [B*N, S, D] tensors with an ALiBi bias (BLOOM's ``baddbmm``): the heads are
merged into the batch for the two bmm, the bias is added to the [B*N, Sq, Skv] scores, and the
padding/causal mask after splitting the heads again. Fused into ``Attention`` with the checks and
mask claim of sdpa.py; the ALiBi bias becomes ``alibi_slopes`` when alibi.py proves it (generated
in the kernel), else it stays an ``attn_bias`` (viewed as [B, N, 1, Skv], plus the mask).
"""

from __future__ import annotations

import numpy as np

from otfuse import ops
from otfuse.fusions.attention.alibi import classify_alibi
from otfuse.fusions.attention import chain_checks as chain
from otfuse.fusions.attention.chain import scaled
from otfuse.fusions.attention.fused_matmul import fused_alpha, fused_scores
from otfuse.rewriter import checks
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.pattern import Either, Match, Var, attr, op
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.rule import Fusion, RewriteContext, Rule

FAMILY = "attention"
_ALL = 2**63 - 1  # a Slice end past every dim


def _merged_heads(tag: str):
    """[B, N, S, D] reshaped to [B*N, S, D]."""
    return op.Reshape(Var(tag), Var(f"{tag}_flat_shape"), _bind=f"{tag}_flat")


def _flat_attention():
    keys_t = op.Transpose(_merged_heads("k"), perm=[0, 2, 1], _bind="k_transpose3")
    query = scaled(_merged_heads("q"), "q")
    scores = scaled(Either(op.MatMul(query, keys_t, _bind="qk"), *fused_scores(query, keys_t, _merged_heads("k"))),
                    "scores")
    biased = Either(op.Add(scores, Var("alibi")), scores)
    scores4 = op.Reshape(biased, Var("scores_shape"), _bind="scores_unflat")
    probs = op.Softmax(Either(op.Add(scores4, Var("mask")), scores4), _bind="softmax")
    # TorchScript writes softmax(dtype=float32).to(T) as Softmax -> Cast(float) -> Cast(T).
    probs = Either(op.Cast(op.Cast(probs, _bind="softmax_widen"), _bind="softmax_narrow"), probs)
    probs3 = op.Reshape(probs, Var("probs_shape"), _bind="probs_flat")
    flat_pv = op.Reshape(op.MatMul(probs3, _merged_heads("v"), _bind="pv"), Var("out_shape"), _bind="out_unflat")
    # With static shapes the exporter's optimiser drops the Reshape pair around P·V: one 4-D MatMul.
    out = Either(flat_pv, op.MatMul(probs, Var("v"), _bind="pv"))
    return Either(op.Transpose(out, perm=[0, 2, 1, 3], _bind="out_transpose"), out)


def _check_reshapes(graph, match: Match, dims) -> None:
    """[B, N, S, D] -> [B*N, S, D] (only the two leading dims merge) for q, k and v, and back
    (v and the way back only where P·V is a 3-D MatMul)."""
    for tag in ("q", "k", "v"):
        if not match.has(f"{tag}_flat"):
            continue
        source = graph.shape(match.value(tag))
        flat = checks.reshaped_dims(graph, match.node(f"{tag}_flat"))
        if flat is None or len(flat) != 3 or not checks.shapes_equal(flat[1:], source[2:]):
            raise Refuse(f"{tag} is reshaped to {flat}, not [B*N, S, D] "
                         f"({checks.shape_mismatch(None if flat is None else flat[1:], source[2:])})")
    expected = {"scores_unflat": (4, [dims["B"], dims["N"], dims["Sq"], None]),
                "out_unflat": (4, [dims["B"], dims["N"], dims["Sq"], dims["Dv"]])}
    for bind, (rank, want) in expected.items():
        if not match.has(bind):
            continue
        got = checks.reshaped_dims(graph, match.node(bind))
        if got is None or len(got) != rank or not all(
                w is None or checks.dims_equal(have, w) for have, w in zip(got, want)):
            raise Refuse(f"{bind} reshapes to {got}, not {want}")
    if not match.has("probs_flat"):
        return
    probs_flat = checks.reshaped_dims(graph, match.node("probs_flat"))
    if probs_flat is None or len(probs_flat) != 3 or not checks.dims_equal(probs_flat[1], dims["Sq"]):
        raise Refuse(f"the probabilities are reshaped to {probs_flat}, not [B*N, Sq, Skv]")


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    """BLOOM-style eager attention: heads merged into the batch for bmm, an ALiBi bias added to
    the [B*N, Sq, Skv] scores, the padding/causal mask added after splitting heads again. The
    fused node's attn_bias is the ALiBi as [B, N, 1, Skv] (+ the mask): one bias, as the graph
    added both."""
    graph = ctx.graph
    fused_alpha(graph, match)  # ORT's FusedMatMul as the scores: its allow-list first
    q, k, v = match.value("q"), match.value("k"), match.value("v")
    dims = ctx.dims(q="B N Sq D", k="_ Nk Skv Dk", v="_ Nv Sv Dv")
    checks.require_static(heads=dims["N"], head_size=dims["D"], kv_heads=dims["Nk"], v_head_size=dims["Dv"])
    if dims["Nk"] != dims["N"] or dims["Nv"] != dims["N"] or dims["Dk"] != dims["D"]:
        raise Refuse("flat-heads attention needs q, k and v with the same heads")
    chain.require_aligned(dims.shape("q"), dims.shape("k"), dims.shape("v"), q_and_k_batch=(dims["B"], dims.shape("k")[0]),
                          q_and_v_batch=(dims["B"], dims.shape("v")[0]), k_and_v_lengths=(dims["Skv"], dims["Sv"]))
    elem = graph.elem_type(q)
    if elem not in checks.FLOAT_TYPES or graph.elem_type(k) != elem or graph.elem_type(v) != elem:
        raise Refuse("q, k and v must share one float type")
    _check_reshapes(graph, match, dims)
    chain.require_softmax_over_keys(graph, match)
    chain.require_softmax_casts(graph, match, elem)
    if match.has("alibi"):
        alibi = graph.shape(match.value("alibi"))
        if alibi is None or len(alibi) != 3 or alibi[1] != 1:
            raise Refuse(f"the ALiBi bias has shape {alibi}, not [B*N, 1, Skv]")
    scores = (dims["B"], dims["N"], dims["Sq"], dims["Skv"])
    if match.has("mask"):
        chain.require_mask(graph, match.value("mask"), scores)
    attributes = {"num_heads": dims["N"], "kv_num_heads": dims["N"], "scale": chain.scale(graph, match),
                  "layout": "BNSD", "output_layout": "BSND" if match.has("out_transpose") else "BNSD"}
    helpers = Helpers(match.root)
    mask, padding = chain.mask_inputs(ctx, match, attributes, helpers, scores)
    bias, slopes, partial = _alibi_inputs(ctx, match, dims["N"], padding, attributes, helpers)
    if mask:
        bias = helpers.node("Add", [bias, mask]) if bias else mask
    y = match.root.output[0]
    call = ops.Attention(Q=q, K=k, V=v, attn_bias=bias, key_padding_mask=padding, alibi_slopes=slopes, Y=y,
                         **attributes)
    shape_reads = _output_shape_reads(graph, match, y, helpers)
    return Fusion(call, tuple(match.covered) + shape_reads, helpers, partial=partial)


def _output_shape_reads(graph, match: Match, y: str, helpers: Helpers) -> tuple:
    """TorchScript sizes the output Reshape from ``Shape(P·V)`` ([B*N, Sq, Dv], interior to the
    fusion): those plain ``Shape`` nodes are taken in and their value is rebuilt after the fused
    node from ``Shape(Y)`` ([B, N, Sq, Dv], or [B, Sq, N, Dv] for a BSND output) as
    [B*N, Sq, Dv]: the same numbers. Anything else reading P·V is left to the leak check."""
    if not match.has("out_unflat"):
        return ()
    pv = match.node("pv").output[0]
    readers = [n for n in graph.uses(pv) if n is not match.node("out_unflat")]
    if not readers or graph.is_graph_output(pv) or not all(
            n.op_type == "Shape" and n.domain in ("", "ai.onnx") and {a.name for a in n.attribute} <= {"start", "end"}
            for n in readers):
        return ()
    heads_axis, seq_axis = (2, 1) if match.has("out_transpose") else (1, 2)
    dims = helpers.node("Shape", [y], after=True)
    merged = helpers.node("Mul", [helpers.node("Gather", [dims, helpers.ints([0])], after=True, axis=0),
                                  helpers.node("Gather", [dims, helpers.ints([heads_axis])], after=True, axis=0)],
                          after=True)
    rest = helpers.node("Gather", [dims, helpers.ints([seq_axis, 3])], after=True, axis=0)
    full = helpers.node("Concat", [merged, rest], after=True, axis=0)
    for reader in readers:  # Shape's start/end clamp as Slice's do (opset 15)
        start, end = attr(reader, "start", 0), attr(reader, "end", _ALL)
        helpers.node("Slice", [full, helpers.ints([start]), helpers.ints([end])], reader.output[0], after=True)
    return tuple(readers)


def _alibi_inputs(ctx: RewriteContext, match: Match, heads: int, padding: str, attributes: dict,
                  helpers: Helpers) -> tuple:
    """(attn_bias, alibi_slopes, partial) for the graph's ALiBi: the slopes when alibi.py proves
    the bias (``attributes`` gets ``alibi_positions``), else the bias itself viewed as
    [B, N, 1, Skv], reported as a partial fusion with alibi.py's reason."""
    if not match.has("alibi"):
        return "", "", ()
    alibi = match.value("alibi")
    try:
        claim = classify_alibi(ctx.graph, alibi, heads, padding or None, ctx.memo)
    except Refuse as refusal:
        tail = helpers.node("Slice", [helpers.node("Shape", [alibi]), helpers.ints([1]), helpers.ints([3])])
        shape = helpers.node("Concat", [helpers.ints([-1, heads]), tail], axis=0)
        bias = helpers.node("Reshape", [alibi, shape])  # [B*N, 1, Skv] -> [B, N, 1, Skv]
        return bias, "", (("ALiBi kept as a materialised attn_bias", str(refusal)),)
    attributes["alibi_positions"] = claim.positions
    slopes = helpers.constant(np.array(claim.slopes, dtype=np.float32), f"{helpers.base}/alibi_slopes")
    return "", slopes, ()


FLAT_HEADS = Rule("Attention(flat heads, ALiBi)", _flat_attention(), _analyse, FAMILY, frozenset({"Softmax"}),
                  fused_op="Attention")

RULES: list[Rule] = [FLAT_HEADS]
