"""Norm spellings of transformers 5.x decoders (models/fixtures/arch5, models/decoder_configs.py):

- Gemma 3n writes its RMSNorm as ``x * pow(mean(x²) + eps, -0.5)``; its v_norm has no weight at all
  (``with_scale=False``): fused as RMSNorm with a scale of ones (rules.RMS_NORM_UNSCALED).
- HunYuan normalises q and k per head *after* the rotation: the rotation's ``x*cos + rotate(x)*sin``
  is no residual sum (residual.is_rotation_sum), so the norm is a plain RMSNorm and the rope family
  still fuses the rotation.
- Bamba's Mamba2 gated RMSNorm normalises groups of a view and applies the weight after viewing
  back: fused with a unit scale, the weight's Mul reported as staying.

Mutations (another power, a plain residual sum, the weight read inside) keep the old outcome."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusing import assert_same_outputs, attrs, fuse_model, fused_nodes
from fusions.norm.graphs import rms_norm, single_norm_model
from fusions.rope.graphs import rotate_half
from graphs import F32, GraphBuilder
from onnx import numpy_helper

import otfuse
from bench.coverage import fused_sites, materialise

ARCH5 = Path(__file__).resolve().parents[3] / "models" / "fixtures" / "arch5"
VARIANTS = json.loads((ARCH5 / "manifest.json").read_text())["models"]
DIMS = {"batch": 2, "seq": 7}


def _fuse_fixture(tmp_path, name, only=None):
    src = materialise(ARCH5 / VARIANTS[name]["file"], tmp_path)
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(src, out, only=only)
    return src, out, report


def _unit_scale(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    scale = next(t for t in model.graph.initializer if t.name == node.input[1])
    return bool(np.all(numpy_helper.to_array(scale) == 1.0))


# -- Gemma 3n: x * pow(mean + eps, -0.5), with and without a weight ---------------------------------

@pytest.mark.parametrize("kwargs", [dict(), dict(weight_first=False), dict(gemma=True), dict(square="mul")])
def test_pow_minus_half_fuses_exactly(tmp_path, kwargs):
    fused, report = fuse_model(tmp_path, single_norm_model("rms", inverse="pow", **kwargs))
    assert report.fusions == {"RMSNorm": 1}
    (node,) = fused_nodes(fused)
    assert attrs(node)["epsilon"] == pytest.approx(1e-6) and attrs(node)["axis"] == -1
    assert not [n for n in fused.graph.node if n.op_type == "Pow"]
    assert_same_outputs(tmp_path)


def test_unscaled_norm_fuses_with_a_unit_scale(tmp_path):
    fused, report = fuse_model(tmp_path, single_norm_model("rms", inverse="pow", scaled=False))
    assert report.fusions == {"RMSNorm": 1}
    (node,) = fused_nodes(fused)
    assert _unit_scale(fused, node) and node.output[0] == "y"
    assert not report.near_misses, report.near_misses
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("inverse", ["reciprocal", "div"])
def test_unscaled_sqrt_spellings_fuse_too(tmp_path, inverse):
    fused, report = fuse_model(tmp_path, single_norm_model("rms", inverse=inverse, scaled=False))
    assert report.fusions == {"RMSNorm": 1}
    assert_same_outputs(tmp_path)


def test_unscaled_float16_with_casts_fuses(tmp_path):
    fused, report = fuse_model(tmp_path, single_norm_model("rms", inverse="pow", scaled=False, cast=True,
                                                           dtype=np.float16))
    assert report.fusions == {"RMSNorm": 1}
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm"]
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("power", [-0.4, 0.5, -1.0])
@pytest.mark.parametrize("scaled", [True, False])
def test_other_powers_are_not_fused_and_the_site_is_reported(tmp_path, power, scaled):
    fused, report = fuse_model(tmp_path, single_norm_model("rms", inverse="pow", power=power, scaled=scaled))
    assert fused is None
    assert any(miss["family"] == "norm" and ("expected -0.5" in miss["reason"] or miss["pattern"] == "norm site")
               for miss in report.near_misses), report.near_misses


def test_unscaled_norm_over_another_axis_is_not_fused(tmp_path):
    fused, report = fuse_model(tmp_path, single_norm_model("rms", inverse="pow", scaled=False, axes=(1,)))
    assert fused is None


def test_unscaled_norm_whose_mean_reads_another_tensor_is_not_fused(tmp_path):
    fused, report = fuse_model(tmp_path, single_norm_model("rms", inverse="pow", scaled=False,
                                                           weight_before_reduce=True))
    assert fused is None


def test_gemma3n_export_fuses_every_norm(tmp_path):
    name = "gemma3n_text_fx/ts17_pos_dyn"
    expected = VARIANTS[name]["expected"]
    src, out, report = _fuse_fixture(tmp_path, name)
    sites = fused_sites(report.fusions)  # a norm that feeds projections is one site of a *NormLinear
    assert sites["norm"] == expected["norm"] == 24, report.fusions
    assert sites["residual_norm"] == expected["residual_norm"]
    assert report.fusions.get("RotaryEmbeddingQK") == expected["rope"]
    assert otfuse.diff(src, out, dims=DIMS).ok


# -- HunYuan: RMSNorm of the rotated q and k --------------------------------------------------------

def _norm_after_rope_model(rotated: bool = True) -> onnx.ModelProto:
    """x [B, N, S, 16] -> x*cos + rotate_half(x)*sin -> per-head RMSNorm (rotated=False: the second
    product reads a plain Mul instead of the rotation, an ordinary sum of two values)."""
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", 2, "seq", 16])
    cos = b.input("cos", F32, ["batch", 1, "seq", 16])
    sin = b.input("sin", F32, ["batch", 1, "seq", 16])
    other = rotate_half(b, x, 16) if rotated else b.node("Mul", [x, b.const(np.float32(0.5))])
    summed = b.node("Add", [b.node("Mul", [x, cos]), b.node("Mul", [other, sin])])
    rms_norm(b, summed, 16)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, ["batch", 2, "seq", 16])
    return b.model()


def test_norm_of_a_rotation_leaves_the_rotation_to_the_rope_family(tmp_path):
    fused, report = fuse_model(tmp_path, _norm_after_rope_model(), only=["norm", "rope"])
    assert report.fusions == {"RMSNorm": 1, "RotaryEmbedding": 1}, report.fusions
    assert not report.near_misses, report.near_misses
    assert_same_outputs(tmp_path)


def test_norm_alone_does_not_absorb_the_rotation_sum(tmp_path):
    fused, report = fuse_model(tmp_path, _norm_after_rope_model(), only=["norm"])
    assert report.fusions == {"RMSNorm": 1}, report.fusions
    assert [n for n in fused.graph.node if n.op_type == "Add" and n.domain == ""], "the rotation's Add stays"


def test_sum_of_plain_products_is_still_a_residual(tmp_path):
    fused, report = fuse_model(tmp_path, _norm_after_rope_model(rotated=False), only=["norm"])
    assert report.fusions == {"AddRMSNorm": 1}, report.fusions


@pytest.mark.parametrize("variant", ["dynamo_pos_dyn", "ts17_pos_dyn"])
def test_hunyuan_export_fuses_rotations_and_norms(tmp_path, variant):
    name = f"hunyuan_v1_dense_fx/{variant}"
    expected = VARIANTS[name]["expected"]
    src, out, report = _fuse_fixture(tmp_path, name)
    assert report.fusions.get("RotaryEmbeddingQK") == expected["rope"] == 2, report.fusions
    sites = fused_sites(report.fusions)  # a norm that feeds projections is one site of a *NormLinear
    assert sites["residual_norm"] == expected["residual_norm"] == 4, report.fusions
    assert sites["norm"] == expected["norm"] == 9, report.fusions
    assert report.fusions.get("Attention") == expected["attention"]
    assert not [m for m in report.near_misses if m["family"] in ("rope", "norm")], report.near_misses
    assert otfuse.diff(src, out, dims=DIMS).ok


# -- Bamba: Mamba2's grouped gated RMSNorm -----------------------------------------------------------

def test_bamba_gated_group_norm_fuses_with_a_unit_scale_and_says_so(tmp_path):
    name = "bamba_fx/dynamo_pos_dyn"
    expected = VARIANTS[name]["expected"]
    src, out, report = _fuse_fixture(tmp_path, name)
    assert fused_sites(report.fusions)["norm"] == expected["norm"], report.fusions  # *NormLinear included
    partial = [m for m in report.near_misses if m["pattern"] == "RMSNorm(no scale): scale"]
    assert len(partial) == 1 and partial[0]["fused_as"] == "RMSNorm", report.near_misses
    assert "stays after it" in partial[0]["reason"]
    assert otfuse.diff(src, out, dims=DIMS).ok
