"""otfuse.diff, its tolerances, and the generated inputs it runs on (otfuse.run.feeds)."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from otfuse.verify import diff as compare
from otfuse.verify.diff import TOLERANCES, compare_arrays, diff, tolerance_for
from otfuse.errors import OtfuseError
from otfuse.run.feeds import DimResolver, InputSpec, make_feeds, parse_dims, vocab_size
from otfuse.run.session import find_library

F32 = TensorProto.FLOAT
REPO = Path(__file__).resolve().parents[2]


def matmul_add_model(*, delta: float = 0.0, input_name: str = "x", hidden: int = 8) -> onnx.ModelProto:
    """x[batch, seq, hidden] -> MatMul W -> Add B -> Relu -> z (and y, the Add output)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((hidden, hidden)).astype(np.float32)
    b = rng.standard_normal(hidden).astype(np.float32)
    b[0] += delta  # the "fused" copy's perturbation: shows up from the Add on
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", [input_name, "W"], ["mm"], name="matmul"),
            helper.make_node("Add", ["mm", "B"], ["y"], name="add"),
            helper.make_node("Relu", ["y"], ["z"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info(input_name, F32, ["batch", "seq", hidden])],
        [helper.make_tensor_value_info("z", F32, None), helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def save(model: onnx.ModelProto, path: Path, external: bool = False) -> Path:
    if external:
        onnx.save(model, path, save_as_external_data=True, location=path.name + ".data", size_threshold=0)
    else:
        onnx.save(model, path)
    return path


# --- diff --------------------------------------------------------------------------------------


def test_identical_copy_passes(tmp_path):
    a = save(matmul_add_model(), tmp_path / "a.onnx")
    b = save(matmul_add_model(), tmp_path / "b.onnx")
    result = diff(a, b)
    assert result.ok
    assert [r.name for r in result.outputs] == ["z", "y"]
    for row in result.outputs:
        assert row.max_abs == 0 and row.cosine == pytest.approx(1.0) and row.mismatches == 0
        assert (row.rtol, row.atol) == TOLERANCES["float32"]
        assert row.shape == [1, 16, 8]  # default batch=1, seq=16


def test_perturbed_initializer_fails_and_names_outputs(tmp_path):
    a = save(matmul_add_model(), tmp_path / "a.onnx")
    b = save(matmul_add_model(delta=0.5), tmp_path / "b.onnx")
    result = diff(a, b, dims={"batch": 2, "seq": 4})
    assert not result.ok
    assert "y" in result.failing_outputs
    row = next(r for r in result.outputs if r.name == "y")
    assert row.max_abs == pytest.approx(0.5, rel=1e-5)
    assert row.mismatches == 2 * 4  # column 0 of every row
    assert row.shape == [2, 4, 8]
    data = result.to_dict()
    assert data["ok"] is False and data["outputs"][1]["name"] == "y"


def test_user_tolerance_overrides_the_table(tmp_path):
    a = save(matmul_add_model(), tmp_path / "a.onnx")
    b = save(matmul_add_model(delta=1e-3), tmp_path / "b.onnx")
    assert not diff(a, b).ok
    assert diff(a, b, atol=1e-2).ok


def test_inputs_from_dict_and_npz(tmp_path):
    a = save(matmul_add_model(), tmp_path / "a.onnx")
    x = np.ones((3, 5, 8))  # float64, as numpy writes by default: cast to the input's float32
    assert diff(a, a, inputs={"x": x}).outputs[0].shape == [3, 5, 8]
    np.savez(tmp_path / "feeds.npz", x=x)
    assert diff(a, a, inputs=tmp_path / "feeds.npz").ok


def test_npz_missing_an_input(tmp_path):
    a = save(matmul_add_model(), tmp_path / "a.onnx")
    np.savez(tmp_path / "feeds.npz", not_x=np.ones((1, 2, 8)))
    with pytest.raises(OtfuseError, match=r"lacks model input\(s\) x"):
        diff(a, a, inputs=tmp_path / "feeds.npz")


def test_mismatching_graph_inputs(tmp_path):
    a = save(matmul_add_model(), tmp_path / "a.onnx")
    b = save(matmul_add_model(input_name="hidden"), tmp_path / "b.onnx")
    with pytest.raises(OtfuseError, match="graph inputs differ.*only the original has x"):
        diff(a, b)


def test_bfloat16_outputs_use_their_tolerance(tmp_path):
    bf16 = TensorProto.BFLOAT16
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xf"], to=F32), helper.make_node("Cast", ["xf"], ["y"], to=bf16)],
        "g", [helper.make_tensor_value_info("x", bf16, ["batch", 4])], [helper.make_tensor_value_info("y", bf16, None)],
    )
    a = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "a.onnx")
    result = diff(a, a)
    assert result.ok
    assert result.outputs[0].dtype == "bfloat16"
    assert (result.outputs[0].rtol, result.outputs[0].atol) == TOLERANCES["bfloat16"]


