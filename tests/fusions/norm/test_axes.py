"""Norms over several trailing axes: otfuse's norm ops normalise ``[axis, rank)``, as ONNX's
LayerNormalization / RMSNormalization do with their ``axis`` and a ReduceMean over the trailing
axes does, so those fuse with that axis; a reduction that leaves a later axis out is refused
saying so."""

from __future__ import annotations

import numpy as np
import pytest
from fusing import assert_same_outputs, attrs, fuse_model, fused_nodes
from fusions.norm.graphs import rms_norm
from graphs import F32, GraphBuilder

ROW = (4, 8)


def _standard_op_model(op: str, axis: int, opset: int, row=ROW) -> tuple:
    b = GraphBuilder(opset=opset)
    x = b.input("x", F32, ["batch", *row])
    scale = b.const(np.linspace(0.5, 1.5, int(np.prod(row)), dtype=np.float32).reshape(row))
    inputs = [x, scale] + ([b.const(np.full(row, 0.25, np.float32))] if op == "LayerNormalization" else [])
    b.node(op, inputs, axis=axis, epsilon=1e-4)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, ["batch", *row])
    return b.model()


@pytest.mark.parametrize("op,opset,fused_op", [("LayerNormalization", 17, "LayerNorm"),
                                                ("RMSNormalization", 23, "RMSNorm")])
@pytest.mark.parametrize("axis", [1, -2])
def test_standard_op_over_the_trailing_axes_from_axis_fuses(tmp_path, op, opset, fused_op, axis):
    fused, report = fuse_model(tmp_path, _standard_op_model(op, axis, opset), only=["norm"])
    assert report.fusions == {fused_op: 1}, report.near_misses
    assert attrs(fused_nodes(fused)[0])["axis"] == -2
    assert_same_outputs(tmp_path, dims={"batch": 3})


def test_standard_op_over_dynamic_dims_names_them(tmp_path):
    """axis 0 takes the dynamic batch in: the scale's shape cannot be proven (not "not trailing")."""
    fused, report = fuse_model(tmp_path, _standard_op_model("LayerNormalization", 0, 17), only=["norm"])
    assert fused is None
    (miss,) = report.near_misses
    assert "normalised dims" in miss["reason"] and "not static" in miss["reason"], miss


def _reduce_mean_model(axes) -> tuple:
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", *ROW])
    weight = np.linspace(0.5, 1.5, 32, dtype=np.float32).reshape(ROW if len(axes) == 2 else ROW[-1:])
    rms_norm(b, x, ROW[-1], weight=weight, axes=axes)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, ["batch", *ROW]) if len(axes) == 2 else b.output("y", F32, None)
    return b.model()


@pytest.mark.parametrize("axes", [(-2, -1), (1, 2), (2, 1)])
def test_reduce_mean_over_several_trailing_axes_fuses(tmp_path, axes):
    fused, report = fuse_model(tmp_path, _reduce_mean_model(axes), only=["norm"])
    assert report.fusions == {"RMSNorm": 1}, report.near_misses
    assert attrs(fused_nodes(fused)[0])["axis"] == -2
    assert_same_outputs(tmp_path, dims={"batch": 3})


def test_reduce_mean_leaving_the_last_axis_out_is_refused_saying_so(tmp_path):
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", *ROW])
    rms_norm(b, x, ROW[-1], weight=np.ones((4, 1), np.float32), axes=(1,))
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, None)
    fused, report = fuse_model(tmp_path, b.model(), only=["norm"])
    assert fused is None
    assert any("axes [1] are not the trailing axes of a rank-3 input" in m["reason"] for m in report.near_misses)
