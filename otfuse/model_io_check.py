"""Read a model's graph without its weights, and check what a run needs before ONNX Runtime does.

Used by ``feeds`` (input specs), ``compare`` (same inputs, per-fusion outputs) and the CLI. Every
problem is raised as :class:`~otfuse.errors.ModelLoadError` / :class:`~otfuse.errors.OtfuseError`
with a one-line message naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx.external_data_helper import uses_external_data

from otfuse.errors import ModelLoadError, OtfuseError


def load_graph_only(path: str | os.PathLike) -> onnx.ModelProto:
    """The model proto with external weights left on disk (specs and topology only)."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, expected an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError:
        raise ModelLoadError(f"{path}: not an ONNX model (protobuf parsing failed; truncated or not .onnx?)") from None
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read: {e.strerror or e}") from None
    # Random bytes occasionally parse as an (empty) ModelProto; a real export always has these.
    if not model.ir_version or not model.HasField("graph"):
        raise ModelLoadError(f"{path}: not an ONNX model (no graph / ir_version)")
    return model


def external_data_files(model: onnx.ModelProto) -> set[str]:
    """Relative locations of every external-data file the model's initializers refer to."""
    files = set()
    for tensor in _initializers(model.graph):
        if uses_external_data(tensor):
            for entry in tensor.external_data:
                if entry.key == "location":
                    files.add(entry.value)
    return files


def check_external_data(model: onnx.ModelProto, model_path: str | os.PathLike) -> None:
    """Fail early, naming the file, when an external-data file is missing."""
    base = Path(model_path).parent
    for location in sorted(external_data_files(model)):
        if not (base / location).is_file():
            raise ModelLoadError(f"{model_path}: external data file '{location}' is missing (looked in {base})")


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Inputs a caller must feed: graph inputs that are not also initializers (old IR lists both)."""
    init_names = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in init_names]


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


def _initializers(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _initializers(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _initializers(g)
