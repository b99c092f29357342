"""ORT's contrib ops brought back to otfuse ops (docs/ops.md, "Re-targeted ops"): the outputs of
onnxscript's ``optimize_for_ort`` and of ORT's ``optimize_model`` on export-matrix variants
(models/fixtures/contrib, made by models/optimize_for_ort.py) and ORT's ``extended`` offline optimisation (the matrix's
``*.ort_extended`` variants, tests/models/test_export_matrix.py) fuse every site with no norm,
rotary or attention contrib op left and a clean diff; mutations of those real exports (an
attribute, input or used output the rules do not model) are refused with a near miss naming it;
ORT's RotaryEmbedding, which neither tool leaves in a graph, on hand-built graphs against ORT."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusing import fuse_in_memory
from onnx import helper, numpy_helper

import otfuse
from models.test_export_matrix import COVERAGE, ENTRIES, MATRIX, dims_for

CONTRIB = MATRIX.parent / "contrib"
CONTRIB_ENTRIES = json.loads((CONTRIB / "manifest.json").read_text())["models"]
MS = "com.microsoft"
# The contrib ops a re-targeting rule reads; none may be left after fusing (activations may), nor
# com.microsoft's packed Attention (BERT's).
MODELLED = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
            "LayerNormalization", "RotaryEmbedding", "MultiHeadAttention", "GroupQueryAttention"}


def materialise(key: str, folder: Path) -> Path:
    entry = CONTRIB_ENTRIES[key]
    target = folder / Path(entry["file"]).name.removesuffix(".gz")
    target.write_bytes(gzip.decompress((CONTRIB / entry["file"]).read_bytes()))
    shutil.copyfile(MATRIX.parent / entry["weights"], folder / "weights.bin")
    return target


def load(key: str, tmp_path: Path) -> onnx.ModelProto:
    """A contrib fixture or a matrix variant, its weights loaded."""
    if key in CONTRIB_ENTRIES:
        return onnx.load(materialise(key, tmp_path))
    return onnx.load(COVERAGE.materialise(MATRIX / ENTRIES[key]["file"], tmp_path))


def left_ops(path: Path) -> set[str]:
    model = onnx.load(path, load_external_data=False)
    return {n.op_type for n in model.graph.node if n.op_type in MODELLED or (n.domain, n.op_type) == (MS, "Attention")}


@pytest.mark.parametrize("key", sorted(CONTRIB_ENTRIES))
def test_optimised_output_fuses_back_with_a_clean_diff(tmp_path, key):
    entry = CONTRIB_ENTRIES[key]
    path = materialise(key, tmp_path)
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(path, out)
    misses = [f"{m.get('pattern')}: {m.get('reason')}" for m in report.near_misses]
    assert COVERAGE.fused_sites(report.fusions) == entry["expected"], (report.fusions, misses)
    assert not left_ops(out), left_ops(out)
    result = otfuse.diff(path, out, dims=dims_for(entry))
    assert result.ok, [row.to_dict() for row in result.outputs]


# -- mutations of real exports ----------------------------------------------------------------
def _nodes(model: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op_type]


def _set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for attribute in list(node.attribute):
        if attribute.name == name:
            node.attribute.remove(attribute)
    node.attribute.append(helper.make_attribute(name, value))


def _use_output(model: onnx.ModelProto, node: onnx.NodeProto, position: int, elem=onnx.TensorProto.FLOAT) -> None:
    while len(node.output) <= position:
        node.output.append("")
    node.output[position] = node.output[position] or f"{node.name}_out{position}"
    model.graph.output.append(helper.make_tensor_value_info(node.output[position], elem, None))


def _refused(model: onnx.ModelProto, family: str, op_type: str, reason: str) -> None:
    """Every ``op_type`` of the model stays, and a near miss says ``reason``."""
    before = len(_nodes(model, op_type))
    fused, report = fuse_in_memory(model, family)
    reasons = [m.get("reason", "") for m in report.near_misses]
    assert len(_nodes(fused, op_type)) == before, report.fusions
    assert any(reason in r for r in reasons), reasons


LLAMA_OFO = "llama/dynamo_pos_dyn.ofo"
BERT_ORT = "bert/dynamo_pos_dyn.ort_extended"
LLAMA_ORT = "llama/dynamo_pos_dyn.ort_extended"


def _all(model, op_type, mutate) -> onnx.ModelProto:
    for node in _nodes(model, op_type):
        mutate(node)
    return model


@pytest.mark.parametrize("mutation, reason", [
    ("mean", "output mean"),
    ("inv_std_var", "output inv_std_var"),
    ("attribute", "attribute 'simplified'"),
    ("opset", "only versions [1] of com.microsoft"),
])
def test_skip_layer_norm_mutations_are_refused(tmp_path, mutation, reason):
    model = load(BERT_ORT, tmp_path)
    if mutation == "opset":
        next(o for o in model.opset_import if o.domain == MS).version = 2
    else:
        for node in _nodes(model, "SkipLayerNormalization"):
            if mutation == "attribute":
                _set_attr(node, "simplified", 1)
            else:
                _use_output(model, node, {"mean": 1, "inv_std_var": 2}[mutation])
    _refused(model, "norm", "SkipLayerNormalization", reason)


def test_skip_layer_norm_with_a_broadcast_skip_is_refused():
    """ORT adds a (1, S, H) skip to every batch row; AddLayerNorm does not broadcast."""
    b = onnx.helper
    nodes = [b.make_node("SkipLayerNormalization", ["x", "skip", "gamma"], ["y"], domain=MS, epsilon=1e-5)]
    graph = b.make_graph(nodes, "g", [b.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4, 8]),
                                      b.make_tensor_value_info("skip", onnx.TensorProto.FLOAT, [1, 4, 8])],
                         [b.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4, 8])],
                         [numpy_helper.from_array(np.ones(8, np.float32), "gamma")])
    model = b.make_model(graph, opset_imports=[b.make_opsetid("", 17), b.make_opsetid(MS, 1)])
    _refused(model, "norm", "SkipLayerNormalization", "residual Add may broadcast")


@pytest.mark.parametrize("mutation, reason", [
    ("bias", "input bias"),
    ("inv_std_var", "output inv_std_var"),
    ("epsilon", "epsilon -1.0"),
])
def test_skip_simplified_layer_norm_mutations_are_refused(tmp_path, mutation, reason):
    model = load(LLAMA_OFO, tmp_path)
    hidden = 64
    bias = numpy_helper.from_array(np.zeros(hidden, np.float32), "extra_bias")
    model.graph.initializer.append(bias)
    for node in _nodes(model, "SkipSimplifiedLayerNormalization"):
        if mutation == "bias":
            node.input.append("extra_bias")
        elif mutation == "epsilon":
            _set_attr(node, "epsilon", -1.0)
        else:
            _use_output(model, node, 2)
    _refused(model, "norm", "SkipSimplifiedLayerNormalization", reason)


def test_skip_simplified_layer_norm_outputs_the_residual_sum(tmp_path):
    """optimize_for_ort's SkipSimplifiedLayerNormalization hands input_skip_bias_sum to the next
    residual Add: it becomes AddRMSNorm's S (not in the final norm, whose sum nothing reads)."""
    fused, report = fuse_in_memory(load(LLAMA_OFO, tmp_path), "norm")
    add_norms = _nodes(fused, "AddRMSNorm")
    assert len(add_norms) == 4, report.near_misses
    assert [len(n.output) for n in add_norms] == [2, 2, 2, 1]


