"""The masks exporters build in the graph are claimed as causal / window / key padding only when
running the mask's own subgraph agrees; any other mask is kept as an additive bias (still exact)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fixtures import fixture_path

import otfuse
from otfuse.patterns.masks import classify_mask
from otfuse.rewriter.graph import GraphIndex


def _attention_attrs(path):
    """The first attention node's attributes, and its (attn_bias, key_padding_mask) inputs."""
    node = next(n for n in onnx.load(path).graph.node if n.op_type in ("Attention", "RopeAttention"))
    first_mask_input = 5 if node.op_type == "RopeAttention" else 3  # after q, k, v (, cos, sin)
    masks = list(node.input[first_mask_input:first_mask_input + 2]) + ["", ""]
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}, masks[:2]


def _fuse_and_diff(tmp_path, model: onnx.ModelProto, name: str):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    otfuse.fuse(src, out)
    result = otfuse.diff(src, out, dims={"batch": 2, "seq": 9})
    assert result.ok, [row.to_dict() for row in result.outputs]
    return out


@pytest.mark.parametrize("name,causal,window", [
    ("llama", 1, 0), ("mistral", 1, 4), ("qwen3", 1, 0), ("llama_kv", 1, 0), ("bloom", 1, 0), ("bert", 0, 0),
])
def test_exported_masks_become_causal_window_and_padding(tmp_path, name, causal, window):
    out = tmp_path / "f.onnx"
    otfuse.fuse(fixture_path(name), out)
    attrs, (bias, padding) = _attention_attrs(out)
    assert (attrs.get("causal", 0), attrs.get("window", 0)) == (causal, window)
    assert padding == "attention_mask"  # key_padding_mask: the model's own [B, Skv] input
    assert not any(n.op_type == "Where" for n in onnx.load(out).graph.node), "the S x S mask is gone"


def _mutated(name: str, mutate) -> onnx.ModelProto:
    model = onnx.load(fixture_path(name))
    mutate(model)
    return model


def test_anti_causal_mask_is_not_claimed_causal(tmp_path):
    def swap(model):
        node = next(n for n in model.graph.node if n.op_type == "LessOrEqual")
        node.input[0], node.input[1] = node.input[1], node.input[0]  # j >= i: not causal
    out = _fuse_and_diff(tmp_path, _mutated("llama", swap), "anti")
    attrs, (bias, padding) = _attention_attrs(out)
    assert attrs.get("causal", 0) == 0 and bias and not padding, "kept as an additive bias"


def test_another_window_size_is_claimed_as_that_size(tmp_path):
    def narrower(model):
        sub = next(n for n in model.graph.node if n.op_type == "Sub" and
                   any(i.name == n.input[1] for i in model.graph.initializer))
        init = next(i for i in model.graph.initializer if i.name == sub.input[1])
        value = onnx.numpy_helper.to_array(init)
        init.CopyFrom(onnx.numpy_helper.from_array(np.asarray(2, dtype=value.dtype), init.name))
    out = _fuse_and_diff(tmp_path, _mutated("mistral", narrower), "window2")
    attrs, _ = _attention_attrs(out)
    assert attrs["window"] == 2


def test_mask_with_a_small_fill_is_kept_as_a_bias(tmp_path):
    def soft(model):
        where = next(n for n in model.graph.node if n.op_type == "Where" and
                     any(i.name == n.input[2] for i in model.graph.initializer))
        init = next(i for i in model.graph.initializer if i.name == where.input[2])
        init.CopyFrom(onnx.numpy_helper.from_array(np.asarray(-3.0, dtype=np.float32), init.name))
    out = _fuse_and_diff(tmp_path, _mutated("llama", soft), "soft")
    attrs, (bias, padding) = _attention_attrs(out)
    assert attrs.get("causal", 0) == 0 and bias and not padding


def test_claims_are_explained_when_refused():
    model = _mutated("llama", lambda m: None)
    graph = GraphIndex(model)
    where = next(n for n in model.graph.node if n.op_type == "Where")
    node = next(n for n in model.graph.node if n.op_type == "LessOrEqual")
    node.input[0], node.input[1] = node.input[1], node.input[0]
    graph = GraphIndex(model)
    reason = classify_mask(graph, where.output[0], {})
    assert isinstance(reason, str) and "contradicts" in reason
