"""CPU kernels of the norm family (RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm) against
otfuse.verify.reference, through real ONNX Runtime sessions with the custom-op library.

ORT's Python API cannot feed or fetch bfloat16 arrays, so bfloat16 tensors cross the graph
boundary as float32 with a Cast on each side; the values are bfloat16-exact, so the Casts
change nothing.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import otfuse
from otfuse.verify import reference
from otfuse.errors import OtfuseError

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
DTYPES = [F32, F16, BF16]
ONNX_TYPE = {F32: TensorProto.FLOAT, F16: TensorProto.FLOAT16, BF16: TensorProto.BFLOAT16,
             np.dtype(np.int64): TensorProto.INT64}
TOLERANCE = {F32: 1e-5, F16: 1e-3, BF16: 1e-2}  # used as both rtol and atol
NODE_NAME = "fused_norm_0"


def _graph_io(name: str, dtype: np.dtype) -> tuple[list, list]:
    """(graph inputs, Cast nodes) that deliver `name` to the op with `dtype`."""
    if dtype == BF16:
        outer = f"{name}_f32"
        return [helper.make_tensor_value_info(outer, TensorProto.FLOAT, None)], [
            helper.make_node("Cast", [outer], [name], to=TensorProto.BFLOAT16)
        ]
    return [helper.make_tensor_value_info(name, ONNX_TYPE[dtype], None)], []


def build_model(op: str, inputs: list, n_outputs: int, out_dtype: np.dtype, attrs: dict,
                omit_outputs: tuple[int, ...] = ()) -> onnx.ModelProto:
    graph_inputs, nodes, input_names = [], [], []
    for i, array in enumerate(inputs):
        if array is None:
            input_names.append("")  # absent optional input, spelled as an empty name
            continue
        name = f"in{i}"
        ios, casts = _graph_io(name, array.dtype)
        graph_inputs += ios
        nodes += casts
        input_names.append(name)
    output_names = ["" if i in omit_outputs else f"out{i}" for i in range(n_outputs)]
    graph_outputs = []
    tail = []
    for name in output_names:
        if not name:
            continue
        if out_dtype == BF16:
            tail.append(helper.make_node("Cast", [name], [f"{name}_f32"], to=TensorProto.FLOAT))
            graph_outputs.append(helper.make_tensor_value_info(f"{name}_f32", TensorProto.FLOAT, None))
        else:
            graph_outputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[out_dtype], None))
    while output_names and not output_names[-1]:
        output_names.pop()  # trailing absent outputs are simply left off
    node = helper.make_node(op, input_names, output_names, domain="otfuse", name=NODE_NAME, **attrs)
    graph = helper.make_graph(nodes + [node] + tail, "g", graph_inputs, graph_outputs)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("otfuse", 1)]
    )


def make_session(model: onnx.ModelProto, library: str, threads: int = 2) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    options.intra_op_num_threads = threads
    options.log_severity_level = 4  # errors reach the test as exceptions; keep stderr quiet
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_op(library: str, op: str, inputs: list, n_outputs: int = 1, attrs: dict | None = None,
           omit_outputs: tuple[int, ...] = (), threads: int = 2) -> list[np.ndarray]:
    out_dtype = inputs[0].dtype
    model = build_model(op, inputs, n_outputs, out_dtype, attrs or {}, omit_outputs)
    session = make_session(model, library, threads)
    feeds = {}
    for i, array in enumerate(inputs):
        if array is not None:
            feeds[f"in{i}_f32" if array.dtype == BF16 else f"in{i}"] = (
                array.astype(F32) if array.dtype == BF16 else array
            )
    results = session.run(None, feeds)
    return [r.astype(BF16) if out_dtype == BF16 else r for r in results]


def random(rng: np.random.Generator, shape, dtype: np.dtype, low=None, high=None) -> np.ndarray:
    if low is None:
        values = rng.standard_normal(shape, dtype=np.float32) * 2 + 0.5
    else:
        values = rng.uniform(low, high, shape).astype(np.float32)
    return values.astype(dtype)


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    tol = TOLERANCE[expected.dtype]
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol)


def op_inputs(op: str, rng, shape, dtype, axis=-1, weight_dtype=None, with_bias=True):
    """Inputs in the op's order (a missing bias is left off the end)."""
    weight_dtype = weight_dtype or dtype
    row_shape = shape[axis % len(shape):]
    scale = random(rng, row_shape, weight_dtype, 0.5, 1.5)
    bias = random(rng, row_shape, weight_dtype, -0.5, 0.5) if with_bias else None
    inputs = [random(rng, shape, dtype) for _ in range(2 if op.startswith("Add") else 1)] + [scale]
    if op.endswith("LayerNorm") and bias is not None:
        inputs.append(bias)
    return inputs


