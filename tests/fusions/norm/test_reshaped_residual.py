"""OPT's residual Adds reach their norms through a Reshape that merges (or splits) the leading dims
and keeps the normalised one: ``(residual + h).reshape(-1, hidden)`` -> LayerNorm. The Add is
absorbed (the fused node normalises the sum in its own shape and a copy of the Reshape shapes the
result); the Reshape stays where its output is read elsewhere (the next residual Add). A Reshape
that changes the normalised dim, a broadcasting Add, or a view no rule models leaves the plain
norm fused and the report says why (the downgrade, ``fused_as``)."""

from __future__ import annotations

import pytest
from pathlib import Path

import numpy as np
import onnx
from fusing import assert_same_outputs, fuse_model, fused_nodes
from fusions.norm.graphs import olmo_torchscript_model, reshaped_residual_model
from onnx import helper

import otfuse

OPT_FIXTURE = Path(__file__).with_name("data") / "opt_ts17.onnx"  # data/export_opt.py

RESIDUAL_OP = {"op": "AddLayerNorm", "ln": "AddLayerNorm", "rms": "AddRMSNorm"}


def _dims(form: str = "merge", **_) -> dict:
    return {"rows": 6} if form == "split" else {"batch": 2, "seq": 3}


def _reshapes(model) -> int:
    return sum(node.op_type == "Reshape" for node in model.graph.node)


@pytest.mark.parametrize("norm", RESIDUAL_OP)
@pytest.mark.parametrize("form", ["merge", "split"])
@pytest.mark.parametrize("shape_from_sum", [False, True])
def test_residual_through_a_row_keeping_reshape_fuses(tmp_path, norm, form, shape_from_sum):
    model = reshaped_residual_model(norm, form=form, shape_from_sum=shape_from_sum)
    fused, report = fuse_model(tmp_path, model, only=["norm"])
    assert report.fusions == {RESIDUAL_OP[norm]: 1}, report.near_misses
    assert not report.near_misses
    (node,) = fused_nodes(fused)
    assert list(node.input[:2]) == ["x", "r"] and node.output[1] == "sum_1"
    # the Reshape stays for the next residual Add; a copy shapes the normalised sum
    assert _reshapes(fused) == 2
    assert_same_outputs(tmp_path, dims=_dims(form))


@pytest.mark.parametrize("norm", RESIDUAL_OP)
def test_reshape_read_only_by_the_norm_is_absorbed(tmp_path, norm):
    fused, report = fuse_model(tmp_path, reshaped_residual_model(norm, reshaped_read=False), only=["norm"])
    assert report.fusions == {RESIDUAL_OP[norm]: 1} and not report.near_misses
    assert _reshapes(fused) == 1  # only the copy behind the fused node
    assert_same_outputs(tmp_path, dims=_dims())


@pytest.mark.parametrize("norm", RESIDUAL_OP)
def test_sum_read_elsewhere_keeps_its_values(tmp_path, norm):
    """A third reader of the Add reads the fused node's sum output, in the Add's own shape."""
    fused, report = fuse_model(tmp_path, reshaped_residual_model(norm, sum_read=True), only=["norm"])
    assert report.fusions == {RESIDUAL_OP[norm]: 1} and not report.near_misses
    assert_same_outputs(tmp_path, dims=_dims())


# -- mutations: the Add is not absorbed, the plain norm is fused and the downgrade reported ------
PLAIN_OP = {"op": "LayerNorm", "ln": "LayerNorm", "rms": "RMSNorm"}
MUTATIONS = {
    "reshape_changes_the_normalised_dim": (dict(form="narrow"), "changes the normalised dims from [16] to [8]"),
    "broadcasting_add": (dict(r_shape=[1, "seq", 16]), "residual Add may broadcast"),
    "transpose_between": (dict(view="Transpose"), "reaches the norm through Transpose"),
}


@pytest.mark.parametrize("norm", RESIDUAL_OP)
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_unabsorbed_residual_is_a_reported_downgrade(tmp_path, norm, mutation):
    kwargs, reason = MUTATIONS[mutation]
    fused, report = fuse_model(tmp_path, reshaped_residual_model(norm, **kwargs), only=["norm"])
    assert report.fusions == {PLAIN_OP[norm]: 1}, report.near_misses
    (miss,) = report.near_misses
    assert miss["fused_as"] == PLAIN_OP[norm] and "Add" in miss["pattern"], miss
    assert reason in miss["reason"], miss
    assert_same_outputs(tmp_path, dims=_dims(**kwargs))


# -- a real export: OPT (TorchScript, opset 17), every LayerNormalization behind a residual Add --
def test_opt_export_absorbs_every_residual(tmp_path):
    """Layer 0's first norm reads the embeddings' sum; the other four read a Reshape of a residual
    sum (to (-1, H) after attention, back to (B, S, H) after the MLP), read by the next Add too."""
    out = tmp_path / "opt_fused.onnx"
    report = otfuse.fuse(OPT_FIXTURE, out, only=["norm"])
    assert report.fusions == {"AddLayerNorm": 5} and not report.near_misses, report.near_misses
    result = otfuse.diff(OPT_FIXTURE, out, dims={"batch": 2, "seq": 7})
    assert result.ok, [row.to_dict() for row in result.outputs]


