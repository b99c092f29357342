"""Inputs onnx.checker rejects but ONNX Runtime runs (issue 11, items 3-4): otfuse keeps its
fusions, says in one note what in the input is non-standard, and accepts the fused model only
because the checker finds nothing new in it and ORT loads it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusions.norm.graphs import layer_norm_decomposed, rms_norm
from graphs import F32, GraphBuilder
from onnx import TensorProto, helper

import otfuse
from otfuse.errors import InternalError
from otfuse.rewriter.model_io import load_model
from otfuse.verify.validation import validate_fused

HIDDEN = 16


def _checker_error(model: onnx.ModelProto) -> str:
    with pytest.raises(onnx.checker.ValidationError) as info:
        onnx.checker.check_model(model)
    return str(info.value)


def _as_written(b: GraphBuilder) -> onnx.ModelProto:
    """The builder's graph without shape inference (which would fill in what the test leaves out)."""
    graph = helper.make_graph(b.nodes, "g", b.inputs, b.outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)])
    model.ir_version = 9
    return model


def exposed_mean_without_shape() -> onnx.ModelProto:
    """A LayerNorm whose mean is also a graph output declared with no shape (as some exporters and
    hand-written graphs do): the checker requires the shape field, ORT does not."""
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", "seq", HIDDEN])
    layer_norm_decomposed(b, x, HIDDEN)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, ["batch", "seq", HIDDEN])
    mean = next(n for n in b.nodes if n.op_type == "ReduceMean").output[0]
    b.outputs.append(helper.make_tensor_value_info(mean, TensorProto.FLOAT, None))
    return _as_written(b)


def ort_simplified_layer_norm_in_default_domain() -> onnx.ModelProto:
    """A decomposed RMSNorm followed by ORT's own SimplifiedLayerNormalization, written in the
    default domain as ORT's offline optimiser saves it; stash_type 0, which otfuse does not
    re-target (fusions/norm/contrib.py), so the non-standard op stays in the fused model."""
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", "seq", HIDDEN])
    normed = rms_norm(b, x, HIDDEN)
    scale = b.const((1 + 0.05 * np.arange(HIDDEN)).astype(np.float32), "ort_scale")
    b.nodes.append(helper.make_node("SimplifiedLayerNormalization", [normed, scale], ["y"], name="sln",
                                    axis=-1, epsilon=1e-6, stash_type=0))
    b.output("y", F32, ["batch", "seq", HIDDEN])
    return _as_written(b)


def layer_normalization_at_opset_16() -> onnx.ModelProto:
    """ONNX has LayerNormalization from opset 17; ORT registers its own in the default domain for
    earlier opsets (same attributes and math), and older exporters wrote it."""
    b = GraphBuilder(opset=16)
    x = b.input("x", F32, ["batch", "seq", HIDDEN])
    scale = b.const((1 + 0.1 * np.arange(HIDDEN)).astype(np.float32), "scale")
    bias = b.const(np.full(HIDDEN, 0.1, np.float32), "bias")
    b.nodes.append(helper.make_node("LayerNormalization", [x, scale, bias], ["y"], name="ln", axis=-1,
                                    epsilon=1e-5))
    b.output("y", F32, ["batch", "seq", HIDDEN])
    return _as_written(b)


@pytest.mark.parametrize("make, what", [
    (exposed_mean_without_shape, "shape"),
    (ort_simplified_layer_norm_in_default_domain, "SimplifiedLayerNormalization"),
])
def test_fused_and_written_with_a_note(tmp_path, make, what):
    model = make()
    assert what in _checker_error(model)
    src, out = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out)
    assert report.fusions
    assert any("not standard ONNX" in note and what in note for note in report.notes), report.notes
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 5}).ok


def test_layer_normalization_before_opset_17_is_fused_into_a_standard_model(tmp_path):
    model = layer_normalization_at_opset_16()
    assert "LayerNormalization" in _checker_error(model)
    src, out = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out)
    assert report.fusions == {"LayerNorm": 1}
    onnx.checker.check_model(onnx.load(out))  # the non-standard node is gone
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 5}).ok


def test_a_new_checker_failure_is_still_an_internal_error(tmp_path):
    """The input fails the checker; the fused model additionally reads a value nothing produces
    (what a broken rule would write): ORT refuses it, so it is our bug."""
    src = tmp_path / "m.onnx"
    onnx.save(exposed_mean_without_shape(), src)
    loaded = load_model(src)
    broken = onnx.ModelProto()
    broken.CopyFrom(loaded.model)
    broken.graph.node[-1].input[0] = "nowhere"
    with pytest.raises(InternalError, match="does not load it"):
        validate_fused(broken, loaded)


@pytest.mark.parametrize("version, hinted", [("1.29.0", True), ("1.23.2", True), ("1.30.0", False),
                                             ("1.32.0", False), ("2.0.0", False), ("1.31.0.dev20261201", False)])
def test_an_ort_target_refused_by_an_older_onnxruntime_says_which_it_needs(monkeypatch, version, hinted):
    # ORT 1.23-1.29 do not know GroupQueryAttention's `causal` attribute (checked on each, 2026-12-05):
    # the internal error then names the version the ort target writes for.
    import onnxruntime

    from otfuse.verify import validation

    monkeypatch.setattr(onnxruntime, "__version__", version)
    hint = validation._old_ort_hint()
    assert ("ONNX Runtime >= 1.30" in hint and version in hint) if hinted else hint == ""
