"""Shared steps of the pattern tests: fuse a model (through files and ``otfuse.fuse``, or in memory),
look at the fused nodes, diff the outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import helper

import otfuse
from otfuse.pipeline import fuse_families


@dataclass
class Fused:
    """What ``fuse_in_memory`` did: the report's ``fusions`` and ``near_misses``, as ``FuseReport``."""

    fusions: dict[str, int] = field(default_factory=dict)
    near_misses: list[dict] = field(default_factory=list)


def fuse_in_memory(model: onnx.ModelProto, family: str | list[str]) -> tuple[onnx.ModelProto, Fused]:
    """Run ``family``'s canonicalisers and passes (one name, or several in the order given) on a
    copy of ``model``, as ``otfuse.fuse`` does but with no files, validation or ORT session: for
    structural tests (which spelling fused, which refusal was reported)."""
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    fusions, near_misses = fuse_families(fused, [family] if isinstance(family, str) else list(family), None)
    return fused, Fused(dict(sorted(fusions.items())), near_misses)


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


def assert_same_outputs(tmp_path, name="m", dims=None, inputs=None):
    """The fused model matches the original in ORT within the per-dtype tolerance (on ``inputs``,
    or on generated ones of ``dims``); returns the diff."""
    result = otfuse.diff(tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx", inputs=inputs,
                         dims=dims or {"batch": 2, "seq": 5})
    assert result.ok, [row.to_dict() for row in result.outputs]
    return result
