"""Squared ReLU (HF "relu2") -> ReluSquared: the real exports of Nemotron and Persimmon
(models/fixtures/relu2: dynamo writes Pow(relu, 2.0), TorchScript Mul(relu, relu)) fuse one per
layer and match the original in ORT; the hand-built spellings fuse; every mutation is refused or
left alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusing import assert_same_outputs, fuse_in_memory, fuse_model, fused_nodes
from fusions.activation.graphs import const, mlp_model
from onnx import TensorProto

import otfuse
from bench.coverage import materialise
from otfuse.pipeline import fuse_families

FAMILY = ["activation"]
RELU2 = Path(__file__).resolve().parents[3] / "models" / "fixtures" / "relu2"
VARIANTS = json.loads((RELU2 / "manifest.json").read_text())["models"]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_real_export_fuses_one_relu_squared_per_layer_and_outputs_match(tmp_path, name):
    entry = VARIANTS[name]
    model_path = materialise(RELU2 / entry["file"], tmp_path)
    model = onnx.load(model_path, load_external_data=False)
    fusions, _ = fuse_families(model, FAMILY, tmp_path)
    assert fusions == {"ReluSquared": entry["expected"]["layers"]}, fusions
    assert not [n for n in model.graph.node if n.op_type in ("Relu", "Pow")]
    out = tmp_path / "fused.onnx"
    otfuse.fuse(model_path, out, only=FAMILY)
    assert otfuse.diff(model_path, out, dims={"batch": 2, "seq": 7}).ok


def relu_squared(g, x, spelling="mul", exponent=2.0, exponent_type=np.float32, relu="Relu", other=None):
    r = g.node(relu, [x])
    if spelling == "mul":
        return g.node("Mul", [r, other if other is not None else r])
    return g.node("Pow", [r, const(g, exponent, exponent_type)])


def only_relu_squared(tmp_path, model):
    fused, report = fuse_model(tmp_path, model, only=FAMILY)
    assert report.fusions == {"ReluSquared": 1}, report.fusions
    assert [n.op_type for n in fused.graph.node] == ["ReluSquared"], "the Relu and the square are absorbed"
    (node,) = fused_nodes(fused)
    assert list(node.input) == ["x"] and list(node.output) == ["y"]
    assert_same_outputs(tmp_path)


SPELLINGS = {
    "mul_torchscript": dict(spelling="mul"),
    "pow_float_dynamo": dict(spelling="pow"),
    "pow_int64_exponent": dict(spelling="pow", exponent=2, exponent_type=np.int64),
    "pow_float16_exponent": dict(spelling="pow", exponent_type=np.float16),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_spellings_fuse(tmp_path, spelling):
    only_relu_squared(tmp_path, mlp_model(lambda g, x: relu_squared(g, x, **SPELLINGS[spelling])))


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_half_types_fuse(elem):
    fused, report = fuse_in_memory(mlp_model(lambda g, x: relu_squared(g, x, "pow"), elem=elem), FAMILY)
    assert report.fusions == {"ReluSquared": 1}


@pytest.mark.parametrize("exponent", [3.0, 2.0001, 1.9999, 0.5, -2.0])
def test_other_exponents_are_refused(exponent):
    fused, report = fuse_in_memory(mlp_model(lambda g, x: relu_squared(g, x, "pow", exponent)), FAMILY)
    assert not fused_nodes(fused)
    assert any("not 2" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_exponent_that_is_not_a_scalar_is_refused():
    def build(g, x):
        return g.node("Pow", [g.node("Relu", [x]), g.const(np.array([2.0, 2.0], np.float32))])
    fused, report = fuse_in_memory(mlp_model(build), FAMILY)
    assert not fused_nodes(fused)
    assert any("not a constant scalar" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_exponent_that_is_not_a_constant_is_refused():
    def build(g, x):
        return g.node("Pow", [g.node("Relu", [x]), g.node("ReduceMax", [x], keepdims=0)])
    fused, _ = fuse_in_memory(mlp_model(build), FAMILY)
    assert not fused_nodes(fused)


def test_mul_with_another_operand_is_left_alone():
    fused, report = fuse_in_memory(mlp_model(lambda g, x: relu_squared(g, x, other=x)), FAMILY)
    assert not fused_nodes(fused) and report.fusions == {}


def test_mul_of_two_relus_of_one_value_is_left_alone():
    # Two Relu nodes of x compute the same r, but the pattern takes one node read twice (what the
    # exporters write); two nodes are left as they are rather than guessed equal.
    fused, report = fuse_in_memory(mlp_model(lambda g, x: g.node("Mul", [g.node("Relu", [x]),
                                                                          g.node("Relu", [x])])), FAMILY)
    assert not fused_nodes(fused)


@pytest.mark.parametrize("spelling", ["mul", "pow"])
def test_leaky_relu_is_left_alone(spelling):
    fused, report = fuse_in_memory(mlp_model(lambda g, x: relu_squared(g, x, spelling, relu="LeakyRelu")), FAMILY)
    assert not fused_nodes(fused) and report.fusions == {}


@pytest.mark.parametrize("spelling", ["mul", "pow"])
def test_relu_output_read_elsewhere_is_refused(spelling):
    # The Relu's output is also a graph output: the fusion would drop it.
    model = mlp_model(lambda g, x: relu_squared(g, x, spelling), also_output=lambda g: g.nodes[0].output[0])
    fused, report = fuse_in_memory(model, FAMILY)
    assert not fused_nodes(fused)
    assert any("interior value" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_relu_output_read_by_another_node_is_refused():
    def build(g, x):
        r = g.node("Relu", [x])
        square = g.node("Mul", [r, r])
        return g.node("Add", [square, g.node("Neg", [r])])
    fused, report = fuse_in_memory(mlp_model(build), FAMILY)
    assert not fused_nodes(fused)
    assert any("interior value" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_integer_input_is_refused():
    fused, _ = fuse_in_memory(mlp_model(lambda g, x: relu_squared(g, x, "mul"), elem=TensorProto.INT32), FAMILY)
    assert not fused_nodes(fused)
