"""otfuse.InferenceSession's own session defaults (the memory pattern off unless asked for)."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import otfuse


def _model() -> bytes:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def test_memory_pattern_is_off_by_default_also_in_the_callers_options():
    session = otfuse.InferenceSession(_model())
    assert session.get_session_options().enable_mem_pattern is False
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = otfuse.InferenceSession(_model(), sess_options=options)
    assert session.get_session_options().enable_mem_pattern is False
    assert session.get_session_options().intra_op_num_threads == 1
    x = np.array([-1.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], [0.0, 2.0])


def test_memory_pattern_on_when_asked_for():
    session = otfuse.InferenceSession(_model(), mem_pattern=True)
    assert session.get_session_options().enable_mem_pattern is True
    assert onnx.load_from_string(_model()).graph.node[0].op_type == "Relu"
