"""Values known before run time count as constants (rewriter/shape_folding.py)."""

from __future__ import annotations

import numpy as np
from graphs import F16, F32, GraphBuilder

from otfuse.rewriter.graph import GraphIndex


def test_castlike_of_a_constant_is_the_constant_in_the_other_type():
    """onnxscript's unoptimised output writes every constant as ``CastLike(c, x)``."""
    b = GraphBuilder()
    x = b.input("x", F16, ["batch", 4])
    eps = b.node("CastLike", [b.const(np.float32(1e-5)), x])
    out = b.node("Add", [x, eps])
    b.output(out, F16, ["batch", 4])
    graph = GraphIndex(b.model())
    assert graph.is_constant(eps) and eps in graph.folded
    value = graph.constant_value(eps)
    assert value.dtype == np.float16 and value == np.float16(1e-5)


def test_castlike_of_a_runtime_value_stays_a_runtime_value():
    b = GraphBuilder()
    x, y = b.input("x", F32, [4]), b.input("y", F16, [4])
    cast = b.node("CastLike", [x, y])
    b.output(cast, F16, [4])
    assert not GraphIndex(b.model()).is_constant(cast)
