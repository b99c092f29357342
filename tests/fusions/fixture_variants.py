"""The committed fixtures rewritten the way other exporters and tools leave a model: no shape
information besides the inputs', input dims unnamed, ``-1`` (paddle2onnx), renamed, or all
static. A fusion that holds only for the shapes one exporter happened to write fails here."""

from __future__ import annotations

import onnx

# The sizes the static variant pins, and the diff's sizes for every variant.
STATIC_DIMS = {"batch": 2, "seq": 5, "past_seq": 3, "total_seq": 8}
DIFF_DIMS = {"batch": 2, "seq": 5, "past": 3}

VARIANTS = ("stripped", "unnamed", "minus_one", "renamed", "static")


def _strip_shapes(model: onnx.ModelProto) -> None:
    """(a) No value_info, output dims blank (onnx.checker wants the outputs' rank): only the
    inputs and initializers say anything."""
    del model.graph.value_info[:]
    for output in model.graph.output:
        for dim in output.type.tensor_type.shape.dim:
            dim.Clear()


def _graph_inputs(model: onnx.ModelProto):
    weights = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in weights]


def _rewrite_input_dims(model: onnx.ModelProto, rewrite) -> None:
    for value in _graph_inputs(model):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                name = dim.dim_param
                dim.Clear()
                rewrite(dim, name)


def _unnamed(dim, name: str) -> None:
    pass  # neither a value nor a name


def _minus_one(dim, name: str) -> None:
    dim.dim_value = -1


def _renamed(dim, name: str) -> None:
    dim.dim_param = f"d_{len(name)}_{name[::-1]}"


def _static(dim, name: str) -> None:
    dim.dim_value = STATIC_DIMS[name]


_REWRITES = {"unnamed": _unnamed, "minus_one": _minus_one, "renamed": _renamed, "static": _static}


def variant(model: onnx.ModelProto, kind: str) -> onnx.ModelProto:
    """A copy of ``model`` as ``kind`` (one of VARIANTS); every variant is also stripped."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _strip_shapes(out)
    if kind != "stripped":
        _rewrite_input_dims(out, _REWRITES[kind])
    return out
