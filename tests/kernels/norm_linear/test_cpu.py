"""CPU kernels of the Norm + Linear family against otfuse.verify.reference, in real ORT sessions.

Weights are constant initializers (packed once, at kernel creation) or graph inputs (packed on
every run); both paths must agree with the reference. bfloat16 crosses the graph boundary as
float32 with a Cast on each side (ORT's Python API cannot feed bfloat16).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import otfuse
from otfuse.verify import reference

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
ONNX_TYPE = {F32: TensorProto.FLOAT, F16: TensorProto.FLOAT16, BF16: TensorProto.BFLOAT16}
# Y_i sums K products: the tolerance grows with K (float32 summation order differs from numpy's).
TOLERANCE = {F32: 2e-5, F16: 2e-3, BF16: 2e-2}

KINDS = {
    "RMSNormLinear": (False, False),  # (residual Add, LayerNorm)
    "AddRMSNormLinear": (True, False),
    "LayerNormLinear": (False, True),
    "AddLayerNormLinear": (True, True),
}


def _tensor(name: str, array: np.ndarray):
    dtype = array.dtype
    if dtype == BF16:
        return helper.make_tensor(name, TensorProto.BFLOAT16, array.shape, array.view(np.uint16).tobytes(), raw=True)
    return helper.make_tensor(name, ONNX_TYPE[dtype], array.shape, array.tobytes(), raw=True)


class Case:
    def __init__(self, op: str, dtype=F32, shape=(2, 5, 64), widths=(64, 32, 32), transposed=None,
                 bias=None, norm_bias=True, keep=False, const=True, seed=0, epsilon=1e-5):
        rng = np.random.default_rng(seed)
        self.op, self.dtype, self.keep, self.const, self.epsilon = op, np.dtype(dtype), keep, const, epsilon
        self.add, self.layer = KINDS[op]
        k = shape[-1]
        self.transposed = list(transposed or [0] * len(widths))
        self.has_bias = list(bias if bias is not None else [1] * len(widths))
        cast = lambda a: np.asarray(a, dtype=np.float32).astype(self.dtype)  # noqa: E731
        self.x = cast(rng.standard_normal(shape))
        self.b = cast(rng.standard_normal(shape)) if self.add else None
        self.scale = cast(1 + 0.1 * rng.standard_normal(k))
        self.norm_bias = cast(0.1 * rng.standard_normal(k)) if self.layer and norm_bias else None
        self.weights = [cast(0.1 * rng.standard_normal((n, k) if t else (k, n)))
                        for n, t in zip(widths, self.transposed)]
        self.biases = [cast(0.1 * rng.standard_normal(n)) if hb else None for n, hb in zip(widths, self.has_bias)]
        self.widths = list(widths)

    def expected(self) -> list[np.ndarray]:
        biases = self.biases
        if self.add and self.layer:
            ys, s, yn = reference.add_layer_norm_linear(self.x, self.b, self.scale, self.norm_bias, self.weights,
                                                        biases, self.transposed, self.epsilon)
        elif self.add:
            ys, s, yn = reference.add_rms_norm_linear(self.x, self.b, self.scale, self.weights, biases,
                                                      self.transposed, self.epsilon)
        elif self.layer:
            (ys, yn), s = reference.layer_norm_linear(self.x, self.scale, self.norm_bias, self.weights, biases,
                                                      self.transposed, self.epsilon), None
        else:
            (ys, yn), s = reference.rms_norm_linear(self.x, self.scale, self.weights, biases, self.transposed,
                                                    self.epsilon), None
        return ys + ([s] if self.add else []) + ([yn] if self.keep else [])

    def model(self, **attr_overrides):
        t = ONNX_TYPE[self.dtype]
        boundary = TensorProto.FLOAT if self.dtype == BF16 else t
        nodes, inputs, inits, feeds = [], [], [], {}

        def feed(name, array):
            outer = f"{name}_in" if self.dtype == BF16 else name
            inputs.append(helper.make_tensor_value_info(outer, boundary, list(array.shape)))
            feeds[outer] = array.astype(np.float32) if self.dtype == BF16 else array
            if self.dtype == BF16:
                nodes.append(helper.make_node("Cast", [outer], [name], to=TensorProto.BFLOAT16))
            return name

        names = [feed("x", self.x)] + ([feed("b", self.b)] if self.add else [])
        inits.append(_tensor("scale", self.scale))
        names.append("scale")
        if self.layer:
            if self.norm_bias is not None:
                inits.append(_tensor("norm_bias", self.norm_bias))
            names.append("norm_bias" if self.norm_bias is not None else "")
        for i, w in enumerate(self.weights):
            if self.const:
                inits.append(_tensor(f"w{i}", w))
                names.append(f"w{i}")
            else:
                names.append(feed(f"w{i}", w))
        for i, bias in enumerate(self.biases):
            if bias is not None:
                inits.append(_tensor(f"bias{i}", bias))
                names.append(f"bias{i}")
        outs = [f"y{i}" for i in range(len(self.weights))] + (["s"] if self.add else []) + (["yn"] if self.keep else [])
        attrs = dict(epsilon=self.epsilon, axis=-1, out_features=self.widths, transposed=self.transposed,
                     has_bias=self.has_bias)
        attrs.update(attr_overrides)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        nodes.append(helper.make_node(self.op, names, [f"{o}_t" for o in outs] if self.dtype == BF16 else outs,
                                      name="fused_0", domain="otfuse", **attrs))
        if self.dtype == BF16:
            nodes += [helper.make_node("Cast", [f"{o}_t"], [o], to=TensorProto.FLOAT) for o in outs]
        graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, boundary, None) for o in outs],
                                  inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("otfuse", 1)])
        model.ir_version = 9
        return model, feeds

    def run(self, threads: int = 2, **attr_overrides):
        model, feeds = self.model(**attr_overrides)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.register_custom_ops_library(otfuse.library_path())
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(None, feeds)


def _check(case: Case, got: list[np.ndarray]) -> None:
    expected = case.expected()
    assert len(got) == len(expected)
    tol = TOLERANCE[case.dtype]
    for index, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, (index, g.shape, e.shape)
        np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32), rtol=tol, atol=tol,
                                   err_msg=f"output {index}")


@pytest.mark.parametrize("op", list(KINDS))
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_matches_reference(op, dtype):
    _check(Case(op, dtype), Case(op, dtype).run())


@pytest.mark.parametrize("op", list(KINDS))
def test_constant_and_runtime_weights_agree(op):
    case = Case(op, shape=(3, 7, 40), widths=(17, 5), transposed=[1, 0], keep=True, seed=3)
    runtime = Case(op, shape=(3, 7, 40), widths=(17, 5), transposed=[1, 0], keep=True, const=False, seed=3)
    packed_once, packed_per_run = case.run(), runtime.run()
    _check(case, packed_once)
    for a, b in zip(packed_once, packed_per_run):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape,widths", [
    ((1, 64), (1,)),  # a single row and a single column
    ((13, 70), (5, 33, 16)),  # odd K, widths around the 16-wide panels, 13 rows = 2 blocks of 6 + 1
    ((2, 3, 300), (100, 7)),  # K past one 256-deep slice
    ((6, 16), (48,)),  # exactly one row block, exact panels
    ((1, 1, 4096), (40,)),  # decode step: one row read straight from the packed panels
    ((4, 203, 70), (300, 9)),  # 812 rows: three row chunks (the last shorter), many panel groups
    ((4, 203, 1100), (100, 9)),  # the same with A past 1 MiB per chunk: k-outer order, five k slices
])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_odd_sizes(shape, widths, dtype):
    case = Case("AddRMSNormLinear", dtype, shape=shape, widths=widths, bias=[i % 2 for i in range(len(widths))],
                keep=True, seed=7)
    _check(case, case.run())


def test_layernorm_without_norm_bias_and_projection_bias():
    case = Case("LayerNormLinear", shape=(4, 32), widths=(8, 24), bias=[0, 0], norm_bias=False)
    _check(case, case.run())


def test_empty_rows():
    case = Case("RMSNormLinear", shape=(0, 5, 32), widths=(8,))
    got = case.run()
    assert got[0].shape == (0, 5, 8)


@pytest.mark.parametrize("shape", [(37, 96), (801, 40), (801, 1100)],
                         ids=["one-chunk", "three-chunks", "three-chunks-k-outer"])
def test_thread_count_does_not_change_results(shape):
    case = Case("AddLayerNormLinear", shape=shape, widths=(130, 64, 3), transposed=[0, 1, 0], seed=11)
    one, two = case.run(threads=1), case.run(threads=2)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_baseline_and_avx2_variants_agree(monkeypatch, tmp_path):
    """The portable micro-kernel (multiply + add) and the AVX2 one (FMA) agree within float32."""
    case = Case("RMSNormLinear", shape=(9, 200), widths=(40, 20), seed=5)
    model, feeds = case.model()
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    import subprocess
    import sys
    script = (
        "import numpy as np, onnxruntime as ort, otfuse, sys\n"
        "o = ort.SessionOptions(); o.register_custom_ops_library(otfuse.library_path())\n"
        "s = ort.InferenceSession(sys.argv[1], o, providers=['CPUExecutionProvider'])\n"
        "feeds = dict(np.load(sys.argv[2]))\n"
        "np.save(sys.argv[3], s.run(None, feeds)[0])\n")
    np.savez(tmp_path / "feeds.npz", **feeds)
    results = []
    for isa in ("baseline", "auto"):
        env = dict(__import__("os").environ, OTFUSE_CPU_ISA=isa)
        out = tmp_path / f"{isa}.npy"
        subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "feeds.npz"), str(out)], env=env,
                       check=True)
        results.append(np.load(out))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results[0], case.expected()[0], rtol=TOLERANCE[F32], atol=TOLERANCE[F32])


@pytest.mark.parametrize("overrides,message", [
    (dict(axis=-2), "attribute 'axis' must be -1"),
    (dict(out_features=None), "'out_features' is required"),
    (dict(transposed=[0]), "attribute 'transposed' has 1 entries"),
    (dict(has_bias=[1, 1, 2]), "entries must be 0 or 1"),
    (dict(has_bias=[0, 0, 0]), "expected 5 inputs"),
    (dict(out_features=[64, 32, 31]), "W3 has shape [64, 32] but must equal [K, out_features]"),
    (dict(epsilon=-1.0), "attribute 'epsilon' must be a finite number >= 0"),
])
def test_bad_nodes_are_refused(overrides, message):
    with pytest.raises(Exception, match=None) as info:
        Case("RMSNormLinear").run(**overrides)
    assert message in str(info.value)
    assert "RMSNormLinear (node 'fused_0')" in str(info.value)


def test_mismatched_k_at_run_time():
    case = Case("RMSNormLinear", const=False, shape=(2, 32), widths=(8,))
    case.weights[0] = np.zeros((16, 8), dtype=np.float32)
    with pytest.raises(Exception) as info:
        case.run()
    assert "W1 has shape [16, 8]" in str(info.value)


def test_weight_of_another_type_is_refused():
    case = Case("RMSNormLinear", shape=(2, 32), widths=(8,))
    case.weights[0] = case.weights[0].astype(np.float16)
    with pytest.raises(Exception) as info:
        case.run()
    assert "W1 has element type float16" in str(info.value)


def test_too_few_outputs():
    case = Case("AddRMSNormLinear", widths=(8, 8), shape=(2, 16))
    model, feeds = case.model()
    del model.graph.node[-1].output[-1]  # drop S: the Add* forms always output it
    del model.graph.output[-1]
    options = ort.SessionOptions()
    options.register_custom_ops_library(otfuse.library_path())
    with pytest.raises(Exception) as info:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert "expected 3 or 4 outputs, got 2" in str(info.value)
