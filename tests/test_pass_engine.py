"""The pass manager's own guards, on real exports that exercise them."""

from __future__ import annotations

import onnx
from fixtures import fixture_path

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