def test_tolerances_match_docs_ops_md():
    text = (REPO / "docs" / "ops.md").read_text()
    table = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(r"^\| (\w+) \| ([\d.e-]+) \| ([\d.e-]+) \|$", text, re.M)}
    assert table == TOLERANCES


def test_tolerance_for_dtypes():
    assert tolerance_for(np.float16) == (1e-2, 1e-2)
    assert tolerance_for(ml_dtypes.bfloat16) == (5e-2, 5e-2)
    assert tolerance_for(np.int64) == (0.0, 0.0)
    assert tolerance_for(np.float32, rtol=0.5) == (0.5, 1e-4)


def test_compare_arrays_nan_and_inf_positions():
    o = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert compare_arrays("t", o, o.copy(), 1e-4, 1e-4).ok
    moved = np.array([np.nan, 1.0, np.inf, -np.inf], np.float32)
    row = compare_arrays("t", o, moved, 1e-4, 1e-4)
    assert not row.ok and row.mismatches == 2
    flipped = np.array([1.0, np.nan, -np.inf, -np.inf], np.float32)
    assert not compare_arrays("t", o, flipped, 1e-4, 1e-4).ok


def test_compare_arrays_rule_and_shape_mismatch():
    o = np.array([100.0, 0.0], np.float32)
    # |f - o| <= atol + rtol * |o|: 100.005 is inside 1e-4 + 1e-4 * 100, 100.02 is not.
    assert compare_arrays("t", o, np.array([100.005, 0.0], np.float32), 1e-4, 1e-4).ok
    assert not compare_arrays("t", o, np.array([100.02, 0.0], np.float32), 1e-4, 1e-4).ok
    assert not compare_arrays("t", o, np.array([100.0, 0.001], np.float32), 1e-4, 1e-4).ok
    row = compare_arrays("t", o, np.zeros(3, np.float32), 1e-4, 1e-4)
    assert not row.ok and "[3]" in row.note
    ints = np.array([1, 2, 3])
    assert not compare_arrays("t", ints, ints + np.array([0, 0, 1]), 0.0, 0.0).ok


# --- per-fusion --------------------------------------------------------------------------------


def test_per_fusion_names_first_divergence_and_cleans_up(tmp_path, monkeypatch):
    # Without the custom-op library, treat every standard node as "fused" (domain ""): the same
    # machinery (extra outputs on temporary copies, graph-order scan) runs on ops ORT knows.
    monkeypatch.setattr(compare, "OP_DOMAIN", "")
    a = save(matmul_add_model(), tmp_path / "a.onnx", external=True)
    b = save(matmul_add_model(delta=0.5), tmp_path / "b.onnx", external=True)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = diff(a, b, per_fusion=True)
    assert [(r.node, r.op_type, r.name, r.ok) for r in result.fusions] == [
        ("matmul", "MatMul", "mm", True), ("add", "Add", "y", False), ("relu", "Relu", "z", False)]
    first = result.first_divergence
    assert (first.node, first.op_type, first.name) == ("add", "Add", "y")
    assert result.to_dict()["first_divergence"]["node"] == "add"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp copies, inputs untouched


def test_per_fusion_without_otfuse_nodes_has_no_rows(tmp_path):
    a = save(matmul_add_model(), tmp_path / "a.onnx")
    result = diff(a, a, per_fusion=True)
    assert result.ok and result.fusions == [] and result.first_divergence is None


@pytest.mark.skipif(find_library()[0] is None, reason="otfuse custom-op library not built")
def test_per_fusion_on_a_really_fused_norm(tmp_path):
    from fusions.norm.graphs import single_norm_model

    import otfuse

    src = save(single_norm_model("rms", hidden=16), tmp_path / "m.onnx")
    otfuse.fuse(src, tmp_path / "m_fused.onnx")
    result = diff(src, tmp_path / "m_fused.onnx", per_fusion=True)
    assert result.ok
    assert result.fusions and result.fusions[0].op_type == "RMSNorm"
    assert result.first_divergence is None

    fused = onnx.load(tmp_path / "m_fused.onnx")
    node = next(n for n in fused.graph.node if n.op_type == "RMSNorm")
    scale = next(t for t in fused.graph.initializer if t.name == node.input[1])
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 1.5, scale.name))
    save(fused, tmp_path / "m_broken.onnx")
    result = diff(src, tmp_path / "m_broken.onnx", per_fusion=True)
    assert not result.ok
    assert (result.first_divergence.node, result.first_divergence.op_type) == (node.name, "RMSNorm")


# --- feeds -------------------------------------------------------------------------------------


def test_parse_dims():
    assert parse_dims("batch=2,seq=64") == {"batch": 2, "seq": 64}
    assert parse_dims(" batch = 2 , ") == {"batch": 2}
    assert parse_dims(None) == {} and parse_dims("") == {}
    for bad in ("batch", "batch=", "=2", "batch=two", "batch=-1", "seq=1.5"):
        with pytest.raises(OtfuseError, match="bad --dims entry"):
            parse_dims(bad)


