"""onnx's own ``Attention`` node tests in their expanded form (the op's function body inlined, as
inliners write it; generated torch-free by tests/onnx_node_cases.py): every case is fused where
its semantics are the op's, and the fused model run with the library matches the original in ONNX
Runtime on the case's inputs (onnx's reference outputs where ORT cannot run the original:
bfloat16). The rest is refused with its reason. Mutations of the spelling pieces the body adds
(the row guard ``Where(ReduceMax(mask) == -inf, 0, p)``, the zero bias) must not fuse wrongly."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from fusing import attrs, fuse_in_memory, fused_nodes
from onnx_node_cases import case_inputs, case_model, case_outputs, cases, keep_outputs

from otfuse.run.session import InferenceSession, baseline_session, run
from otfuse.verify.diff import tolerance_for

FAMILIES = ["rope", "attention"]
CASES = [case for case in cases(["test_attention_"]) if "linear_attention" not in case.name]
BY_NAME = {case.name: case for case in CASES}
# The graph reads the scores or probabilities (qk_matmul_output): an interior value of the chain.
READS_SCORES = {case.name for case in CASES if any(v.name == "qk_matmul_output" for v in case.model.graph.output)}
# bfloat16 masks the fused graph still computes with plain Adds, which ORT's CPU has no kernel
# for (the original has them too): fused, but not run here.
UNRUNNABLE = {"test_attention_4d_attn_mask_causal_bf16_expanded", "test_attention_4d_causal_padded_kv_bf16_expanded",
              "test_attention_4d_padded_kv_bf16_expanded"}


def _fuse(model: onnx.ModelProto):
    return fuse_in_memory(model, FAMILIES)


@functools.lru_cache(maxsize=None)
def _fused_case(name: str):
    """The case as collected, fused once per session (read only by the tests)."""
    return _fuse(case_model(BY_NAME[name]))


def _reference(case, model: onnx.ModelProto, feeds: dict) -> dict:
    """The original in ORT (graph optimisations off), or onnx's outputs where ORT cannot run it."""
    try:
        return run(baseline_session(model.SerializeToString()), feeds)
    except Exception:  # noqa: BLE001 - ORT has no CPU kernel (bfloat16 MatMul / Softmax)
        return case_outputs(case)


def assert_matches_original(case, model: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    feeds = case_inputs(case)
    want = _reference(case, model, feeds)
    got = run(InferenceSession(fused.SerializeToString()), feeds)
    for value in model.graph.output:
        expected, actual = np.asarray(want[value.name]), np.asarray(got[value.name])
        rtol, atol = tolerance_for(actual.dtype)
        assert actual.shape == expected.shape, (case.name, value.name)
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=f"{case.name}: {value.name}")


def test_the_cases_are_collected():
    assert len(CASES) == 93, len(CASES)
    assert len(READS_SCORES) == 18


@pytest.mark.parametrize("name", sorted(set(BY_NAME) - READS_SCORES))
def test_expanded_attention_fuses_and_matches(name):
    case = BY_NAME[name]
    model = case_model(case)
    fused, report = _fused_case(name)
    assert report.fusions == {"Attention": 1}, (report.fusions, report.near_misses)
    assert [n.op_type for n in fused_nodes(fused)] == ["Attention"]
    assert not any(n.op_type == "Softmax" for n in fused.graph.node)
    if name not in UNRUNNABLE:
        assert_matches_original(case, model, fused)


@pytest.mark.parametrize("name", sorted(READS_SCORES))
def test_a_read_qk_matmul_output_is_refused_and_fuses_once_cut(name):
    """The graph outputs the scores or probabilities: refused, naming the reader; the same case
    cut to Y (and the present key / value) fuses and matches."""
    case = BY_NAME[name]
    model = case_model(case)
    _, report = _fused_case(name)
    assert not report.fusions
    assert any("qk_matmul_output" in miss["reason"] for miss in report.near_misses), report.near_misses
    outputs = [v.name for v in model.graph.output if v.name != "qk_matmul_output"]
    cut = keep_outputs(case_model(case), outputs)
    fused, report = _fuse(cut)
    assert report.fusions == {"Attention": 1}, report.near_misses
    assert_matches_original(case, cut, fused)


