"""DiT norms without a weight of their own, followed by the adaptive (AdaLN) modulation
`norm(x) * (1 + scale) + shift` with a computed per-sample `[B, 1, C]` scale: LTX-Video's
`RMSNorm(elementwise_affine=False)` (models/fixtures/dit/ltx_block.onnx, models/dit_blocks.py).

The pattern takes the modulation's Mul for the norm's scale; it is no per-channel weight, so the
fused node normalises with a unit scale and the Mul (and the shift Add) stay, reported as a
downgrade (norm/wide_scale.py `is_modulation`). After the residual Add the same, as AddRMSNorm
(the sum stays an output for the next residual). Mutations of the plain norm (a constant changed,
an operand swapped, an extra reader) leave it unfused and reported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusing import fused_nodes
from onnx import helper, numpy_helper

import otfuse
from graphs import read_elsewhere

DIT = Path(__file__).resolve().parents[3] / "models" / "fixtures" / "dit"
LTX = DIT / "ltx_block.onnx"
EXPECTED = json.loads((DIT / "manifest.json").read_text())["fixtures"]["ltx_block"]["expected"]


def _fuse(tmp_path, model, name="m"):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    return src, out, otfuse.fuse(src, out, only=["norm"])


def _diff_ok(src, out):
    for batch in (1, 3):
        result = otfuse.diff(src, out, dims={"batch": batch})
        assert result.ok, [row.to_dict() for row in result.outputs]


def test_modulated_norms_fuse_with_a_unit_scale(tmp_path):
    src, out, report = _fuse(tmp_path, onnx.load(LTX))
    assert report.fusions == {"RMSNorm": 5, "AddRMSNorm": 1}, report.near_misses
    assert sum(report.fusions.values()) == EXPECTED["norm"]
    misses = [m for m in report.near_misses if m["family"] == "norm"]
    assert sorted(m["fused_as"] for m in misses) == ["AddRMSNorm", "RMSNorm"]
    assert all("adaptive modulation" in m["reason"] and "[32]" in m["reason"] for m in misses)
    fused = onnx.load(out)
    constants = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer}
    unit = [n for n in fused_nodes(fused) if n.input[-1] in constants and (constants[n.input[-1]] == 1).all()]
    assert sorted(n.op_type for n in unit) == ["AddRMSNorm", "RMSNorm"]
    for node in unit:  # the modulation Mul reads the fused node's output
        readers = [n for n in fused.graph.node if node.output[0] in n.input]
        assert [n.op_type for n in readers] == ["Mul"]
    _diff_ok(src, out)


def _node(model, name):
    return next(n for n in model.graph.node if n.name == name)


def _cubed(model):
    model.graph.initializer.append(numpy_helper.from_array(np.array(3.0, np.float32), "three"))
    _node(model, "node_pow_2").input[1] = "three"


def _other_value_normalised(model):
    # x * rsqrt(mean(x²)) -> (-x) * rsqrt(mean(x²)): not the value whose RMS was taken
    model.graph.node.insert(0, helper.make_node("Neg", ["hidden_states"], ["neg_hidden_states"]))
    mul = _node(model, "node_mul_7")
    mul.input[list(mul.input).index("hidden_states")] = "neg_hidden_states"


def _rsqrt_read_elsewhere(model):
    read_elsewhere(model, "rsqrt")


@pytest.mark.parametrize("mutate", [_cubed, _other_value_normalised, _rsqrt_read_elsewhere])
def test_modulated_norm_mutations_are_near_misses(tmp_path, mutate):
    model = onnx.load(LTX)
    mutate(model)
    src, out, report = _fuse(tmp_path, model)
    assert report.fusions == {"RMSNorm": 4, "AddRMSNorm": 1}, report.fusions
    refused = [m for m in report.near_misses if m["family"] == "norm" and not m.get("fused_as")]
    assert refused, report.near_misses
    _diff_ok(src, out)