@pytest.mark.parametrize("mutation, reason", [
    ("stash_type", "attribute 'stash_type' is 0"),
    ("inv_std_var", "output inv_std_var"),
])
def test_simplified_layer_norm_mutations_are_refused(tmp_path, mutation, reason):
    model = load(LLAMA_OFO, tmp_path)
    for node in _nodes(model, "SimplifiedLayerNormalization"):
        if mutation == "stash_type":
            _set_attr(node, "stash_type", 0)
        else:
            _use_output(model, node, 1)
    _refused(model, "norm", "SimplifiedLayerNormalization", reason)


# (transA / transBatch* change the product's shape: a real export mutated so stays no valid model;
# FUSED_MATMUL_OP refuses them like any attribute value it does not list.)
@pytest.mark.parametrize("attribute, value, reason", [
    ("alpha", 0.0, "FusedMatMul alpha 0.0"),
    ("activation", "Relu", "attribute 'activation'"),
])
def test_fused_matmul_scores_mutations_are_refused(tmp_path, attribute, value, reason):
    model = _all(load(LLAMA_ORT, tmp_path), "FusedMatMul", lambda node: _set_attr(node, attribute, value))
    fused, report = fuse_in_memory(model, ["rope", "attention"])
    reasons = [m.get("reason", "") for m in report.near_misses]
    assert "RopeAttention" not in report.fusions and "Attention" not in report.fusions, report.fusions
    assert any(reason in r for r in reasons), reasons


