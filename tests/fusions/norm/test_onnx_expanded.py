"""onnx's own node test cases of LayerNormalization and RMSNormalization in their expanded form
(the op's function body inlined: ``*_expanded``, ``*_expanded_ver18``; tests/onnx_node_cases.py):
every one is fused into one otfuse norm node that computes, in ONNX Runtime with our library, what
the original does and what onnx's reference says, with the case's axis and epsilon. The
LayerNormalization cases also write the Mean and InvStdDev outputs, which otfuse's ops do not
compute: as given they are refused with that reason; cut to Y (the form a model that reads only
Y has) they fuse."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from fusing import assert_same_outputs, attrs, fuse_model, fused_nodes
from onnx_node_cases import case_inputs, case_model, case_outputs, cases, keep_outputs

import otfuse

KINDS = {"layer": ("test_layer_normalization_", "LayerNorm", 38),
         "rms": ("test_rms_normalization_", "RMSNorm", 19)}


@lru_cache(maxsize=None)
def _cases(kind: str) -> tuple:
    return tuple(cases([KINDS[kind][0]], expanded=True))


def _axis_of(case) -> int:
    """The axis the case's name states (``axis1``, ``axis_negative_2``; default -1)."""
    name = case.name.split("_expanded")[0]
    if "_axis_negative_" in name:
        return -int(name.split("_axis_negative_")[1].split("_")[0])
    if "_axis" in name and "default_axis" not in name:
        return int(name.split("_axis")[1].split("_")[0])
    return -1


@pytest.mark.parametrize("kind", KINDS)
def test_every_expanded_case_cut_to_y_fuses_exactly(tmp_path, kind):
    prefix, op, count = KINDS[kind]
    assert len(_cases(kind)) == count, [case.name for case in _cases(kind)]
    for index, case in enumerate(_cases(kind)):
        name = f"case{index}"
        model = keep_outputs(case_model(case), ["Y"])
        fused, report = fuse_model(tmp_path, model, name=name, only=["norm"])
        assert report.fusions == {op: 1}, (case.name, report.near_misses)
        assert [node.op_type for node in fused.graph.node] == [op], case.name
        rank = len(case_inputs(case)["X"].shape)
        assert attrs(fused_nodes(fused)[0])["axis"] % rank == _axis_of(case) % rank, case.name
        inputs = case_inputs(case)
        assert_same_outputs(tmp_path, name=name, inputs=inputs)
        got = otfuse.InferenceSession(str(tmp_path / f"{name}_fused.onnx")).run(["Y"], inputs)[0]
        np.testing.assert_allclose(got, case_outputs(case)["Y"], rtol=1e-4, atol=1e-5, err_msg=case.name)


def test_expanded_layer_norm_cases_with_statistics_read_are_refused_with_the_reason(tmp_path):
    refused = 0
    for index, case in enumerate(_cases("layer")):
        fused, report = fuse_model(tmp_path, case_model(case), name=f"case{index}", only=["norm"])
        assert fused is None, case.name
        reasons = [miss["reason"] for miss in report.near_misses if miss["pattern"] == "LayerNorm(function body)"]
        assert any("Mean output" in r and "do not output training statistics" in r for r in reasons), \
            (case.name, report.near_misses)
        refused += 1
    assert refused == KINDS["layer"][2]


def test_expanded_rms_norm_cases_fuse_as_given(tmp_path):
    """RMSNormalization has only Y: its cases fuse as onnx writes them."""
    for index, case in enumerate(_cases("rms")):
        fused, report = fuse_model(tmp_path, case_model(case), name=f"case{index}", only=["norm"])
        assert report.fusions == {"RMSNorm": 1}, (case.name, report.near_misses)
