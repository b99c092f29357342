"""The models the tests build carry an IR version the installed ONNX Runtime loads.

`onnx.helper.make_model` stamps the installed onnx's newest IR version, and an onnx newer than
onnxruntime (onnx 1.23 writes IR 14, ORT 1.30 reads up to 13) makes every such model unloadable
although nothing in it needs the newer IR. The package accepts such pairs, so the suite must run
on them: the newest IR version both know is found once, by loading a one-node model into ORT, and
becomes make_model's default (a test that sets `ir_version` itself keeps it)."""

from __future__ import annotations

import functools

import onnx
import onnxruntime as ort

_make_model = onnx.helper.make_model


@functools.lru_cache(maxsize=1)
def newest_loadable_ir_version() -> int:
    for version in range(onnx.IR_VERSION, 2, -1):
        graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "probe",
                                       [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                       [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        model = _make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=version)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:
            continue
        return version
    return onnx.IR_VERSION


def make_model(graph, **kwargs):
    kwargs.setdefault("ir_version", newest_loadable_ir_version())
    return _make_model(graph, **kwargs)


def install() -> None:
    """Make `onnx.helper.make_model` (and `onnx.helper`'s own callers) default to that version."""
    if newest_loadable_ir_version() < onnx.IR_VERSION:
        onnx.helper.make_model = make_model