@pytest.mark.parametrize("mutation, reason", [
    ("unidirectional", "attribute 'unidirectional'"),
    ("key_padding_mask", "key_padding_mask: ORT adds mask_filter_value"),
    ("qk", "output qk"),
    ("past_sequence_length", "input past_sequence_length"),
    ("bias_shape", "is not a constant of shape"),
])
def test_multi_head_attention_mutations_are_refused(tmp_path, mutation, reason):
    model = load(LLAMA_OFO, tmp_path)
    model.graph.initializer.extend([numpy_helper.from_array(np.ones((2, 7), np.int32), "kpm"),
                                    numpy_helper.from_array(np.array([0], np.int32), "past_len"),
                                    numpy_helper.from_array(np.zeros(10, np.float32), "short_bias")])
    for node in _nodes(model, "MultiHeadAttention"):
        inputs = list(node.input) + [""] * (10 - len(node.input))
        if mutation == "unidirectional":
            _set_attr(node, "unidirectional", 1)
        elif mutation == "qk":
            _use_output(model, node, 3)
        else:
            position, name = {"key_padding_mask": (4, "kpm"), "past_sequence_length": (8, "past_len"),
                              "bias_shape": (3, "short_bias")}[mutation]
            inputs[position] = name
        del node.input[:]
        node.input.extend(inputs[:max(i for i, n in enumerate(inputs) if n) + 1])
    _refused(model, "attention", "MultiHeadAttention", reason)


def test_multi_head_attention_with_the_projections_bias_diffs_clean(tmp_path):
    """optimize_for_ort's MultiHeadAttention given a bias input (what ORT's optimizer folds into it
    from the q/k/v projections): the fused Attention adds it in front and matches ORT's op."""
    model = load(LLAMA_OFO, tmp_path)
    rng = np.random.default_rng(0)
    for index, node in enumerate(_nodes(model, "MultiHeadAttention")):
        name = f"mha_bias_{index}"
        model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal(3 * 64).astype(np.float32), name))
        node.input[3] = name
    src, out = tmp_path / "biased.onnx", tmp_path / "biased_fused.onnx"
    onnx.save(model, src, save_as_external_data=True, location="biased.bin")
    report = otfuse.fuse(src, out)
    assert report.fusions.get("Attention") == 2 and not left_ops(out), report.near_misses
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 7}).ok


