"""onnx's own ``RotaryEmbedding`` node tests in their expanded form (the op's function body
inlined: complex products on half-width tables; generated torch-free by tests/onnx_node_cases.py):
every case fuses into one ``RotaryEmbedding`` and matches the original in ONNX Runtime on the
case's inputs. Mutations of the products, the cuts and the tables must not fuse."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusing import attrs, fuse_in_memory, fused_nodes
from onnx_node_cases import case_inputs, case_model, cases

from otfuse.run.session import InferenceSession, baseline_session, run
from otfuse.verify.diff import tolerance_for

CASES = {case.name: case for case in cases(["test_rotary_embedding"])}
# (mode, rotary_dim) each case's attributes mean.
EXPECTED = {
    "test_rotary_embedding_expanded": ("half", 0),
    "test_rotary_embedding_3d_input_expanded": ("half", 0),
    "test_rotary_embedding_interleaved_expanded": ("interleaved", 0),
    "test_rotary_embedding_with_rotary_dim_expanded": ("half", 4),
    "test_rotary_embedding_with_interleaved_rotary_dim_expanded": ("interleaved", 4),
    "test_rotary_embedding_no_position_ids_expanded": ("half", 0),
    "test_rotary_embedding_no_position_ids_interleaved_expanded": ("interleaved", 0),
    "test_rotary_embedding_no_position_ids_rotary_dim_expanded": ("half", 4),
}


def _matches_original(case, model: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    feeds = case_inputs(case)
    want = run(baseline_session(model.SerializeToString()), feeds)
    got = run(InferenceSession(fused.SerializeToString()), feeds)
    for value in model.graph.output:
        rtol, atol = tolerance_for(got[value.name].dtype)
        np.testing.assert_allclose(got[value.name], want[value.name], rtol=rtol, atol=atol, err_msg=case.name)


def test_every_case_is_listed():
    assert sorted(CASES) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_expanded_rotary_embedding_fuses_and_matches(name):
    case = CASES[name]
    model = case_model(case)
    fused, report = fuse_in_memory(model, "rope")
    assert report.fusions == {"RotaryEmbedding": 1}, report.near_misses
    (node,) = fused_nodes(fused)
    got = attrs(node)
    assert (got["mode"].decode(), got.get("rotary_dim", 0)) == EXPECTED[name]
    assert not any(n.op_type in ("Sub", "Mul") for n in fused.graph.node)
    _matches_original(case, model, fused)


# -- mutations --------------------------------------------------------------------------------------
def _node(model: onnx.ModelProto, suffix: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.output[0].endswith(f"_function_{suffix}"))


def _mutated(name: str, mutate) -> dict:
    model = case_model(CASES[name])
    mutate(model)
    return fuse_in_memory(model, "rope")[1].fusions


def test_a_plus_in_the_real_part_is_not_a_rotation():
    assert not _mutated("test_rotary_embedding_expanded", lambda m: setattr(_node(m, "Real"), "op_type", "Add"))


def test_cos_and_sin_swapped_in_one_product_is_not_a_rotation():
    def swap(model):
        cos_x2 = _node(model, "CosX2")
        sin = _node(model, "SinX1").input[0]
        cos_x2.input[0] = sin
    assert not _mutated("test_rotary_embedding_expanded", swap)


def test_halves_swapped_in_the_imaginary_part_are_not_a_rotation():
    def swap(model):
        sin_x1, cos_x2 = _node(model, "SinX1"), _node(model, "CosX2")
        sin_x1.input[1], cos_x2.input[1] = cos_x2.input[1], sin_x1.input[1]
    assert not _mutated("test_rotary_embedding_expanded", swap)


def test_the_odd_lanes_taken_from_zero_are_not_interleaved():
    def shift(model):
        odd = _node(model, "X2")
        odd.input[1] = _node(model, "X1").input[1]  # start 0: the even lanes twice
    assert not _mutated("test_rotary_embedding_interleaved_expanded", shift)


def test_real_and_imaginary_concatenated_in_the_other_order_are_not_a_rotation():
    def swap(model):
        concat = _node(model, "XRotated")
        concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
    assert not _mutated("test_rotary_embedding_expanded", swap)


def test_a_rotated_part_joined_on_another_axis_fuses_only_the_rotation():
    """The outer Concat joins the heads axis: not a partial rotation of x, but the rotated lanes
    alone are still one (of the Split's first part, all its lanes)."""
    model = case_model(CASES["test_rotary_embedding_with_rotary_dim_expanded"])
    _node(model, "XConcat").attribute[0].i = 2
    fused, report = fuse_in_memory(model, "rope")
    assert report.fusions == {"RotaryEmbedding": 1}
    (node,) = fused_nodes(fused)
    assert node.input[0].endswith("_function_XToRotate") and attrs(node).get("rotary_dim", 0) == 0
    assert any(n.op_type == "Concat" and n.output[0].endswith("_function_XConcat") for n in fused.graph.node)
