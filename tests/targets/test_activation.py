"""The activation family in the targets: every otfuse activation written in ORT's contrib ops
(``ort``) or standard ops (``onnx``), computed in float32 and rounded once, with no otfuse op left;
the output runs in stock onnxruntime and matches the original."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import otfuse
from tests.fusions.activation.graphs import gated_model, gelu_erf, gelu_tanh, mlp_model, quick_gelu, silu

DIMS = {"batch": 2, "seq": 5}

ELEMENTWISE = {
    "gelu_erf": (lambda g, x: gelu_erf(g, x), "Gelu", {"ort": "com.microsoft.Gelu", "onnx": "ai.onnx.Gelu"}),
    "gelu_tanh": (lambda g, x: gelu_tanh(g, x), "Gelu", {"ort": "com.microsoft.FastGelu", "onnx": "ai.onnx.Gelu"}),
    "quick_gelu": (lambda g, x: quick_gelu(g, x, alpha=1.702), "QuickGelu",
                   {"ort": "com.microsoft.QuickGelu", "onnx": "ai.onnx.Sigmoid"}),
    "silu": (lambda g, x: silu(g, x), "SiLU", {"ort": "com.microsoft.QuickGelu", "onnx": "ai.onnx.Sigmoid"}),
    "relu_squared": (lambda g, x: g.node("Pow", [g.node("Relu", [x]), g.const(np.array(2.0, np.float32))]),
                     "ReluSquared", {"ort": "ai.onnx.Relu", "onnx": "ai.onnx.Relu"}),
}


def _lower(tmp_path, model, target, name="m"):
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}_{target}.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, dst, target=target)
    out = onnx.load(dst)
    assert not [n for n in out.graph.node if n.domain == "otfuse"]
    assert "otfuse" not in {o.domain for o in out.opset_import}
    ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])  # stock ORT, no library
    return src, dst, report, out


@pytest.mark.parametrize("target", ["ort", "onnx"])
@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_activation_is_written_in_the_target(tmp_path, name, target):
    build, op, written = ELEMENTWISE[name]
    src, dst, report, out = _lower(tmp_path, mlp_model(build), target)
    assert report.fusions == {op: 1}, report.near_misses
    assert written[target] in report.target_ops, report.target_ops
    assert not [m for m in report.near_misses if m["reason"].startswith("target")]
    assert otfuse.diff(src, dst, dims=DIMS).ok


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_quick_gelu_keeps_its_alpha(tmp_path, target):
    src, dst, report, out = _lower(tmp_path, mlp_model(lambda g, x: quick_gelu(g, x, alpha=1.25)), target)
    assert report.fusions == {"QuickGelu": 1}
    if target == "ort":
        node = next(n for n in out.graph.node if n.op_type == "QuickGelu")
        assert onnx.helper.get_attribute_value(node.attribute[0]) == pytest.approx(1.25)
    assert otfuse.diff(src, dst, dims=DIMS).ok


@pytest.mark.parametrize("target", ["ort", "onnx"])
@pytest.mark.parametrize("form,gate_first", [("two", True), ("one", True), ("one", False)])
@pytest.mark.parametrize("act,op", [("silu", "SwiGLU"), ("gelu_erf", "GeGLU"), ("gelu_tanh", "GeGLU")])
def test_gated_activation_is_written_in_the_target(tmp_path, act, op, form, gate_first, target):
    model = gated_model(act, form=form, gate_first=gate_first)
    src, dst, report, out = _lower(tmp_path, model, target)
    assert report.fusions == {op: 1}, report.near_misses
    assert otfuse.diff(src, dst, dims=DIMS).ok
    # the halves are cut at D / 2 of the value itself, whichever half the gate is
    if form == "one":
        assert sum(n.op_type == "Slice" for n in out.graph.node) >= 2


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_half_precision_computes_in_float32_and_rounds_once(tmp_path, target, elem):
    """float16 / bfloat16: widened to float32 (exact), the target op in float32, one Cast back: the
    contract's single rounding (the target ops' own half-precision kernels round every step)."""
    model = mlp_model(lambda g, x: silu(g, x), elem=elem)
    src, dst, report, out = _lower(tmp_path, model, target)
    if not report.fusions:
        pytest.skip(f"the otfuse rules do not fuse this spelling in {elem}: {report.near_misses}")
    casts = [n for n in out.graph.node if n.op_type == "Cast"]
    assert [onnx.helper.get_attribute_value(c.attribute[0]) for c in casts][-2:] == [TensorProto.FLOAT, elem]
    session = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    x = np.linspace(-8, 8, 2 * 5 * 16, dtype=np.float32).reshape(2, 5, 16)
    feed = x.astype(np.float16) if elem == TensorProto.FLOAT16 else x
    if elem == TensorProto.BFLOAT16:
        pytest.skip("numpy has no bfloat16 to feed; the session was built")
    got = session.run(None, {"x": feed})[0].astype(np.float64)
    wide = feed.astype(np.float64)
    exact = wide / (1 + np.exp(-wide))
    assert np.array_equal(got, exact.astype(np.float16).astype(np.float64)) or \
        np.max(np.abs(got - exact) / (np.abs(exact) + 1e-3)) <= 2**-10


def test_onnx_target_raises_the_opset_for_gelu(tmp_path):
    src, dst, report, out = _lower(tmp_path, mlp_model(lambda g, x: gelu_erf(g, x), opset=17), "onnx")
    assert report.fusions == {"Gelu": 1}
    assert next(o.version for o in out.opset_import if o.domain == "") >= 20
    assert otfuse.diff(src, dst, dims=DIMS).ok


def test_an_input_already_holding_an_otfuse_op_the_target_cannot_express_is_refused(tmp_path):
    """A target model never needs otfuse's library: an otfuse op in the input that the target cannot
    write (here norm_linear's, which no target maps) fails the target in one line."""
    from fixtures import fixture_path

    fused = tmp_path / "llama_nl.onnx"
    otfuse.fuse(fixture_path("llama"), fused, only=["norm", "norm_linear"])
    with pytest.raises(otfuse.OtfuseError, match="already holds otfuse's .*must not need otfuse's library"):
        otfuse.fuse(fused, tmp_path / "out.onnx", target="ort")
    assert not (tmp_path / "out.onnx").exists()


def test_an_input_already_fused_by_otfuse_is_converted(tmp_path):
    """otfuse ops in the input that the target expresses are written in its ops (a fused model
    converted to stock ORT)."""
    src = tmp_path / "m.onnx"
    onnx.save(mlp_model(lambda g, x: gelu_tanh(g, x)), src)
    fused = tmp_path / "fused.onnx"
    otfuse.fuse(src, fused)
    out = tmp_path / "out.onnx"
    report = otfuse.fuse(fused, out, target="ort")
    assert report.fusions == {"Gelu": 1} and "com.microsoft.FastGelu" in report.target_ops
    assert not [n for n in onnx.load(out).graph.node if n.domain == "otfuse"]
    assert otfuse.diff(src, out, dims=DIMS).ok
