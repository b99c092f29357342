"""Norm + Linear patterns on hand-built graphs: the projection spellings, and mutations that must
not fuse (or must fuse while keeping the normalised tensor), each proven by otfuse.diff."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto
from fusing import assert_same_outputs, attrs, fuse_model, fused_nodes
from fusions.norm.graphs import layer_norm_decomposed, rms_norm
from graphs import F32, GraphBuilder

HIDDEN = 16
RNG = np.random.default_rng(42)


def weight(*shape) -> np.ndarray:
    return (0.1 * RNG.standard_normal(shape)).astype(np.float32)


def builder(residual=False, seq="seq"):
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", seq, HIDDEN])
    if residual:
        r = b.input("r", F32, ["batch", seq, HIDDEN])
        x = b.node("Add", [x, r], base="sum")
    return b, x


def out(b: GraphBuilder, value: str, name: str, shape) -> str:
    b.nodes.append(__import__("onnx").helper.make_node("Identity", [value], [name], name=f"id_{name}"))
    b.output(name, F32, shape)
    return name


def fuse(tmp_path, b: GraphBuilder, dims=None, only=("norm", "norm_linear")):
    model, report = fuse_model(tmp_path, b.model(), only=list(only))
    if model is not None:
        assert_same_outputs(tmp_path, dims=dims)
    return model, report


def linear_nodes(model):
    return [n for n in fused_nodes(model) if n.op_type.endswith("Linear")]


def test_qkv_fan_out_is_one_node(tmp_path):
    b, x = builder()
    n = rms_norm(b, x, HIDDEN)
    for name, width in (("q", 16), ("k", 8), ("v", 8)):
        out(b, b.node("MatMul", [n, b.const(weight(HIDDEN, width))]), name, ["batch", "seq", width])
    model, report = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert node.op_type == "RMSNormLinear"
    assert attrs(node)["out_features"] == [16, 8, 8] and attrs(node)["transposed"] == [0, 0, 0]
    assert len(node.output) == 3  # nothing else reads the normalised tensor: no Yn output
    assert report.fusions == {"RMSNormLinear": 1}
    assert not any(n.op_type == "MatMul" for n in model.graph.node)


def test_mlp_gate_up_after_residual_add(tmp_path):
    b, s = builder(residual=True)
    n = rms_norm(b, s, HIDDEN)
    gate = b.node("MatMul", [n, b.const(weight(HIDDEN, 32))])
    up = b.node("MatMul", [n, b.const(weight(HIDDEN, 32))])
    out(b, b.node("Mul", [b.node("Sigmoid", [gate]), up]), "y", ["batch", "seq", 32])
    out(b, s, "residual", ["batch", "seq", HIDDEN])
    model, _ = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert node.op_type == "AddRMSNormLinear"
    assert len(node.output) == 3  # gate, up, the residual sum


def test_lm_head_through_transpose_of_a_constant(tmp_path):
    b, x = builder()
    n = rms_norm(b, x, HIDDEN)
    table = b.const(weight(40, HIDDEN), "embedding")  # tied embedding [vocab, hidden]
    out(b, b.node("MatMul", [n, b.node("Transpose", [table], perm=[1, 0])]), "logits", ["batch", "seq", 40])
    model, _ = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert attrs(node)["transposed"] == [1]
    assert node.input[-1] == table  # the exported tensor, read transposed by the kernel
    assert not any(n.op_type == "Transpose" for n in model.graph.node)


def tied_head(gather_reads_table=True):
    """RMSNorm -> MatMul(., Transpose(E)) -> logits, and the embedding lookup Gather(E, ids) -> emb
    (GPT-2 / Qwen2-0.5B's tied table; with ``gather_reads_table`` False the Gather reads its own
    table: an untied head). Returns (the builder, the norm's output, E)."""
    b, x = builder()
    n = rms_norm(b, x, HIDDEN)
    table = b.const(weight(40, HIDDEN), "embedding")
    out(b, b.node("MatMul", [n, b.node("Transpose", [table], perm=[1, 0])]), "logits", ["batch", "seq", 40])
    ids = b.input("ids", TensorProto.INT64, ["batch", "seq"])
    looked_up = table if gather_reads_table else b.const(weight(40, HIDDEN), "embedding_in")
    out(b, b.node("Gather", [looked_up, ids], axis=0), "emb", ["batch", "seq", HIDDEN])
    return b, n, table


def test_tied_lm_head_marks_its_weight_shared(tmp_path):
    """A Gather reads the head's table too: ORT keeps it whatever the fused node does, so the node
    says so (shared_weight = 1: the custom-op kernel packs it once, docs/ops.md)."""
    b, _, table = tied_head()
    model, _ = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert attrs(node)["shared_weight"] == [1] and attrs(node)["transposed"] == [1]
    assert node.input[-1] == table
    assert sorted(n.op_type for n in model.graph.node if table in n.input) == ["Gather", "RMSNormLinear"]


def test_untied_lm_head_has_no_shared_weight(tmp_path):
    """Mutation: the Gather reads another table, so nothing else keeps the head's weight: no
    attribute (an untied weight is read in place, never copied)."""
    b, _, _ = tied_head(gather_reads_table=False)
    model, _ = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert "shared_weight" not in attrs(node)


def test_weight_read_by_another_op_is_not_marked_shared(tmp_path):
    """Mutation: the head's table is read by something that is no Gather (a second, unfused MatMul;
    an Identity to an output): ORT may pack and free it in the unfused graph, so reading it elsewhere
    proves nothing about the memory: no attribute."""
    for other in ("MatMul", "Identity"):
        b, x = builder()
        n = rms_norm(b, x, HIDDEN)
        table = b.const(weight(40, HIDDEN), "embedding")
        out(b, b.node("MatMul", [n, b.node("Transpose", [table], perm=[1, 0])]), "logits", ["batch", "seq", 40])
        if other == "MatMul":
            out(b, b.node("MatMul", [x, b.node("Transpose", [table], perm=[1, 0])]), "raw", ["batch", "seq", 40])
        else:
            out(b, b.node("Identity", [table]), "table_out", [40, HIDDEN])
        model, _ = fuse(tmp_path, b)
        (node,) = linear_nodes(model)
        assert "shared_weight" not in attrs(node), other


def test_shared_weight_per_projection(tmp_path):
    """Two projections of one norm, one over the tied table: only that one is marked."""
    b, n, _ = tied_head()
    out(b, b.node("MatMul", [n, b.const(weight(HIDDEN, 8))]), "q", ["batch", "seq", 8])
    model, _ = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert attrs(node)["out_features"] == [40, 8]
    assert attrs(node)["shared_weight"] == [1, 0]


def test_gemm_trans_b_behind_a_flattening_reshape(tmp_path):
    b, s = builder(residual=True)
    n = layer_norm_decomposed(b, s, HIDDEN)
    flat = b.node("Reshape", [n, b.const(np.array([-1, HIDDEN], np.int64))])
    gemm = b.node("Gemm", [flat, b.const(weight(24, HIDDEN)), b.const(weight(24))], transB=1)
    out(b, gemm, "y", ["batch*seq", 24])
    out(b, s, "residual", ["batch", "seq", HIDDEN])
    model, _ = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert node.op_type == "AddLayerNormLinear"
    assert attrs(node)["transposed"] == [1] and attrs(node)["has_bias"] == [1]
    assert [n.op_type for n in model.graph.node if n.domain != "otfuse"].count("Reshape") == 1  # the way back


def test_lm_head_behind_a_reshape_to_the_same_shape(tmp_path):
    """GPT-2's lm_head: ln_f -> Reshape to [batch, seq, hidden] (a no-op view) -> MatMul. The fused
    node writes the logits itself: a Reshape back would copy them (a graph output)."""
    b, x = builder()
    n = layer_norm_decomposed(b, x, HIDDEN)
    view = b.node("Reshape", [n, b.const(np.array([0, 0, HIDDEN], np.int64))])
    table = b.const(weight(40, HIDDEN), "embedding")
    out(b, b.node("MatMul", [view, b.node("Transpose", [table], perm=[1, 0])]), "logits", ["batch", "seq", 40])
    model, _ = fuse(tmp_path, b, dims={"batch": 2, "seq": 5})
    (node,) = linear_nodes(model)
    assert attrs(node)["transposed"] == [1]
    assert not any(n.op_type == "Reshape" for n in model.graph.node)


def test_reshape_that_may_change_the_shape_keeps_the_way_back(tmp_path):
    """Mutation of the above: [1, -1, hidden] equals [batch, seq, hidden] only when batch is 1, so
    the projection still reads the reshaped rows and its output is reshaped back."""
    b, x = builder()
    n = layer_norm_decomposed(b, x, HIDDEN)
    view = b.node("Reshape", [n, b.const(np.array([1, -1, HIDDEN], np.int64))])
    out(b, b.node("MatMul", [view, b.const(weight(HIDDEN, 40))]), "logits", [1, "rows", 40])
    model, _ = fuse(tmp_path, b, dims={"batch": 2, "seq": 5})
    (node,) = linear_nodes(model)
    assert [n.op_type for n in model.graph.node if n.domain != "otfuse"].count("Reshape") == 1  # the way back


def test_bias_add_is_absorbed(tmp_path):
    b, x = builder()
    n = layer_norm_decomposed(b, x, HIDDEN)
    y = b.node("Add", [b.node("MatMul", [n, b.const(weight(HIDDEN, 12))]), b.const(weight(12))])
    out(b, y, "y", ["batch", "seq", 12])
    model, _ = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert node.op_type == "LayerNormLinear" and attrs(node)["has_bias"] == [1]
    assert not any(n.op_type in ("Add", "MatMul") for n in model.graph.node)


def test_non_constant_weight_is_a_near_miss(tmp_path):
    b, x = builder()
    n = rms_norm(b, x, HIDDEN)
    w = b.input("w", F32, [HIDDEN, 8])
    out(b, b.node("MatMul", [n, w]), "y", ["batch", "seq", 8])
    model, report = fuse(tmp_path, b)
    assert not linear_nodes(model)
    assert any("is not a constant" in m["reason"] and m["family"] == "norm_linear" for m in report.near_misses)


def test_other_consumer_keeps_the_normalised_output(tmp_path):
    """One consumer is not a projection (and one MatMul weight is not constant): the fused node
    also outputs the normalised tensor, which they keep reading."""
    b, x = builder()
    n = rms_norm(b, x, HIDDEN)
    out(b, b.node("MatMul", [n, b.const(weight(HIDDEN, 8))]), "q", ["batch", "seq", 8])
    out(b, b.node("Add", [n, x]), "other", ["batch", "seq", HIDDEN])
    out(b, b.node("MatMul", [n, b.input("w", F32, [HIDDEN, 4])]), "dynamic", ["batch", "seq", 4])
    model, _ = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert attrs(node)["out_features"] == [8]
    assert len(node.output) == 2  # q, then Yn
    readers = [m.op_type for m in model.graph.node if node.output[1] in m.input]
    assert sorted(readers) == ["Add", "MatMul"]


def test_normalised_value_as_graph_output(tmp_path):
    b, x = builder()
    n = rms_norm(b, x, HIDDEN)
    out(b, b.node("MatMul", [n, b.const(weight(HIDDEN, 8))]), "q", ["batch", "seq", 8])
    b.output(n, F32, ["batch", "seq", HIDDEN])
    model, _ = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert node.output[-1] == n


def test_weight_on_the_left_is_not_a_projection(tmp_path):
    """W @ x (the normalised value as MatMul's second operand) is left alone; the x @ W next to it
    is fused and W @ x reads Yn."""
    b, x = builder(seq=4)
    n = rms_norm(b, x, HIDDEN)
    out(b, b.node("MatMul", [b.const(weight(3, 4)), n]), "left", ["batch", 3, HIDDEN])
    out(b, b.node("MatMul", [n, b.const(weight(HIDDEN, 8))]), "right", ["batch", 4, 8])
    model, _ = fuse(tmp_path, b, dims={"batch": 2})
    (node,) = linear_nodes(model)
    assert attrs(node)["out_features"] == [8] and len(node.output) == 2


def test_weight_on_the_left_alone_is_a_near_miss(tmp_path):
    b, x = builder(seq=4)
    n = rms_norm(b, x, HIDDEN)
    out(b, b.node("MatMul", [b.const(weight(3, 4)), n]), "left", ["batch", 3, HIDDEN])
    model, report = fuse(tmp_path, b, dims={"batch": 2})
    assert not linear_nodes(model)
    assert any("second operand" in m["reason"] for m in report.near_misses)


def test_mismatched_k_is_refused(tmp_path):
    """A weight whose first dim is not the row length (a broken export) is not a projection."""
    b, x = builder()
    n = rms_norm(b, x, HIDDEN)
    out(b, b.node("MatMul", [n, b.const(weight(HIDDEN + 1, 8))]), "y", ["batch", "seq", 8])
    model, report = fuse_model(tmp_path, b.model(), only=["norm", "norm_linear"])
    assert not linear_nodes(model)
    assert any("has K = 17 but the normalised rows have 16" in m["reason"] for m in report.near_misses)


def test_matmul_feeding_something_else_keeps_its_add(tmp_path):
    """A bias Add is taken only when it is the MatMul's sole reader."""
    b, x = builder()
    n = rms_norm(b, x, HIDDEN)
    mm = b.node("MatMul", [n, b.const(weight(HIDDEN, 8))])
    out(b, b.node("Add", [mm, b.const(weight(8))]), "y", ["batch", "seq", 8])
    out(b, mm, "raw", ["batch", "seq", 8])
    model, _ = fuse(tmp_path, b)
    (node,) = linear_nodes(model)
    assert attrs(node)["has_bias"] == [0]


def test_fusing_twice_changes_nothing(tmp_path):
    b, x = builder()
    n = rms_norm(b, x, HIDDEN)
    out(b, b.node("MatMul", [n, b.node("Transpose", [b.const(weight(8, HIDDEN))], perm=[1, 0])]), "y",
        ["batch", "seq", 8])
    model, _ = fuse(tmp_path, b)
    again, report = fuse_model(tmp_path, model, name="again", only=["norm", "norm_linear"])
    assert again is None and not report.fusions
