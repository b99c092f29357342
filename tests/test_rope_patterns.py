"""RoPE family on hand-built graphs: every spelling fuses with the right attributes and the fused
model matches the original; mutations are refused or fused with attributes that keep it exact."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusing import assert_same_outputs, attrs, fuse_model, fused_nodes
from graphs import rope_model, rope_sections_model


def fuse_rope(tmp_path, model, name="m"):
    return fuse_model(tmp_path, model, name, only=["rope"])


POSITIVE = {
    "half_slices": (dict(), "half", 0),
    "half_split": (dict(split=True), "half", 0),
    "half_partial": (dict(rotary_dim=8), "half", 8),
    "half_bsnd": (dict(layout="BSND"), "half", 0),
    "interleaved": (dict(mode="interleaved"), "interleaved", 0),
    "interleaved_partial_bsnd": (dict(mode="interleaved", rotary_dim=8, layout="BSND"), "interleaved", 8),
    "fp16": (dict(dtype=np.float16), "half", 0),
}


@pytest.mark.parametrize("variant", POSITIVE)
def test_rope_spellings_fuse_into_one_qk_node(tmp_path, variant):
    kwargs, mode, rotary_dim = POSITIVE[variant]
    fused, report = fuse_rope(tmp_path, rope_model(**kwargs))
    assert report.fusions == {"RotaryEmbeddingQK": 1}
    (node,) = fused_nodes(fused)
    assert attrs(node)["mode"].decode() == mode and attrs(node)["rotary_dim"] == rotary_dim
    assert list(node.output) == ["q_rot", "k_rot"]
    assert [n.op_type for n in fused.graph.node] == ["Identity", "Slice", "RotaryEmbeddingQK"]
    assert_same_outputs(tmp_path)


def test_single_rotation_stays_single(tmp_path):
    fused, report = fuse_rope(tmp_path, rope_model(pair=False))
    assert report.fusions == {"RotaryEmbedding": 1}
    assert_same_outputs(tmp_path)


# -- mutations --------------------------------------------------------------------------------------
def test_neg_on_the_wrong_half_is_not_fused(tmp_path):
    fused, _ = fuse_rope(tmp_path, rope_model(neg_first_half=True))
    assert fused is None


def test_split_point_off_the_middle_is_not_fused(tmp_path):
    fused, report = fuse_rope(tmp_path, rope_model(split_at=6))
    assert fused is None
    assert any("expected [0:8]" in miss["reason"] for miss in report.near_misses)


def test_split_op_off_the_middle_is_not_fused(tmp_path):
    fused, report = fuse_rope(tmp_path, rope_model(split=True, split_at=6))
    assert fused is None


def test_cos_and_sin_swapped_is_fused_with_the_tensors_swapped(tmp_path):
    # x*sin + rotate(x)*cos is still y = c*x + s*Mx with c=sin, s=cos: fused exactly, proven by diff.
    fused, report = fuse_rope(tmp_path, rope_model(cos_sin_swapped=True))
    (node,) = fused_nodes(fused)
    assert list(node.input[2:]) == ["sin", "cos"]
    assert_same_outputs(tmp_path)


def test_q_and_k_with_different_positions_are_not_paired(tmp_path):
    fused, report = fuse_rope(tmp_path, rope_model(k_positions_differ=True))
    assert report.fusions == {"RotaryEmbedding": 2}
    cos_inputs = sorted(node.input[1] for node in fused_nodes(fused))
    assert cos_inputs == ["cos", "cos_k"]
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("interior", ["Neg", "Concat"])
def test_rotated_value_used_elsewhere_blocks_that_fusion(tmp_path, interior):
    fused, report = fuse_rope(tmp_path, rope_model(extra_consumer=interior))
    assert report.fusions == {"RotaryEmbedding": 1}  # only the untouched k rotation
    assert any("also used by" in miss["reason"] for miss in report.near_misses)
    assert_same_outputs(tmp_path)


def test_cos_wider_than_the_rotation_is_not_fused(tmp_path):
    model = rope_model(rotary_dim=8)
    for value in model.graph.input:
        if value.name in ("cos", "sin"):
            value.type.tensor_type.shape.dim[-1].dim_value = 16  # lanes the rotation does not have
    model = onnx.shape_inference.infer_shapes(model)
    fused, report = fuse_model(tmp_path, model)
    assert fused is None


# -- multi-axis (sections) ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,widths", [
    (dict(), [4, 6, 6]),
    (dict(split=True), [4, 6, 6]),
    (dict(sections=(8, 8)), [8, 8]),
    (dict(sections=(4, 4, 4, 4)), [4, 4, 4, 4]),
])
def test_multi_axis_rope_fuses_into_one_node_with_sections(tmp_path, kwargs, widths):
    fused, report = fuse_rope(tmp_path, rope_sections_model(**kwargs))
    assert report.fusions == {"RotaryEmbedding": 1}
    (node,) = fused_nodes(fused)
    assert attrs(node)["sections"] == widths
    assert_same_outputs(tmp_path)


def test_sections_with_an_odd_width_are_not_fused_as_sections(tmp_path):
    fused, report = fuse_rope(tmp_path, rope_sections_model(sections=(5, 5, 6)))
    assert all("sections" not in attrs(n) or not attrs(n)["sections"] for n in fused_nodes(fused))
    assert any("not even widths" in miss["reason"] for miss in report.near_misses)
    assert_same_outputs(tmp_path)
