"""ORT's GroupQueryAttention re-targeted to otfuse's Attention (fusions/attention/group_query.py) on
graphs built with onnx.helper (torch-free): where ``seqlens_k`` / ``total_sequence_length`` are
provably ``P + S - 1`` / ``P + S`` (shape arithmetic, as otfuse's own ``--target ort`` writes them)
the fused model matches ORT's kernel; the exporters' mask sums, the rotation and the attributes
not modelled are refused by name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusing import fuse_in_memory
from onnx import TensorProto, helper, numpy_helper

import otfuse

MS = "com.microsoft"
F32, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
N, NKV, D = 4, 2, 8


def _lengths(nodes, inits, keys_from: str, past: bool, less: int = 1):
    """total = S (+ P) as an int32 scalar and seqlens_k = total - 1 expanded to [B], from shapes."""
    def c(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.int64), name))
        return name
    nodes += [helper.make_node("Shape", [keys_from], ["k_shape"]),
              helper.make_node("Slice", ["k_shape", c("one", [1]), c("two", [2]), c("zero", [0])], ["s_len"])]
    total = "s_len"
    if past:
        nodes += [helper.make_node("Shape", ["past_k"], ["p_shape"]),
                  helper.make_node("Slice", ["p_shape", c("two_", [2]), c("three", [3]), c("zero_", [0])], ["p_len"]),
                  helper.make_node("Add", ["p_len", "s_len"], ["t_len"])]
        total = "t_len"
    nodes += [helper.make_node("Squeeze", [total, c("axis0", [0])], ["t_scalar"]),
              helper.make_node("Cast", ["t_scalar"], ["total"], to=I32),
              helper.make_node("Sub", [total, c("one_", [less])], ["last"]),
              helper.make_node("Slice", ["k_shape", c("zero__", [0]), c("one__", [1]), c("zero___", [0])], ["batch"]),
              helper.make_node("Expand", ["last", "batch"], ["lengths64"]),
              helper.make_node("Cast", ["lengths64"], ["seqlens_k"], to=I32)]
    return "seqlens_k", "total"


def gqa_model(*, packed=False, past=False, bias=False, seqlens_input=False, extra_inputs=(), qk_used=False,
              seq="seq", less=1, **attributes) -> onnx.ModelProto:
    nodes, inits = [], []
    inputs = []
    if packed:
        inputs.append(helper.make_tensor_value_info("qkv", F32, ["batch", seq, (N + 2 * NKV) * D]))
        names = ["qkv", "", ""]
    else:
        inputs += [helper.make_tensor_value_info("q", F32, ["batch", seq, N * D]),
                   helper.make_tensor_value_info("k", F32, ["batch", seq, NKV * D]),
                   helper.make_tensor_value_info("v", F32, ["batch", seq, NKV * D])]
        names = ["q", "k", "v"]
    if past:
        inputs += [helper.make_tensor_value_info(n, F32, ["batch", NKV, "past", D]) for n in ("past_k", "past_v")]
        names += ["past_k", "past_v"]
    else:
        names += ["", ""]
    if seqlens_input:  # the exporters' form: computed from the mask at run time, here a graph input
        inputs += [helper.make_tensor_value_info("seqlens_k", I32, ["batch"]),
                   helper.make_tensor_value_info("total", I32, [])]
        names += ["seqlens_k", "total"]
    else:
        names += list(_lengths(nodes, inits, names[0] if packed else "k", past, less))
    names += ["", "", ""]
    if bias:
        inputs.append(helper.make_tensor_value_info("bias", F32, [1, 1, seq, "total_len"]))
        names.append("bias")
    for position, name, value in extra_inputs:
        while len(names) <= position:
            names.append("")
        names[position] = name
        inits.append(numpy_helper.from_array(value, name))
    while names and not names[-1]:
        names.pop()
    outputs = ["y", "present_k", "present_v"] + (["qk"] if qk_used else [])
    nodes.append(helper.make_node("GroupQueryAttention", names, outputs, name="gqa", domain=MS, num_heads=N,
                                  kv_num_heads=NKV, **attributes))
    total_len = "total_len" if past else seq
    graph_outputs = [helper.make_tensor_value_info("y", F32, ["batch", seq, N * D]),
                     helper.make_tensor_value_info("present_k", F32, ["batch", NKV, total_len, D]),
                     helper.make_tensor_value_info("present_v", F32, ["batch", NKV, total_len, D])]
    if qk_used:
        graph_outputs.append(helper.make_tensor_value_info("qk", F32, None))
    graph = helper.make_graph(nodes, "g", inputs, graph_outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    return model


def _feeds(packed: bool, past: bool, batch: int, seq: int, plen: int = 3, bias: bool = False) -> dict:
    rng = np.random.default_rng(7)
    feeds = ({"qkv": rng.standard_normal((batch, seq, (N + 2 * NKV) * D))} if packed else
             {"q": rng.standard_normal((batch, seq, N * D)), "k": rng.standard_normal((batch, seq, NKV * D)),
              "v": rng.standard_normal((batch, seq, NKV * D))})
    if past:
        feeds.update({n: rng.standard_normal((batch, NKV, plen, D)) for n in ("past_k", "past_v")})
    if bias:
        feeds["bias"] = rng.standard_normal((1, 1, seq, seq + (plen if past else 0)))
    return {k: v.astype(np.float32) for k, v in feeds.items()}


CASES = {
    "causal": (dict(), 2, 5),
    "bidirectional": (dict(causal=0), 2, 5),
    "window": (dict(local_window_size=2), 2, 6),
    "softcap_scale": (dict(softcap=3.0, scale=0.2), 2, 5),
    "packed": (dict(packed=True), 2, 5),
    "decode_with_past": (dict(past=True), 2, 1),
    "prompt_with_past": (dict(past=True), 1, 4),  # ORT: several queries with a past want batch 1
    "packed_past_window": (dict(packed=True, past=True, local_window_size=3), 1, 3),
    # head_sink -> sinks (gpt-oss as onnxruntime-genai writes it, with provable lengths here)
    "head_sink": (dict(extra_inputs=[(11, "sink", np.array([0.5, -2.0, 3.0, 0.0][:N], np.float32))]), 2, 5),
    "head_sink_window_past": (dict(past=True, local_window_size=2,
                                   extra_inputs=[(11, "sink", np.linspace(-3, 3, N).astype(np.float32))]), 2, 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_group_query_attention_with_provable_lengths_matches_ort(tmp_path, case):
    spec, batch, seq = CASES[case]
    src, out = tmp_path / "gqa.onnx", tmp_path / "gqa_fused.onnx"
    onnx.save(gqa_model(**spec), src)
    report = otfuse.fuse(src, out, only=["attention"])
    assert report.fusions == {"Attention": 1}, report.near_misses
    fused = onnx.load(out)
    assert not [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    feeds = _feeds(spec.get("packed", False), spec.get("past", False), batch, seq, bias=spec.get("bias", False))
    result = otfuse.diff(src, out, inputs=feeds)
    assert result.ok, [row.to_dict() for row in result.outputs]


def _refused(model: onnx.ModelProto, reason: str) -> None:
    fused, report = fuse_in_memory(model, ["attention"])
    assert not report.fusions, report.fusions
    misses = [m for m in report.near_misses if "GroupQueryAttention" in m.get("pattern", "")]
    assert misses and any(reason in m["reason"] for m in misses), report.near_misses


@pytest.mark.parametrize("spec, reason", [
    (dict(seqlens_input=True), "seqlens_k / total_sequence_length give per-row key counts"),
    (dict(bias=True), "attention_bias: ORT's kernel outputs 0 or NaN"),
    (dict(less=2), "seqlens_k is not provably past + new keys - 1"),  # the mutation: one key short per row
    (dict(do_rotary=1), "attribute 'do_rotary' is 1"),
    (dict(smooth_softmax=1), "attribute 'smooth_softmax' is 1"),
    (dict(local_window_size=0), "local_window_size 0"),
    (dict(causal=0, local_window_size=2), "local_window_size 2 with causal = 0"),
    (dict(qk_used=True, qk_output=1), "attribute 'qk_output' is 1"),
    (dict(sliding_window_cache=1, local_window_size=2), "attribute 'sliding_window_cache' is 1"),
    (dict(extra_inputs=[(7, "cos", np.ones((16, D // 2), np.float32)), (8, "sin", np.ones((16, D // 2), np.float32))]),
     "cos_cache: the rotation (do_rotary) is not modelled"),
    (dict(extra_inputs=[(11, "sink", np.ones(N + 1, np.float32))]), "head_sink 'sink' has shape (5,), not [4]"),
    (dict(extra_inputs=[(12, "kscale", np.ones(1, np.float32))]), "input k_scale ('kscale') is not modelled"),
], ids=str)
def test_group_query_attention_not_modelled_is_refused(spec, reason):
    _refused(gqa_model(**spec), reason)


def test_genai_form_is_refused_with_its_reason():
    """onnxruntime-genai's GQA (packed QKV, rotary inside, seqlens_k from the mask's sums)."""
    _refused(gqa_model(packed=True, past=True, seqlens_input=True), "seqlens_k / total_sequence_length")


@pytest.mark.parametrize("target", ["ort", "onnx"])
@pytest.mark.parametrize("spec", [dict(), dict(local_window_size=2), dict(causal=0)], ids=str)
def test_round_trip_through_the_targets(tmp_path, target, spec):
    """A GroupQueryAttention model brought to otfuse, written back in the target's ops, diffs clean
    in stock ORT: the ort target writes GroupQueryAttention again for grouped heads, with its own
    causal mask and window when those are the only mask (no [S, S] tensor)."""
    src, out = tmp_path / "gqa.onnx", tmp_path / f"gqa_{target}.onnx"
    onnx.save(gqa_model(**spec), src)
    report = otfuse.fuse(src, out, only=["attention"], target=target)
    assert report.fusions == {"Attention": 1}, report.near_misses
    nodes = onnx.load(out).graph.node
    assert not [n for n in nodes if n.domain == "otfuse"]
    if target == "ort":
        gqa = next(n for n in nodes if n.op_type == "GroupQueryAttention")
        attrs = {a.name: helper.get_attribute_value(a) for a in gqa.attribute}
        assert attrs["causal"] == spec.get("causal", 1)
        assert attrs.get("local_window_size", -1) == spec.get("local_window_size", -1)
        assert len(gqa.input) <= 10, gqa.input  # no attention_bias: the op's own mask
    assert otfuse.diff(src, out, inputs=_feeds(False, False, 2, 6)).ok


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_head_sink_round_trip_through_the_targets(tmp_path, target):
    """GroupQueryAttention with head_sink becomes Attention with sinks; ``ort`` writes it back as
    GroupQueryAttention with head_sink and its own causal mask; ``onnx`` (no sink input) gives the
    site back, saying why. Both diff clean in stock ORT."""
    src, out = tmp_path / "gqa.onnx", tmp_path / f"gqa_{target}.onnx"
    onnx.save(gqa_model(local_window_size=2, extra_inputs=[(11, "sink", np.linspace(-2, 2, N).astype(np.float32))]),
              src)
    report = otfuse.fuse(src, out, only=["attention"], target=target)
    nodes = onnx.load(out).graph.node
    assert not [n for n in nodes if n.domain == "otfuse"]
    (gqa,) = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    if target == "ort":
        assert report.fusions == {"Attention": 1}, report.near_misses
        assert len(gqa.input) == 12 and gqa.input[11] and not gqa.input[10], gqa.input
    else:
        refused = [m for m in report.near_misses if m["reason"].startswith("target onnx cannot express")]
        assert len(refused) == 1 and "no sink input" in refused[0]["reason"], report.near_misses
    assert otfuse.diff(src, out, inputs=_feeds(False, False, 2, 6)).ok
