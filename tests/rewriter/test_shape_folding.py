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


def _lane_indices(step_start: int, limit_of):
    """torch's slice_scatter lane indices: Unsqueeze(Slice(Range(0, limit, 1), start::2), -1)."""
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", 8, 16])
    limit = limit_of(b, x)
    lanes = b.node("Range", [b.const(np.int64(0)), limit, b.const(np.int64(1))])
    picked = b.node("Slice", [lanes, b.const(np.array([step_start], np.int64)),
                              b.const(np.array([2**63 - 1], np.int64)), b.const(np.array([0], np.int64)),
                              b.const(np.array([2], np.int64))])
    indices = b.node("Unsqueeze", [picked, b.const(np.array([-1], np.int64))])
    b.output(indices, 7, ["lanes", 1])  # int64
    return GraphIndex(b.model()), indices


def test_range_of_a_static_dim_folds():
    """Wan's odd lanes: Range(0, Shape(x)[2], 1)[1::2] with x's last dim static."""
    def static_dim(b, x):
        return b.node("Gather", [b.node("Shape", [x]), b.const(np.int64(2))], axis=0)
    graph, indices = _lane_indices(1, static_dim)
    assert graph.is_constant(indices)
    assert graph.constant_value(indices).reshape(-1).tolist() == [1, 3, 5, 7, 9, 11, 13, 15]


def test_range_of_a_dynamic_dim_stays_a_runtime_value():
    def dynamic_dim(b, x):
        return b.node("Gather", [b.node("Shape", [x]), b.const(np.int64(0))], axis=0)
    graph, indices = _lane_indices(0, dynamic_dim)
    assert not graph.is_constant(indices)


def test_range_too_long_is_not_folded():
    b = GraphBuilder()
    x = b.input("x", F32, [4])
    lanes = b.node("Range", [b.const(np.int64(0)), b.const(np.int64(10**6)), b.const(np.int64(1))])
    b.output(lanes, 7, ["n"])
    b.output(b.node("Identity", [x]), F32, [4])
    assert not GraphIndex(b.model()).is_constant(lanes)
