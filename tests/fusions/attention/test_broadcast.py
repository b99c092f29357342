"""Attention whose q, k, v or mask only line up by broadcasting a literal 1 (found by the property
test, tests/properties): the graph's MatMuls and mask Add broadcast, the fused op does not, so the
fused model failed at run time ("batch sizes differ: Q 2, K 2, V 1", "V has 7 positions but K has
1") where the original ran. Such chains are refused, naming the two dims."""

from __future__ import annotations

import onnx
import pytest
from fusing import fuse_in_memory
from fusions.attention.graphs import attention_model
from graphs import retyped


def with_dim(model: onnx.ModelProto, value: str, axis: int, size: int) -> onnx.ModelProto:
    """``model`` with graph input ``value``'s dim ``axis`` declared ``size``, retyped."""
    for info in model.graph.input:
        if info.name == value:
            dim = info.type.tensor_type.shape.dim[axis]
            dim.Clear()
            dim.dim_value = size
    return retyped(model)


def refusals(model: onnx.ModelProto) -> list[str]:
    fused, report = fuse_in_memory(model, "attention")
    assert not report.fusions, report.fusions
    return [miss["reason"] for miss in report.near_misses]


@pytest.mark.parametrize("kwargs", [dict(kt="reshape"), dict()], ids=["static_batch_2", "symbolic_batch"])
def test_values_broadcast_over_the_batch_are_not_fused(kwargs):
    reasons = refusals(with_dim(attention_model(**kwargs), "v", 0, 1))
    assert any("batch 1, which the MatMul broadcasts" in r for r in reasons), reasons


def test_one_key_widened_by_the_mask_is_not_fused():
    """k [B, N, 1, D]: the scores [B, N, S, 1] plus a [B, 1, S, S] mask are [B, N, S, S], read
    against v's S positions; the op takes K and V of one length."""
    reasons = refusals(with_dim(attention_model(kv_heads=4), "k", 2, 1))
    assert any("k and v lengths 1 vs seq" in r for r in reasons), reasons


def test_one_query_widened_by_the_mask_is_not_fused():
    """q [B, N, 1, D] with a [B, 1, S, S] mask: the mask widens the scores' query axis to S."""
    reasons = refusals(with_dim(attention_model(kv_heads=4), "q", 2, 1))
    assert any("does not broadcast" in r and "the mask" in r for r in reasons), reasons
