"""Norm family on hand-built graphs: every spelling fuses with the right attributes and numerics;
every mutation of the subgraph is refused (or fused with attributes that keep it exact)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusing import assert_same_outputs, attrs, fuse_model, fused_nodes
from fusions.norm.graphs import rms_norm, single_norm_model
from graphs import F32, GraphBuilder
from onnx import helper


POSITIVE_RMS = {
    "pow_reciprocal": {},
    "mul_self_div": dict(square="mul", inverse="div"),
    "div_one": dict(inverse="div_one"),
    "weight_last": dict(weight_first=False),
    "axes_attribute_opset17": dict(axes_as_input=False),
    "gemma_one_plus_weight": dict(gemma=True),
    "eps_1e-5": dict(eps=1e-5),
    "axes_positive": dict(axes=(2,)),
}


@pytest.mark.parametrize("variant", POSITIVE_RMS)
def test_rms_norm_spellings_fuse_exactly(tmp_path, variant):
    kwargs = POSITIVE_RMS[variant]
    fused, report = fuse_model(tmp_path, single_norm_model("rms", **kwargs))
    assert report.fusions == {"RMSNorm": 1}
    (node,) = fused_nodes(fused)
    assert attrs(node)["axis"] == -1
    assert attrs(node)["epsilon"] == pytest.approx(kwargs.get("eps", 1e-6))
    assert node.output[0] == "y", "the fused node keeps the original output name"
    assert_same_outputs(tmp_path)


def test_fp16_with_casts_fuses_into_one_node(tmp_path):
    fused, report = fuse_model(tmp_path, single_norm_model("rms", dtype=np.float16, cast=True))
    assert report.fusions == {"RMSNorm": 1}
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm"]
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("kind,op", [("rms", "AddRMSNorm"), ("ln", "AddLayerNorm")])
def test_residual_add_fuses_with_sum_output(tmp_path, kind, op):
    fused, report = fuse_model(tmp_path, single_norm_model(kind, residual=True))
    assert report.fusions == {op: 1}
    node = fused_nodes(fused)[0]
    assert list(node.input[:2]) == ["x", "r"] and len(node.output) == 2
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("kwargs", [dict(), dict(bias=False), dict(square="mul")])
def test_decomposed_layer_norm_fuses(tmp_path, kwargs):
    fused, report = fuse_model(tmp_path, single_norm_model("ln", **kwargs))
    assert report.fusions == {"LayerNorm": 1}
    node = fused_nodes(fused)[0]
    assert len(node.input) == (3 if kwargs.get("bias", True) else 2)
    assert_same_outputs(tmp_path)


def test_onnx_layer_normalization_op_fuses(tmp_path):
    b = GraphBuilder(opset=17)
    x = b.input("x", F32, ["batch", "seq", 8])
    r = b.input("r", F32, ["batch", "seq", 8])
    s = b.node("Add", [x, r])
    b.node("LayerNormalization", [s, b.const(np.linspace(0.5, 1.5, 8).astype(np.float32)),
                                      b.const(np.linspace(-1, 1, 8).astype(np.float32))], epsilon=1e-3)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, ["batch", "seq", 8])
    b.nodes.append(helper.make_node("Identity", [s], ["s_out"]))
    b.output("s_out", F32, ["batch", "seq", 8])
    fused, report = fuse_model(tmp_path, b.model())
    assert report.fusions == {"AddLayerNorm": 1}
    assert attrs(fused_nodes(fused)[0])["epsilon"] == pytest.approx(1e-3)
    assert_same_outputs(tmp_path)


# -- mutations: the subgraph no longer computes the norm, so nothing may be fused --------------
NEGATIVE_RMS = {
    "eps_not_constant": (dict(eps_const=False), "not a constant"),
    "pow_exponent_3": (dict(exponent=3.0), "expected 2.0"),
    "reduce_over_seq_axis": (dict(axes=(1,)), "not the trailing axes"),
    "keepdims_0": (dict(keepdims=0), None),
    "weight_before_reduction": (dict(weight_before_reduce=True), None),
}


@pytest.mark.parametrize("variant", NEGATIVE_RMS)
def test_rms_norm_mutations_are_not_fused(tmp_path, variant):
    kwargs, reason = NEGATIVE_RMS[variant]
    fused, report = fuse_model(tmp_path, single_norm_model("rms", **kwargs))
    assert fused is None and report.fusions == {}
    if reason:
        assert any(reason in miss["reason"] for miss in report.near_misses), report.near_misses


def _with_extra_consumer(model: onnx.ModelProto, op_type: str) -> onnx.ModelProto:
    """Expose the output of the first ``op_type`` node as an extra graph output."""
    node = next(n for n in model.graph.node if n.op_type == op_type)
    model.graph.output.append(helper.make_empty_tensor_value_info(node.output[0]))
    model.graph.node.append(helper.make_node("Identity", [node.output[0]], ["leak"]))
    model.graph.output[-1].name = "leak"
    return model


@pytest.mark.parametrize("interior", ["ReduceMean", "Sqrt", "Reciprocal"])
def test_extra_consumer_of_interior_value_blocks_fusion(tmp_path, interior):
    fused, report = fuse_model(tmp_path, _with_extra_consumer(single_norm_model("rms"), interior))
    assert fused is None
    assert any("also used by" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_scale_broadcasting_over_rows_is_not_fused(tmp_path):
    weight = np.full((2, 1, 16), 1.1, dtype=np.float32)  # differs per batch row: not a norm scale
    fused, report = fuse_model(tmp_path, single_norm_model("rms", weight=weight))
    assert fused is None
    assert any("broadcasts" in miss["reason"] for miss in report.near_misses)


def test_scale_with_leading_ones_is_fused_with_row_shaped_scale(tmp_path):
    weight = np.linspace(0.5, 1.5, 16, dtype=np.float32).reshape(1, 1, 16)
    fused, report = fuse_model(tmp_path, single_norm_model("rms", weight=weight))
    assert report.fusions == {"RMSNorm": 1}
    scale = fused_nodes(fused)[0].input[1]
    (init,) = [t for t in fused.graph.initializer if t.name == scale]
    assert list(init.dims) == [16]
    assert_same_outputs(tmp_path)


def test_broadcasting_residual_add_fuses_only_the_norm(tmp_path):
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", "seq", 16])
    bias = b.const(np.linspace(-1, 1, 16).astype(np.float32))
    s = b.node("Add", [x, bias])  # a bias add, not a residual: operand shapes differ
    rms_norm(b, s, 16)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, ["batch", "seq", 16])
    fused, report = fuse_model(tmp_path, b.model())
    assert report.fusions == {"RMSNorm": 1}
    assert_same_outputs(tmp_path)


def test_layer_norm_mean_of_another_tensor_is_not_fused(tmp_path):
    model = single_norm_model("ln")
    # Re-point the first ReduceMean at another input: x - mean(z) is not a LayerNorm.
    model.graph.input.append(helper.make_tensor_value_info("z", F32, ["batch", "seq", 16]))
    first = next(n for n in model.graph.node if n.op_type == "ReduceMean")
    first.input[0] = "z"
    fused, report = fuse_model(tmp_path, model)
    # What remains is a genuine RMSNorm of (x - mean(z)) followed by the bias Add: that one may fuse.
    assert "LayerNorm" not in report.fusions and "AddLayerNorm" not in report.fusions
    assert report.fusions == {"RMSNorm": 1}


def test_fusing_a_fused_model_changes_nothing(tmp_path):
    fused, _ = fuse_model(tmp_path, single_norm_model("rms", residual=True))
    again, report = fuse_model(tmp_path, fused, name="again")
    assert again is None and report.fusions == {}
    assert onnx.load(tmp_path / "again_fused.onnx").graph == fused.graph
