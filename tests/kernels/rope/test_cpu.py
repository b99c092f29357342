"""CPU kernels of the rotary family (RotaryEmbedding, RotaryEmbeddingQK) against otfuse.verify.reference
and against the unfused ONNX subgraph, through real ONNX Runtime sessions with the custom-op
library.

The kernels compute the contract's cos*x + sin*(M x) in float32 (no FMA) and round once, exactly
as the numpy reference does, so results are compared bit for bit. ORT's Python API cannot feed or
fetch bfloat16 arrays, so bfloat16 tensors cross the graph boundary as float32 with a Cast on
each side; the values are bfloat16-exact, so the Casts change nothing.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from buffers import off_line
from onnx import TensorProto, helper

from otfuse.verify import reference

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
DTYPES = [F32, F16, BF16]
ONNX_TYPE = {F32: TensorProto.FLOAT, F16: TensorProto.FLOAT16, BF16: TensorProto.BFLOAT16,
             np.dtype(np.int64): TensorProto.INT64}
NODE_NAME = "fused_rope_0"
MODES = ["half", "interleaved"]


# ---- single-node models ----


def _graph_input(name: str, dtype: np.dtype) -> tuple[list, list]:
    """(graph inputs, Cast nodes) that deliver `name` to the op with `dtype`."""
    if dtype == BF16:
        outer = f"{name}_f32"
        return [helper.make_tensor_value_info(outer, TensorProto.FLOAT, None)], [
            helper.make_node("Cast", [outer], [name], to=TensorProto.BFLOAT16)
        ]
    return [helper.make_tensor_value_info(name, ONNX_TYPE[dtype], None)], []


def _graph_output(name: str, dtype: np.dtype) -> tuple[list, list]:
    if dtype == BF16:
        return [helper.make_tensor_value_info(f"{name}_f32", TensorProto.FLOAT, None)], [
            helper.make_node("Cast", [name], [f"{name}_f32"], to=TensorProto.FLOAT)
        ]
    return [helper.make_tensor_value_info(name, ONNX_TYPE[dtype], None)], []


def build_model(op: str, inputs: list[np.ndarray], n_outputs: int, attrs: dict) -> onnx.ModelProto:
    graph_inputs, head, names = [], [], []
    for i, array in enumerate(inputs):
        ios, casts = _graph_input(f"in{i}", array.dtype)
        graph_inputs += ios
        head += casts
        names.append(f"in{i}")
    graph_outputs, tail = [], []
    for i in range(n_outputs):
        ios, casts = _graph_output(f"out{i}", inputs[0].dtype)
        graph_outputs += ios
        tail += casts
    node = helper.make_node(op, names, [f"out{i}" for i in range(n_outputs)], domain="otfuse", name=NODE_NAME,
                            **attrs)
    graph = helper.make_graph(head + [node] + tail, "g", graph_inputs, graph_outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("otfuse", 1)])


def make_session(model: onnx.ModelProto, library: str | None, threads: int = 2) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if library:
        options.register_custom_ops_library(library)
    options.intra_op_num_threads = threads
    options.log_severity_level = 4  # errors reach the test as exceptions; keep stderr quiet
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def feeds_for(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {f"in{i}_f32" if a.dtype == BF16 else f"in{i}": a.astype(F32) if a.dtype == BF16 else a
            for i, a in enumerate(inputs)}


def run_op(library: str, op: str, inputs: list[np.ndarray], attrs: dict | None = None,
           threads: int = 2) -> list[np.ndarray]:
    n_outputs = 2 if op == "RotaryEmbeddingQK" else 1
    session = make_session(build_model(op, inputs, n_outputs, attrs or {}), library, threads)
    results = session.run(None, feeds_for(inputs))
    return [r.astype(BF16) if inputs[0].dtype == BF16 else r for r in results]


def reference_outputs(op: str, inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    if op == "RotaryEmbedding":
        return [reference.rotary_embedding(*inputs, **attrs)]
    return list(reference.rotary_embedding_qk(*inputs, **attrs))


def random(rng: np.random.Generator, shape, dtype: np.dtype) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * 2).astype(dtype)


def cos_sin(rng: np.random.Generator, shape, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of random angles, duplicated across the two halves as Hugging Face builds them
    (any values would do: the ops never assume cos^2 + sin^2 = 1)."""
    angles = rng.uniform(-np.pi, np.pi, shape).astype(np.float32)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def assert_same_bits(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual.dtype, actual.shape,
                                                                                expected.dtype, expected.shape)
    if not np.array_equal(actual.view(np.uint8), expected.view(np.uint8)):
        diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
        raise AssertionError(f"{np.count_nonzero(diff)} of {diff.size} elements differ, max |diff| {diff.max()}")


