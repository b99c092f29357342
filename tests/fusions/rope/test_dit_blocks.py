"""Rotary embeddings of diffusers' DiTs on real exports (models/fixtures/dit, models/dit_blocks.py).

diffusers' `apply_rotary_emb(use_real_unbind_dim=-1)` (Flux, CogVideoX, HunyuanVideo, LTX-Video)
takes the lanes as `x.reshape(.., D/2, 2).unbind(-1)`: `Reshape` to pairs, `Slice 0:1 / 1:2` (or a
`Split`) and `Squeeze`, then `stack([-x1, x0], -1).flatten()`, times full-width (repeat_interleave)
tables: the `interleaved` rotation (rope/rotations.py). Wan computes `x0*c - x1*s`, `x0*s + x1*c`
and writes them back with `out[..., 0::2] = ...; out[..., 1::2] = ...` (ScatterND between
Transposes; rope/scatter_pairs.py), dynamic batch or static (the optimizer's folded form).

Mutations of the Flux rotation (the Neg on the other lane, a lane's Slice constant changed, an
extra reader of a lane) and of Wan's (the odd lane indices changed, the Sub's operands swapped, an
extra reader of the first scatter) leave that rotation unfused and reported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusing import attrs, fused_nodes
from onnx import helper, numpy_helper

import otfuse
from graphs import read_elsewhere

DIT = Path(__file__).resolve().parents[3] / "models" / "fixtures" / "dit"
MANIFEST = json.loads((DIT / "manifest.json").read_text())["fixtures"]
ROTATED = ["flux_attention", "ltx_block", "cogvideox_block_torchscript", "wan_attention", "wan_attention_static"]


def _fuse(tmp_path, model, only=None, name="m"):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    return src, out, otfuse.fuse(src, out, only=only)


def _diff_ok(src, out):
    static = all(d.dim_value for i in onnx.load(src).graph.input for d in i.type.tensor_type.shape.dim)
    for batch in (1, 3) if not static else (None,):
        result = otfuse.diff(src, out, dims={"batch": batch} if batch else None)
        assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("name", ROTATED)
def test_unbound_pair_rotations_fuse_interleaved(tmp_path, name):
    expected = MANIFEST[name]["expected"]
    src, out, report = _fuse(tmp_path, onnx.load(DIT / f"{name}.onnx"), only=["rope"])
    assert report.fusions == {"RotaryEmbeddingQK": expected["rope_applications"] // 2}, report.near_misses
    fused = onnx.load(out)
    (node,) = fused_nodes(fused)
    assert attrs(node)["mode"] == b"interleaved" and attrs(node)["rotary_dim"] == 0
    left = ("Neg", "ScatterND") if name.startswith("wan") else ("Neg",)  # CogVideoX scatters q[:, :, text:] back
    assert not [n for n in fused.graph.node if n.op_type in left], "a rotation was left unfused"
    _diff_ok(src, out)


def test_flux_joint_attention_folds_the_rotation(tmp_path):
    src, out, report = _fuse(tmp_path, onnx.load(DIT / "flux_attention.onnx"))
    assert report.fusions == {"RMSNorm": 4, "RopeAttention": 1}, report.near_misses
    assert report.near_misses == []
    (node,) = [n for n in fused_nodes(onnx.load(out)) if n.op_type == "RopeAttention"]
    assert attrs(node)["rotary_mode"] in (b"interleaved", "interleaved")
    _diff_ok(src, out)


@pytest.mark.parametrize("name", ["wan_attention", "wan_attention_static"])
def test_wan_attention_folds_the_scattered_rotation(tmp_path, name):
    src, out, report = _fuse(tmp_path, onnx.load(DIT / f"{name}.onnx"))
    assert report.fusions == {"RMSNorm": 2, "RopeAttention": 1}, report.near_misses
    assert report.near_misses == []
    _diff_ok(src, out)


# -- mutations of the q rotation: flux_attention, then wan_attention_static --

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
    read_elsewhere(model, _node(model, "node_unbind__1").output[0])


def _odd_lanes_changed(model):
    # the odd scatter writes lane 13 twice and never lane 15 (which keeps the base's zeros)
    indices = np.array([1, 3, 5, 7, 9, 11, 13, 13], np.int64).reshape(8, 1)
    model.graph.initializer.append(numpy_helper.from_array(indices, "odd_lanes_changed"))
    _node(model, "node_ScatterND_273").input[1] = "odd_lanes_changed"


def _real_part_swapped(model):
    # x1*s - x0*c: the Sub's operands swapped
    sub = _node(model, "node_sub")
    sub.input[0], sub.input[1] = sub.input[1], sub.input[0]


def _first_scatter_read_elsewhere(model):
    read_elsewhere(model, _node(model, "node_ScatterND_249").output[0])


# Each mutation breaks the q rotation only: k still fuses alone, the q site is one rope near miss.
@pytest.mark.parametrize("fixture,mutate", [
    ("flux_attention", _neg_of_lane_zero), ("flux_attention", _odd_lane_from_zero),
    ("flux_attention", _lane_read_elsewhere), ("wan_attention_static", _odd_lanes_changed),
    ("wan_attention_static", _real_part_swapped), ("wan_attention_static", _first_scatter_read_elsewhere),
])
def test_rotation_mutations_are_near_misses(tmp_path, fixture, mutate):
    model = onnx.load(DIT / f"{fixture}.onnx")
    mutate(model)
    src, out, report = _fuse(tmp_path, model, only=["rope"])
    assert report.fusions == {"RotaryEmbedding": 1}, report.fusions  # k alone, nothing to pair with
    rope = [m for m in report.near_misses if m["family"] == "rope"]
    assert len(rope) == 1, rope
    _diff_ok(src, out)
