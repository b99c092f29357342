"""Copies dropped (otfuse/canonicalise/no_ops.py): Casts to the input's own type and Slices that keep
every element go, their readers reading the input; every other Cast and Slice stays, and the outputs
never change. The real exports it serves (GPT-J's eager float32 Casts, the unoptimised dynamo
export's full Slices) are in the export matrix (gptj/optimum_*, gptj/dynamo_pos_dyn.unoptimised)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from graphs import F16, F32, GraphBuilder
from onnx import TensorProto

from otfuse.canonicalise.no_ops import NoOpsPass

BIG = 2**63 - 1


def _model(build, x_shape=("batch", 4, 8), elem=F32):
    """x -> build(b, x) -> Neg -> y (the Neg keeps the tested node off the graph output)."""
    b = GraphBuilder()
    x = b.input("x", elem, list(x_shape))
    b.node("Neg", [build(b, x)])
    b.nodes[-1].output[0] = "y"
    b.output("y", elem, None)
    return b.model()


def _run(model, elem=F32):
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float16 if elem == F16 else np.float32)
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})


def _dropped(model, elem=F32) -> list[str]:
    """Run the pass, check the outputs are the same; the op types it removed."""
    before, ops = _run(model, elem), [n.op_type for n in model.graph.node]
    NoOpsPass().run(model, None)
    after = _run(model, elem)
    for a, c in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, c)
    left = [n.op_type for n in model.graph.node]
    for op in left:
        ops.remove(op)
    return ops


def _slice(b, x, starts, ends, axes, steps=None):
    inputs = [x, b.const(np.array(starts, np.int64)), b.const(np.array(ends, np.int64)),
              b.const(np.array(axes, np.int64))]
    if steps is not None:
        inputs.append(b.const(np.array(steps, np.int64)))
    return b.node("Slice", inputs)


def test_a_cast_to_the_inputs_own_type_is_dropped():
    assert _dropped(_model(lambda b, x: b.node("Cast", [x], to=TensorProto.FLOAT))) == ["Cast"]


def test_a_cast_to_another_type_stays():
    model = _model(lambda b, x: b.node("Cast", [b.node("Cast", [x], to=TensorProto.FLOAT)], to=TensorProto.FLOAT16),
                   elem=F16)
    assert _dropped(model, F16) == []  # float16 -> float32 -> float16: neither is a copy


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([0], [BIG], [0], None),
    ([0, 0], [BIG, 4], [0, 1], [1, 1]),
    ([0], [8], [-1], None),
    ([0], [100], [2], [1]),
], ids=["open_end", "two_axes", "static_end", "past_the_end"])
def test_a_slice_that_keeps_every_element_is_dropped(starts, ends, axes, steps):
    assert _dropped(_model(lambda b, x: _slice(b, x, starts, ends, axes, steps))) == ["Slice"]


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1], [BIG], [0], None),
    ([0], [7], [2], None),
    ([0], [BIG], [2], [2]),
    ([0], [3], [1], None),
    ([-8], [BIG], [2], None),
], ids=["start_1", "end_short", "step_2", "end_short_of_axis_1", "negative_start"])
def test_a_slice_that_cuts_stays(starts, ends, axes, steps):
    # (a negative start that reaches the axis' beginning is a copy too, but not proven here: kept)
    assert _dropped(_model(lambda b, x: _slice(b, x, starts, ends, axes, steps))) == []


def test_a_slice_of_an_unknown_length_with_a_finite_end_stays():
    assert _dropped(_model(lambda b, x: _slice(b, x, [0], [2], [0]))) == []  # the batch may be longer


def test_a_copy_that_is_a_graph_output_stays():
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", 4, 8])
    b.node("Cast", [x], to=TensorProto.FLOAT)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, None)
    assert _dropped(b.model()) == []


def _dropout(ratio=None, training=None, outputs=1, read_mask=False):
    """x -> Dropout(x[, ratio[, training_mode]]) -> Neg; with ``read_mask`` its mask output feeds a
    second graph output."""
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", 4, 8])
    inputs = [x]
    if ratio is not None or training is not None:
        inputs.append(b.const(np.array(0.0 if ratio is None else ratio, np.float32)))
    if training is not None:
        inputs.append(b.const(np.array(training, bool)))
    out = b.node("Dropout", inputs, outputs=outputs)
    data = out[0] if outputs == 2 else out
    b.node("Neg", [data])
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, None)
    if read_mask:
        b.node("Not", [out[1]])
        b.nodes[-1].output[0] = "kept"
        b.output("kept", TensorProto.BOOL, None)
    return b.model()


@pytest.mark.parametrize("ratio,training,outputs", [
    (None, None, 1), (0.0, None, 2), (0.1, None, 1), (0.5, False, 2)])
def test_an_inference_dropout_is_dropped(ratio, training, outputs):
    """onnxscript's test models (and older dynamo exports) write ``Dropout(p, 0.0)`` after the
    attention Softmax; without a training mode (or a false one) it returns its input."""
    assert _dropped(_dropout(ratio, training, outputs)) == ["Dropout"]


def test_a_training_dropout_or_one_whose_mask_is_read_stays():
    model = _dropout(0.0, True)  # ratio 0: outputs equal, yet training mode is not this pass's to judge
    NoOpsPass().run(model, None)
    assert [n.op_type for n in model.graph.node] == ["Dropout", "Neg"]
    assert _dropped(_dropout(0.0, None, outputs=2, read_mask=True)) == []
