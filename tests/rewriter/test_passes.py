"""The pass manager's own guards, on real exports that exercise them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fixtures import fixture_path
from fusions.norm.graphs import layer_norm_decomposed, rms_norm
from graphs import F32, GraphBuilder

import otfuse


def test_a_fusion_is_refused_when_its_node_would_read_a_value_derived_from_its_interior(tmp_path):
    """meta_rope_causal: the causal mask is built from Shape(transpose(q_rot)). The BSND
    RopeAttention match covers that transpose, and the fused node reads the mask, so the Shape
    chain cannot die with the match; fusing it anyway left the graph reading a removed value (the
    fused model failed onnx.checker). The fold is refused; the rotation and the attention fuse
    separately and the outputs match."""
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(fixture_path("meta_rope_causal"), out)
    assert report.fusions == {"RotaryEmbeddingQK": 1, "Attention": 1}
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert otfuse.diff(fixture_path("meta_rope_causal"), out, dims={"batch": 2}).ok


def _norm_whose_scale_reads_the_residual_sum(norm: str) -> onnx.ModelProto:
    """onnxscript's unoptimised output (whisper encoder, phi-2): the norm's scale is
    ``CastLike(w, x)`` with x the residual sum the Add-norm would absorb and produce itself."""
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
    scale_mul.input[scale_index] = b.node("CastLike", [scale_mul.input[scale_index], total])
    b.nodes.append(b.nodes.pop(b.nodes.index(scale_mul)))  # keep the list topologically sorted
    scale_mul.output[0] = "y"
    b.output("y", F32, ["batch", "seq", hidden])
    b.node("Identity", [total])
    b.nodes[-1].output[0] = "sum_out"
    b.output("sum_out", F32, ["batch", "seq", hidden])
    return b.model()


@pytest.mark.parametrize("norm, smaller", [("rms", "RMSNorm"), ("layer", "LayerNorm")])
def test_a_fusion_whose_input_depends_on_its_own_output_is_refused(tmp_path, norm, smaller):
    """Absorbing the Add would make the fused node read CastLike(w, its own second output): a
    cycle ("otfuse produced a cyclic graph", exit 3, before). The Add-norm is refused, the plain
    norm over the sum fuses, and the outputs match."""
    src, out = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(_norm_whose_scale_reads_the_residual_sum(norm), src)
    report = otfuse.fuse(src, out)
    assert report.fusions == {smaller: 1}
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 5}).ok