def reference_outputs(op: str, inputs: list, attrs: dict) -> list[np.ndarray]:
    kw = dict(attrs)
    if op == "RMSNorm":
        return [reference.rms_norm(*inputs, **kw)]
    if op == "AddRMSNorm":
        return list(reference.add_rms_norm(*inputs, **kw))
    if op == "LayerNorm":
        x, scale, *bias = inputs
        return [reference.layer_norm(x, scale, bias[0] if bias else None, **kw)]
    a, b, scale, *bias = inputs
    return list(reference.add_layer_norm(a, b, scale, bias[0] if bias else None, **kw))


def reference_inputs(inputs: list) -> list:
    return [i for i in inputs if i is not None]


OPS = ["RMSNorm", "AddRMSNorm", "LayerNorm", "AddLayerNorm"]
N_OUTPUTS = {"RMSNorm": 1, "AddRMSNorm": 2, "LayerNorm": 1, "AddLayerNorm": 2}
SHAPES = {
    "D1": (5, 1),
    "D3": (7, 3),
    "D17": (2, 3, 17),
    "D4097": (3, 4097),
    "one_row": (1, 64),
    "many_rows": (1000, 40),  # several parallel tasks
    "rank1": (33,),
}


def check(library, op, inputs, attrs=None, omit_outputs=()):
    attrs = attrs or {}
    got = run_op(library, op, inputs, N_OUTPUTS[op], attrs, omit_outputs)
    want = [w for i, w in enumerate(reference_outputs(op, reference_inputs(inputs), attrs)) if i not in omit_outputs]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w)
    if len(got) == 2:  # S is the same rounded sum on both sides: bit-exact
        np.testing.assert_array_equal(got[1].view(np.uint8), want[1].view(np.uint8))


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", OPS)
def test_matches_reference(library, op, dtype, shape):
    rng = np.random.default_rng(zlib.crc32(f"{op}{dtype.name}{shape}".encode()))
    check(library, op, op_inputs(op, rng, shape, dtype))


@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("op", OPS)
def test_float32_weights_with_half_inputs(library, op, dtype):
    rng = np.random.default_rng(1)
    check(library, op, op_inputs(op, rng, (6, 48), dtype, weight_dtype=F32))


@pytest.mark.parametrize("op", ["LayerNorm", "AddLayerNorm"])
def test_mixed_scale_and_bias_types(library, op):
    rng = np.random.default_rng(2)
    inputs = op_inputs(op, rng, (4, 24), F16)
    inputs[-1] = inputs[-1].astype(F32)  # fp16 scale, fp32 bias
    check(library, op, inputs)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", OPS)
def test_axis_minus_two_normalises_two_trailing_dims(library, op, dtype):
    rng = np.random.default_rng(3)
    inputs = op_inputs(op, rng, (3, 4, 6, 5), dtype, axis=-2)
    assert inputs[-1].shape == (6, 5)
    check(library, op, inputs, {"axis": -2})


@pytest.mark.parametrize("op", OPS)
def test_positive_axis_and_epsilon(library, op):
    rng = np.random.default_rng(4)
    inputs = op_inputs(op, rng, (2, 3, 8), F32, axis=1)
    check(library, op, inputs, {"axis": 1, "epsilon": 0.25})