def embedding_model(vocab: int = 50, *, through_cast: bool = False, extra_inputs=()) -> onnx.ModelProto:
    table = numpy_helper.from_array(np.zeros((vocab, 4), np.float32), "embed_tokens")
    nodes = []
    ids = "input_ids"
    if through_cast:
        nodes.append(helper.make_node("Cast", [ids], ["ids32"], to=TensorProto.INT32))
        ids = "ids32"
    nodes.append(helper.make_node("Gather", ["embed_tokens", ids], ["h"]))
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])]
    inputs += list(extra_inputs)
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("h", F32, None)], [table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("through_cast", [False, True])
def test_vocab_from_embedding_gather(through_cast):
    model = embedding_model(37, through_cast=through_cast)
    assert vocab_size(model, "input_ids") == 37
    ids = make_feeds(model, dims={"seq": 500})["input_ids"]
    assert ids.shape == (1, 500) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < 37 and ids.max() > 20  # spread over the vocabulary


def test_vocab_fallback_without_gather():
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["f"], to=F32)], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("f", F32, None)])
    model = helper.make_model(graph)
    assert vocab_size(model, "input_ids") is None
    assert make_feeds(model, dims={"seq": 1000})["input_ids"].max() < 100


def test_named_inputs_get_realistic_values():
    i64 = TensorProto.INT64
    extra = [
        helper.make_tensor_value_info("attention_mask", i64, ["batch_size", "total_sequence_length"]),
        helper.make_tensor_value_info("position_ids", i64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("token_type_ids", i64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("past_key_values.0.key", F32, ["batch_size", 2, "past_sequence_length", 8]),
        helper.make_tensor_value_info("is_causal", TensorProto.BOOL, []),
        helper.make_tensor_value_info("hidden", F32, ["batch_size", "sequence_length", 8]),
    ]
    feeds = make_feeds(embedding_model(extra_inputs=extra), dims={"batch": 2, "seq": 5, "past": 3})
    assert feeds["input_ids"].shape == (2, 5)
    # total = past + seq; batch row 1 right-padded by one, so a claimed padding is exercised
    assert feeds["attention_mask"].shape == (2, 8)
    assert feeds["attention_mask"].tolist() == [[1] * 8, [1] * 7 + [0]]
    assert (feeds["position_ids"] == np.arange(5)).all() and feeds["position_ids"].shape == (2, 5)
    assert (feeds["token_type_ids"] == 0).all()
    past = feeds["past_key_values.0.key"]
    assert past.shape == (2, 2, 3, 8) and past.dtype == np.float32 and 0 < np.abs(past).std() < 0.3
    assert feeds["is_causal"].dtype == np.bool_ and feeds["is_causal"].item() is True
    assert 0.3 < feeds["hidden"].std() < 0.7  # standard normal * 0.5


def test_past_defaults_to_seq_and_expressions_evaluate():
    extra = [
        helper.make_tensor_value_info("past_key", F32, [1, 2, "past_sequence_length", 4]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "past_sequence_length + 1"]),
    ]
    feeds = make_feeds(embedding_model(extra_inputs=extra))
    assert feeds["past_key"].shape == (1, 2, 16, 4)
    assert feeds["attention_mask"].shape == (1, 17)


def test_unnamed_dims_by_position():
    spec_ids = InputSpec("input_ids", TensorProto.INT64, (None, None))
    spec_past = InputSpec("past_key_values.0.value", F32, ("unk__1", 4, "unk__2", 8))
    resolver = DimResolver({"batch": 3, "seq": 7}, has_past=True)
    assert [resolver.size(d, spec=spec_ids, axis=i) for i, d in enumerate(spec_ids.shape)] == [3, 7]
    assert [resolver.size(d, spec=spec_past, axis=i) for i, d in enumerate(spec_past.shape)] == [3, 4, 7, 8]


def test_exact_dim_names_win_and_unknown_names_are_refused():
    model = embedding_model()
    assert make_feeds(model, dims={"sequence_length": 9, "seq": 4})["input_ids"].shape == (1, 9)
    with pytest.raises(OtfuseError, match="--dims names no dimension of the model: seqq"):
        make_feeds(model, dims={"seqq": 4})


def test_feeds_are_seeded():
    model = embedding_model(1000)
    first, again, other = make_feeds(model, seed=1), make_feeds(model, seed=1), make_feeds(model, seed=2)
    assert (first["input_ids"] == again["input_ids"]).all()
    assert not (first["input_ids"] == other["input_ids"]).all()


def test_feeds_never_load_external_weights(tmp_path):
    path = save(embedding_model(64), tmp_path / "m.onnx", external=True)
    (tmp_path / "m.onnx.data").write_bytes(b"\0" * (64 * 4 * 4))  # same size, nothing useful in it
    assert make_feeds(path)["input_ids"].max() < 64
