"""The dimension engine op by op (otfuse/rewriter/dims/ops_*.py): shapes, the symbolic values of
shape tensors, and what each op implies about its inputs, on small graphs with no value_info
(so nothing but the engine says anything), as GraphIndex shows them to the families."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from otfuse.domain import OP_DOMAIN
from otfuse.rewriter.graph import GraphIndex

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


class G:
    """A graph under construction: ``x = g.op("Reshape", a, b)``; ``g.index()`` the GraphIndex."""

    def __init__(self, opset: int = 18):
        self.nodes, self.inputs, self.inits, self.opset, self.n = [], [], [], opset, 0
        self.domains = {"": opset}

    def input(self, name, shape, elem=F32):
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def const(self, value, dtype=np.int64):
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type, *inputs, outputs=1, domain="", **attrs):
        self.n += 1
        outs = [f"{op_type.lower()}{self.n}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=f"{op_type}{self.n}", domain=domain,
                                           **attrs))
        if domain:
            self.domains.setdefault(domain, 1)
        return outs[0] if outputs == 1 else outs

    def index(self, outputs=()) -> GraphIndex:
        out = [helper.make_tensor_value_info(self.nodes[-1].output[0], F32, None)]
        graph = helper.make_graph(self.nodes, "g", self.inputs, out, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self.domains.items()])
        model.ir_version = 9
        return GraphIndex(model)


def dims(graph: GraphIndex, name: str):
    return [d if isinstance(d, int) else str(d) for d in graph.shape(name)]


def proven(graph: GraphIndex, name: str):
    return [d if isinstance(d, int) else str(d) for d in graph.proven_shape(name)]


def value(graph: GraphIndex, name: str):
    found = graph.dims.value(name)
    return None if found is None else [None if v is None else (v.value if v.value is not None else v.text)
                                       for v in found.reshape(-1)]


# -- inputs ----------------------------------------------------------------------------------------
def test_input_dims_named_static_and_unknown():
    g = G()
    x = g.input("x", ["batch", "past_seq + seq", 8, None])
    y = g.input("y", [None])
    g.nodes.append(helper.make_node("Identity", [x], ["out"]))
    model_graph = g.index()
    proto = model_graph.model.graph.input[1].type.tensor_type.shape.dim[0]
    proto.Clear()
    proto.dim_value = 0  # paddle-style dims are fresh unknowns too: -1, 0, unk__N, blank
    assert dims(model_graph, x) == ["batch", "past_seq + seq", 8, "x.dim3"]
    assert dims(model_graph, y) == ["y.dim0"]
    for spelled in (-1, "unk__3", "?"):
        g2 = G()
        g2.input("z", [spelled])
        g2.nodes.append(helper.make_node("Identity", ["z"], ["out"]))
        assert dims(g2.index(), "z") == ["z.dim0"]


def test_an_input_without_a_shape_has_no_rank():
    g = G()
    g.inputs.append(helper.make_tensor_value_info("x", F32, None))
    g.op("Relu", "x")
    assert g.index().shape("x") is None


# -- shape arithmetic --------------------------------------------------------------------------------
def _torchscript_heads(g: G, x: str) -> str:
    """Reshape(x, Concat(Unsqueeze(Shape(x)[0]), Unsqueeze(Shape(x)[1]), [-1], [16]))."""
    shape = g.op("Shape", x)
    batch = g.op("Unsqueeze", g.op("Gather", shape, g.const(0), axis=0), g.const([0]))
    seq = g.op("Unsqueeze", g.op("Gather", shape, g.const(1), axis=0), g.const([0]))
    target = g.op("Concat", batch, seq, g.const([-1]), g.const([16]), axis=0)
    return g.op("Reshape", x, target)


def test_reshape_from_shape_arithmetic_solves_minus_one():
    g = G()
    x = g.input("x", [None, None, 64])
    y = _torchscript_heads(g, x)
    graph = g.index()
    assert dims(graph, y) == ["x.dim0", "x.dim1", 4, 16]
    target = graph.producer[y].input[1]
    assert value(graph, target) == ["x.dim0", "x.dim1", -1, 16]


def test_reshape_zero_copies_and_minus_one_cancels_symbolic_factors():
    g = G()
    x = g.input("x", ["B", 2, 2, "S", 8])
    y = g.op("Reshape", x, g.const([0, 4, -1, 8]))
    assert dims(g.index(), y) == ["B", 4, "S", 8]


def test_reshape_learns_the_element_count():
    """A target whose entries are unknown at export time: the product still has to match."""
    g = G()
    x = g.input("x", ["batch", "seq", 64])
    target = g.input("target", [2], I64)
    y = g.op("Reshape", x, target)
    z = g.op("Reshape", y, g.const([-1, 64]))
    graph = g.index()
    assert len(dims(graph, y)) == 2
    assert dims(graph, z) == ["batch*seq", 64]


def test_reshape_with_one_unknown_entry_solves_it():
    g = G()
    x = g.input("x", ["batch", "seq", 64])
    unknown = g.input("n", [1], I64)
    y = g.op("Reshape", x, g.op("Concat", g.const([0]), unknown, g.const([16]), axis=0))
    assert dims(g.index(), y) == ["batch", "4*seq", 16]


def test_size_and_shape_slices():
    g = G()
    x = g.input("x", ["batch", "seq", 8])
    size = g.op("Size", x)
    tail = g.op("Shape", x, start=-2)
    picked = g.op("Slice", g.op("Shape", x), g.const([1]), g.const([2]))
    graph = g.index()
    assert value(graph, size) == ["8*batch*seq"]
    assert value(graph, tail) == ["seq", 8] and dims(graph, tail) == [2]
    assert value(graph, picked) == ["seq"]


def test_static_dims_fold_to_constants():
    g = G()
    x = g.input("x", ["batch", "seq", 64])
    d = g.op("Gather", g.op("Shape", x), g.const(2), axis=0)
    half = g.op("Div", d, g.const(2))
    graph = g.index()
    assert graph.is_constant(half) and int(graph.constant_value(half)) == 32
    assert not graph.is_constant(g.nodes[0].output[0])  # the whole shape is not known


def test_integer_mod_of_known_values_is_known():
    """TorchScript's ``q.unflatten(1, (heads, -1))`` slices the shape at ``Mod(4, 3)`` and
    ``Mod(4, 3) + 1`` (Sana's linear attention): the view's dims follow from them."""
    g = G()
    x = g.input("x", ["batch", 64, 16])
    cut = g.op("Reshape", g.op("Mod", g.const(4), g.const(3)), g.const([1]))
    after = g.op("Reshape", g.op("Add", g.op("Mod", g.const(4), g.const(3)), g.const(1)), g.const([1]))
    shape = g.op("Shape", x)
    head = g.op("Slice", shape, g.const([0]), cut)
    tail = g.op("Slice", shape, after, g.const([2**63 - 1]))
    view = g.op("Reshape", x, g.op("Concat", head, g.const([4, -1]), tail, axis=0))
    negative = g.op("Mod", g.const(-4), g.const(3))  # fmod 0 and 1 disagree: not folded
    graph = g.index()
    assert value(graph, cut) == [1]
    assert dims(graph, view) == ["batch", 4, 16, 16]
    assert value(graph, negative) in (None, [None])


def test_where_minus_one_and_expand():
    """HF's ``Expand(x, Where(shape == -1, 1, shape))`` for ``x.expand(B, -1, -1)``."""
    g = G()
    x = g.input("x", [1, "seq", 8])
    b = g.input("b", ["batch", 3])
    batch = g.op("Slice", g.op("Shape", b), g.const([0]), g.const([1]))
    shape = g.op("Concat", batch, g.const([-1, -1]), axis=0)
    fixed = g.op("Where", g.op("Equal", shape, g.const([-1, -1, -1])), g.const([1, 1, 1]), shape)
    y = g.op("Expand", x, fixed)
    graph = g.index()
    assert value(graph, fixed) == ["batch", 1, 1]
    assert dims(graph, y) == ["batch", "seq", 8]


def test_range_cumsum_and_constant_of_shape():
    g = G()
    x = g.input("x", ["batch", "seq"], I64)
    p = g.input("past", ["batch", 2, "past", 8])
    seq = g.op("Gather", g.op("Shape", x), g.const(1), axis=0)
    past = g.op("Gather", g.op("Shape", p), g.const(2), axis=0)
    positions = g.op("Range", past, g.op("Add", past, seq), g.const(1))
    ones = g.op("ConstantOfShape", g.op("Shape", x), value=numpy_helper.from_array(np.array([1], np.int64)))
    steps = g.op("CumSum", g.const([2, 3, 4]), g.const(0))
    small = g.op("Range", g.const(0), g.const(4), g.const(2))
    graph = g.index()
    assert dims(graph, positions) == ["seq"]
    assert dims(graph, ones) == ["batch", "seq"] and graph.elem_type(ones) == I64
    assert value(graph, steps) == [2, 5, 9]
    assert value(graph, small) == [0, 2]


def test_max_min_cast_and_comparisons_of_values():
    g = G()
    x = g.input("x", ["batch", "seq"])
    seq = g.op("Gather", g.op("Shape", x), g.const([1]), axis=0)
    bigger = g.op("Max", seq, g.const([1]))
    smaller = g.op("Min", seq, g.const([0]))
    as_float = g.op("Cast", seq, to=F32)
    same = g.op("Equal", seq, g.op("Identity", seq))
    graph = g.index()
    assert value(graph, bigger) == ["max(1, seq)"]
    assert value(graph, smaller) == [0]
    assert value(graph, as_float) == ["seq"] and graph.elem_type(as_float) == F32
    assert value(graph, same) == [1] and graph.elem_type(same) == BOOL


def test_arithmetic_on_values():
    g = G()
    x = g.input("x", ["batch", "seq", 64])
    shape = g.op("Shape", x)
    heads = g.op("Div", g.op("Gather", shape, g.const([2]), axis=0), g.const([16]))
    flat = g.op("Mul", g.op("Gather", shape, g.const([0]), axis=0), heads)
    total = g.op("Sub", g.op("Add", flat, g.const([3])), g.const([1]))
    graph = g.index()
    assert value(graph, heads) == [4]
    assert value(graph, flat) == ["4*batch"]
    assert value(graph, total) == ["4*batch + 2"]


# -- moving data ---------------------------------------------------------------------------------------
def test_squeeze_unsqueeze_flatten_transpose():
    g = G()
    x = g.input("x", ["batch", 1, "seq", 8])
    squeezed = g.op("Squeeze", x, g.const([1]))
    unsqueezed = g.op("Unsqueeze", squeezed, g.const([-1, 0]))
    flat = g.op("Flatten", x, axis=2)
    moved = g.op("Transpose", x, perm=[0, 2, 1, 3])
    graph = g.index()
    assert dims(graph, squeezed) == ["batch", "seq", 8]
    assert dims(graph, unsqueezed) == [1, "batch", "seq", 8, 1]
    assert dims(graph, flat) == ["batch", "8*seq"]
    assert dims(graph, moved) == ["batch", "seq", 1, 8]


def test_squeeze_without_axes_needs_static_dims():
    g = G()
    x = g.input("x", [1, "seq", 1])
    y = g.op("Squeeze", x)
    assert g.index().shape(y) is None


def test_tile_concat_split_and_gathers():
    g = G()
    x = g.input("x", ["batch", 2, "seq", 8])
    tiled = g.op("Tile", x, g.const([1, 3, 1, 1]))
    joined = g.op("Concat", x, g.input("past", ["batch", 2, "past", 8]), axis=2)
    halves = g.op("Split", x, g.const([4, 4]), axis=-1, outputs=2)
    rows = g.op("Gather", x, g.input("ids", ["n", "m"], I64), axis=2)
    nd = g.op("GatherND", x, g.input("idx", ["k", 2], I64))
    graph = g.index()
    assert dims(graph, tiled) == ["batch", 6, "seq", 8]
    assert dims(graph, joined) == ["batch", 2, "past + seq", 8]
    assert [dims(graph, h) for h in halves] == [["batch", 2, "seq", 4]] * 2
    assert dims(graph, rows) == ["batch", 2, "n", "m", 8]
    assert dims(graph, nd) == ["k", "seq", 8]


def test_concat_learns_its_other_axes():
    g = G()
    a = g.input("a", [None, 2, 8])
    b = g.input("b", ["batch", 3, None])
    y = g.op("Concat", a, b, axis=1)
    graph = g.index()
    assert dims(graph, y) == ["batch", 5, 8]
    assert dims(graph, a) == ["batch", 2, 8] and dims(graph, b) == ["batch", 3, 8]


def test_slices_of_tensors():
    g = G()
    x = g.input("x", ["batch", "seq", 64])
    cache = g.input("cache", [2048, 16])
    seq = g.op("Gather", g.op("Shape", x), g.const([1]), axis=0)
    head = g.op("Slice", x, g.const([0]), g.const([32]), g.const([-1]))
    tail = g.op("Slice", x, g.const([1]), g.const([2**63 - 1]), g.const([1]))
    last = g.op("Slice", x, g.const([-1]), g.const([2**63 - 1]), g.const([1]))
    odd = g.op("Slice", x, g.const([1]), g.const([64]), g.const([2]), g.const([2]))
    table = g.op("Slice", cache, g.const([0]), seq, g.const([0]))
    graph = g.index()
    assert dims(graph, head) == ["batch", "seq", 32]
    assert dims(graph, tail) == ["batch", "max(0, seq - 1)", 64]
    assert dims(graph, last) == ["batch", "min(1, seq)", 64]
    assert dims(graph, odd) == ["batch", "seq", 32]
    assert dims(graph, table) == ["min(2048, seq)", 16]


def test_pad_and_old_opset_attributes():
    g = G(opset=10)
    x = g.input("x", ["batch", 4])
    padded = g.op("Pad", x, pads=[0, 1, 0, 2])
    squeezed = g.op("Squeeze", g.op("Unsqueeze", x, axes=[0]), axes=[0])
    graph = g.index()
    assert dims(graph, padded) == ["batch", 7]
    assert dims(graph, squeezed) == ["batch", 4]


# -- broadcasting and what it implies -----------------------------------------------------------
def test_broadcasting_proves_only_dims_that_are_not_one():
    g = G()
    a = g.input("a", ["n", 1, 8])
    b = g.input("b", [1, "m", 8])
    c = g.input("c", ["p", "m", None])
    ab = g.op("Add", a, b)
    abc = g.op("Mul", ab, c)
    graph = g.index()
    assert dims(graph, ab) == ["n", "m", 8]
    assert proven(graph, abc) == ["broadcast(n, p)", "m", 8]  # n or p may be 1
    assert dims(graph, abc) == ["n", "m", 8]  # the exporters' convention: they are equal
    assert dims(graph, c) == ["n", "m", 8] and proven(graph, c) == ["p", "m", "c.dim2"]


def test_two_dims_not_one_that_broadcast_are_equal():
    g = G()
    a = g.input("a", ["2*n", 8])
    b = g.input("b", ["m", 8])
    c = g.input("c", ["q", 8])
    g.op("Add", a, b)
    g.op("Sub", a, g.op("Mul", c, c))
    graph = g.index()
    assert proven(graph, b) == ["m", 8]  # m may be 1
    assert proven(graph, c) == ["2*n", 8] or proven(graph, c) == ["q", 8]
    assert graph.dims.same("q", "2*n") and not graph.dims.same("q", "2*n", proven=True)


def test_where_and_comparisons_broadcast():
    g = G()
    cond = g.input("cond", [1, 1, "seq", "seq"], BOOL)
    scores = g.input("s", ["batch", 4, "seq", "seq"])
    y = g.op("Where", cond, scores, g.const(-1e30, np.float32))
    ge = g.op("GreaterOrEqual", scores, g.const(0.0, np.float32))
    graph = g.index()
    assert dims(graph, y) == ["batch", 4, "seq", "seq"] and graph.elem_type(y) == F32
    assert graph.elem_type(ge) == BOOL


def test_matmul_inner_dims_agree_and_batch_dims_broadcast():
    g = G()
    x = g.input("x", ["batch", "seq", "hidden"])
    y = g.op("MatMul", x, g.const(np.zeros((64, 32)), np.float32))
    q = g.input("q", ["batch", 4, "seq", 8])
    k = g.input("k", ["batch", 1, 8, "kv"])
    scores = g.op("MatMul", q, k)
    vec = g.op("MatMul", g.input("v", [8]), g.input("m", [8, 3]))
    graph = g.index()
    assert dims(graph, x) == ["batch", "seq", 64]
    assert dims(graph, y) == ["batch", "seq", 32]
    assert dims(graph, scores) == ["batch", 4, "seq", "kv"]
    assert dims(graph, vec) == [3]


def test_gemm_transposed_operands():
    g = G()
    a = g.input("a", ["m", "k"])
    y = g.op("Gemm", a, g.const(np.zeros((16, 32)), np.float32), transB=1)
    graph = g.index()
    assert dims(graph, y) == ["m", 16] and dims(graph, a) == ["m", 32]


def test_reductions_and_normalisations():
    g = G()
    x = g.input("x", ["batch", "seq", 64])
    mean = g.op("ReduceMean", x, g.const([-1]), keepdims=1)
    total = g.op("ReduceSum", x, g.const([1]), keepdims=0)
    arg = g.op("ArgMax", x, axis=1, keepdims=0)
    ln = g.op("LayerNormalization", x, g.const(np.ones(64), np.float32), axis=-1, outputs=3)
    graph = g.index()
    assert dims(graph, mean) == ["batch", "seq", 1]
    assert dims(graph, total) == ["batch", 64]
    assert dims(graph, arg) == ["batch", 64] and graph.elem_type(arg) == I64
    assert dims(graph, ln[0]) == ["batch", "seq", 64] and dims(graph, ln[1]) == ["batch", "seq", 1]


def test_reduce_axes_as_attributes_before_opset_18():
    g = G(opset=17)
    x = g.input("x", ["batch", "seq", 64])
    mean = g.op("ReduceMean", x, axes=[-1], keepdims=1)
    assert dims(g.index(), mean) == ["batch", "seq", 1]


# -- opset 23 ops ---------------------------------------------------------------------------------------
def test_opset_23_attention_rotary_and_rms():
    g = G(opset=23)
    x = g.input("x", ["batch", "seq", 64])
    rms = g.op("RMSNormalization", x, g.const(np.ones(64), np.float32))
    q = g.input("q", ["batch", 4, "seq", 16])
    k = g.input("k", ["batch", 2, None, 16])
    v = g.input("v", ["batch", 2, "kv", 32])
    past_k = g.input("pk", ["batch", 2, "past", 16])
    past_v = g.input("pv", ["batch", 2, "past", 32])
    rot = g.op("RotaryEmbedding", q, g.input("cos", ["seq", 8]), g.input("sin", ["seq", 8]))
    y, present_k, present_v = g.op("Attention", q, k, v, "", past_k, past_v, outputs=3)
    y3 = g.op("Attention", x, g.input("k3", ["batch", "kv", 32]), g.input("v3", ["batch", "kv", 32]),
              q_num_heads=4, kv_num_heads=2)
    graph = g.index()
    assert dims(graph, rms) == ["batch", "seq", 64]
    assert dims(graph, rot) == ["batch", 4, "seq", 16]
    assert dims(graph, y) == ["batch", 4, "seq", 32]
    assert dims(graph, present_k) == ["batch", 2, "kv + past", 16]
    assert dims(graph, present_v) == ["batch", 2, "kv + past", 32]
    assert dims(graph, k) == ["batch", 2, "kv", 16]  # K and V have the same length
    assert dims(graph, y3) == ["batch", "seq", 64]


# -- otfuse's own ops ----------------------------------------------------------------------------------------
def test_otfuse_norms_and_rotations():
    g = G()
    a = g.input("a", ["batch", "seq", 64])
    b = g.input("b", [None, None, 64])
    y, total = g.op("AddRMSNorm", a, b, g.const(np.ones(64), np.float32), domain=OP_DOMAIN, outputs=2)
    q = g.input("q", ["batch", 4, "seq", 16])
    k = g.input("k", ["batch", 2, "seq", 16])
    q_rot, k_rot = g.op("RotaryEmbeddingQK", q, k, g.input("cos", [1, 1, "seq", 16]), "cos", domain=OP_DOMAIN,
                        outputs=2)
    graph = g.index()
    assert dims(graph, y) == dims(graph, total) == ["batch", "seq", 64]
    assert proven(graph, b) == ["batch", "seq", 64]  # the op does not broadcast
    assert dims(graph, q_rot) == ["batch", 4, "seq", 16] and dims(graph, k_rot) == ["batch", 2, "seq", 16]


@pytest.mark.parametrize("op, past_at", [("Attention", 5), ("RopeAttention", 7)])
def test_otfuse_attention_layouts_and_cache(op, past_at):
    g = G()
    q = g.input("q", ["batch", "seq", 64])  # BSND as [B, S, N*D]
    k = g.input("k", ["batch", "seq", 2, 16])
    v = g.input("v", ["batch", "seq", 2, 16])
    inputs = [q, k, v] + [""] * (past_at - 3)
    inputs += [g.input("pk", ["batch", 2, "past", 16]), g.input("pv", ["batch", 2, "past", 16])]
    y, present_k, present_v = g.op(op, *inputs, domain=OP_DOMAIN, outputs=3, num_heads=4, kv_num_heads=2,
                                   layout="BSND", output_layout="BSND")
    graph = g.index()
    assert dims(graph, y) == ["batch", "seq", 64]
    assert dims(graph, present_k) == dims(graph, present_v) == ["batch", 2, "past + seq", 16]


def test_otfuse_norm_linear_outputs():
    g = G()
    a = g.input("a", ["batch", "seq", 64])
    outs = g.op("AddRMSNormLinear", a, a, g.const(np.ones(64), np.float32), g.const(np.ones((64, 8)), np.float32),
                g.const(np.ones((64, 4)), np.float32), domain=OP_DOMAIN, outputs=3, out_features=[8, 4])
    graph = g.index()
    assert [dims(graph, o) for o in outs] == [["batch", "seq", 8], ["batch", "seq", 4], ["batch", "seq", 64]]


# -- everything else: onnx's inference for the one node, and declarations -----------------------------
def test_an_op_without_a_rule_keeps_symbolic_dims_through_onnx_inference():
    g = G()
    x = g.input("x", ["batch", 3, 32, 32])
    y = g.op("Conv", x, g.const(np.zeros((8, 3, 4, 4)), np.float32), strides=[4, 4])
    z = g.op("Relu", y)
    graph = g.index()
    assert dims(graph, z) == ["batch", 8, 8, 8]
    assert "Conv" in graph.dims.unmodelled


def test_declared_value_info_adds_facts():
    g = G()
    x = g.input("x", ["batch", None])
    y = g.op("Relu", x)
    index = g.index()
    index.model.graph.value_info.append(helper.make_tensor_value_info(y, F32, ["batch", "seq"]))
    graph = GraphIndex(index.model)
    assert dims(graph, x) == ["batch", "seq"]


def test_unknown_domains_have_unknown_outputs():
    g = G()
    x = g.input("x", ["batch", 8])
    y = g.op("Mystery", x, domain="com.example")
    assert g.index().shape(y) is None


# -- ONNX Runtime's contrib ops (offline-optimised models) ---------------------------------------------
def test_ort_contrib_ops_keep_shapes():
    g = G()
    x = g.input("x", ["batch", "seq", 64])
    skip = g.input("skip", [None, None, 64])
    gamma = g.const(np.ones(64), np.float32)
    y, mean, inv, total = g.op("SkipLayerNormalization", x, skip, gamma, domain="com.microsoft", outputs=4)
    simplified = g.op("SimplifiedLayerNormalization", x, gamma, axis=-1)
    q = g.input("q", ["batch", 4, "seq", 16])
    k = g.input("k", ["batch", 4, "kv", 16])
    scores = g.op("FusedMatMul", q, k, domain="com.microsoft", transB=1, alpha=0.25)
    gelu = g.op("FastGelu", x, g.const(np.zeros(64), np.float32), domain="com.microsoft")
    graph = g.index()
    assert dims(graph, y) == dims(graph, total) == ["batch", "seq", 64] and dims(graph, mean) == ["batch", "seq", 1]
    assert proven(graph, skip) == ["batch", "seq", 64]
    assert dims(graph, simplified) == ["batch", "seq", 64]
    assert dims(graph, scores) == ["batch", 4, "seq", "kv"]
    assert dims(graph, gelu) == ["batch", "seq", 64]
