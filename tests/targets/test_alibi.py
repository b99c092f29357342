"""ALiBi in the targets: an otfuse ``Attention`` with ``alibi_slopes`` written in ORT's
MultiHeadAttention / ONNX's Attention with the bias built by the graph (float32, as the kernel
evaluates it), run in stock onnxruntime against otfuse's numpy reference; what the targets refuse."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import otfuse
from otfuse.verify import reference

B, N, S, D, P = 2, 4, 5, 8, 3
SLOPES = (2.0 ** -np.arange(1, N + 1)).astype(np.float32)


def _model(mode: str, empty_rows: str, causal: int, padding: bool, past: bool, elem=TensorProto.FLOAT,
           **extra) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, elem, [B, N, S, D]) for n in "qkv"]
    names = ["q", "k", "v", "", ""]
    if padding:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT64, [B, S + (P if past else 0)]))
        names[4] = "mask"
    outputs = [helper.make_tensor_value_info("y", elem, [B, N, S, D])]
    out_names = ["y"]
    if past:
        inputs += [helper.make_tensor_value_info(n, elem, [B, N, P, D]) for n in ("past_k", "past_v")]
        names += ["past_k", "past_v"]
        outputs += [helper.make_tensor_value_info(n, elem, [B, N, S + P, D]) for n in ("pk", "pv")]
        out_names += ["pk", "pv"]
    else:
        names += ["", ""]
    names.append("slopes")
    node = helper.make_node("Attention", names, out_names, name="attn", domain="otfuse", num_heads=N, causal=causal,
                            empty_rows=empty_rows, alibi_positions=mode, **extra)
    graph = helper.make_graph([node], "g", inputs, outputs, [numpy_helper.from_array(SLOPES, "slopes")])
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 18),
                                                                 helper.make_opsetid("otfuse", 1)])


def _feeds(padding: bool, past: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((B, N, S, D)).astype(np.float32) for n in "qkv"}
    if past:
        feeds.update({n: rng.standard_normal((B, N, P, D)).astype(np.float32) for n in ("past_k", "past_v")})
    if padding:
        mask = np.ones((B, S + (P if past else 0)), np.int64)
        mask[0, :2] = 0  # left padding: row 0's first query rows see no key when causal
        feeds["mask"] = mask
    return feeds


@pytest.mark.parametrize("target", ["ort", "onnx"])
@pytest.mark.parametrize("mode", ["index", "mask_cumsum"])
@pytest.mark.parametrize("empty_rows", ["zero", "uniform"])
@pytest.mark.parametrize("causal,padding,past", [(1, True, False), (0, False, False), (1, False, True),
                                                 (1, True, True), (0, True, False)])
def test_alibi_attention_in_the_target_matches_the_reference(tmp_path, target, mode, empty_rows, causal, padding,
                                                             past):
    src, dst = tmp_path / "m.onnx", tmp_path / "t.onnx"
    onnx.save(_model(mode, empty_rows, causal, padding, past), src)
    report = otfuse.fuse(src, dst, target=target)
    assert report.fusions == {"Attention": 1}, report.near_misses
    out = onnx.load(dst)
    assert not [n for n in out.graph.node if n.domain == "otfuse"]
    op = "MultiHeadAttention" if target == "ort" else "Attention"
    assert any(n.op_type == op for n in out.graph.node)
    feeds = _feeds(padding, past)
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, feeds)
    want = reference.attention(feeds["q"], feeds["k"], feeds["v"], None, feeds.get("mask"), feeds.get("past_k"),
                               feeds.get("past_v"), SLOPES, num_heads=N, causal=causal, empty_rows=empty_rows,
                               alibi_positions=mode)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_alibi_on_float16_is_refused(tmp_path, target):
    src, dst = tmp_path / "m.onnx", tmp_path / "t.onnx"
    onnx.save(_model("index", "zero", 1, False, False, elem=TensorProto.FLOAT16), src)
    with pytest.raises(otfuse.OtfuseError, match="ALiBi on float16 attention"):
        otfuse.fuse(src, dst, target=target)  # the input's otfuse op cannot be expressed: refused


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_alibi_with_softcap_is_refused(tmp_path, target):
    src, dst = tmp_path / "m.onnx", tmp_path / "t.onnx"
    onnx.save(_model("index", "zero", 1, False, False, softcap=5.0), src)
    with pytest.raises(otfuse.OtfuseError, match="ALiBi together with softcap"):
        otfuse.fuse(src, dst, target=target)


def test_a_bias_per_head_with_rows_masked_entirely_is_zeroed_per_head(tmp_path):
    """ort: an attn_bias with a head axis (a materialised ALiBi + mask) whose row is -inf for one
    head only: MultiHeadAttention gives NaN there, the Where after it zeroes that head's row only."""
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, N, S, D]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [B, N, S, S]))
    node = helper.make_node("Attention", ["q", "k", "v", "bias"], ["y"], name="attn", domain="otfuse", num_heads=N)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, N, S, D])])
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 18),
                                                                 helper.make_opsetid("otfuse", 1)])
    src, dst = tmp_path / "m.onnx", tmp_path / "t.onnx"
    onnx.save(model, src)
    assert otfuse.fuse(src, dst, target="ort").fusions == {"Attention": 1}
    feeds = _feeds(False, False)
    bias = np.random.default_rng(4).standard_normal((B, N, S, S)).astype(np.float32)
    bias[0, 1, 2, :] = -np.inf
    bias[1, 3, 0, :] = -np.inf
    feeds["bias"] = bias
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    want = reference.attention(feeds["q"], feeds["k"], feeds["v"], bias, num_heads=N)[0]
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
