"""Residual Adds of two ``[?, ?, H]`` values (the MiniLM / ViT exports of issue 10, whose dims are
unnamed): the fused AddLayerNorm / AddRMSNorm does not broadcast, so it is fused only when the
dimension engine proves both operands have one shape (they come from the same input through
MatMuls, Reshapes, the attention); otherwise the norm alone is fused and the report lists the
downgrade, naming the two dims it could not prove equal. No value_info: the engine alone."""

from __future__ import annotations

import numpy as np
import onnx
from fusing import assert_same_outputs, fuse_model
from fusions.norm.graphs import layer_norm_decomposed, rms_norm
from graphs import F32, GraphBuilder

HIDDEN = 32


def _model(b: GraphBuilder, out: str) -> onnx.ModelProto:
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, [None, None, HIDDEN])
    model = b.model()
    del model.graph.value_info[:]
    return model


def _weight(rows: int, cols: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)


def _block(b: GraphBuilder, x: str, seed: int) -> str:
    """A MiniLM-like block without the softmax: heads split with a Reshape of 0-copies, merged
    back, projected; the residual Add feeds the next norm."""
    q = b.node("MatMul", [x, b.const(_weight(HIDDEN, HIDDEN, seed))])
    heads = b.node("Transpose", [b.node("Reshape", [q, b.const(np.array([0, 0, 4, 8]))])], perm=[0, 2, 1, 3])
    merged = b.node("Reshape", [b.node("Transpose", [b.node("Tanh", [heads])], perm=[0, 2, 1, 3]),
                                b.const(np.array([0, 0, HIDDEN]))])
    attn = b.node("MatMul", [merged, b.const(_weight(HIDDEN, HIDDEN, seed + 1))])
    return b.node("Add", [x, attn])


def test_residuals_of_one_unnamed_input_through_matmuls_fuse(tmp_path):
    b = GraphBuilder()
    x = b.input("x", F32, [None, None, HIDDEN])
    h = layer_norm_decomposed(b, _block(b, x, 0), HIDDEN)
    mlp = b.node("MatMul", [b.node("Relu", [b.node("MatMul", [h, b.const(_weight(HIDDEN, 64, 2))])]),
                            b.const(_weight(64, HIDDEN, 3))])
    layer_norm_decomposed(b, b.node("Add", [h, mlp]), HIDDEN)
    fused, report = fuse_model(tmp_path, _model(b, "y"), only=["norm"])
    assert report.fusions == {"AddLayerNorm": 2}, report.near_misses
    assert not report.near_misses
    assert_same_outputs(tmp_path, dims={"batch": 2, "seq": 5})


def test_residual_of_two_unrelated_inputs_is_a_reported_downgrade(tmp_path):
    b = GraphBuilder()
    x, r = b.input("x", F32, [None, None, HIDDEN]), b.input("r", F32, [None, None, HIDDEN])
    rms_norm(b, b.node("Add", [x, r]), HIDDEN)
    fused, report = fuse_model(tmp_path, _model(b, "y"), only=["norm"])
    assert report.fusions == {"RMSNorm": 1}
    (miss,) = report.near_misses
    assert miss["pattern"] == "AddRMSNorm" and miss["fused_as"] == "RMSNorm", miss
    assert "dim 0: r.dim0 vs x.dim0 not proven equal" in miss["reason"] or \
        "dim 0: x.dim0 vs r.dim0 not proven equal" in miss["reason"], miss
    assert_same_outputs(tmp_path, dims={"batch": 2, "seq": 5})


def test_vit_patch_embeddings_then_residuals(tmp_path):
    """ViT: Conv patches -> Reshape(0, C, -1) -> Transpose -> + position table [1, N, C]. The
    position Add broadcasts over the batch (the norm after it fuses alone: a downgrade); the
    block's residual reads the embeddings through MatMuls and fuses with its Add."""
    b = GraphBuilder()
    pixels = b.input("pixels", F32, [None, 3, 16, 16])
    patches = b.node("Conv", [pixels, b.const(0.1 * np.ones((HIDDEN, 3, 4, 4), np.float32))], strides=[4, 4])
    tokens = b.node("Transpose", [b.node("Reshape", [patches, b.const(np.array([0, HIDDEN, -1]))])], perm=[0, 2, 1])
    position = b.const(np.random.default_rng(5).standard_normal((1, 16, HIDDEN)).astype(np.float32))
    embedded = b.node("Add", [tokens, position])
    normed = layer_norm_decomposed(b, embedded, HIDDEN)
    layer_norm_decomposed(b, _block(b, normed, 7), HIDDEN)
    fused, report = fuse_model(tmp_path, _model(b, "y"), only=["norm"])
    assert report.fusions == {"AddLayerNorm": 1, "LayerNorm": 1}, report.near_misses
    (miss,) = report.near_misses
    assert miss["fused_as"] == "LayerNorm" and "dim 0: 1 vs pixels.dim0 not proven equal" in miss["reason"], miss
    assert_same_outputs(tmp_path, dims={"batch": 2})


def test_an_add_of_a_broadcast_bias_is_no_residual(tmp_path):
    """``h + b`` with b a [H] constant in front of a norm (the bias of the norm before it, as
    BLOOM's TorchScript embedding LayerNorm spells it) is no residual Add: the norm fuses alone and
    nothing is reported as a downgrade. A [1, S, H] table of the input's rank still is (ViT above)."""
    b = GraphBuilder()
    x = b.input("x", F32, [None, None, HIDDEN])
    biased = b.node("Add", [b.node("Tanh", [x]), b.const(np.linspace(-1, 1, HIDDEN).astype(np.float32))])
    layer_norm_decomposed(b, biased, HIDDEN)
    fused, report = fuse_model(tmp_path, _model(b, "y"), only=["norm"])
    assert report.fusions == {"LayerNorm": 1}
    assert not report.near_misses, report.near_misses
    assert_same_outputs(tmp_path, dims={"batch": 2, "seq": 5})