def test_opt_export_with_a_residual_sum_read_elsewhere_still_absorbs_it(tmp_path):
    model = onnx.load(OPT_FIXTURE)
    add = next(n for n in model.graph.node if n.op_type == "Add" and n.name.endswith("layers.0/Add"))
    model.graph.node.append(helper.make_node("Neg", [add.output[0]], ["sum_read"]))
    model.graph.output.append(helper.make_empty_tensor_value_info("sum_read"))
    fused, report = fuse_model(tmp_path, model, only=["norm"])
    assert report.fusions == {"AddLayerNorm": 5} and not report.near_misses, report.near_misses
    assert_same_outputs(tmp_path, dims={"batch": 2, "seq": 7})


def test_opt_export_with_a_reshape_narrowing_the_rows_is_a_reported_downgrade(tmp_path):
    """The merge Reshape re-pointed at (-1, H/2) rows would no longer be OPT (the next layers break),
    so only the norm behind it is kept: its Add is not absorbed, and the report says why."""
    model = onnx.load(OPT_FIXTURE)
    final = next(n for n in model.graph.node if n.name.endswith("decoder/final_layer_norm/LayerNormalization"))
    reshape = next(n for n in model.graph.node if final.input[0] in n.output)
    narrow = helper.make_tensor("narrow_rows", onnx.TensorProto.INT64, [2], [-1, 8])
    model.graph.initializer.append(narrow)
    reshape.input[1] = "narrow_rows"
    for position, name in enumerate(("scale_8", "bias_8")):
        model.graph.initializer.append(helper.make_tensor(name, onnx.TensorProto.FLOAT, [8], np.ones(8) * position))
        final.input[1 + position] = name
    keep = {final.output[0]}
    model.graph.output[0].CopyFrom(helper.make_empty_tensor_value_info(final.output[0]))
    del model.graph.node[[i for i, n in enumerate(model.graph.node) if n.output[0] in keep][0] + 1:]
    fused, report = fuse_model(tmp_path, model, only=["norm"])
    downgrades = [m for m in report.near_misses if m.get("fused_as") == "LayerNorm"]
    assert report.fusions == {"AddLayerNorm": 4, "LayerNorm": 1}, report.near_misses
    assert len(downgrades) == 1 and "changes the normalised dims from [16] to [8]" in downgrades[0]["reason"]
    assert_same_outputs(tmp_path, dims={"batch": 2, "seq": 7})


# -- OLMo's TorchScript spelling: Add -> Cast(float32) -> LayerNormalization ---------------------
def test_olmo_torchscript_residual_through_the_float32_cast_fuses(tmp_path):
    fused, report = fuse_model(tmp_path, olmo_torchscript_model(), only=["norm"])
    assert report.fusions == {"AddLayerNorm": 2} and not report.near_misses, report.near_misses
    assert_same_outputs(tmp_path, dims=_dims())


def test_olmo_torchscript_float16_sum_is_a_reported_downgrade(tmp_path):
    """A float16 sum normalised in float32 (the LayerNormalization outputs float32): not what
    AddLayerNorm outputs, so only the norm of the Cast is fused, and the report says why."""
    fused, report = fuse_model(tmp_path, olmo_torchscript_model(np.float16), only=["norm"])
    assert report.fusions == {"LayerNorm": 2}, report.near_misses
    assert len(report.near_misses) == 2, report.near_misses
    assert all(m["fused_as"] == "LayerNorm" and "float16" in m["reason"] for m in report.near_misses)
    assert_same_outputs(tmp_path, dims=_dims())


def test_simplified_layer_normalization_behind_an_unmodelled_view_is_a_reported_downgrade():
    """ORT's SimplifiedLayerNormalization (default domain) reads the residual sum through a
    Transpose: RMSNorm is fused, and the report names the Add it did not take."""
    from fusing import fuse_in_memory
    from graphs import F32, GraphBuilder

    b = GraphBuilder(opset=17)
    x, r = b.input("x", F32, ["batch", "seq", 16]), b.input("r", F32, ["batch", "seq", 16])
    view = b.node("Transpose", [b.node("Add", [x, r])], perm=[1, 0, 2])
    b.node("SimplifiedLayerNormalization", [view, b.const(np.ones(16, np.float32))], axis=-1, epsilon=1e-6)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, None)
    _, report = fuse_in_memory(b.model(), "norm")
    assert report.fusions == {"RMSNorm": 1}
    (miss,) = report.near_misses
    assert miss["fused_as"] == "RMSNorm" and "reaches the norm through Transpose" in miss["reason"], miss
