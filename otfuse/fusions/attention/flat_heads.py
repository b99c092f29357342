"""Eager attention on [B*N, S, D] tensors with an ALiBi bias (BLOOM's ``baddbmm``): the heads are
merged into the batch for the two bmm, the bias is added to the [B*N, Sq, Skv] scores, and the
padding/causal mask after splitting the heads again. Fused into ``Attention`` with the ALiBi bias
(viewed as [B, N, 1, Skv]) plus the mask as ``attn_bias``, the checks and mask claim of sdpa.py.
"""

from __future__ import annotations

from otfuse import ops
from otfuse.fusions.attention import chain_checks as chain
from otfuse.fusions.attention.chain import scaled
from otfuse.rewriter import checks
from otfuse.rewriter.builder import Helpers
from otfuse.rewriter.pattern import Either, Match, Var, op
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.rule import Fusion, RewriteContext, Rule

FAMILY = "attention"


def _merged_heads(tag: str):
    """[B, N, S, D] reshaped to [B*N, S, D]."""
    return op.Reshape(Var(tag), Var(f"{tag}_flat_shape"), _bind=f"{tag}_flat")


def _flat_attention():
    keys_t = op.Transpose(_merged_heads("k"), perm=[0, 2, 1], _bind="k_transpose3")
    scores = scaled(op.MatMul(scaled(_merged_heads("q"), "q"), keys_t, _bind="qk"), "scores")
    biased = Either(op.Add(scores, Var("alibi")), scores)
    scores4 = op.Reshape(biased, Var("scores_shape"), _bind="scores_unflat")
    probs = op.Softmax(Either(op.Add(scores4, Var("mask")), scores4), _bind="softmax")
    probs3 = op.Reshape(probs, Var("probs_shape"), _bind="probs_flat")
    out = op.Reshape(op.MatMul(probs3, _merged_heads("v"), _bind="pv"), Var("out_shape"), _bind="out_unflat")
    return Either(op.Transpose(out, perm=[0, 2, 1, 3], _bind="out_transpose"), out)


def _check_reshapes(graph, match: Match, dims) -> None:
    """[B, N, S, D] -> [B*N, S, D] (only the two leading dims merge) for q, k and v, and back."""
    for tag in ("q", "k", "v"):
        source = graph.shape(match.value(tag))
        flat = checks.reshaped_dims(graph, match.node(f"{tag}_flat"))
        if flat is None or len(flat) != 3 or not checks.shapes_equal(flat[1:], source[2:]):
            raise Refuse(f"{tag} is reshaped to {flat}, not [B*N, S, D] "
                         f"({checks.shape_mismatch(None if flat is None else flat[1:], source[2:])})")
    expected = {"scores_unflat": (4, [dims["B"], dims["N"], dims["Sq"], None]),
                "out_unflat": (4, [dims["B"], dims["N"], dims["Sq"], dims["Dv"]])}
    for bind, (rank, want) in expected.items():
        got = checks.reshaped_dims(graph, match.node(bind))
        if got is None or len(got) != rank or not all(
                w is None or checks.dims_equal(have, w) for have, w in zip(got, want)):
            raise Refuse(f"{bind} reshapes to {got}, not {want}")
    probs_flat = checks.reshaped_dims(graph, match.node("probs_flat"))
    if probs_flat is None or len(probs_flat) != 3 or not checks.dims_equal(probs_flat[1], dims["Sq"]):
        raise Refuse(f"the probabilities are reshaped to {probs_flat}, not [B*N, Sq, Skv]")


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    """BLOOM-style eager attention: heads merged into the batch for bmm, an ALiBi bias added to
    the [B*N, Sq, Skv] scores, the padding/causal mask added after splitting heads again. The
    fused node's attn_bias is the ALiBi as [B, N, 1, Skv] (+ the mask): one bias, as the graph
    added both."""
    graph = ctx.graph
    q, k, v = match.value("q"), match.value("k"), match.value("v")
    dims = ctx.dims(q="B N Sq D", k="_ Nk Skv Dk", v="_ Nv Sv Dv")
    checks.require_static(heads=dims["N"], head_size=dims["D"], kv_heads=dims["Nk"], v_head_size=dims["Dv"])
    if dims["Nk"] != dims["N"] or dims["Nv"] != dims["N"] or dims["Dk"] != dims["D"]:
        raise Refuse("flat-heads attention needs q, k and v with the same heads")
    elem = graph.elem_type(q)
    if elem not in checks.FLOAT_TYPES or graph.elem_type(k) != elem or graph.elem_type(v) != elem:
        raise Refuse("q, k and v must share one float type")
    _check_reshapes(graph, match, dims)
    chain.require_softmax_over_keys(graph, match)
    if match.has("alibi"):
        alibi = graph.shape(match.value("alibi"))
        if alibi is None or len(alibi) != 3 or alibi[1] != 1:
            raise Refuse(f"the ALiBi bias has shape {alibi}, not [B*N, 1, Skv]")
    if match.has("mask"):
        chain.require_mask(graph, match.value("mask"), (dims["B"], dims["N"], dims["Sq"], dims["Skv"]))
    attributes = {"num_heads": dims["N"], "kv_num_heads": dims["N"], "scale": chain.scale(graph, match),
                  "layout": "BNSD", "output_layout": "BSND" if match.has("out_transpose") else "BNSD"}
    helpers = Helpers(match.root)
    bias = ""
    if match.has("alibi"):
        alibi = match.value("alibi")  # [B*N, 1, Skv] -> [B, N, 1, Skv]
        tail = helpers.node("Slice", [helpers.node("Shape", [alibi]), helpers.ints([1]), helpers.ints([3])])
        shape = helpers.node("Concat", [helpers.ints([-1, dims["N"]]), tail], axis=0)
        bias = helpers.node("Reshape", [alibi, shape])
    mask, padding = chain.mask_inputs(ctx, match, attributes, helpers)
    if mask:
        bias = helpers.node("Add", [bias, mask]) if bias else mask
    call = ops.Attention(Q=q, K=k, V=v, attn_bias=bias, key_padding_mask=padding, Y=match.root.output[0],
                         **attributes)
    return Fusion(call, match.covered, helpers)


FLAT_HEADS = Rule("Attention(flat heads, ALiBi)", _flat_attention(), _analyse, FAMILY, frozenset({"Softmax"}),
                  fused_op="Attention")

RULES: list[Rule] = [FLAT_HEADS]
