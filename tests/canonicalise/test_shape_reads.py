"""Shape reads moved to equal-dimensioned sources (otfuse/canonicalise/shape_reads.py), so TorchScript
exports fuse like dynamo ones (tests/fusions/attention/test_torchscript_exports.py): the rotation folded into the
attention, repeat_kv absorbed. Here: which reads move, and that outputs stay the same."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from otfuse.canonicalise.shape_reads import ShapeReadsPass


def _repeat_kv_reads(picks: list[list[int]], reader: str = "Gather") -> onnx.ModelProto:
    """x [B, 2, S, 8] -> repeat_kv -> y [B, 4, S, 8]; one Shape(y) per entry of ``picks``, read by
    Gather(indices) (or Slice), each result a graph output."""
    inits = [numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
             numpy_helper.from_array(np.array([1, 2, 2, 1, 8], dtype=np.int64), "expand_to"),
             numpy_helper.from_array(np.array([0, 4, -1, 8], dtype=np.int64), "merged")]
    nodes = [helper.make_node("Unsqueeze", ["x", "axis2"], ["u"]),
             helper.make_node("Expand", ["u", "expand_to"], ["e"]),
             helper.make_node("Reshape", ["e", "merged"], ["y"]),
             helper.make_node("Neg", ["y"], ["out"])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4, "seq", 8])]
    for i, pick in enumerate(picks):
        inits.append(numpy_helper.from_array(np.array(pick, dtype=np.int64), f"pick{i}"))
        nodes.append(helper.make_node("Shape", ["y"], [f"shape{i}"], name=f"Shape{i}"))
        if reader == "Gather":
            nodes.append(helper.make_node("Gather", [f"shape{i}", f"pick{i}"], [f"dims{i}"], axis=0))
        else:
            nodes.append(helper.make_node("Slice", [f"shape{i}", f"pick{i}", f"pick{i}"], [f"dims{i}"]))
        outputs.append(helper.make_tensor_value_info(f"dims{i}", TensorProto.INT64, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, "seq", 8])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return onnx.shape_inference.infer_shapes(model)


def _moved(model: onnx.ModelProto) -> dict[str, str]:
    """Run the pass; check the outputs are unchanged; the input each Shape node now reads."""
    x = np.random.default_rng(0).standard_normal((3, 2, 5, 8)).astype(np.float32)
    before = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    ShapeReadsPass().run(model, None)
    after = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    return {n.name: n.input[0] for n in model.graph.node if n.op_type == "Shape"}


def test_dims_repeat_kv_keeps_are_read_from_its_source():
    assert _moved(_repeat_kv_reads([[0], [2, 3], [-1]])) == {"Shape0": "x", "Shape1": "x", "Shape2": "x"}


def test_the_head_count_repeat_kv_changes_stays_read_from_the_repeated_tensor():
    assert _moved(_repeat_kv_reads([[1], [0, 1]])) == {"Shape0": "y", "Shape1": "y"}


def test_shape_read_by_other_ops_stays():
    assert _moved(_repeat_kv_reads([[3]], reader="Slice")) == {"Shape0": "y"}


def test_reads_do_not_move_past_a_computation():
    """Shape(Neg(y)) picks dim 0: Neg is not a rearranging hop, so the read stays on its output."""
    model = _repeat_kv_reads([])
    model.graph.initializer.append(numpy_helper.from_array(np.array([0], dtype=np.int64), "first"))
    model.graph.node.extend([helper.make_node("Shape", ["out"], ["s"], name="ShapeOut"),
                             helper.make_node("Gather", ["s", "first"], ["b"], axis=0)])
    model.graph.output.append(helper.make_tensor_value_info("b", TensorProto.INT64, None))
    assert _moved(model) == {"ShapeOut": "out"}
