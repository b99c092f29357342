"""A decoder exported with ``input_ids`` only (models/input_ids_only.py: tiny LLaMA, dynamo):
transformers builds the causal mask from the input's shape alone, with its packed-sequence test
(Range -> diff == 1 -> CumSum -> GatherND -> Equal) in the condition. It is claimed as
``causal = 1`` (proven by running the mask); mutations that change what it computes keep it as a
bias and report the site."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fixtures import FIXTURES
from fusing import attrs, fused_nodes

import otfuse

FIXTURE = FIXTURES / "ids_only" / "llama_ids_only.onnx"


def _fuse(tmp_path, model: onnx.ModelProto):
    src, dst = tmp_path / "m.onnx", tmp_path / "m_fused.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, dst)
    return onnx.load(dst), report, src, dst


def _attention(fused: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in fused_nodes(fused) if n.op_type.endswith("Attention")]
    return node


def test_the_shape_built_causal_mask_is_claimed(tmp_path):
    fused, report, src, dst = _fuse(tmp_path, onnx.load(FIXTURE))
    assert report.fusions["RopeAttention"] == 1
    node = _attention(fused)
    assert attrs(node)["causal"] == 1 and attrs(node)["window"] == 0
    assert len(node.input) <= 5 or not node.input[5], "no attn_bias"
    assert not any(m.get("fused_as") for m in report.near_misses), report.near_misses
    assert not any(n.op_type in ("CumSum", "GatherND") for n in fused.graph.node)
    for seq in (1, 7, 19):
        assert otfuse.diff(src, dst, dims={"batch": 2, "seq": seq}).ok


def _node(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.op_type == op_type]
    return node


def _packed_boundary_every_step(model: onnx.ModelProto) -> None:
    """diff == 2 instead of 1: every position starts a new packed sequence (only the diagonal)."""
    equal = next(n for n in model.graph.node if n.op_type == "Equal" and
                 any(p.op_type == "Sub" for p in model.graph.node if p.output[0] == n.input[0]))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(2, np.int64), "two"))
    equal.input[1] = "two"


def _strictly_below_the_diagonal(model: onnx.ModelProto) -> None:
    _node(model, "LessOrEqual").op_type = "Less"


@pytest.mark.parametrize("mutate", [_packed_boundary_every_step, _strictly_below_the_diagonal])
def test_a_mask_that_is_not_causal_stays_a_bias_and_is_reported(tmp_path, mutate):
    model = onnx.load(FIXTURE)
    mutate(model)
    fused, report, src, dst = _fuse(tmp_path, model)
    node = _attention(fused)
    assert not attrs(node).get("causal")
    assert node.input[5], "the mask is added as attn_bias"
    (miss,) = [m for m in report.near_misses if m.get("fused_as")]
    assert "materialised attn_bias" in miss["pattern"] and "contradicts" in miss["reason"], miss
    assert otfuse.diff(src, dst, dims={"batch": 2, "seq": 5}).ok
