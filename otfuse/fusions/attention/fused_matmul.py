"""ORT's ``FusedMatMul`` (com.microsoft) as the scores of an attention chain. ORT's
``MatMulScaleFusion`` / ``MatMulTransposeFusion`` (the ``extended`` offline optimisation) and
onnxscript's ``optimize_for_ort`` write the scores
``MatMul(q * a, Kᵀ * b)`` as ``FusedMatMul(q, Kᵀ, alpha=a*b)``, or, folding the key transpose,
``FusedMatMul(q, K, transB=1, alpha)``. Per its schema it is ``alpha * (A' @ B')`` with ``A'``/``B'``
transposed on their last two axes by ``transA``/``transB``, and on the batch axes by
``transBatchA``/``transBatchB``; the chain patterns (chain.py, flat_heads.py) take it in place of the
scores' ``MatMul``, ``alpha`` joins the scale, and only ``transB`` is modelled (``FUSED_MATMUL_OP``).
"""

from __future__ import annotations

import math

import numpy as np

from otfuse.rewriter.allow_list import CONTRIB_DOMAIN, OpAllowList, only, require_allowed
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Match, attr, op
from otfuse.rewriter.refuse import Refuse

FUSED_MATMUL_OP = OpAllowList(
    "FusedMatMul", versions=frozenset({1}),
    attributes={"alpha": None, "transA": only(0), "transB": only(0, 1), "transBatchA": only(0), "transBatchB": only(0)},
    inputs=2, outputs=1, domain=CONTRIB_DOMAIN,
    formals=(("A", "B"), ("Y",)))


def _trans_b(want: int):
    """A pattern attribute check: FusedMatMul's transB (absent = 0) is ``want``."""

    def check(got) -> None:
        if (got or 0) != want:
            raise Refuse(f"is {got or 0}, this alternative reads transB={want}")

    return check


def fused_scores(query, keys_t, keys=None, bind: str = "qk") -> list:
    """Alternatives to ``MatMul(query, keys_t)``: ``FusedMatMul(query, keys_t)``, and, when the
    untransposed keys pattern is given, ``FusedMatMul(query, keys, transB=1)``."""
    alternatives = [op.FusedMatMul(query, keys_t, _domain=CONTRIB_DOMAIN, _bind=bind, transB=_trans_b(0))]
    if keys is not None:
        alternatives.append(op.FusedMatMul(query, keys, _domain=CONTRIB_DOMAIN, _bind=bind, transB=_trans_b(1)))
    return alternatives


def fused_alpha(graph: GraphIndex, match: Match, bind: str = "qk") -> float:
    """The factor a ``FusedMatMul`` scores node adds to the scale (1 for a plain MatMul)."""
    node = match.nodes.get(bind)
    if node is None or node.op_type != "FusedMatMul":
        return 1.0
    require_allowed(graph, node, FUSED_MATMUL_OP)
    alpha = float(attr(node, "alpha", 1.0))
    if not math.isfinite(alpha) or alpha == 0:
        raise Refuse(f"FusedMatMul alpha {alpha} is not a finite non-zero number")
    return float(np.float32(alpha))