# -- ORT's RotaryEmbedding on hand-built graphs -------------------------------------------------
def _rotary_model(*, rank=3, heads=2, head_dim=8, rotary_dim=0, interleaved=0, num_heads_attr=True,
                  extra=None, ids_rank=2) -> onnx.ModelProto:
    b = onnx.helper
    half = (rotary_dim or head_dim) // 2
    rng = np.random.default_rng(3)
    shape = ["batch", "seq", heads * head_dim] if rank == 3 else ["batch", heads, "seq", head_dim]
    attrs = {"interleaved": interleaved, **(extra or {})}
    if rotary_dim:
        attrs["rotary_embedding_dim"] = rotary_dim
    if (rank == 3 and num_heads_attr) or rotary_dim:  # ORT wants num_heads with rotary_embedding_dim
        attrs["num_heads"] = heads
    node = b.make_node("RotaryEmbedding", ["x", "ids", "cos", "sin"], ["y"], domain=MS, **attrs)
    inits = [numpy_helper.from_array(rng.standard_normal((32, half)).astype(np.float32), n) for n in ("cos", "sin")]
    ids_shape = ["batch", "seq"] if ids_rank == 2 else [1]
    graph = b.make_graph([node], "g", [b.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape),
                                       b.make_tensor_value_info("ids", onnx.TensorProto.INT64, ids_shape)],
                         [b.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)], inits)
    model = b.make_model(graph, opset_imports=[b.make_opsetid("", 17), b.make_opsetid(MS, 1)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("spec", [
    dict(rank=3), dict(rank=4), dict(rank=3, interleaved=1), dict(rank=4, interleaved=1),
    dict(rank=3, rotary_dim=4), dict(rank=4, rotary_dim=4, interleaved=1), dict(rank=3, num_heads_attr=False),
], ids=str)
def test_ort_rotary_embedding_matches_ort(tmp_path, spec):
    src, out = tmp_path / "rope.onnx", tmp_path / "rope_fused.onnx"
    onnx.save(_rotary_model(**spec), src)
    report = otfuse.fuse(src, out, only=["rope"])
    assert report.fusions == {"RotaryEmbedding": 1}, report.near_misses
    ids = np.tile(np.array([[3, 0, 7, 1, 30]], np.int64), (2, 1))
    x_shape = (2, 5, 16) if spec["rank"] == 3 else (2, 2, 5, 8)
    x = np.random.default_rng(5).standard_normal(x_shape).astype(np.float32)
    assert otfuse.diff(src, out, inputs={"x": x, "ids": ids}).ok


@pytest.mark.parametrize("spec, reason", [
    (dict(extra={"scale": 0.5}), "attribute 'scale' is 0.5"),
    (dict(extra={"is_packed_batching": 1}), "attribute 'is_packed_batching' is 1"),
    (dict(ids_rank=1), "a 1-D start offset is not modelled"),
    (dict(rotary_dim=6, head_dim=4), "rotary_embedding_dim 6 is not even and within the head size 4"),
], ids=str)
def test_ort_rotary_embedding_mutations_are_refused(spec, reason):
    _refused(_rotary_model(**spec), "rope", "RotaryEmbedding", reason)


def test_group_query_attention_is_refused_with_its_reason():
    """onnxruntime-genai's GQA (packed QKV, rotary inside, seqlens_k from the mask's sums); the
    forms re-targeted are in test_contrib_gqa.py."""
    b = onnx.helper
    heads, kv_heads, head_dim = 4, 2, 8
    node = b.make_node("GroupQueryAttention", ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total", "cos", "sin"],
                       ["y", "present_k", "present_v"], domain=MS, num_heads=heads, kv_num_heads=kv_heads,
                       do_rotary=1)
    f32, i32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
    cache = ["batch", kv_heads, "past", head_dim]
    graph = b.make_graph([node], "g", [
        b.make_tensor_value_info("qkv", f32, ["batch", "seq", (heads + 2 * kv_heads) * head_dim]),
        b.make_tensor_value_info("past_k", f32, cache), b.make_tensor_value_info("past_v", f32, cache),
        b.make_tensor_value_info("seqlens_k", i32, ["batch"]), b.make_tensor_value_info("total", i32, [])],
        [b.make_tensor_value_info("y", f32, ["batch", "seq", heads * head_dim])],
        [numpy_helper.from_array(np.ones((32, head_dim // 2), np.float32), n) for n in ("cos", "sin")])
    model = b.make_model(graph, opset_imports=[b.make_opsetid("", 17), b.make_opsetid(MS, 1)])
    _refused(model, "attention", "GroupQueryAttention", "attribute 'do_rotary' is 1")
    # without the rotation, its lengths (graph inputs here, the mask's sums in genai) are not provable
    node = model.graph.node[0]
    _set_attr(node, "do_rotary", 0)
    del node.input[7:]
    _refused(model, "attention", "GroupQueryAttention", "seqlens_k / total_sequence_length give per-row key counts")


def test_residual_add_before_simplified_layer_norm_becomes_add_rms_norm(tmp_path):
    """ORT leaves the residual Add in front of SimplifiedLayerNormalization when the sum is read
    elsewhere (gemma's TorchScript export after the extended optimisation): AddRMSNorm, S = the sum."""
    b = onnx.helper
    f32 = onnx.TensorProto.FLOAT
    nodes = [b.make_node("Add", ["a", "b"], ["sum"]),
             b.make_node("SimplifiedLayerNormalization", ["sum", "w"], ["y"], epsilon=1e-6, axis=-1),
             b.make_node("Mul", ["sum", "y"], ["out"])]
    shape = ["batch", "seq", 16]
    graph = b.make_graph(nodes, "g", [b.make_tensor_value_info(n, f32, shape) for n in ("a", "b")],
                         [b.make_tensor_value_info("out", f32, shape)],
                         [numpy_helper.from_array(np.linspace(0.5, 1.5, 16).astype(np.float32), "w")])
    model = b.make_model(graph, opset_imports=[b.make_opsetid("", 17)])
    model.ir_version = 9
    src, out = tmp_path / "m.onnx", tmp_path / "m_fused.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out, only=["norm"])
    assert report.fusions == {"AddRMSNorm": 1}, report.near_misses
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 5}).ok


# -- the packed Attention (BERT through optimize_for_ort) ----------------------------------------
BERT_OFO = "bert/dynamo_pos_dyn.ofo"


def _packed(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == MS and n.op_type == "Attention"]


def test_packed_attention_with_a_left_padded_mask_diffs_clean(tmp_path):
    """BERT's additive mask, offered to masks.py, becomes key padding: a padded batch row agrees."""
    path = materialise(BERT_OFO, tmp_path)
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(path, out)
    assert report.fusions.get("Attention") == 2 and not left_ops(out), report.near_misses
    rng = np.random.default_rng(2)
    mask = np.ones((2, 7), np.int64)
    mask[0, :3] = 0
    feeds = {"input_ids": rng.integers(0, 100, (2, 7)), "attention_mask": mask}
    names = {i.name for i in onnx.load(path, load_external_data=False).graph.input}
    if "position_ids" in names:
        feeds["position_ids"] = np.tile(np.arange(7), (2, 1))
    if "token_type_ids" in names:
        feeds["token_type_ids"] = np.zeros((2, 7), np.int64)
    result = otfuse.diff(path, out, inputs=feeds)
    assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("mutation, reason", [
    ("mask_index", "mask_index: ORT adds mask_filter_value"),
    ("unidirectional", "attribute 'unidirectional' is 1"),
    ("do_rotary", "attribute 'do_rotary' is 1"),
    ("present", "output present"),
    ("qkv_hidden_sizes", "qkv_hidden_sizes [32, 64, 96] do not split"),
    ("past_sequence_length", "input past_sequence_length"),
])
def test_packed_attention_mutations_are_refused(tmp_path, mutation, reason):
    model = load(BERT_OFO, tmp_path)
    model.graph.initializer.extend([numpy_helper.from_array(np.full(2, 7, np.int32), "lengths"),
                                    numpy_helper.from_array(np.array([0], np.int32), "past_len")])
    for node in _packed(model):
        inputs = list(node.input) + [""] * (7 - len(node.input))
        if mutation in ("unidirectional", "do_rotary"):
            _set_attr(node, mutation, 1)
        elif mutation == "qkv_hidden_sizes":
            _set_attr(node, mutation, [32, 64, 96])
        elif mutation == "present":
            _use_output(model, node, 1)
        else:
            position, name = {"mask_index": (3, "lengths"), "past_sequence_length": (6, "past_len")}[mutation]
            inputs[position] = name
        del node.input[:]
        node.input.extend(inputs[:max(i for i, n in enumerate(inputs) if n) + 1])
    before = len(_packed(model))
    fused, report = fuse_in_memory(model, "attention")
    assert len(_packed(fused)) == before == 2, report.fusions
    assert any(reason in m.get("reason", "") for m in report.near_misses), report.near_misses
