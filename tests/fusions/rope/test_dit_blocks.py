"""Rotary embeddings of diffusers' DiTs on real exports (models/fixtures/dit, models/dit_blocks.py).

diffusers' `apply_rotary_emb(use_real_unbind_dim=-1)` (Flux, CogVideoX, HunyuanVideo, LTX-Video)
takes the lanes as `x.reshape(.., D/2, 2).unbind(-1)`: `Reshape` to pairs, `Slice 0:1 / 1:2` (or a
`Split`) and `Squeeze`, then `stack([-x1, x0], -1).flatten()`, times full-width (repeat_interleave)
tables: the `interleaved` rotation (rope/rotations.py). Wan writes the rotated pairs back with
`out[..., 0::2] = ...` (ScatterND): no rule, but every rotation is reported as a rope site.

Mutations of the Flux rotation (the Neg on the other lane, a lane's Slice constant changed, an
extra reader of a lane) leave that rotation unfused and reported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusing import attrs, fused_nodes
from onnx import helper, numpy_helper

import otfuse

DIT = Path(__file__).resolve().parents[3] / "models" / "fixtures" / "dit"
MANIFEST = json.loads((DIT / "manifest.json").read_text())["fixtures"]
ROTATED = ["flux_attention", "ltx_block", "cogvideox_block_torchscript"]


def _fuse(tmp_path, model, only=None, name="m"):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    return src, out, otfuse.fuse(src, out, only=only)


def _diff_ok(src, out):
    for batch in (1, 3):
        result = otfuse.diff(src, out, dims={"batch": batch})
        assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("name", ROTATED)
def test_unbound_pair_rotations_fuse_interleaved(tmp_path, name):
    expected = MANIFEST[name]["expected"]
    src, out, report = _fuse(tmp_path, onnx.load(DIT / f"{name}.onnx"), only=["rope"])
    assert report.fusions == {"RotaryEmbeddingQK": expected["rope_applications"] // 2}, report.near_misses
    fused = onnx.load(out)
    (node,) = fused_nodes(fused)
    assert attrs(node)["mode"] == b"interleaved" and attrs(node)["rotary_dim"] == 0
    assert not [n for n in fused.graph.node if n.op_type == "Neg"], "a rotation was left unfused"
    _diff_ok(src, out)


def test_flux_joint_attention_folds_the_rotation(tmp_path):
    src, out, report = _fuse(tmp_path, onnx.load(DIT / "flux_attention.onnx"))
    assert report.fusions == {"RMSNorm": 4, "RopeAttention": 1}, report.near_misses
    assert report.near_misses == []
    (node,) = [n for n in fused_nodes(onnx.load(out)) if n.op_type == "RopeAttention"]
    assert attrs(node)["rotary_mode"] in (b"interleaved", "interleaved")
    _diff_ok(src, out)


def test_wan_scatter_rotations_are_reported_as_rope_sites(tmp_path):
    src, out, report = _fuse(tmp_path, onnx.load(DIT / "wan_attention.onnx"))
    assert report.fusions == {"Attention": 1, "RMSNorm": 2}
    rope = [m for m in report.near_misses if m["family"] == "rope"]
    assert len(rope) == MANIFEST["wan_attention"]["expected"]["rope_applications"]
    assert all(m["pattern"] == "rope site" and "lane pairs" in m["reason"] for m in rope)
    _diff_ok(src, out)


# -- mutations of the q rotation of flux_attention --

def _node(model, name):
    return next(n for n in model.graph.node if n.name == name)


def _neg_of_lane_zero(model):
    # stack([-x0, x0]): the Neg reads the even lane
    _node(model, "node_neg").input[0] = _node(model, "node_unbind__0").output[0]


def _odd_lane_from_zero(model):
    # the odd lane's Slice starts at 0: both lanes are x0 (a constant changed)
    model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "lane_start_zero"))
    model.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "lane_end_one"))
    _node(model, "node_Slice_161").input[1] = "lane_start_zero"
    _node(model, "node_Slice_161").input[2] = "lane_end_one"


def _lane_read_elsewhere(model):
    lane = _node(model, "node_unbind__1").output[0]
    model.graph.node.append(helper.make_node("Identity", [lane], ["lane_out"]))
    model.graph.output.append(helper.make_tensor_value_info("lane_out", onnx.TensorProto.FLOAT, None))


@pytest.mark.parametrize("mutate", [_neg_of_lane_zero, _odd_lane_from_zero, _lane_read_elsewhere])
def test_flux_rotation_mutations_are_near_misses(tmp_path, mutate):
    model = onnx.load(DIT / "flux_attention.onnx")
    mutate(model)
    src, out, report = _fuse(tmp_path, model, only=["rope"])
    assert report.fusions == {"RotaryEmbedding": 1}, report.fusions  # k alone, nothing to pair with
    assert [m for m in report.near_misses if m["family"] == "rope"], "the mutated rotation is not reported"
    _diff_ok(src, out)
