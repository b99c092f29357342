"""The pass manager's own guards, on real exports that exercise them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fixtures import fixture_path
from fusions.norm.graphs import layer_norm_decomposed, rms_norm
from graphs import F32, GraphBuilder

import otfuse


def _shape_read_through_identity(model: onnx.ModelProto) -> onnx.ModelProto:
    """meta_rope_causal with each Shape of an interior value reading it through a Neg (an Identity
    or a same-type Cast would be dropped by the no_ops canonicaliser; the shape is the same), and
    the mask made anti-causal (``Trilu(upper=1)``: no claim, so the fused node must read it): a
    value (not a shape) now leaves the match."""
    producers = {out: node for node in model.graph.node for out in node.output}
    for node in model.graph.node:
        if node.op_type == "Trilu":
            node.attribute[0].i = 1
    for node in list(model.graph.node):
        source = producers.get(node.input[0]) if node.op_type == "Shape" else None
        if source is not None and source.op_type == "Transpose":
            copy = onnx.helper.make_node("Neg", [node.input[0]], [node.input[0] + "_copy"])
            node.input[0] = copy.output[0]
            model.graph.node.insert(list(model.graph.node).index(node), copy)
    return model


def test_a_shape_read_of_the_interior_is_rebuilt_from_the_fused_node_inputs(tmp_path):
    """meta_rope_causal: the causal mask is sized by Shape(transpose(q_rot)), a value inside the
    BSND RopeAttention match. Only its shape crosses the boundary, and the dimension engine proves
    the dims read equal q's: the Shape is rebuilt from q (rewriter/interior_shapes.py) and the whole
    site is one RopeAttention; the fused model is valid and matches."""
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(fixture_path("meta_rope_causal"), out)
    assert report.fusions == {"RopeAttention": 1}
    assert not report.near_misses
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert otfuse.diff(fixture_path("meta_rope_causal"), out, dims={"batch": 2}).ok


def test_a_fusion_is_refused_when_its_node_would_read_a_value_derived_from_its_interior(tmp_path):
    """The same with a Neg between the interior value and its Shape: a value leaves the
    match and the fused node would read what it computes. Fusing it anyway left the graph reading a
    removed value (the fused model failed onnx.checker). The fold is refused; the rotation and the
    attention fuse separately, reported once as a downgrade, and the outputs match."""
    source = tmp_path / "identity.onnx"
    onnx.save(_shape_read_through_identity(onnx.load(fixture_path("meta_rope_causal"))), source)
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(source, out)
    assert report.fusions == {"RotaryEmbeddingQK": 1, "Attention": 1}
    downgrades = [m for m in report.near_misses if m.get("fused_as") and "mask kept" not in m["pattern"]]
    assert len(downgrades) == 1, report.near_misses
    assert any("mask kept" in m["pattern"] for m in report.near_misses)  # the anti-causal mask, as a bias
    (miss,) = downgrades
    assert miss["pattern"].startswith("RopeAttention") and miss["fused_as"] == "RotaryEmbeddingQK + Attention"
    assert "computed from" in miss["reason"], miss
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert otfuse.diff(source, out, dims={"batch": 2}).ok


def _norm_whose_scale_reads_the_residual_sum(norm: str, scale: str) -> onnx.ModelProto:
    """A norm of the residual sum x whose scale is computed from x: ``CastLike(w, x)`` (onnxscript's
    unoptimised output: whisper encoder, phi-2), which needs only x's type, or ``w + mean(x)``
    (``data``), which needs its values."""
    hidden = 16
    b = GraphBuilder()
    x, r = b.input("x", F32, ["batch", "seq", hidden]), b.input("r", F32, ["batch", "seq", hidden])
    total = b.node("Add", [x, r], base="sum")
    weight = (1 + 0.1 * np.arange(hidden)).astype(np.float32)
    if norm == "rms":
        rms_norm(b, total, hidden, weight=weight)
    else:
        layer_norm_decomposed(b, total, hidden, bias=False)
    scale_mul = b.nodes[-1]
    weights = {t.name for t in b.inits}
    scale_index = next(i for i, name in enumerate(scale_mul.input) if name in weights)
    w = scale_mul.input[scale_index]
    if scale == "castlike":
        scale_mul.input[scale_index] = b.node("CastLike", [w, total])
    else:
        scale_mul.input[scale_index] = b.node("Add", [w, b.node("ReduceMean", [total], keepdims=0)])
    b.nodes.append(b.nodes.pop(b.nodes.index(scale_mul)))  # keep the list topologically sorted
    scale_mul.output[0] = "y"
    b.output("y", F32, ["batch", "seq", hidden])
    b.node("Identity", [total])
    b.nodes[-1].output[0] = "sum_out"
    b.output("sum_out", F32, ["batch", "seq", hidden])
    return b.model()


@pytest.mark.parametrize("norm, smaller", [("rms", "RMSNorm"), ("layer", "LayerNorm")])
def test_a_fusion_whose_input_depends_on_its_own_output_is_refused(tmp_path, norm, smaller):
    """Absorbing the Add would make the fused node read ``w + mean(its own second output)``: a
    cycle ("otfuse produced a cyclic graph", exit 3, before). The Add-norm is refused (reported as
    a downgrade), the plain norm over the sum fuses, and the outputs match."""
    src, out = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(_norm_whose_scale_reads_the_residual_sum(norm, "data"), src)
    report = otfuse.fuse(src, out)
    assert report.fusions == {smaller: 1}
    assert any(miss.get("fused_as") for miss in report.near_misses), report.near_misses
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 5}).ok


@pytest.mark.parametrize("norm, fused", [("rms", "AddRMSNorm"), ("layer", "AddLayerNorm")])
def test_a_static_input_computed_from_the_match_becomes_a_constant(tmp_path, norm, fused):
    """``CastLike(w, sum)`` is w in the sum's type: known before run time, so the fused node reads
    it as an initializer and the Add is absorbed after all."""
    src, out = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(_norm_whose_scale_reads_the_residual_sum(norm, "castlike"), src)
    report = otfuse.fuse(src, out)
    assert report.fusions == {fused: 1}, report.near_misses
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 5}).ok
