"""ALiBi added to the scores before a ``masked_fill`` (MPT): ``Where(masked, fill, s + alibi)``.

MPT's bias is ``slope_h * (j - Skv + 1)``, key-only, precomputed for the longest sequence and sliced:
``slope_h * j`` plus an offset that is the same for every key of a row. The fill replaces each masked
score (it is not added), so every key the softmax sees carries the same offset and it cancels: the
bias is the op's own ``alibi_slopes`` with ``alibi_positions = "index"`` (relative ``j - t``, which
differs from it by another per-row constant). Both halves are proven by running them: the
condition by masks.py (causal / window / padding), the bias by alibi.py with integer row offsets
allowed. Anything else keeps the ``Where(cond, alibi, fill)`` bias of chain_checks.py (reported).
"""

from __future__ import annotations

import math

import numpy as np

from otfuse.fusions.attention.alibi import classify_alibi
from otfuse.fusions.attention.chain_checks import fill
from otfuse.fusions.attention.mask_probes import FLOAT_PADDING
from otfuse.fusions.attention.masks import classify_bool_mask
from otfuse.rewriter.builder import Helpers, Value
from otfuse.rewriter.pattern import Match
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.rule import RewriteContext


def alibi_before_fill(ctx: RewriteContext, match: Match, attributes: dict, helpers: Helpers,
                      scores: tuple) -> tuple[Value, Value] | None:
    """(alibi_slopes, key_padding_mask) for ``Where(cond, s + m, fill)`` when m is a proven ALiBi
    and cond a proven causal / window / padding condition (``attributes`` updated), else None."""
    if not (match.has("fill_where") and match.has("mask_add")):
        return None
    graph = ctx.graph
    swapped = match.node("fill_where").input[1] == match.value("fill")
    try:
        filler = fill(graph, match)
        claim = classify_bool_mask(graph, match.value("fill_cond"), ctx.memo, scores, masked=swapped)
        if claim.key_padding and graph.elem_type(claim.key_padding) in FLOAT_PADDING:
            raise Refuse(f"the padding mask {claim.key_padding!r} is a float input: alibi_positions "
                         f"'mask_cumsum' counts its integer values")
        alibi = classify_alibi(graph, match.value("mask"), attributes["num_heads"], claim.key_padding,
                               ctx.memo, row_offsets=True)
    except Refuse as refusal:
        ctx.fused_less_than_fully("ALiBi before masked_fill kept as a materialised attn_bias", str(refusal))
        return None
    attributes.update(causal=int(claim.causal), window=claim.window,
                      empty_rows="uniform" if math.isfinite(filler) else "zero", alibi_positions=alibi.positions)
    slopes = helpers.constant(np.array(alibi.slopes, dtype=np.float32), f"{helpers.base}/alibi_slopes")
    return slopes, claim.key_padding or ""
