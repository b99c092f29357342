"""Attention family on hand-built SDPA graphs: spellings fuse with the right attributes and exact
numerics; mutations are refused or fused with attributes that keep them exact."""

from __future__ import annotations

import numpy as np
import pytest
from fusing import assert_same_outputs, attrs, fuse_model, fused_nodes
from graphs import attention_model


def fuse_attention(tmp_path, model):
    return fuse_model(tmp_path, model, only=["attention"])


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(kt="reshape3"),
    dict(scale_at="scores_div"),
    dict(kv_heads=4),
    dict(kv_heads=1),
    dict(mask=False, nan_guard=False, out_transpose=False),
    dict(dtype=np.float16),
], ids=["gqa", "kt_reshape_transpose_reshape", "scale_on_scores", "mha", "mqa", "bare", "fp16"])
def test_sdpa_spellings_fuse_into_one_attention_node(tmp_path, kwargs):
    fused, report = fuse_attention(tmp_path, attention_model(**kwargs))
    assert report.fusions == {"Attention": 1}
    assert [n.op_type for n in fused.graph.node] == ["Attention"], "repeat_kv must be absorbed"
    node = fused_nodes(fused)[0]
    a = attrs(node)
    assert a["num_heads"] == 4 and a["kv_num_heads"] == kwargs.get("kv_heads", 2)
    assert a["scale"] == pytest.approx(8 ** -0.5, rel=1e-3)
    assert a["output_layout"].decode() == ("BNSD" if kwargs.get("out_transpose") is False else "BSND")
    assert_same_outputs(tmp_path)


def test_scale_split_unevenly_is_fused_with_the_product(tmp_path):
    fused, report = fuse_attention(tmp_path, attention_model(q_scale=0.5, k_scale=0.25))
    assert attrs(fused_nodes(fused)[0])["scale"] == pytest.approx(0.125)
    assert_same_outputs(tmp_path)


def test_scale_from_a_graph_input_is_not_fused(tmp_path):
    fused, report = fuse_attention(tmp_path, attention_model(scale_input=True))
    assert fused is None
    assert any("not a constant" in miss["reason"] for miss in report.near_misses)


def test_softmax_over_another_axis_is_not_fused(tmp_path):
    fused, report = fuse_attention(tmp_path, attention_model(softmax_axis=2))
    assert fused is None
    assert any("Softmax runs over axis 2" in miss["reason"] for miss in report.near_misses)


def test_k_not_transposed_is_not_fused(tmp_path):
    fused, _ = fuse_attention(tmp_path, attention_model(k_perm=(0, 1, 2, 3)))
    assert fused is None


def test_v_from_another_head_grouping_keeps_its_repeat(tmp_path):
    # v repeated as [v0, v1, v0, v1] (not HF's [v0, v0, v1, v1]): its repeat is not an index map
    # the kernel knows, so the fused node must read the repeated tensor and count every head.
    fused, report = fuse_attention(tmp_path, attention_model(v_grouping="other"))
    node = fused_nodes(fused)[0]
    assert attrs(node)["kv_num_heads"] == 4
    assert "Expand" in [n.op_type for n in fused.graph.node]
    assert_same_outputs(tmp_path)


def test_probabilities_used_elsewhere_block_the_fusion(tmp_path):
    fused, report = fuse_attention(tmp_path, attention_model(leak_probs=True))
    assert fused is None
    assert any("also used by" in miss["reason"] for miss in report.near_misses)
