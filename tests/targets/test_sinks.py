"""Attention sinks under ``--target ort`` / ``--target onnx`` (otfuse/targets/attention.py).

ORT's GroupQueryAttention ``head_sink`` is the contract's sink (measured here against otfuse's
reference with ORT's own CPU kernel: the shift is max(row max, sink), exp(sink - max) joins the
denominator after the bias, and a row the bias hides entirely is 0), so gpt-oss's attention is
written as GroupQueryAttention with ``head_sink``; ONNX's Attention has no sink input, so under
``--target onnx`` those sites go back to the original nodes, saying why. A KV cache (which
GroupQueryAttention does not read here) with sinks is refused under ``ort`` too."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import otfuse
from bench.coverage import materialise
from fusions.attention.test_sinks import _padded_feeds, sinks_model
from otfuse.verify import reference

ARCH5 = Path(__file__).resolve().parents[2] / "models" / "fixtures" / "arch5"
VARIANTS = json.loads((ARCH5 / "manifest.json").read_text())["models"]


def _gqa(b, n, nkv, s, d, bias: np.ndarray | None, sinks: np.ndarray, causal=0, window=0, seed=0):
    """GroupQueryAttention (ORT 1.32 CPU) with head_sink, against reference.attention."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, s, n * d), dtype=np.float32)
    k, v = (rng.standard_normal((b, s, nkv * d), dtype=np.float32) for _ in "kv")
    names = ["q", "k", "v", "", "", "seqlens", "total", "", "", "", "bias" if bias is not None else "", "sinks"]
    node = helper.make_node("GroupQueryAttention", names, ["y"], domain="com.microsoft", num_heads=n,
                            kv_num_heads=nkv, causal=causal, **({"local_window_size": window} if window else {}))
    typed = {"seqlens": TensorProto.INT32, "total": TensorProto.INT32}
    inputs = [helper.make_tensor_value_info(x, typed.get(x, TensorProto.FLOAT), None) for x in names if x]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    feeds = {"q": q, "k": k, "v": v, "seqlens": np.full(b, s - 1, np.int32), "total": np.array(s, np.int32),
             "sinks": sinks}
    if bias is not None:
        feeds["bias"] = bias
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    want = reference.attention(q, k, v, bias, None, None, None, None, sinks, num_heads=n, kv_num_heads=nkv,
                               causal=causal, window=window, layout="BSND")[0]
    return y, want


@pytest.mark.parametrize("causal, window", [(0, 0), (1, 0), (1, 3)])
def test_group_query_head_sink_is_the_contracts_sink(causal, window):
    # A bias of 0 / -1e30 with a row hidden entirely (batch 0, query 0): 0 in both.
    b, n, nkv, s = 2, 4, 2, 7
    bias = np.zeros((b, 1, s, s), np.float32)
    bias[0, :, 0, :] = -1e30
    bias[1, :, :, 2] = -1e30
    sinks = np.array([0.5, -2.0, 3.0, 0.0], np.float32)
    y, want = _gqa(b, n, nkv, s, 16, bias, sinks, causal, window)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert np.all(y[0, 0] == 0)


@pytest.mark.parametrize("variant", ["dynamo_pos_dyn", "ts17_pos_dyn"])
def test_gpt_oss_under_target_ort_is_group_query_attention_with_head_sink(tmp_path, variant):
    src = materialise(ARCH5 / VARIANTS[f"gpt_oss_fx/{variant}"]["file"], tmp_path)
    out = tmp_path / "ort.onnx"
    report = otfuse.fuse(src, out, target="ort")
    assert not [m for m in report.near_misses if m["family"] == "attention"], report.near_misses
    model = onnx.load(out)
    assert not [n for n in model.graph.node if n.domain == "otfuse"]
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and all(len(n.input) == 12 and n.input[11] for n in gqa), gqa
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])  # stock ORT, no library
    for inputs, dims in ((_padded_feeds(2, 9), None), (None, {"batch": 2, "seq": 7})):
        result = otfuse.diff(src, out, inputs=inputs, dims=dims)
        assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("variant", ["dynamo_pos_dyn", "ts17_pos_dyn"])
def test_gpt_oss_under_target_onnx_stays_unfused_saying_why(tmp_path, variant):
    src = materialise(ARCH5 / VARIANTS[f"gpt_oss_fx/{variant}"]["file"], tmp_path)
    out = tmp_path / "onnx.onnx"
    report = otfuse.fuse(src, out, target="onnx")
    refused = [m for m in report.near_misses if m["reason"].startswith("target onnx cannot express")]
    assert len(refused) == 2 and all("no sink input" in m["reason"] for m in refused), report.near_misses
    model = onnx.load(out)
    assert not [n for n in model.graph.node if n.domain == "otfuse" or n.op_type == "Attention"]
    assert otfuse.diff(src, out, inputs=_padded_feeds(2, 9)).ok


def test_sinks_with_a_kv_cache_stay_unfused_under_target_ort(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "ort.onnx"
    onnx.save(sinks_model(cache=True), src)
    report = otfuse.fuse(src, out, target="ort")
    refused = [m for m in report.near_misses if m["reason"].startswith("target ort cannot express")]
    assert len(refused) == 1 and "attention sinks with a KV cache" in refused[0]["reason"], report.near_misses
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 5, "past": 3}).ok


def _fp16_attention_with_sinks(sinks: np.ndarray) -> onnx.ModelProto:
    """An otfuse Attention node over float16 BNSD q/k/v (2 heads, 1 kv head) with constant sinks."""
    shape = ["batch", 2, "seq", 8]
    kv = ["batch", 1, "seq", 8]
    node = helper.make_node("Attention", ["q", "k", "v", "", "", "", "", "", "sinks"], ["y"], domain="otfuse",
                            num_heads=2, kv_num_heads=1, causal=1)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("q", TensorProto.FLOAT16, shape),
                      helper.make_tensor_value_info("k", TensorProto.FLOAT16, kv),
                      helper.make_tensor_value_info("v", TensorProto.FLOAT16, kv)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, shape)],
        [onnx.numpy_helper.from_array(sinks, "sinks")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("otfuse", 1)])


def test_float16_sinks_exact_in_float16_become_a_float16_head_sink(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "ort.onnx"
    onnx.save(_fp16_attention_with_sinks(np.array([0.5, -1.25], np.float32)), src)
    otfuse.fuse(src, out, target="ort")
    model = onnx.load(out)
    (gqa,) = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    head_sink = inits.get(gqa.input[11])
    if head_sink is None:  # written as a Constant node
        (const,) = [n for n in model.graph.node if gqa.input[11] in n.output]
        head_sink = onnx.numpy_helper.to_array(const.attribute[0].t)
    assert head_sink.dtype == np.float16 and head_sink.tolist() == [0.5, -1.25]
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 6}).ok


def test_float16_attention_with_sinks_float16_cannot_hold_is_refused(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "ort.onnx"
    onnx.save(_fp16_attention_with_sinks(np.array([0.1, -1.25], np.float32)), src)
    with pytest.raises(Exception, match="not constants exact in float16"):
        otfuse.fuse(src, out, target="ort")
