"""A fuzz case as a one-node ONNX model, run in a real ORT session, checked against its expectation.

bfloat16 crosses the graph boundary as float32 with a Cast (ORT's Python API cannot feed or fetch
bfloat16); an `Empty` input is ConstantOfShape + Cast inside the graph; an output expected only by
its shape is fetched through a Shape node. Sessions run without ORT's memory arena and memory
patterns, so every tensor is its own allocation and AddressSanitizer sees reads past its end.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from otfuse.verify.diff import tolerance_for

from .case import BF16, F32, Case, Const, Empty, ShapeOnly, dtype_of

NODE = "fuzz_node"
ONNX_TYPE = {np.dtype(t): helper.np_dtype_to_tensor_dtype(np.dtype(t))
             for t in (np.float32, np.float16, np.float64, np.int64, np.int32, np.int8, bool)}
ONNX_TYPE[BF16] = TensorProto.BFLOAT16


def _initializer(name: str, array: np.ndarray) -> onnx.TensorProto:
    if array.dtype == BF16:
        return helper.make_tensor(name, TensorProto.BFLOAT16, array.shape, array.view(np.uint16).tobytes(), raw=True)
    return numpy_helper.from_array(array, name)


def build(case: Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    nodes, graph_inputs, inits, feeds, names = [], [], [], {}, []
    for i, spec in enumerate(case.inputs):
        name = f"in{i}"
        if spec is None:
            names.append("")
            continue
        names.append(name)
        if isinstance(spec, Const):
            inits.append(_initializer(name, spec.array))
        elif isinstance(spec, Empty):
            inits.append(numpy_helper.from_array(np.array(spec.shape, np.int64), f"{name}_shape"))
            nodes.append(helper.make_node("ConstantOfShape", [f"{name}_shape"], [f"{name}_f32"]))
            nodes.append(helper.make_node("Cast", [f"{name}_f32"], [name], to=ONNX_TYPE[np.dtype(spec.dtype)]))
        elif spec.dtype == BF16:
            graph_inputs.append(helper.make_tensor_value_info(f"{name}_f32", TensorProto.FLOAT, None))
            nodes.append(helper.make_node("Cast", [f"{name}_f32"], [name], to=TensorProto.BFLOAT16))
            feeds[f"{name}_f32"] = spec.astype(F32)
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[spec.dtype], None))
            feeds[name] = spec
    while names and not names[-1]:
        names.pop()

    out_type = dtype_of(case.inputs[0]) if case.inputs and case.inputs[0] is not None else F32
    named = [i for i in range(case.n_outputs) if i not in case.omit]
    outputs = [f"out{i}" if i in named else "" for i in range(case.n_outputs)]
    while outputs and not outputs[-1]:
        outputs.pop()
    # An invalid case fetches shapes only: a kernel that wrongly accepts it fails as "did not raise".
    expected = case.expected or [ShapeOnly(())] * len(named)
    graph_outputs, tail = [], []
    for i, want in zip(named, expected):
        name = f"out{i}"
        if isinstance(want, ShapeOnly):
            tail.append(helper.make_node("Shape", [name], [f"{name}_shape"]))
            graph_outputs.append(helper.make_tensor_value_info(f"{name}_shape", TensorProto.INT64, None))
        elif out_type == BF16:
            tail.append(helper.make_node("Cast", [name], [f"{name}_f32"], to=TensorProto.FLOAT))
            graph_outputs.append(helper.make_tensor_value_info(f"{name}_f32", TensorProto.FLOAT, None))
        else:
            graph_outputs.append(helper.make_tensor_value_info(name, ONNX_TYPE.get(out_type, TensorProto.FLOAT), None))
    node = helper.make_node(case.op, names, outputs, domain="otfuse", name=NODE, **case.attrs)
    graph = helper.make_graph(nodes + [node] + tail, "fuzz", graph_inputs, graph_outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("otfuse", 1)])
    model.ir_version = 9
    return model, feeds


def session_options(base: ort.SessionOptions, threads: int) -> ort.SessionOptions:
    base.intra_op_num_threads = threads
    base.log_severity_level = 4  # errors reach the test as exceptions
    base.enable_cpu_mem_arena = False
    base.enable_mem_pattern = False
    base.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return base


def run(case: Case, options: ort.SessionOptions) -> list[np.ndarray]:
    model, feeds = build(case)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def check_outputs(case: Case, got: list[np.ndarray]) -> None:
    assert len(got) == len(case.expected), case.describe()
    for index, (actual, want) in enumerate(zip(got, case.expected)):
        where = f"output {index} of {case.describe()}"
        if isinstance(want, ShapeOnly):
            assert tuple(actual) == want.shape, f"{where}: shape {tuple(actual)}, expected {want.shape}"
            continue
        assert actual.shape == want.shape, f"{where}: shape {actual.shape}, expected {want.shape}"
        rtol, atol = tolerance_for(want.dtype)
        np.testing.assert_allclose(actual.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=where)


def check_error(case: Case, message: str) -> None:
    where = f"{case.describe()}\nerror: {message}"
    assert re.search(case.error, message), f"the error does not match {case.error!r}: {where}"
    if not case.by_ort:
        assert f"{case.op} (node '{NODE}')" in message, f"the error does not name the op and node: {where}"
