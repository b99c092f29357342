"""Activation family on hand-built graphs: every spelling fuses into the op it computes, with its
attributes, and diffs clean in ORT; every mutation is refused (with the near miss) or fused into
an op that computes the mutated graph exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fusing import assert_same_outputs, attrs, fuse_in_memory, fuse_model, fused_nodes
from fusions.activation.graphs import contrib_model, gated_model, gelu_erf, gelu_tanh, mlp_model, quick_gelu, silu
from graphs import F32, GraphBuilder
from onnx import TensorProto

FAMILY = ["activation"]


def fused_ops(model) -> dict[str, int]:
    fused, _ = fuse_in_memory(model, FAMILY)
    ops: dict[str, int] = {}
    for node in fused_nodes(fused):
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return ops


def only_node(tmp_path, model, op_type):
    fused, report = fuse_model(tmp_path, model, only=FAMILY)
    assert report.fusions == {op_type: 1}, report.fusions
    (node,) = fused_nodes(fused)
    assert [n.op_type for n in fused.graph.node] == [op_type], "every node of the activation is absorbed"
    assert list(node.input) == ["x"] and list(node.output) == ["y"]
    assert_same_outputs(tmp_path)
    return node


TANH_SPELLINGS = {
    "gpt2_newgelu_pow": dict(spelling="gpt2"),
    "gpt2_cube_mul_mul": dict(spelling="gpt2", cube_spelling="mul_mul"),
    "gpt2_cube_x_times_square": dict(spelling="gpt2", cube_spelling="x_square"),
    "sqrt_2_over_pi_as_sqrt": dict(spelling="gpt2", c_as_sqrt=True),
    "bloom_gelu": dict(spelling="bloom"),
    "bloom_with_sqrt": dict(spelling="bloom", c_as_sqrt=True),
    "torchscript_gelu_pytorch_tanh": dict(spelling="torchscript"),
    "as_sigmoid_of_twice_the_argument": dict(spelling="sigmoid"),
}


@pytest.mark.parametrize("variant", TANH_SPELLINGS)
def test_tanh_gelu_spellings(tmp_path, variant):
    node = only_node(tmp_path, mlp_model(lambda g, x: gelu_tanh(g, x, **TANH_SPELLINGS[variant])), "Gelu")
    assert attrs(node) == {"approximate": b"tanh"}


@pytest.mark.parametrize("spelling", ["div", "mul", "div_two"])
def test_erf_gelu_spellings(tmp_path, spelling):
    node = only_node(tmp_path, mlp_model(lambda g, x: gelu_erf(g, x, spelling)), "Gelu")
    assert attrs(node) == {"approximate": b"none"}


def test_silu(tmp_path):
    assert attrs(only_node(tmp_path, mlp_model(silu), "SiLU")) == {}


@pytest.mark.parametrize("alpha_first", [False, True])
@pytest.mark.parametrize("alpha", [1.702, 1.701, 0.5])
def test_quick_gelu_takes_the_graphs_alpha(tmp_path, alpha, alpha_first):
    # 1.701 for 1.702 is not refused: QuickGelu states its alpha, and the graph's is carried exactly.
    node = only_node(tmp_path, mlp_model(lambda g, x: quick_gelu(g, x, alpha, alpha_first)), "QuickGelu")
    assert attrs(node)["alpha"] == pytest.approx(np.float32(alpha), rel=1e-7)


def test_alpha_one_is_silu(tmp_path):
    only_node(tmp_path, mlp_model(lambda g, x: quick_gelu(g, x, 1.0)), "SiLU")


def test_float16_graph_with_float16_constants(tmp_path):
    model = mlp_model(lambda g, x: gelu_tanh(g, x, dtype=np.float16), elem=TensorProto.FLOAT16)
    node = only_node(tmp_path, model, "Gelu")
    assert attrs(node) == {"approximate": b"tanh"}


MUTATIONS = {  # name -> (builder, words of the near miss; None: refused without one)
    "another_tanh_constant_k": (lambda g, x: gelu_tanh(g, x, k=0.0447), "its argument is"),
    "another_tanh_constant_c": (lambda g, x: gelu_tanh(g, x, c=0.8), "its argument is"),
    "bloom_other_constant": (lambda g, x: gelu_tanh(g, x, spelling="bloom", k=0.05), "its argument is"),
    "half_is_not_one_half": (lambda g, x: gelu_tanh(g, x, half=0.49), "GELU's is 0.5*x + 0.5*x*T"),
    "erf_scale": (lambda g, x: gelu_erf(g, x, scale=1.5), "its argument is"),
    "erf_half": (lambda g, x: gelu_erf(g, x, "mul", half=0.25), "GELU's is 0.5*x + 0.5*x*T"),
    "sigmoid_cubic_argument": (lambda g, x: gelu_tanh(g, x, spelling="sigmoid", k=0.05), "not alpha*x"),
    "pow_not_an_integer": (lambda g, x: g.node("Mul", [x, g.node("Sigmoid", [g.node("Pow", [x, g.const(
        np.array(1.5, np.float32))])])]), "not a small non-negative integer"),
    "per_channel_alpha": (lambda g, x: g.node("Mul", [x, g.node("Sigmoid", [g.node("Mul", [x, g.const(
        np.full(16, 1.702, np.float32))])])]), "is not a scalar"),
    "sigmoid_of_another_value": (lambda g, x: silu(g, x, sigmoid_of=g.node("Neg", [g.node("Relu", [x])])), None),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_mutations_are_refused(name):
    build, reason = MUTATIONS[name]
    fused, report = fuse_in_memory(mlp_model(build), FAMILY)
    assert not fused_nodes(fused), [n.op_type for n in fused_nodes(fused)]
    if reason is not None:
        assert any(reason in miss["reason"] for miss in report.near_misses), report.near_misses


def test_an_extra_reader_of_the_sigmoid_is_refused_and_reported():
    def build(g, x):
        return silu(g, x)

    model = mlp_model(build, also_output=lambda g: g.nodes[-2].output[0])  # the Sigmoid's output
    fused, report = fuse_in_memory(model, FAMILY)
    assert not fused_nodes(fused)
    assert any("is also read outside it" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_an_extra_reader_of_an_interior_value_is_refused():
    model = mlp_model(gelu_tanh, also_output=lambda g: next(n.output[0] for n in g.nodes if n.op_type == "Pow"))
    fused, _ = fuse_in_memory(model, FAMILY)
    assert not fused_nodes(fused)


def test_an_extra_reader_of_x_is_fine(tmp_path):
    fused, report = fuse_model(tmp_path, mlp_model(silu, also_output=lambda g: "x"), only=FAMILY)
    assert report.fusions == {"SiLU": 1}
    assert_same_outputs(tmp_path)


def test_non_float_input_is_refused():
    model = mlp_model(lambda g, x: gelu_tanh(g, x, dtype=np.float64), elem=TensorProto.DOUBLE)
    fused, report = fuse_in_memory(model, FAMILY)
    assert not fused_nodes(fused)
    assert any("not float32/float16/bfloat16" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_a_broadcasting_constant_is_refused():
    def build(g, x):
        return g.node("Mul", [x, g.node("Sigmoid", [g.node("Mul", [x, g.const(np.ones((1, 1, 1, 1), np.float32))])])])

    g = GraphBuilder()
    x = g.input("x", F32, ["batch", "seq", 16])
    build(g, x)
    g.nodes[-1].output[0] = "y"
    g.output("y", F32, None)
    fused, report = fuse_in_memory(g.model(), FAMILY)
    assert not fused_nodes(fused)
    assert any("broadcasts the result to rank 4" in miss["reason"] for miss in report.near_misses)


# -- the standard ops -----------------------------------------------------------------------------

@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu_op(tmp_path, approximate):
    model = mlp_model(lambda g, x: g.node("Gelu", [x], approximate=approximate), opset=20)
    assert attrs(only_node(tmp_path, model, "Gelu")) == {"approximate": approximate.encode()}


@pytest.mark.parametrize("alpha, op", [(1.0, "SiLU"), (1.702, "QuickGelu")])
def test_onnx_swish_op(tmp_path, alpha, op):
    only_node(tmp_path, mlp_model(lambda g, x: g.node("Swish", [x], alpha=alpha), opset=24), op)


def test_onnx_gelu_attribute_not_modelled_is_refused():
    model = mlp_model(lambda g, x: g.node("Gelu", [x], approximate="none", surprise=1), opset=20)
    fused, report = fuse_in_memory(model, FAMILY)
    assert not fused_nodes(fused)
    assert any("'surprise'" in miss["reason"] for miss in report.near_misses), report.near_misses


# -- ONNX Runtime's contrib ops (what its optimiser writes) ---------------------------------------

CONTRIB = {  # name -> (contrib_model args, the otfuse nodes made, the fused op's attributes)
    "quick_gelu": (("QuickGelu",), dict(alpha=1.702), ["QuickGelu"], {"alpha": 1.702}),
    "quick_gelu_default_alpha": (("QuickGelu",), {}, ["QuickGelu"], {"alpha": 1.702}),
    "quick_gelu_alpha_one": (("QuickGelu",), dict(alpha=1.0), ["SiLU"], {}),
    "gelu": (("Gelu",), {}, ["Gelu"], {"approximate": b"none"}),
    "fast_gelu": (("FastGelu",), {}, ["Gelu"], {"approximate": b"tanh"}),
    "fast_gelu_bias": (("FastGelu", [16]), {}, ["Add", "Gelu"], {"approximate": b"tanh"}),
    "bias_gelu": (("BiasGelu", [16]), {}, ["Add", "Gelu"], {"approximate": b"none"}),
}


@pytest.mark.parametrize("name", CONTRIB)
def test_ort_contrib_ops(tmp_path, name):
    args, kwargs, nodes, attributes = CONTRIB[name]
    fused, report = fuse_model(tmp_path, contrib_model(*args, **kwargs), only=FAMILY)
    assert [n.op_type for n in fused.graph.node] == nodes
    (node,) = fused_nodes(fused)
    got = attrs(node)
    if "alpha" in got:
        got["alpha"] = round(got["alpha"], 6)
    assert got == attributes
    assert_same_outputs(tmp_path)


CONTRIB_REFUSED = {  # name -> (contrib_model args, kwargs, the near miss names)
    "unknown_attribute": (("FastGelu",), dict(surprise=1), "'surprise'"),
    "domain_opset_2": (("BiasGelu", [16]), dict(ms_opset=2), "opset 2): only versions [1] of com.microsoft"),
    "bias_not_1d": (("FastGelu", [1, 16]), {}, "not one value per element of x's last axis"),
    "bias_one_value": (("BiasGelu", [1]), {}, "not one value per element of x's last axis"),
    "bias_float16": (("BiasGelu", [16]), dict(bias_type=np.float16), "has type float16"),
    "quick_gelu_alpha_inf": (("QuickGelu",), dict(alpha=math.inf), "alpha is inf"),
}


@pytest.mark.parametrize("name", CONTRIB_REFUSED)
def test_ort_contrib_ops_not_modelled_are_refused(name):
    args, kwargs, reason = CONTRIB_REFUSED[name]
    fused, report = fuse_in_memory(contrib_model(*args, **kwargs), FAMILY)
    assert not fused_nodes(fused)
    assert any(reason in miss["reason"] for miss in report.near_misses), report.near_misses


# -- gated forms ----------------------------------------------------------------------------------

GATED = {  # name -> (gated_model kwargs, op, attributes besides gate_half)
    "swiglu_two_matmuls": (dict(), "SwiGLU", {}),
    "swiglu_two_matmuls_up_first": (dict(swap_product=True), "SwiGLU", {}),
    "swiglu_chunk_split": (dict(form="one"), "SwiGLU", {"gate_half": 0}),
    "swiglu_chunk_gate_second": (dict(form="one", gate_first=False), "SwiGLU", {"gate_half": 1}),
    "swiglu_split_num_outputs": (dict(form="one", split_spelling="num_outputs"), "SwiGLU", {"gate_half": 0}),
    "swiglu_slices": (dict(form="one", split_spelling="slice"), "SwiGLU", {"gate_half": 0}),
    "swiglu_slices_gate_second": (dict(form="one", split_spelling="slice", gate_first=False), "SwiGLU",
                                  {"gate_half": 1}),
    "geglu_erf": (dict(act="gelu_erf"), "GeGLU", {"approximate": b"none"}),
    "geglu_tanh_chunk": (dict(act="gelu_tanh", form="one", gate_first=False), "GeGLU",
                         {"approximate": b"tanh", "gate_half": 1}),
    "geglu_onnx_op": (dict(act="gelu_op", act_kwargs={"approximate": "tanh"}, opset=20), "GeGLU",
                      {"approximate": b"tanh"}),
}


@pytest.mark.parametrize("name", GATED)
def test_gated_forms(tmp_path, name):
    kwargs, op, expected = GATED[name]
    fused, report = fuse_model(tmp_path, gated_model(**kwargs), only=FAMILY)
    assert report.fusions == {op: 1}, report.fusions
    (node,) = fused_nodes(fused)
    assert [n.op_type for n in fused.graph.node] == [op]
    assert attrs(node) == expected
    form_inputs = ["x"] if kwargs.get("form") == "one" else ["gate", "up"]
    assert list(node.input) == form_inputs
    assert_same_outputs(tmp_path)


def test_gate_and_up_roles_are_read_from_the_graph(tmp_path):
    # Swapping the projections makes SiLU(up) * gate: fused with the roles the graph has.
    g = GraphBuilder()
    a = g.input("a", F32, ["batch", "seq", 8])
    b = g.input("b", F32, ["batch", "seq", 8])
    g.node("Mul", [a, silu(g, b)])
    g.nodes[-1].output[0] = "y"
    g.output("y", F32, ["batch", "seq", 8])
    fused, report = fuse_model(tmp_path, g.model(), only=FAMILY)
    assert report.fusions == {"SwiGLU": 1}
    assert list(fused_nodes(fused)[0].input) == ["b", "a"]
    assert_same_outputs(tmp_path)


def test_roles_mixed_up_are_refused():
    # gate * sigmoid(up) * up computes neither SwiGLU(gate, up) nor SwiGLU(up, gate).
    ops = fused_ops(gated_model(mutate="sigmoid_of_up"))
    assert "SwiGLU" not in ops and "SiLU" not in ops


def test_halves_swapped_in_the_product_keep_the_split():
    # act(gate half) * (gate half): the Split's other half is unused, so no one-input form.
    assert fused_ops(gated_model(form="one", mutate="halves_swapped_in_product")) == {"SwiGLU": 1}


def test_an_extra_reader_of_the_activated_gate_keeps_the_silu():
    fused, report = fuse_in_memory(gated_model(mutate="gate_read_outside"), FAMILY)
    assert [n.op_type for n in fused_nodes(fused)] == ["SiLU"]
    assert any("is also used by" in miss["reason"] or "graph output" in miss["reason"]
               for miss in report.near_misses), report.near_misses


def test_an_extra_reader_of_a_half_keeps_the_split(tmp_path):
    fused, report = fuse_model(tmp_path, gated_model(form="one", mutate="half_read_outside"), only=FAMILY)
    (node,) = fused_nodes(fused)
    assert node.op_type == "SwiGLU" and len(node.input) == 2  # the two-input form, over the Split
    assert "Split" in [n.op_type for n in fused.graph.node]
    assert_same_outputs(tmp_path)


def test_unequal_split_is_refused_as_one_input():
    g = GraphBuilder()
    x = g.input("x", F32, ["batch", "seq", 24])
    gate, up = g.node("Split", [x, g.const(np.array([8, 16], np.int64))], outputs=2, axis=-1)
    g.node("Mul", [silu(g, gate), up])
    g.nodes[-1].output[0] = "y"
    g.output("y", F32, None)
    fused, report = fuse_in_memory(g.model(), FAMILY)
    assert [n.op_type for n in fused_nodes(fused)] == ["SiLU"]  # the product broadcasts [8] by [16]: no
    assert any("not proven equal halves" in miss["reason"] or "may broadcast" in miss["reason"]
               for miss in report.near_misses), report.near_misses


def test_split_on_another_axis_is_not_the_one_input_form():
    # SwiGLU's halves are those of the last axis: over axis 0, only the two-input form fits.
    g = GraphBuilder()
    x = g.input("x", F32, [4, 6, 8])
    gate, up = g.node("Split", [x, g.const(np.array([2, 2], np.int64))], outputs=2, axis=0)
    g.node("Mul", [silu(g, gate), up])
    g.nodes[-1].output[0] = "y"
    g.output("y", F32, [2, 6, 8])
    fused, _ = fuse_in_memory(g.model(), FAMILY)
    (node,) = fused_nodes(fused)
    assert node.op_type == "SwiGLU" and len(node.input) == 2 and "Split" in [n.op_type for n in fused.graph.node]


def test_gelu_constants_in_float64_precision_are_taken():
    # A graph whose constants are the exact values rounded to float32 (as every exporter writes them).
    model = mlp_model(lambda g, x: gelu_tanh(g, x, c=float(np.float32(math.sqrt(2 / math.pi)))))
    assert fused_ops(model) == {"Gelu": 1}