def test_the_count_of_fused_expanded_cases():
    fused = sum(bool(_fused_case(case.name)[1].fusions) for case in CASES)
    assert fused == len(CASES) - len(READS_SCORES) == 75


# -- mutations --------------------------------------------------------------------------------------
def _node(model: onnx.ModelProto, suffix: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.output[0].endswith(f"_function_{suffix}"))


def _set_constant(node: onnx.NodeProto, value) -> None:
    node.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(value, np.float32)))


def _plain_case() -> onnx.ModelProto:
    return case_model(BY_NAME["test_attention_4d_attn_mask_expanded"])


def test_a_row_guard_against_a_finite_minimum_is_refused():
    model = _plain_case()
    _set_constant(_node(model, "FloatNegInf"), [-1e4])
    _, report = _fuse(model)
    assert not report.fusions
    assert any("not -inf" in miss["reason"] for miss in report.near_misses), report.near_misses


@pytest.mark.parametrize("axes", [[2], [-2]])
def test_a_row_guard_over_another_axis_is_refused(axes):
    model = _plain_case()
    axes_node = _node(model, "BiasRowMaxAxes")
    axes_node.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.array(axes, np.int64)))
    _, report = _fuse(model)
    assert not report.fusions
    assert any("not the keys" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_a_row_guard_dropping_the_reduced_axis_is_refused():
    model = _plain_case()
    _node(model, "BiasRowMax").attribute.append(onnx.helper.make_attribute("keepdims", 0))
    _, report = _fuse(model)
    assert not report.fusions


def test_a_row_guard_reading_another_mask_is_not_fused():
    """The guard reduces a mask the scores never had added: its rows zero where the op's do not."""
    model = _plain_case()
    other = onnx.helper.make_tensor_value_info("other_mask", onnx.TensorProto.FLOAT, [4, 6])
    model.graph.input.append(other)
    _node(model, "BiasRowMax").input[0] = "other_mask"
    _, report = _fuse(model)
    assert not report.fusions


def test_a_row_guard_filling_another_value_is_refused():
    model = _plain_case()
    _set_constant(_node(model, "ScalarZero"), [0.5])
    _, report = _fuse(model)
    assert not report.fusions


def test_a_non_zero_constant_bias_is_added_not_dropped():
    """The zero bias of an unmasked body is dropped; filled with 1 it is a real bias (kept)."""
    case = BY_NAME["test_attention_4d_expanded"]
    model = case_model(case)
    bias = _node(model, "AttnBias")
    bias.attribute.append(onnx.helper.make_attribute("value", onnx.numpy_helper.from_array(np.array([1.0], np.float32))))
    fused, report = _fuse(model)
    assert report.fusions == {"Attention": 1}
    (node,) = fused_nodes(fused)
    assert len(node.input) > 3 and node.input[3], "the bias of ones must be added"
    assert_matches_original(case, model, fused)
    dropped, _ = _fused_case(case.name)
    assert list(fused_nodes(dropped)[0].input) == ["Q", "K", "V"]


# -- masks ------------------------------------------------------------------------------------------
def test_is_causal_with_as_many_queries_as_new_keys_is_the_causal_attribute():
    """Sq == S: ONNX's causal (j <= i + P) is otfuse's bottom-right one; the body's mask, folded
    at static shapes, is claimed, and the cache Concat becomes past / present."""
    name = "test_attention_4d_causal_with_past_and_present_expanded"
    fused, report = _fused_case(name)
    (node,) = fused_nodes(fused)
    assert attrs(node)["causal"] == 1 and attrs(node)["empty_rows"] == b"zero"
    assert list(node.input) == ["Q", "K", "V", "", "", "past_key", "past_value"]
    assert not report.near_misses


def test_is_causal_with_fewer_queries_than_keys_stays_the_bodys_bias():
    """Sq = 4, Skv = 6: ONNX aligns to the past length (top left here), otfuse to the bottom right:
    the mask the body computed is added as it is, and the site reported."""
    fused, report = _fused_case("test_attention_4d_causal_expanded")
    (node,) = fused_nodes(fused)
    assert not attrs(node).get("causal") and node.input[3]
    (miss,) = report.near_misses
    assert "aligned to the past length" in miss["reason"] and miss["fused_as"] == "Attention"