@pytest.mark.parametrize("op", ["AddRMSNorm", "AddLayerNorm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_residual_output_omitted(library, op, dtype):
    rng = np.random.default_rng(5)
    check(library, op, op_inputs(op, rng, (9, 31), dtype), omit_outputs=(1,))


@pytest.mark.parametrize("op", ["LayerNorm", "AddLayerNorm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_bias_absent(library, op, dtype):
    rng = np.random.default_rng(6)
    inputs = op_inputs(op, rng, (5, 19), dtype, with_bias=False)
    check(library, op, inputs)  # bias left off the end
    check(library, op, inputs + [None])  # bias spelled as an empty input name


def test_multithreaded_rows_match_single_thread(library):
    rng = np.random.default_rng(7)
    inputs = op_inputs("AddLayerNorm", rng, (512, 384), F16)
    one = run_op(library, "AddLayerNorm", inputs, 2, threads=1)
    two = run_op(library, "AddLayerNorm", inputs, 2, threads=2)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", OPS)
def test_cpu_variants_agree_bit_for_bit(library, monkeypatch, op, dtype):
    # x86-64 builds also carry AVX2/F16C row kernels; OTFUSE_CPU_ISA=baseline forces the portable
    # ones (read when the session creates its kernels). Both round to nearest even identically.
    rng = np.random.default_rng(14)
    inputs = op_inputs(op, rng, (37, 203), dtype)  # 203: vector bodies plus scalar tails
    inputs[0][0, :4] = np.array([6e4, -6e4, 1e-7, 0.0], np.float32).astype(dtype)  # overflow, subnormal
    default = run_op(library, op, inputs, N_OUTPUTS[op])
    monkeypatch.setenv("OTFUSE_CPU_ISA", "baseline")
    baseline = run_op(library, op, inputs, N_OUTPUTS[op])
    for a, b in zip(default, baseline):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the reference overflows to inf too
def test_half_outputs_round_to_subnormal_and_overflow_to_inf(library):
    x = np.tile(np.array([1.0, -1.0, 2.0, -2.0], np.float16), (3, 4))
    for scale_value in (1e-6, 3e-8, 4e4, 7e4):  # fp16 subnormals, below the smallest, near max, inf
        scale = np.full(16, scale_value, np.float32)
        check(library, "RMSNorm", [x, scale])


@pytest.mark.parametrize("op", OPS)
def test_empty_tensors(library, op):
    rng = np.random.default_rng(8)
    for shape in [(0, 8), (4, 0)]:
        inputs = op_inputs(op, rng, shape, F32)
        out = run_op(library, op, inputs, N_OUTPUTS[op])
        assert all(o.shape == shape for o in out)


def test_reference_layer_norm_matches_onnx_layer_normalization():
    # Anchors the reference itself to the standard op: same mean, biased variance and epsilon.
    rng = np.random.default_rng(9)
    x, scale, bias = random(rng, (4, 5, 6), F32), random(rng, (5, 6), F32), random(rng, (5, 6), F32)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-2, epsilon=1e-3)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "xsb"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x, "s": scale, "b": bias})
    np.testing.assert_allclose(reference.layer_norm(x, scale, bias, 1e-3, -2), expected, rtol=1e-5, atol=1e-5)


# ---- errors: ORT raises an exception naming the op and the node; the process survives ----


def expect_error(library, op, inputs, attrs=None, match=None, n_outputs=1):
    with pytest.raises(Exception) as info:
        run_op(library, op, inputs, n_outputs, attrs)
    message = str(info.value)
    assert op in message and NODE_NAME in message, message
    if match:
        assert match in message, message
    return message


@pytest.mark.parametrize("op", OPS)
def test_wrong_scale_shape(library, op):
    rng = np.random.default_rng(10)
    inputs = op_inputs(op, rng, (4, 8), F32)
    scale_index = 2 if op.startswith("Add") else 1
    inputs[scale_index] = inputs[scale_index][:5]
    expect_error(library, op, inputs, match="scale has shape [5]")


def test_scale_with_rank_of_x_is_rejected(library):
    x = np.ones((4, 8), np.float32)
    expect_error(library, "RMSNorm", [x, np.ones((1, 8), np.float32)], match="scale has shape [1, 8]")


@pytest.mark.parametrize("op", ["LayerNorm", "AddLayerNorm"])
def test_wrong_bias_shape(library, op):
    rng = np.random.default_rng(11)
    inputs = op_inputs(op, rng, (4, 8), F32)
    inputs[-1] = np.ones(9, np.float32)
    expect_error(library, op, inputs, match="bias has shape [9]")


@pytest.mark.parametrize("op", ["AddRMSNorm", "AddLayerNorm"])
def test_a_b_shape_mismatch(library, op):
    rng = np.random.default_rng(12)
    inputs = op_inputs(op, rng, (4, 8), F32)
    inputs[1] = np.ones((1, 8), np.float32)  # broadcastable, but the contract forbids broadcasting
    expect_error(library, op, inputs, match="B has shape [1, 8]")


@pytest.mark.parametrize("axis", [2, -3, 100])
@pytest.mark.parametrize("op", OPS)
def test_axis_out_of_range(library, op, axis):
    rng = np.random.default_rng(13)
    expect_error(library, op, op_inputs(op, rng, (4, 8), F32), {"axis": axis}, match="out of range")


def test_scalar_input_has_no_valid_axis(library):
    expect_error(library, "RMSNorm", [np.array(2.0, np.float32), np.array(1.0, np.float32)],
                 match="out of range")


def test_scale_of_another_half_type_is_rejected(library):
    x = np.ones((2, 4), np.float32)
    expect_error(library, "RMSNorm", [x, np.ones(4, np.float16)], match="scale has element type float16")
    expect_error(library, "RMSNorm", [x.astype(F16), np.ones(4, np.int64)], match="scale has element type int64")


def test_negative_epsilon_fails_at_session_creation(library):
    model = build_model("RMSNorm", [np.ones((2, 4), np.float32)] * 2, 1, F32, {"epsilon": -1.0})
    with pytest.raises(Exception, match=f"RMSNorm \\(node '{NODE_NAME}'\\).*epsilon"):
        make_session(model, library)


def test_attribute_of_wrong_type(library):
    model = build_model("RMSNorm", [np.ones((2, 4), np.float32)] * 2, 1, F32, {"axis": 1.5})
    with pytest.raises(Exception, match="attribute 'axis' must be an int"):
        make_session(model, library)


def test_a_b_type_mismatch_is_refused(library):
    with pytest.raises(Exception):
        run_op(library, "AddRMSNorm", [np.ones((2, 4), np.float16), np.ones((2, 4), np.float32),
                                       np.ones(4, np.float32)], 1)


def test_session_still_works_after_an_error(library):
    model = build_model("RMSNorm", [np.ones((2, 4), np.float32)] * 2, 1, F32, {})
    session = make_session(model, library)
    with pytest.raises(Exception):
        session.run(None, {"in0": np.ones((2, 4), np.float32), "in1": np.ones(3, np.float32)})
    (y,) = session.run(None, {"in0": np.ones((2, 4), np.float32), "in1": np.ones(4, np.float32)})
    np.testing.assert_allclose(y, np.ones((2, 4)), rtol=1e-5)


# ---- finding the library ----


def test_library_path_env_override(monkeypatch, library):
    monkeypatch.setenv("OTFUSE_LIBRARY", library)
    assert otfuse.library_path() == library
    monkeypatch.setenv("OTFUSE_LIBRARY", "/nonexistent/libotfuse_ops.so")
    with pytest.raises(OtfuseError, match="OTFUSE_LIBRARY"):
        otfuse.library_path()
