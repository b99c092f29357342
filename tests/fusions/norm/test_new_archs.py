"""Norm spellings of decoders the first corpus did not have (data/export_new_archs.py, dynamo exports
of transformers 4.57.6):

- Helium (rms_norm_eps 1e-8): the exporter's optimizer drops the `+ eps`, every RMSNorm reads
  `Sqrt(ReduceMean(x²))`; fused with epsilon 0 (rules._plus_epsilon).
- Cohere's q/k norm: a LayerNorm over head_dim whose weight is [heads, head_dim]; the normalisation
  is fused with a unit scale and the scale Mul stays, reported as a downgrade (norm/wide_scale.py).

Mutations of either (another constant, a swapped input, an extra reader) must not fuse and must be
reported as near misses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from fusing import attrs, fused_nodes
from onnx import helper, numpy_helper

import otfuse
from graphs import read_elsewhere

DATA = Path(__file__).with_name("data")
HELIUM = DATA / "helium_eps.onnx"
COHERE = DATA / "cohere_qknorm.onnx"
DIMS = {"batch": 2, "seq": 7}


def _fuse(tmp_path, model, name="m"):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out, only=["norm"])
    return src, out, report


def _diff_ok(src, out):
    result = otfuse.diff(src, out, dims=DIMS)
    assert result.ok, [row.to_dict() for row in result.outputs]


def _node(model, name):
    return next(n for n in model.graph.node if n.name == name)


def _norm_misses(report):
    return [m for m in report.near_misses if m.get("family") == "norm"]


# -- Helium: no epsilon in the graph --

def test_helium_export_has_no_epsilon_add():
    model = onnx.load(HELIUM)
    producers = {o: n for n in model.graph.node for o in n.output}
    sqrts = [n for n in model.graph.node if n.op_type == "Sqrt"]
    assert len(sqrts) == 3 and all(producers[n.input[0]].op_type == "ReduceMean" for n in sqrts)


def test_helium_norms_fuse_with_epsilon_zero(tmp_path):
    src, out, report = _fuse(tmp_path, onnx.load(HELIUM))
    assert report.fusions == {"RMSNorm": 1, "AddRMSNorm": 2} and not report.near_misses, report.near_misses
    assert all(attrs(n)["epsilon"] == 0.0 for n in fused_nodes(onnx.load(out)))
    _diff_ok(src, out)


def _helium_changed_exponent(model):
    pow_node = _node(model, "node_pow_1")
    model.graph.initializer.append(numpy_helper.from_array(np.array(3.0, np.float32), "three"))
    pow_node.input[1] = "three"


def _helium_swapped_input(model):
    # x * rsqrt(mean(x²)) with the other factor's x replaced by the rsqrt's own input (mean)
    mul = _node(model, "node_mul_3")
    mul.input[0] = _node(model, "node_mean").output[0]


def _helium_extra_reader(model):
    sqrt = next(n for n in model.graph.node if n.op_type == "Sqrt")
    read_elsewhere(model, sqrt.output[0], op="Neg")


@pytest.mark.parametrize("mutate", [_helium_changed_exponent, _helium_swapped_input, _helium_extra_reader])
def test_helium_mutations_are_near_misses(tmp_path, mutate):
    model = onnx.load(HELIUM)
    mutate(model)
    _, _, report = _fuse(tmp_path, model)
    assert report.fusions.get("RMSNorm", 0) == 0, report.fusions  # layer 0's input norm: the mutated one
    assert report.fusions.get("AddRMSNorm", 0) == 2, report.fusions  # the others still fuse
    misses = _norm_misses(report)
    assert misses and all(not m.get("fused_as") for m in misses), misses


# -- Cohere: per-head q/k norm weight --

def test_cohere_qk_norms_fuse_with_the_scale_kept(tmp_path):
    src, out, report = _fuse(tmp_path, onnx.load(COHERE))
    assert report.fusions == {"LayerNorm": 3, "AddLayerNorm": 1}, report.fusions
    fused = onnx.load(out)
    constants = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer}
    heads = [n for n in fused_nodes(fused) if n.input[1] in constants and (constants[n.input[1]] == 1).all()]
    assert len(heads) == 2  # q_norm and k_norm, each normalising with a unit [head_dim] scale
    for node in heads:
        assert constants[node.input[1]].shape == (8,)
        (reader,) = [n for n in fused.graph.node if node.output[0] in n.input]
        assert reader.op_type == "Mul" and any(i.endswith("_norm.weight") for i in reader.input)
    misses = _norm_misses(report)
    assert len(misses) == 2 and all(m["fused_as"] == "LayerNorm" and "unit scale" in m["reason"] for m in misses)
    _diff_ok(src, out)


def _cohere_changed_constant(model):
    # the variance squared with exponent 3
    pow_node = _node(model, "node_pow_2")
    model.graph.initializer.append(numpy_helper.from_array(np.array(3.0, np.float32), "three"))
    pow_node.input[1] = "three"


def _cohere_swapped_input(model):
    # (x - mean) * rsqrt(var) -> x * rsqrt(var): x is not the value the variance was taken of.
    # (Swapping the Sub's operands is no mutation: mean(c²) of c = mean - x is an RMSNorm of c.)
    mul = _node(model, "node_mul_5")
    mul.input[0] = _node(model, "node_sub_3").input[0]


def _cohere_extra_reader(model):
    rsqrt = _node(model, "node_rsqrt_1")
    model.graph.node.append(helper.make_node("Neg", [rsqrt.output[0]], ["rsqrt_read"]))
    model.graph.output.append(helper.make_tensor_value_info("rsqrt_read", onnx.TensorProto.FLOAT, None))


def _cohere_computed_scale(model):
    # the per-head weight computed (not a constant): no weight the op can take
    mul = _node(model, "node_mul_6")
    weight = next(i for i in mul.input if i.endswith("q_norm.weight"))
    model.graph.node.insert(0, helper.make_node("Neg", [weight], ["neg_weight"]))
    mul.input[list(mul.input).index(weight)] = "neg_weight"


def test_cohere_computed_per_head_scale_keeps_its_mul(tmp_path):
    # A computed [N, D] scale is no weight of the op: as for a DiT's modulation (norm/wide_scale.py
    # is_modulation), the normalisation is fused with a unit scale and the Mul stays after it.
    model = onnx.load(COHERE)
    _cohere_computed_scale(model)
    src, out, report = _fuse(tmp_path, model)
    assert report.fusions == {"LayerNorm": 3, "AddLayerNorm": 1}, report.fusions
    kept = [m for m in _norm_misses(report) if m.get("fused_as") and "neg_weight" in m["reason"]]
    assert len(kept) == 1 and "unit scale" in kept[0]["reason"], _norm_misses(report)
    fused = onnx.load(out)
    assert [n for n in fused.graph.node if n.op_type == "Mul" and "neg_weight" in n.input]
    _diff_ok(src, out)


@pytest.mark.parametrize("mutate", [_cohere_changed_constant, _cohere_swapped_input, _cohere_extra_reader])
def test_cohere_qk_norm_mutations_are_near_misses(tmp_path, mutate):
    model = onnx.load(COHERE)
    mutate(model)
    src, out, report = _fuse(tmp_path, model)
    assert report.fusions.get("LayerNorm", 0) == 2, report.fusions  # the mutated q norm is left
    misses = _norm_misses(report)
    refused = [m for m in misses if not m.get("fused_as")]
    assert len(refused) >= 1, misses
    assert not any("q_norm" in m["reason"] for m in misses if m.get("fused_as")), misses  # not fused in part
    assert any(any(name in m["location"] for name in ("node_mul_6", "node_mean_2", "node_mean_3", "node_mul_5"))
               for m in refused), refused