def check(library, op, inputs, attrs=None, threads=2):
    attrs = attrs or {}
    got = run_op(library, op, inputs, attrs, threads)
    want = reference_outputs(op, inputs, attrs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same_bits(g, w)
    return got


def seeded(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# X shape, cos/sin shape: BNSD and BSND layouts with the cos/sin shapes exporters produce, and
# odd sizes (vector bodies plus scalar tails, several row tasks, rank 2..5).
LAYOUTS = {
    "bnsd_cos_11sr": ((2, 4, 10, 16), (1, 1, 10, 16)),
    "bnsd_cos_b1sr": ((2, 4, 10, 16), (2, 1, 10, 16)),
    "bnsd_cos_sr": ((2, 4, 10, 16), (10, 16)),
    "bsnd_cos_bs1r": ((2, 10, 4, 16), (2, 10, 1, 16)),
    "bsnd_cos_1s1r": ((3, 10, 4, 16), (1, 10, 1, 16)),
    "odd_sizes": ((3, 5, 7, 6), (5, 1, 6)),
    "odd_head_dim_tail": ((2, 3, 9, 26), (1, 1, 9, 26)),
    "rank2": ((7, 10), (7, 10)),
    "rank3_cos_r": ((4, 6, 8), (8,)),  # one cos row for every row
    "rank5": ((2, 3, 1, 5, 8), (3, 1, 5, 8)),
    "decode_one_position": ((1, 32, 1, 128), (1, 1, 1, 128)),
    "many_tasks": ((1, 8, 300, 64), (1, 1, 300, 64)),
    "many_tasks_bsnd": ((2, 150, 8, 64), (2, 150, 1, 64)),
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", MODES)
def test_matches_reference(library, mode, dtype, layout):
    x_shape, c_shape = layout
    rng = seeded(mode, dtype.name, layout)
    check(library, "RotaryEmbedding", [random(rng, x_shape, dtype), *cos_sin(rng, c_shape, dtype)], {"mode": mode})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", [((2, 4, 10, 16), (1, 1, 10, 8)), ((2, 10, 3, 16), (2, 10, 1, 8))],
                         ids=["bnsd", "bsnd"])
def test_partial_rotary(library, layout, mode, dtype):
    x_shape, c_shape = layout
    rng = seeded("partial", mode, dtype.name, layout)
    x = random(rng, x_shape, dtype)
    (y,) = check(library, "RotaryEmbedding", [x, *cos_sin(rng, c_shape, dtype)], {"mode": mode, "rotary_dim": 8})
    np.testing.assert_array_equal(y[..., 8:].view(np.uint8), x[..., 8:].view(np.uint8))  # lanes >= r untouched


@pytest.mark.parametrize("mode", MODES)
def test_rotary_dim_equal_to_d_is_the_default(library, mode):
    rng = seeded("r=D", mode)
    inputs = [random(rng, (2, 3, 5, 12), F32), *cos_sin(rng, (5, 12), F32)]
    (explicit,) = check(library, "RotaryEmbedding", inputs, {"mode": mode, "rotary_dim": 12})
    (default,) = run_op(library, "RotaryEmbedding", inputs, {"mode": mode})
    np.testing.assert_array_equal(explicit, default)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", MODES)
def test_sections(library, mode, dtype):
    rng = seeded("sections", mode, dtype.name)
    inputs = [random(rng, (2, 3, 7, 16), dtype), *cos_sin(rng, (1, 1, 7, 16), dtype)]
    (y,) = check(library, "RotaryEmbedding", inputs, {"mode": mode, "sections": [4, 6, 6]})
    if mode == "interleaved":  # pairs never straddle an (even) section boundary
        (plain,) = run_op(library, "RotaryEmbedding", inputs, {"mode": mode})
        assert_same_bits(y, plain)
    else:  # half mode rotates inside each section: not the same as one section of 16
        (plain,) = run_op(library, "RotaryEmbedding", inputs, {"mode": mode})
        assert not np.array_equal(y, plain)


def test_sections_with_partial_rotary(library):
    rng = seeded("sections+partial")
    inputs = [random(rng, (2, 5, 3, 20), F16), *cos_sin(rng, (2, 5, 1, 12), F16)]
    check(library, "RotaryEmbedding", inputs, {"rotary_dim": 12, "sections": [4, 8]})
    check(library, "RotaryEmbedding", inputs, {"rotary_dim": 12, "sections": [2, 0, 10]})  # an empty section


@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("mode", MODES)
def test_float32_cos_sin_with_half_inputs(library, mode, dtype):
    rng = seeded("f32 cos", mode, dtype.name)
    check(library, "RotaryEmbedding", [random(rng, (2, 4, 9, 24), dtype), *cos_sin(rng, (1, 1, 9, 24), F32)],
          {"mode": mode})


QK_LAYOUTS = {
    # Q and K with different head counts (grouped-query attention).
    "bnsd": ((2, 8, 10, 16), (2, 2, 10, 16), (1, 1, 10, 16)),
    "bsnd": ((2, 10, 8, 16), (2, 10, 2, 16), (2, 10, 1, 16)),
    "odd": ((3, 5, 7, 6), (3, 1, 7, 6), (7, 6)),
}


@pytest.mark.parametrize("layout", QK_LAYOUTS.values(), ids=QK_LAYOUTS.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", MODES)
def test_qk_matches_reference(library, mode, dtype, layout):
    q_shape, k_shape, c_shape = layout
    rng = seeded("qk", mode, dtype.name, layout)
    inputs = [random(rng, q_shape, dtype), random(rng, k_shape, dtype), *cos_sin(rng, c_shape, dtype)]
    q, k = check(library, "RotaryEmbeddingQK", inputs, {"mode": mode})
    # The same as two RotaryEmbedding nodes.
    (q1,) = run_op(library, "RotaryEmbedding", [inputs[0], *inputs[2:]], {"mode": mode})
    (k1,) = run_op(library, "RotaryEmbedding", inputs[1:], {"mode": mode})
    assert_same_bits(q, q1)
    assert_same_bits(k, k1)


@pytest.mark.parametrize("mode", MODES)
def test_qk_partial_rotary_and_sections(library, mode):
    rng = seeded("qk partial", mode)
    inputs = [random(rng, (1, 4, 6, 20), BF16), random(rng, (1, 2, 6, 20), BF16), *cos_sin(rng, (6, 12), F32)]
    check(library, "RotaryEmbeddingQK", inputs, {"mode": mode, "rotary_dim": 12, "sections": [4, 8]})


@pytest.mark.parametrize("op", ["RotaryEmbedding", "RotaryEmbeddingQK"])
def test_multithreaded_rows_match_single_thread(library, op):
    rng = seeded("threads", op)
    xs = [random(rng, (2, 16, 200, 64), F16)] * (2 if op == "RotaryEmbeddingQK" else 1)
    inputs = xs + list(cos_sin(rng, (1, 1, 200, 64), F16))
    one = run_op(library, op, inputs, threads=1)
    two = run_op(library, op, inputs, threads=2)
    for a, b in zip(one, two):
        assert_same_bits(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", MODES)
def test_cpu_variants_agree_bit_for_bit(library, monkeypatch, mode, dtype):
    # x86-64 builds also carry AVX2/F16C row kernels; OTFUSE_CPU_ISA=baseline forces the portable
    # ones (read when the session creates its kernels).
    rng = seeded("isa", mode, dtype.name)
    x = random(rng, (3, 4, 11, 42), dtype)  # 42 lanes: vector bodies plus scalar tails
    x[0, 0, 0, :6] = np.array([6e4, -6e4, 1e-7, 0.0, np.nan, np.inf], np.float32).astype(dtype)  # overflow, subnormal
    inputs = [x, *cos_sin(rng, (1, 1, 11, 42), dtype)]
    attrs = {"mode": mode, "sections": [18, 24]} if mode == "half" else {"mode": mode}
    default = run_op(library, "RotaryEmbedding", inputs, attrs)
    monkeypatch.setenv("OTFUSE_CPU_ISA", "baseline")
    baseline = run_op(library, "RotaryEmbedding", inputs, attrs)
    assert_same_bits(default[0], baseline[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", MODES)
def test_large_outputs_streamed(library, mode, dtype):
    # Outputs of 16 MiB and more are written with streaming stores by the AVX2 variant.
    rng = seeded("large", mode, dtype.name)
    seq = 8192 // dtype.itemsize
    inputs = [random(rng, (1, 16, seq, 128), dtype), *cos_sin(rng, (1, 1, seq, 128), dtype)]
    assert inputs[0].nbytes == 16 << 20
    check(library, "RotaryEmbedding", inputs, {"mode": mode})


@pytest.mark.parametrize("misalign", [0, 16, 4], ids=["aligned", "16_bytes_in", "4_bytes_in"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_large_output_bound_at_any_alignment(library, dtype, misalign):
    # An output bound by the caller: streamed when every 8-lane store is 16-byte aligned (numpy
    # buffers sit 16 bytes into a 64-byte line), plain stores otherwise; the same values.
    rng = seeded("bound", dtype.name, misalign)
    seq = 8192 // dtype.itemsize
    x = random(rng, (1, 16, seq, 128), dtype)
    cos, sin = cos_sin(rng, (1, 1, seq, 128), dtype)
    y = off_line(x.shape, dtype, misalign)
    session = make_session(build_model("RotaryEmbedding", [x, cos, sin], 1, {}), library)
    binding = session.io_binding()
    for name, array in (("in0", x), ("in1", cos), ("in2", sin)):
        binding.bind_input(name, "cpu", 0, dtype, list(array.shape), array.ctypes.data)
    binding.bind_output("out0", "cpu", 0, dtype, list(y.shape), y.ctypes.data)
    session.run_with_iobinding(binding)
    assert_same_bits(y, reference.rotary_embedding(x, cos, sin))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the reference overflows to inf too
def test_half_output_overflows_to_inf_like_the_reference(library):
    x = np.full((1, 2, 3, 8), 6e4, np.float16)
    cos = np.full((3, 8), 1.0, np.float16)
    sin = np.full((3, 8), -0.5, np.float16)  # first half: 6e4 - 6e4*(-0.5) = 9e4 -> inf
    (y,) = check(library, "RotaryEmbedding", [x, cos, sin])
    assert np.isinf(y[..., :4]).all() and (y[..., 4:] == 3e4).all()


@pytest.mark.parametrize("x_shape", [(2, 0, 10, 16), (0, 4, 10, 16), (2, 4, 10, 0)])
def test_empty_tensors(library, x_shape):
    c_shape = (1, 1, 10, x_shape[-1])
    inputs = [np.ones(x_shape, np.float32), np.ones(c_shape, np.float32), np.ones(c_shape, np.float32)]
    (y,) = run_op(library, "RotaryEmbedding", inputs)
    assert y.shape == x_shape


# ---- an independent formulation: the unfused subgraph the exporters emit, in plain ORT ----


def _const(name: str, values) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], list(values))


class _Builder:
    def __init__(self):
        self.nodes, self.inits, self.count = [], [], 0

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        self.count += 1
        out = f"t{self.count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def const(self, values) -> str:
        self.count += 1
        name = f"c{self.count}"
        self.inits.append(_const(name, values))
        return name

    def slice(self, x: str, start: int, end: int, step: int = 1) -> str:
        return self.op("Slice", [x, self.const([start]), self.const([end]), self.const([-1]), self.const([step])])


def unfused_model(dtype: np.dtype, mode: str, d: int, rotary_dim: int = 0, sections=()) -> onnx.ModelProto:
    """y = x*cos + rotate(x)*sin spelled as Hugging Face's exports spell it: rotate_half is
    Slice/Slice/Neg/Concat (per section), interleaved rotation is strided Slices, Neg, Unsqueeze,
    Concat and Reshape; partial rotary Slices the rotary lanes off and Concats the rest back."""
    r = rotary_dim or d
    b = _Builder()
    rot = b.slice("x", 0, r) if r < d else "x"
    if mode == "half":
        parts, start = [], 0
        for w in sections or (r,):
            h = w // 2
            parts += [b.op("Neg", [b.slice(rot, start + h, start + w)]), b.slice(rot, start, start + h)]
            start += w
        rotated = b.op("Concat", parts, axis=-1)
    else:
        even, odd = b.slice(rot, 0, r, 2), b.slice(rot, 1, r, 2)
        pairs = b.op("Concat", [b.op("Unsqueeze", [b.op("Neg", [odd]), b.const([-1])]),
                                b.op("Unsqueeze", [even, b.const([-1])])], axis=-1)
        shape = b.op("Concat", [b.slice(b.op("Shape", [rot]), 0, -1), b.const([r])], axis=0)
        rotated = b.op("Reshape", [pairs, shape])
    y = b.op("Add", [b.op("Mul", [rot, "cos"]), b.op("Mul", [rotated, "sin"])])
    if r < d:
        y = b.op("Concat", [y, b.slice("x", r, d)], axis=-1)
    b.nodes.append(helper.make_node("Identity", [y], ["y"]))
    t = ONNX_TYPE[dtype]
    graph = helper.make_graph(b.nodes, "unfused", [helper.make_tensor_value_info(n, t, None) for n in ("x", "cos", "sin")],
                              [helper.make_tensor_value_info("y", t, None)], initializer=b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


UNFUSED_CASES = {
    "half": ("half", (2, 4, 10, 16), (1, 1, 10, 16), {}),
    "half_bsnd": ("half", (2, 10, 4, 16), (2, 10, 1, 16), {}),
    "half_partial": ("half", (2, 4, 10, 24), (1, 1, 10, 8), {"rotary_dim": 8}),
    "half_sections": ("half", (1, 3, 5, 16), (5, 16), {"sections": [4, 6, 6]}),
    "interleaved": ("interleaved", (2, 4, 10, 16), (1, 1, 10, 16), {}),
    "interleaved_partial": ("interleaved", (1, 2, 9, 64), (1, 1, 9, 32), {"rotary_dim": 32}),
}


@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
@pytest.mark.parametrize("case", UNFUSED_CASES.values(), ids=UNFUSED_CASES.keys())
def test_matches_unfused_subgraph(library, case, dtype):
    mode, x_shape, c_shape, attrs = case
    rng = seeded("unfused", mode, x_shape, attrs, dtype.name)
    x = random(rng, x_shape, dtype)
    cos, sin = cos_sin(rng, c_shape, dtype)
    unfused = make_session(unfused_model(dtype, mode, x_shape[-1], **attrs), None)
    (expected,) = unfused.run(None, {"x": x, "cos": cos, "sin": sin})
    (fused,) = run_op(library, "RotaryEmbedding", [x, cos, sin], {"mode": mode, **attrs})
    if dtype == F32:
        # Same products and sum in float32, no FMA on either side: identical bits.
        assert_same_bits(fused, expected)
    else:
        # The unfused graph rounds both products to float16 before adding (the contract's float16
        # tolerance); most elements still agree exactly.
        np.testing.assert_allclose(fused.astype(np.float64), expected.astype(np.float64), rtol=1e-2, atol=1e-2)
        assert np.mean(fused != expected) < 0.5


# ---- errors: ORT raises an exception naming the op and the node; the process survives ----


def expect_error(library, op, inputs, attrs=None, match=None):
    with pytest.raises(Exception) as info:
        run_op(library, op, inputs, attrs)
    message = str(info.value)
    assert f"{op} (node '{NODE_NAME}')" in message, message
    if match:
        assert match in message, message
    return message


def rope_inputs(x_shape=(2, 4, 10, 16), c_shape=(1, 1, 10, 16), dtype=F32, sin_shape=None):
    rng = seeded("errors", x_shape, c_shape)
    cos, sin = cos_sin(rng, c_shape, dtype)
    if sin_shape is not None:
        sin = cos_sin(rng, sin_shape, dtype)[1]
    return [random(rng, x_shape, dtype), cos, sin]


def test_cos_shorter_than_the_sequence(library):
    message = expect_error(library, "RotaryEmbedding", rope_inputs(c_shape=(1, 1, 8, 16)), match="cover")
    assert "[1, 1, 8, 16]" in message and "[2, 4, 10, 16]" in message


def test_cos_longer_than_the_sequence(library):
    expect_error(library, "RotaryEmbedding", rope_inputs(c_shape=(1, 1, 12, 16)), match="does not broadcast")


def test_cos_sin_shapes_differ(library):
    expect_error(library, "RotaryEmbedding", rope_inputs(sin_shape=(1, 1, 10, 16)[1:]),
                 match="sin has shape [1, 10, 16] but must equal cos.shape")


def test_cos_last_dim_must_be_r(library):
    expect_error(library, "RotaryEmbedding", rope_inputs(c_shape=(1, 1, 10, 8)), match="last dim must be r = 16")
    expect_error(library, "RotaryEmbedding", rope_inputs(c_shape=(1, 1, 10, 16)), {"rotary_dim": 8},
                 match="last dim must be r = 8")


def test_cos_of_higher_rank_than_x(library):
    expect_error(library, "RotaryEmbedding", rope_inputs(x_shape=(10, 16), c_shape=(1, 10, 16)),
                 match="cannot add dims")


def test_odd_rotary_dim_fails_at_session_creation(library):
    model = build_model("RotaryEmbedding", rope_inputs(), 1, {"rotary_dim": 7})
    with pytest.raises(Exception, match=f"RotaryEmbedding \\(node '{NODE_NAME}'\\).*rotary_dim.*even"):
        make_session(model, library)


def test_odd_head_dim_with_full_rotary(library):
    expect_error(library, "RotaryEmbedding", rope_inputs(x_shape=(2, 3, 5, 7), c_shape=(5, 7)), match="odd")


def test_rotary_dim_larger_than_head_dim(library):
    expect_error(library, "RotaryEmbedding", rope_inputs(c_shape=(10, 24)), {"rotary_dim": 24},
                 match="rotary_dim 24 is larger than X's last dim D = 16")


def test_sections_not_summing_to_r(library):
    model = build_model("RotaryEmbedding", rope_inputs(c_shape=(10, 8)), 1, {"rotary_dim": 8, "sections": [4, 6]})
    with pytest.raises(Exception, match="sums to 10 but must sum to rotary_dim = 8"):
        make_session(model, library)
    # rotary_dim 0: r is only known at run time.
    expect_error(library, "RotaryEmbedding", rope_inputs(), {"sections": [4, 6, 4]}, match="sums to 14")


def test_odd_or_negative_section(library):
    for sections in ([5, 11], [-2, 18]):
        model = build_model("RotaryEmbedding", rope_inputs(), 1, {"sections": sections})
        with pytest.raises(Exception, match="'sections'.*even widths >= 0"):
            make_session(model, library)


def test_unknown_mode(library):
    model = build_model("RotaryEmbedding", rope_inputs(), 1, {"mode": "neox"})
    with pytest.raises(Exception, match="'mode' must be \"half\" or \"interleaved\", got \"neox\""):
        make_session(model, library)


@pytest.mark.parametrize("attrs, match", [
    ({"mode": 1}, "attribute 'mode' must be a string, got an int"),
    ({"sections": 16}, "attribute 'sections' must be a list of ints, got an int"),
    ({"sections": [4.0, 12.0]}, "attribute 'sections' must be a list of ints, got a list of floats"),
    ({"rotary_dim": 8.0}, "attribute 'rotary_dim' must be an int, got a float"),
])
def test_attribute_of_wrong_type(library, attrs, match):
    model = build_model("RotaryEmbedding", rope_inputs(), 1, attrs)
    with pytest.raises(Exception, match=match):
        make_session(model, library)


def test_rank_one_x(library):
    expect_error(library, "RotaryEmbedding", [np.ones(16, np.float32)] * 3, match="expected rank >= 2")


def test_cos_sin_types(library):
    x, cos, sin = rope_inputs()
    expect_error(library, "RotaryEmbedding", [x, cos.astype(F16), sin.astype(F16)],
                 match="cos has element type float16; expected float32")
    expect_error(library, "RotaryEmbedding", [x.astype(F16), cos.astype(np.int64), sin.astype(np.int64)],
                 match="cos has element type int64; expected float32 or float16")
    expect_error(library, "RotaryEmbedding", [x.astype(F16), cos.astype(F16), sin],
                 match="sin has element type float32 but cos has float16")


def test_qk_head_dims_differ(library):
    rng = seeded("qk errors")
    inputs = [random(rng, (1, 4, 6, 16), F32), random(rng, (1, 2, 6, 8), F32), *cos_sin(rng, (6, 8), F32)]
    expect_error(library, "RotaryEmbeddingQK", inputs, {"rotary_dim": 8}, match="Q has head dim 16")


def test_qk_cos_must_cover_both(library):
    rng = seeded("qk cover")
    inputs = [random(rng, (1, 4, 6, 16), F32), random(rng, (1, 2, 5, 16), F32), *cos_sin(rng, (1, 1, 6, 16), F32)]
    expect_error(library, "RotaryEmbeddingQK", inputs, match="K.shape[:-1] + [r]")


def test_session_still_works_after_an_error(library):
    x, cos, sin = rope_inputs()
    session = make_session(build_model("RotaryEmbedding", [x, cos, sin], 1, {}), library)
    with pytest.raises(Exception, match="cover"):
        session.run(None, {"in0": x, "in1": cos[:, :, :5], "in2": sin[:, :, :5]})
    (y,) = session.run(None, {"in0": x, "in1": cos, "in2": sin})
    assert_same_bits(y, reference.rotary_embedding(x, cos, sin))


def test_reference_rejects_what_the_kernel_rejects():
    x, cos, sin = rope_inputs()
    bad = [
        dict(cos=cos[:, :, :8], sin=sin[:, :, :8]),  # cos shorter than the sequence
        dict(sin=sin[0]),  # cos/sin shapes differ
        dict(rotary_dim=7),
        dict(rotary_dim=24),
        dict(sections=[4, 6]),
        dict(sections=[5, 11]),
        dict(mode="neox"),
        dict(x=x[0, 0, 0]),  # rank 1
    ]
    for change in bad:
        args = dict(x=x, cos=cos, sin=sin) | change
        with pytest.raises(ValueError):
            reference.rotary_embedding(**args)
    with pytest.raises(ValueError):
        reference.rotary_embedding_qk(x, x[..., :8], cos, sin)
