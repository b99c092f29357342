"""Sites the targets cannot express stay as the original wrote them, with the reason; what they can
express, on small graphs: tables proven half-width (or not), weights of another type, the opset
raise (allowed, adapted, refused), a float32 scale on float16."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import otfuse
from tests.fusions.norm.graphs import single_norm_model
from tests.fusions.rope.graphs import rope, rope_sections_model
from tests.graphs import GraphBuilder

F32 = TensorProto.FLOAT


def _fuse(tmp_path, model: onnx.ModelProto, target: str, name="m"):
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}_{target}.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, dst, target=target)
    return src, dst, report


def _reasons(report, target):
    return [m["reason"] for m in report.near_misses if m["reason"].startswith(f"target {target}")]


def _rotation_model(table: str) -> onnx.ModelProto:
    """x [B, 4, S, 16] rotated (half) by cos/sin made from freqs [B, 1, S, 8] as ``table`` says:
    "concat" Cos(Concat(f, f)) (two equal halves), "input" cos/sin given as graph inputs."""
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", 4, "seq", 16])
    if table == "concat":
        f = b.input("freqs", F32, ["batch", 1, "seq", 8])
        both = b.node("Concat", [f, f], axis=-1)
        cos, sin = b.node("Cos", [both]), b.node("Sin", [both])
    else:
        cos, sin = (b.input(n, F32, ["batch", 1, "seq", 16]) for n in ("cos", "sin"))
    rope(b, x, cos, sin, 16)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, ["batch", 4, "seq", 16])
    return b.model()


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_rotation_by_a_doubled_table_is_expressed(tmp_path, target):
    src, dst, report = _fuse(tmp_path, _rotation_model("concat"), target)
    assert report.fusions == {"RotaryEmbedding": 1} and not _reasons(report, target)
    ops = {n.op_type for n in onnx.load(dst).graph.node}
    assert "RotaryEmbedding" in ops
    assert otfuse.diff(src, dst, dims={"batch": 2, "seq": 5}).ok


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_rotation_by_tables_of_unknown_lanes_stays_unfused(tmp_path, target):
    src, dst, report = _fuse(tmp_path, _rotation_model("input"), target)
    assert not report.fusions
    assert any("is not provably two equal halves" in r for r in _reasons(report, target)), report.near_misses
    assert [n.op_type for n in onnx.load(dst).graph.node] == [n.op_type for n in onnx.load(src).graph.node]
    assert otfuse.diff(src, dst, dims={"batch": 2, "seq": 5}).ok


def test_rms_norm_with_float32_scale_on_float16_keeps_one_rounding(tmp_path):
    b = GraphBuilder()
    x = b.input("x", TensorProto.FLOAT16, ["batch", "seq", 16])
    wide = b.node("Cast", [x], to=F32)
    sq = b.node("Mul", [wide, wide])
    mean = b.node("ReduceMean", [sq, b.const(np.array([-1], np.int64))], keepdims=1)
    inv = b.node("Reciprocal", [b.node("Sqrt", [b.node("Add", [mean, b.const(np.float32(1e-6))])])])
    normed = b.node("Mul", [wide, inv])
    y = b.node("Mul", [normed, b.const(np.linspace(0.5, 1.5, 16).astype(np.float32))])
    b.node("Cast", [y], to=TensorProto.FLOAT16)
    b.nodes[-1].output[0] = "y"
    b.output("y", TensorProto.FLOAT16, ["batch", "seq", 16])
    for target in ("ort", "onnx"):
        src, dst, report = _fuse(tmp_path, b.model(), target, name=f"rms_{target}")
        if not report.fusions:
            pytest.skip(f"the otfuse rules do not fuse this spelling: {report.near_misses}")
        assert report.fusions == {"RMSNorm": 1}
        assert otfuse.diff(src, dst, dims={"batch": 2, "seq": 3}).ok


def test_onnx_target_raises_the_opset_and_adapts_reduce_axes(tmp_path):
    model = single_norm_model("rms", axes_as_input=False)  # opset 17: ReduceMean(axes=[-1])
    src, dst, report = _fuse(tmp_path, model, "onnx")
    out = onnx.load(dst)
    assert report.fusions == {"RMSNorm": 1}
    assert next(o.version for o in out.opset_import if o.domain == "") == 23
    onnx.checker.check_model(out)
    assert otfuse.diff(src, dst, dims={"batch": 2, "seq": 3}).ok


def test_onnx_target_refuses_a_raise_that_changes_another_op(tmp_path):
    model = single_norm_model("rms", axes_as_input=False)
    # GroupNormalization-18 changed meaning in opset 21 (scale per channel, not per group).
    g = model.graph
    g.input.append(helper.make_tensor_value_info("img", F32, [1, 4, 2, 2]))
    g.initializer.extend([onnx.numpy_helper.from_array(np.ones(2, np.float32), "gn_scale"),
                          onnx.numpy_helper.from_array(np.zeros(2, np.float32), "gn_bias")])
    g.node.append(helper.make_node("GroupNormalization", ["img", "gn_scale", "gn_bias"], ["gn"], num_groups=2))
    g.output.append(helper.make_tensor_value_info("gn", F32, [1, 4, 2, 2]))
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", 18))
    for node in g.node:  # opset 18: ReduceMean's axes as an input
        if node.op_type == "ReduceMean":
            axes = [a for a in node.attribute if a.name == "axes"]
            if axes:
                g.initializer.append(onnx.numpy_helper.from_array(np.array(axes[0].ints, np.int64), "rm_axes"))
                node.attribute.remove(axes[0])
                node.input.append("rm_axes")
    src, dst, report = _fuse(tmp_path, model, "onnx")
    assert not report.fusions
    assert any("cannot be raised to 23: GroupNormalization changed in opset 21" in r
               for r in _reasons(report, "onnx")), report.near_misses
    assert next(o.version for o in onnx.load(dst).opset_import if o.domain == "") == 18


def test_unknown_target_is_one_line_usage_error(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(single_norm_model("rms"), src)
    with pytest.raises(otfuse.OtfuseError, match="unknown target 'tvm'"):
        otfuse.fuse(src, tmp_path / "o.onnx", target="tvm")


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_sections_with_tables_of_unknown_lanes_stay_unfused(tmp_path, target):
    src, dst, report = _fuse(tmp_path, rope_sections_model(), target)
    assert not report.fusions
    assert any("is not provably two equal halves" in r for r in _reasons(report, target)), report.near_misses
    assert otfuse.diff(src, dst, dims={"batch": 2, "seq": 5}).ok


def test_norm_linear_sites_go_back_with_the_reason(tmp_path):
    from fixtures import fixture_path

    out = tmp_path / "llama_ort.onnx"
    report = otfuse.fuse(fixture_path("llama"), out, only=["norm", "norm_linear"], target="ort")
    reasons = _reasons(report, "ort")
    assert reasons and all("no ort op is mapped to it" in r for r in reasons), report.near_misses
    assert not any(n.domain == "otfuse" for n in onnx.load(out).graph.node)
    assert otfuse.diff(fixture_path("llama"), out).ok


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_rope_attention_whose_attention_is_refused_keeps_its_rotations(tmp_path, monkeypatch, target):
    """No committed fixture has an attention the targets refuse behind a rotation any more: the
    attention emitter is made to refuse, as a softcap with a KV cache makes ORT's."""
    from fixtures import fixture_path

    from otfuse.targets import attention
    from otfuse.targets.build import CannotExpress

    def refuse(*args, **kwargs):
        raise CannotExpress("refused by the test")

    monkeypatch.setattr(attention, "_attend", refuse)
    out = tmp_path / f"llama_{target}.onnx"
    report = otfuse.fuse(fixture_path("llama"), out, target=target)
    misses = [m for m in report.near_misses if m["reason"].endswith("refused by the test")]
    assert len(misses) == 2 and all(m["fused_as"] == "RotaryEmbeddingQK (target ops)" for m in misses)
    assert report.fusions == {"AddRMSNorm": 4, "RMSNorm": 1, "RotaryEmbeddingQK": 2, "SwiGLU": 2}
    model = onnx.load(out)
    assert sum(n.op_type == "RotaryEmbedding" for n in model.graph.node) == 4
    assert any(n.op_type == "Softmax" for n in model.graph.node)  # the attention as exported
    assert otfuse.diff(fixture_path("llama"), out, dims={"batch": 2, "seq": 5}).ok


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_an_input_or_attribute_no_emitter_reads_is_refused_not_dropped(target, monkeypatch):
    """As ALiBi's slopes were before the targets modelled them: the table says what is read."""
    from otfuse.targets import lowering
    from otfuse.targets.build import CannotExpress
    from otfuse.targets.call import read_call
    from otfuse.targets.lowering import require_modelled

    inputs, attributes = lowering.MODELLED["Attention"]
    monkeypatch.setitem(lowering.MODELLED, "Attention", (inputs - {"alibi_slopes"}, attributes - {"alibi_positions"}))

    plain = helper.make_node("Attention", ["q", "k", "v"], ["y"], domain="otfuse", num_heads=2)
    require_modelled(read_call(plain), target)
    slopes = helper.make_node("Attention", ["q", "k", "v", "", "", "", "", "slopes"], ["y"], domain="otfuse",
                              num_heads=2)
    with pytest.raises(CannotExpress, match="alibi_slopes"):
        require_modelled(read_call(slopes), target)
    positions = helper.make_node("Attention", ["q", "k", "v"], ["y"], domain="otfuse", num_heads=2,
                                 alibi_positions="mask_cumsum")
    with pytest.raises(CannotExpress, match="alibi_positions"):
        require_modelled(read_call(positions), target)
