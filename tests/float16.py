"""A float32 test graph rewritten in float16 the way onnxconverter-common's
``convert_float_to_float16`` leaves it (with ``Cast`` in its block list, as models/export_matrix.py
runs it), so the tests need not import the converter:

* every float32 initializer, ``Constant`` and value becomes float16 (values clamped to +-1e4 and
  magnitudes below 1e-7 raised to 1e-7, as the converter does);
* a ``Cast(to=FLOAT)`` computes in float16 too (the converter wraps the blocked Cast in
  Cast-to-float32 / Cast-to-float16, which is the identity on float16 values): a graph's float32
  upcast around a norm or a softmax is gone, and the whole region runs in float16;
* with ``keep_io_types`` the float32 graph inputs and outputs stay float32, behind a Cast to
  float16 after each input and a Cast to float32 before each output.

On the norm and attention builders (no Cast), ONNX's reference evaluator gives bit-identical
outputs for this and onnxconverter-common's ``convert_float_to_float16(keep_io_types=True)``.
(With ``Cast`` blocked the converter did not finish on ``single_norm_model(cast=True)``.)
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_MIN_POSITIVE, _MAX_FINITE = 1e-7, 1e4  # the converter's defaults


def _clamped(values: np.ndarray) -> np.ndarray:
    out = values.astype(np.float32).copy()
    tiny = (np.abs(out) < _MIN_POSITIVE) & (out != 0)
    out[tiny] = np.copysign(_MIN_POSITIVE, out[tiny])
    return np.clip(out, -_MAX_FINITE, _MAX_FINITE).astype(np.float16)


def _tensor_to_float16(tensor: onnx.TensorProto) -> None:
    if tensor.data_type == TensorProto.FLOAT:
        tensor.CopyFrom(numpy_helper.from_array(_clamped(numpy_helper.to_array(tensor)), tensor.name))


def _retype(values) -> None:
    for value in values:
        tensor_type = value.type.tensor_type
        if tensor_type.elem_type == TensorProto.FLOAT:
            tensor_type.elem_type = TensorProto.FLOAT16


def to_float16(model: onnx.ModelProto, keep_io_types: bool = False) -> onnx.ModelProto:
    """A float16 copy of ``model`` (see the module docstring)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for tensor in graph.initializer:
        _tensor_to_float16(tensor)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                _tensor_to_float16(attr.t)
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
    _retype(graph.value_info)
    if not keep_io_types:
        _retype(graph.input)
        _retype(graph.output)
        return out
    weights = {t.name for t in graph.initializer}
    casts_in = []
    for value in graph.input:
        if value.name in weights or value.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        inner = f"{value.name}_float16"
        for node in graph.node:
            node.input[:] = [inner if name == value.name else name for name in node.input]
        casts_in.append(helper.make_node("Cast", [value.name], [inner], name=f"{inner}_cast", to=TensorProto.FLOAT16))
    casts_out = []
    for value in graph.output:
        if value.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        inner = f"{value.name}_float16"
        for node in graph.node:
            node.input[:] = [inner if name == value.name else name for name in node.input]
            node.output[:] = [inner if name == value.name else name for name in node.output]
        casts_out.append(helper.make_node("Cast", [inner], [value.name], name=f"{inner}_cast", to=TensorProto.FLOAT))
        for info in graph.value_info:  # what was known of the output is now known of its float16 value
            if info.name == value.name:
                info.name = inner
    nodes = casts_in + list(graph.node) + casts_out
    del graph.node[:]
    graph.node.extend(nodes)
    return out
