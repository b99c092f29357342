"""Shared steps of the pattern tests: fuse a model, look at the fused nodes, diff the outputs."""

from __future__ import annotations

import onnx
from onnx import helper

import otfuse


def fuse_model(tmp_path, model: onnx.ModelProto, name="m", only=None):
    """Save ``model``, fuse it; return (fused proto, report), or (None, report) if nothing fused."""
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, dst, only=only)
    if not report.fusions:
        return None, report
    return onnx.load(dst), report


def fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == "otfuse"]


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def assert_same_outputs(tmp_path, name="m", dims=None):
    """The fused model matches the original in ORT within the per-dtype tolerance."""
    result = otfuse.diff(tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx",
                         dims=dims or {"batch": 2, "seq": 5})
    assert result.ok, [row.to_dict() for row in result.outputs]
