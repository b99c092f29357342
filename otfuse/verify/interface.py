"""Checks on a model's interface (graph inputs and outputs) used by ``otfuse diff``.

Loading itself is ``otfuse.rewriter.model_io.load_model`` (weights stay on disk; missing or
truncated external data is reported there).
"""

from __future__ import annotations

import onnx

from otfuse.errors import OtfuseError
from otfuse.rewriter.model_io import graph_inputs


def check_same_interface(original: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    """Both models must take the same inputs (name, element type, rank) and produce the same outputs."""
    a = {vi.name: vi for vi in graph_inputs(original)}
    b = {vi.name: vi for vi in graph_inputs(fused)}
    problems = []
    if only_a := sorted(a.keys() - b.keys()):
        problems.append(f"only the original has {', '.join(only_a)}")
    if only_b := sorted(b.keys() - a.keys()):
        problems.append(f"only the fused model has {', '.join(only_b)}")
    for name in sorted(a.keys() & b.keys()):
        ta, tb = _type_str(a[name]), _type_str(b[name])
        if ta != tb:
            problems.append(f"'{name}' is {ta} vs {tb}")
    if problems:
        raise OtfuseError("graph inputs differ between the models: " + "; ".join(problems))
    outs_a = [o.name for o in original.graph.output]
    outs_b = [o.name for o in fused.graph.output]
    if sorted(outs_a) != sorted(outs_b):
        raise OtfuseError(f"graph outputs differ between the models: {outs_a} vs {outs_b}")


def _type_str(vi: onnx.ValueInfoProto) -> str:
    t = vi.type.tensor_type
    elem = onnx.TensorProto.DataType.Name(t.elem_type).lower() if t.elem_type else "?"
    rank = len(t.shape.dim) if t.HasField("shape") else "?"
    return f"{elem} rank {rank}"
