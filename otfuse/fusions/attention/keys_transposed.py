"""Attention whose keys the graph already holds transposed ([B, Nkv, D, S]): the permute of
[B, S, Nkv, D] straight from the head split (GPT-2's eager ``_split_heads(key, k=True)``), a graph
input, or a cache kept transposed. The chain and checks are sdpa.py's with Kᵀ given, as two more
layouts; the fused node reads the keys in BSND, or behind a Transpose to BNSD the emit adds.
"""

from __future__ import annotations

from otfuse.fusions.attention.chain import keys_from_bsnd, sdpa_chain, to_bnsd
from otfuse.fusions.attention.sdpa import Layout, layout_rule
from otfuse.rewriter.pattern import Either, Match, Var, attr
from otfuse.rewriter.refuse import NotCandidate
from otfuse.rewriter.rule import RewriteContext, Rule


def _transposed_keys_given(ctx: RewriteContext, match: Match) -> None:
    """Kᵀ as any value would take every right operand (a scaled Kᵀ, a wrong transpose): only a
    graph input or a cache kept transposed (Concat along the last axis) is a candidate, the
    rest silently not (the other rules report their near misses)."""
    if not match.has("k_t"):
        return
    node = ctx.graph.producer.get(match.value("k_t"))
    if node is None:
        if match.value("k_t") not in ctx.graph.graph_inputs:
            raise NotCandidate("Kᵀ is a constant")
        return
    if node.op_type != "Concat" or attr(node, "axis") not in (-1, 3):
        raise NotCandidate("Kᵀ is neither a graph input nor a cache kept transposed")


# q and v Transpose(·, [0,2,1,3]) of [B, S, N, D] and Kᵀ the permute of [B, S, Nkv, D]: the fused
# node reads the three in BSND (layout BSND) and the three transposes disappear.
KEYS_FROM_BSND = Layout("Attention(Kᵀ from BSND)",
                        sdpa_chain(to_bnsd(Var("q"), "q"), None, to_bnsd(Var("v"), "v"), keys_t=keys_from_bsnd()),
                        q="q_to_bnsd", keys=("k",), values=("v_to_bnsd",), keys_dims="BSND", layout="BSND")
# Kᵀ that is not the transpose of a BNSD K in the graph: the permute of [B, S, Nkv, D] (with q or
# v in another layout than BSND), or a [B, Nkv, D, S] graph input or cache kept transposed.
KEYS_GIVEN = Layout("Attention(Kᵀ given)",
                    sdpa_chain(Var("q"), None, Var("v"),
                               keys_t=Either(keys_from_bsnd(), Var("k_t"), tag="keys_t", tags=("BSND", "BNDS"))),
                    keys=("k", "k_t"), keys_dims="keys_t", keys_to_bnsd=True, candidate=_transposed_keys_given)

RULES: list[Rule] = [layout_rule(KEYS_FROM_BSND), layout_rule(KEYS_GIVEN)]
