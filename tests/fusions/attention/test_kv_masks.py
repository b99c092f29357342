"""Causal masks sized by the present key (``Shape(Concat(past, k))[2]`` = past + seq), as optimum's
decoders with a cache build them: the mask subgraph reads that key only for its shape, and the
probe model takes it as an input of shape ``past + seq`` (mask_probes.subgraph_model) instead of
cutting through the key projection. Proven by running, bottom-right aligned to the past; a mask
one key too long, or sized by another tensor, keeps the bias and says why. The merged decoders'
cache branch (Whisper, BART) claims its self-attention causal; BART's cross-attention padding
(``1 - m`` of encoder_attention_mask) stays a bias, with the reason."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import otfuse
from otfuse.fusions.attention.mask_probes import subgraph_model
from otfuse.fusions.attention.masks import classify_mask
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.refuse import Refuse

MIN = np.float32(-3.4028234663852886e38)
HIDDEN = 160  # the key projection's 160 x 32 weights: too large for a probe model to carry


def _kv_mask_model(total_from: str = "present", extra_keys: int = 0) -> onnx.ModelProto:
    """x [batch, seq, 160] -> k [batch, 2, seq, 16] -> present = Concat(past, k); the mask
    Where(j <= t, 0, min) [1, 1, seq, T] with T = Shape(``total_from``)[2] (+ ``extra_keys`` keys)
    and query positions T - seq .. T - 1."""
    nodes, inits = [], []

    def node(op, inputs, out=None, **attrs):
        out = out or f"n{len(nodes)}"
        nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def const(value, dtype=np.int64):
        name = f"c{len(inits)}"
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    rng = np.random.default_rng(0)
    inits.append(numpy_helper.from_array((rng.standard_normal((HIDDEN, 32)) * 0.1).astype(np.float32), "w_k"))
    k = node("Transpose", [node("Reshape", [node("MatMul", ["x", "w_k"]), const([0, 0, 2, 16])])], perm=[0, 2, 1, 3])
    node("Concat", ["past_key_values.0.key", k], out="present.0.key", axis=2)
    sized = {"present": "present.0.key", "past": "past_key_values.0.key"}[total_from]
    total = node("Gather", [node("Shape", [sized]), const(2)], axis=0)
    seq = node("Gather", [node("Shape", ["input_ids"]), const(1)], axis=0)
    keys = node("Range", [const(0), node("Add", [total, const(extra_keys)]), const(1)])
    queries = node("Range", [node("Sub", [total, seq]), total, const(1)])
    visible = node("LessOrEqual", [node("Unsqueeze", [keys, const([0])]), node("Unsqueeze", [queries, const([1])])])
    where = node("Where", [visible, const(0.0, np.float32), const(MIN, np.float32)])
    node("Unsqueeze", [where, const([0, 1])], out="mask")
    graph = helper.make_graph(nodes, "kv_mask", [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
        helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["batch", 2, "past_seq", 16]),
    ], [helper.make_tensor_value_info("mask", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    return onnx.shape_inference.infer_shapes(model)


def test_mask_sized_by_the_present_key_is_causal_aligned_to_the_past():
    graph = GraphIndex(_kv_mask_model())
    claim = classify_mask(graph, "mask", {}, ())
    assert (claim.causal, claim.window, claim.key_padding, claim.lengths) == (True, 0, None, None)
    probe = subgraph_model(graph, "mask")
    inputs = {vi.name: [d.dim_value or d.dim_param for d in vi.type.tensor_type.shape.dim] for vi in probe.graph.input}
    # the present key enters as a shape of past + seq; the projection's weights are not carried
    assert inputs["present.0.key"][0] == "batch" and inputs["present.0.key"][1:] in (
        [2, "past_seq + seq", 16], [2, "seq + past_seq", 16])
    assert not any(init.name == "w_k" for init in probe.graph.initializer)
    assert not any(node.op_type == "MatMul" for node in probe.graph.node)


@pytest.mark.parametrize("mutation, reason", [
    ({"extra_keys": 1}, "contradicts causal=True"),  # one key past the present key's length
    ({"total_from": "past"}, "contradicts causal=True"),  # the past's length: the new keys forgotten
])
def test_mask_of_the_wrong_length_is_not_claimed_and_says_why(mutation, reason):
    graph = GraphIndex(_kv_mask_model(**mutation))
    with pytest.raises(Refuse, match=reason):
        classify_mask(graph, "mask", {}, ())


# -- the merged decoders' cache branch --------------------------------------------------------------
MERGED = Path(__file__).resolve().parents[3] / "models" / "fixtures" / "merged"
MANIFEST = json.loads((MERGED / "manifest.json").read_text())
THEN = "If 'optimum::if' then_branch"
DIMS = {"batch": 2, "seq": 5}


def _unpacked(name: str, folder: Path) -> Path:
    path = folder / f"{name}.onnx"
    path.write_bytes(gzip.decompress((MERGED / MANIFEST["fixtures"][name]["file"]).read_bytes()))
    return path


def _self_attentions(path: Path) -> dict[str, list[onnx.NodeProto]]:
    """The fused self-attention nodes of each branch of the If."""
    (if_node,) = onnx.load(path).graph.node
    return {branch.name: [n for n in branch.g.node if n.domain == "otfuse" and n.op_type == "Attention"
                          and "self" in n.name.lower()] for branch in if_node.attribute}


@pytest.mark.parametrize("name", ["whisper", "bart"])
def test_merged_decoders_claim_the_cache_branch_causal(tmp_path, name):
    src = _unpacked(name, tmp_path)
    out = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(src, out)
    for branch, nodes in _self_attentions(out).items():
        assert len(nodes) == 2, branch
        for node in nodes:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            assert attrs.get("causal") == 1 and attrs.get("window", 0) == 0, (branch, node.name)
            assert len(node.input) <= 3 or not node.input[3], (branch, node.name)  # no attn_bias
            if branch == "then_branch":  # the cache enters as past_key / past_value
                assert node.input[5].startswith("past_key_values.") and node.input[6].startswith("past_key_values.")
    assert not [m for m in report.near_misses if "self_attn" in m["location"] and "mask" in m["pattern"]]
    cross = [m for m in report.near_misses if "encoder_attn" in m["location"] and "mask" in m["pattern"]]
    if name == "bart":  # 1 - m of encoder_attention_mask: key padding for 0 / 1 values only
        assert len(cross) == 4 and all("only where that mask holds 0 or 1" in m["reason"] for m in cross), cross
    result = otfuse.diff(src, out, dims=DIMS)  # with the cache, and use_cache_branch=False
    assert result.branches == ["use_cache_branch=False"]
    assert result.ok, [row.to_dict() for row in result.outputs if not row.ok]


def test_merged_decoder_mask_sized_by_the_cross_key_keeps_the_bias(tmp_path):
    """Whisper's layer-0 mask sliced to Shape(past encoder key)[2] instead of the present
    decoder key: the encoder's length, not past + seq, so no causal claim."""
    model = onnx.load(_unpacked("whisper", tmp_path))
    then = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")
    shape = next(n for n in then.node if n.op_type == "Shape" and n.input[0] == "present.0.decoder.key")
    shape.input[0] = "past_key_values.0.encoder.key"
    src, out = tmp_path / "mutated.onnx", tmp_path / "mutated_fused.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out)
    kept = [m for m in report.near_misses if m.get("body") == THEN and "layers.0/self_attn" in m["location"]]
    assert len(kept) == 1 and "mask kept as a materialised attn_bias" in kept[0]["pattern"], kept
    layer0 = [n for n in _self_attentions(out)["then_branch"] if "layers.0" in n.name]
    assert len(layer0) == 1 and layer0[0].input[3]  # the mask stays an attn_bias
    layer1 = [n for n in _self_attentions(out)["then_branch"] if "layers.1" in n.name]
    assert {a.name: helper.get_attribute_value(a) for a in layer1[0].attribute}.get("causal") == 1
