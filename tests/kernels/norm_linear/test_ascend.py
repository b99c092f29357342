"""The Ascend (CANN) kernels of the Norm + Linear family, end to end inside ONNX Runtime sessions,
against otfuse's CPU test double of the CANN runtime (tests/fake_cann) — no NPU, no CANN here.

As in tests/kernels/norm/test_ascend.py, the session config ``otfuse.ascend_ep.fake_mode=1`` makes the library
register its Ascend kernels under the CPU EP in place of the CPU kernels of the same op and type.
A node is the norm op's aclnn call (aclnnRmsNorm, aclnnAddRmsNorm, aclnnLayerNorm,
aclnnAddLayerNorm) writing Yn, then per projection aclnnMatmul, or aclnnAddmm with its bias; the
double implements them as documented (hicann/ops-nn matmul/mat_mul_v3/docs), checks their
arguments and logs every call. Each op is diffed against the CPU kernel and the numpy reference;
the log shows the mapping (transposed weights as strided views, biases, scalars). Also here: the
double's own matmul checks (through ctypes), the fused fixtures, ``otfuse diff --provider cann``
and ``verify_ops`` with a numpy runner.
"""

from __future__ import annotations

import ctypes
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_runner import cli_runner
from fake_cann import FakeCann, build, fake_mode_options
from fixtures import fixture_path
from kernels.norm_linear.test_cpu import BF16, F16, F32, KINDS, TOLERANCE, Case, _check

import otfuse
from otfuse.run import ascend as ascend_ep
from otfuse.run import session as otfuse_session
from otfuse.verify import reference
from otfuse.verify import ops_on_npu as verify
from otfuse.cli import cli
from otfuse.verify.diff import compare_arrays, tolerance_for
from otfuse.errors import OtfuseError
from otfuse.run.feeds import make_feeds
from otfuse.run.session import run

DTYPES = [F32, F16, BF16]
NORM_API = {"RMSNormLinear": "aclnnRmsNorm", "AddRMSNormLinear": "aclnnAddRmsNorm",
            "LayerNormLinear": "aclnnLayerNorm", "AddLayerNormLinear": "aclnnAddLayerNorm"}
MATMUL, ADDMM, COPY = "aclnnMatmul", "aclnnAddmm", "aclnnInplaceCopy"
PHASE_TWO = {*NORM_API.values(), MATMUL, ADDMM, COPY}
NODE = "fused_0"  # Case.model's node name
HAS_CANN_PROVIDER = ascend_ep.CANN_PROVIDER in ort.get_available_providers()


def session(model: onnx.ModelProto, library: str, ascend: bool) -> ort.InferenceSession:
    if ascend:
        options = fake_mode_options(library, threads=2)
    else:
        options = ort.SessionOptions()
        options.register_custom_ops_library(library)
        options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_case(case: Case, library: str, ascend: bool, **overrides) -> list[np.ndarray]:
    model, feeds = case.model(**overrides)
    return session(model, library, ascend).run(None, feeds)


def vs_cpu(case: Case, library: str, **overrides) -> list[np.ndarray]:
    """Ascend path vs the CPU kernel (and both vs the numpy reference); S bit for bit."""
    got = run_case(case, library, True, **overrides)
    want = run_case(case, library, False, **overrides)
    assert len(got) == len(want)
    tol = TOLERANCE[case.dtype]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol,
                                   err_msg=f"output {i}")
    if case.add:  # S: the same rounded sum on both paths
        s = len(case.widths)
        np.testing.assert_array_equal(got[s].view(np.uint8), want[s].view(np.uint8))
    _check(case, got)
    return got


def executed(fake: FakeCann) -> list[str]:
    """Phase-two calls, in order."""
    return [c["fn"] for c in fake.calls() if c["fn"] in PHASE_TWO]


def clean(fake: FakeCann) -> None:
    """Every phase one succeeded and was followed by phase two with the workspace asked for; every
    aclTensor / aclIntArray / aclScalar released; nothing from aclrtMalloc (ORT's allocator)."""
    phase_one = [c for c in fake.calls() if c["fn"].endswith("GetWorkspaceSize")]
    phase_two = [c for c in fake.calls() if c["fn"] in PHASE_TWO]
    assert len(phase_one) == len(phase_two) > 0
    for p1, p2 in zip(phase_one, phase_two):
        assert p1["fn"] == p2["fn"] + "GetWorkspaceSize" and p1["status"] == 0
        assert p2["workspace_size"] == p1["workspace_size"]
    for made, freed in (("aclCreateTensor", "aclDestroyTensor"), ("aclCreateIntArray", "aclDestroyIntArray"),
                        ("aclCreateScalar", "aclDestroyScalar")):
        assert len(fake.calls(made)) == len(fake.calls(freed))
    assert not fake.calls("aclrtMalloc")


# ----------------------------------------------------------------------------- each op vs CPU


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", list(KINDS))
def test_matches_cpu_kernel(library, fake, op, dtype):
    case = Case(op, dtype, shape=(2, 5, 64), widths=(64, 32, 32), bias=[1, 0, 1], seed=1)
    vs_cpu(case, library)
    fake.clear()
    run_case(case, library, True)
    assert executed(fake) == [NORM_API[op], ADDMM, MATMUL, ADDMM]
    clean(fake)
    norm = fake.calls(NORM_API[op] + "GetWorkspaceSize")[0]
    x = norm.get("x", norm.get("x1", norm.get("input")))
    assert x == {"shape": [10, 64], "dtype": dtype.name}  # X as [rows, K]
    for call in fake.calls(MATMUL + "GetWorkspaceSize"):
        assert call["cubeMathType"] == 0 and call["self"] == {"shape": [10, 64], "dtype": dtype.name}
        assert call["out"] == {"shape": [10, 32], "dtype": dtype.name}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_transposed_weights_are_strided_views(library, fake, dtype):
    case = Case("AddRMSNormLinear", dtype, shape=(3, 4, 48), widths=(40, 24, 8), transposed=[1, 0, 1],
                bias=[0, 1, 1], seed=2)
    vs_cpu(case, library)
    fake.clear()
    run_case(case, library, True)
    mat2 = [c["mat2"] for c in fake.calls() if c["fn"] in (MATMUL + "GetWorkspaceSize", ADDMM + "GetWorkspaceSize")]
    assert mat2 == [
        {"shape": [48, 40], "dtype": dtype.name, "strides": [1, 48], "offset": 0},  # W [40, 48] read transposed
        {"shape": [48, 24], "dtype": dtype.name},
        {"shape": [48, 8], "dtype": dtype.name, "strides": [1, 48], "offset": 0},
    ]
    assert not fake.calls(COPY)  # no copy of any weight
    clean(fake)


def test_biases_use_addmm_with_unit_scalars(library, fake):
    case = Case("LayerNormLinear", F16, shape=(6, 32), widths=(16, 8), bias=[1, 1], seed=3)
    vs_cpu(case, library)
    calls = fake.calls(ADDMM + "GetWorkspaceSize")
    assert len(calls) == 2  # one per projection (the CPU run makes no call)
    for call in calls:
        assert call["beta"] == call["alpha"] == {"value": 1.0, "dtype": "float32"}
        assert call["self"]["shape"] in ([16], [8]) and call["self"]["dtype"] == "float16"
        assert call["mat1"] == {"shape": [6, 32], "dtype": "float16"} and call["cubeMathType"] == 0


@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
def test_float32_projection_bias_is_cast_to_t(library, fake, dtype):
    case = Case("RMSNormLinear", dtype, shape=(4, 32), widths=(24, 16), bias=[1, 0], seed=4)
    case.biases[0] = case.biases[0].astype(np.float32)  # the contract allows T or float32
    vs_cpu(case, library)
    fake.clear()
    run_case(case, library, True)
    (copy,) = fake.calls(COPY + "GetWorkspaceSize")
    assert copy["selfRef"] == {"shape": [24], "dtype": dtype.name} and copy["src"] == {"shape": [24], "dtype": "float32"}
    (addmm,) = fake.calls(ADDMM + "GetWorkspaceSize")
    assert addmm["self"] == {"shape": [24], "dtype": dtype.name}
    clean(fake)


@pytest.mark.parametrize("op", list(KINDS))
def test_normalised_output_is_written_by_the_norm_call(library, fake, op):
    case = Case(op, F16, shape=(2, 3, 40), widths=(17, 5), transposed=[1, 0], keep=True, seed=5)
    got = vs_cpu(case, library)
    assert got[-1].shape == (2, 3, 40)  # Yn
    fake.clear()
    run_case(case, library, True)
    assert not [c for c in fake.calls("aclrtMemsetAsync") if c["count"] == 6 * 40 * 2]
    clean(fake)


@pytest.mark.parametrize("shape,widths", [
    ((1, 64), (1,)),  # one row, one column
    ((13, 70), (5, 33, 16, 3)),  # odd sizes, four projections
    ((1, 1, 1, 1, 1, 1, 1, 2, 2, 24), (7,)),  # rank 10: the calls see [rows, K]
    ((1, 1, 4096), (40,)),  # decode step, long rows
])
def test_shapes_and_several_projections(library, fake, shape, widths):
    case = Case("AddLayerNormLinear", F32, shape=shape, widths=widths, bias=[i % 2 for i in range(len(widths))],
                keep=True, seed=6)
    vs_cpu(case, library)
    assert len(fake.calls(MATMUL)) + len(fake.calls(ADDMM)) == len(widths)


@pytest.mark.parametrize("op", ["LayerNormLinear", "AddLayerNormLinear"])
def test_layer_norms_without_norm_bias(library, fake, op):
    case = Case(op, BF16, shape=(4, 32), widths=(8, 24), bias=[0, 0], norm_bias=False, seed=7)
    vs_cpu(case, library)


def test_weights_fed_at_run_time(library, fake):
    case = Case("RMSNormLinear", F16, shape=(3, 7, 40), widths=(17, 5), transposed=[1, 0], keep=True, const=False,
                seed=8)
    vs_cpu(case, library)


def test_empty_rows_make_no_aclnn_call(library, fake):
    case = Case("AddRMSNormLinear", F32, shape=(0, 5, 32), widths=(8,))
    got = run_case(case, library, True)
    assert got[0].shape == (0, 5, 8) and got[1].shape == (0, 5, 32)
    assert executed(fake) == []


def test_plain_sessions_never_touch_the_cann_runtime(library, fake):
    run_case(Case("RMSNormLinear", F32, shape=(2, 16), widths=(8,)), library, False)
    assert fake.calls() == []


# ----------------------------------------------------------------------------- fused fixtures

FIXTURES = ["llama", "qwen2", "bert", "gpt2", "phi", "llama_fp16"]


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_norm_linear_on_ascend_path_matches_cpu(tmp_path, library, fake, name):
    out = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(fixture_path(name), out, only=["norm", "norm_linear"])
    linear = {op: n for op, n in report.fusions.items() if op.endswith("Linear")}
    assert linear, report.fusions
    fused = onnx.load(out)
    feeds = make_feeds(fused, dims={"batch": 2, "seq": 7}, seed=0)
    names = [o.name for o in fused.graph.output]
    cpu = run(session(fused, library, ascend=False), feeds, names)
    fake.clear()
    ascend = run(session(fused, library, ascend=True), feeds, names)
    for output in names:
        rtol, atol = tolerance_for(cpu[output].dtype)
        row = compare_arrays(output, cpu[output], ascend[output], rtol, atol)
        assert row.ok, row.to_dict()
    nodes = [n for n in fused.graph.node if n.domain == "otfuse" and n.op_type.endswith("Linear")]
    projections = sum(len(next(a.ints for a in n.attribute if a.name == "out_features")) for n in nodes)
    assert len(fake.calls(MATMUL)) + len(fake.calls(ADDMM)) == projections
    norms = sum(len(fake.calls(api)) for api in NORM_API.values())
    assert norms == sum(report.fusions.values())  # every norm, fused with projections or alone
    assert len(fake.calls("aclCreateTensor")) == len(fake.calls("aclDestroyTensor"))
    assert len(fake.calls("aclCreateScalar")) == len(fake.calls("aclDestroyScalar"))


# ----------------------------------------------------------------------------- refusals and errors


@pytest.mark.parametrize("overrides,message", [
    ({"axis": -2}, "attribute 'axis' must be -1"),
    ({"out_features": [64, 32, 31]}, "W3 has shape [64, 32] but must equal [K, out_features] = [64, 31]"),
    ({"has_bias": [0, 0, 0]}, "expected 5 inputs"),
])
def test_contract_checks_still_apply(library, fake, overrides, message):
    with pytest.raises(Exception) as info:
        run_case(Case("RMSNormLinear"), library, True, **overrides)
    assert f"RMSNormLinear (node '{NODE}'): " in str(info.value) and message in str(info.value)


def test_add_rms_norm_linear_refuses_float32_scale_with_half_input(library, fake):
    case = Case("AddRMSNormLinear", F16, shape=(4, 16), widths=(8,))
    case.scale = case.scale.astype(np.float32)
    run_case(case, library, False)  # fine on CPU
    with pytest.raises(Exception, match=r"scale is float32 but A is float16; aclnnAddRmsNorm needs gamma of the "
                                        r"input's type \(store scale as float16, or run this node on CPU\)"):
        run_case(case, library, True)
    assert executed(fake) == []


def test_layer_norm_linear_refuses_mixed_norm_weight_types(library, fake):
    case = Case("LayerNormLinear", F16, shape=(4, 24), widths=(8,))
    case.norm_bias = case.norm_bias.astype(np.float32)
    with pytest.raises(Exception, match="scale is float16 but norm_bias is float32; aclnnLayerNorm needs both"):
        run_case(case, library, True)


PRODUCT_REFUSALS = {
    "310P-f32": ("Ascend310P3", "RMSNormLinear", F32,
                 r"aclnnMatmul/aclnnAddmm on Atlas inference products \(Ascend310P3\): float32 needs cubeMathType 0"),
    "310P-layernorm": ("Ascend310P3", "LayerNormLinear", F16,
                       r"aclnnLayerNorm on Atlas inference products \(Ascend310P3\): this operator is not supported"),
    "310P-bf16": ("Ascend310P3", "AddRMSNormLinear", BF16, r"aclnnAddRmsNorm on .*: bfloat16 is not supported"),
    "910-rmsnorm": ("Ascend910A", "RMSNormLinear", F16,
                    r"aclnnRmsNorm on Atlas training products \(Ascend910A\): this operator is not supported"),
    "910-f32": ("Ascend910A", "LayerNormLinear", F32,
                r"aclnnMatmul/aclnnAddmm on Atlas training products \(Ascend910A\): float32 needs cubeMathType 0"),
    "310B": ("Ascend310B1", "LayerNormLinear", F16,
             r"aclnnMatmul/aclnnAddmm on Atlas 200I/500 A2 \(Ascend310B1\): these operators are not supported"),
}


@pytest.mark.parametrize("case", PRODUCT_REFUSALS.values(), ids=PRODUCT_REFUSALS.keys())
def test_product_limits_are_refused_with_the_product_named(library, fake, case):
    soc, op, dtype, reason = case
    fake.soc(soc)
    with pytest.raises(Exception, match=reason + r".*\(run this node on CPU\)"):
        run_case(Case(op, dtype, shape=(3, 64), widths=(16,)), library, True)
    assert executed(fake) == []


@pytest.mark.parametrize("soc, op, dtype", [("Ascend310P3", "RMSNormLinear", F16),
                                            ("Ascend310P3", "AddLayerNormLinear", F16),
                                            ("Ascend910A", "LayerNormLinear", F16),
                                            ("Ascend910_9391", "AddRMSNormLinear", BF16)])
def test_what_a_product_supports_runs(library, fake, soc, op, dtype):
    fake.soc(soc)
    vs_cpu(Case(op, dtype, shape=(3, 64), widths=(16, 8), bias=[1, 0]), library)


@pytest.mark.parametrize("api", ["aclnnMatmulGetWorkspaceSize", "aclnnMatmul", "aclnnAddmmGetWorkspaceSize",
                                 "aclnnAddmm"])
def test_aclnn_status_becomes_an_ort_error_with_the_cann_message(library, fake, api):
    fake.fail(api, 161002, "bad mat2 (injected)")
    with pytest.raises(Exception) as info:
        run_case(Case("RMSNormLinear", F16, shape=(2, 32), widths=(8, 8), bias=[1, 0]), library, True)
    assert (f"RMSNormLinear (node '{NODE}'): {api} returned 161002 (ACLNN_ERR_PARAM_INVALID): "
            "bad mat2 (injected)") in str(info.value)
    for made, freed in (("aclCreateTensor", "aclDestroyTensor"), ("aclCreateScalar", "aclDestroyScalar")):
        assert len(fake.calls(made)) == len(fake.calls(freed))  # released on error too


def test_scalar_creation_failure_is_reported(library, fake):
    fake.fail("aclCreateScalar", 1, "no scalar (injected)")
    with pytest.raises(Exception, match=r"aclCreateScalar failed for beta: no scalar \(injected\)"):
        run_case(Case("LayerNormLinear", F32, shape=(2, 16), widths=(8,), bias=[1]), library, True)


def test_norm_failure_stops_before_the_projections(library, fake):
    fake.fail("aclnnAddLayerNorm", 561002, "tiling (injected)")
    with pytest.raises(Exception, match="aclnnAddLayerNorm returned 561002"):
        run_case(Case("AddLayerNormLinear", F32, shape=(2, 16), widths=(8,)), library, True)
    assert not fake.calls(MATMUL + "GetWorkspaceSize") and not fake.calls(ADDMM + "GetWorkspaceSize")


# ----------------------------------------------------------------------------- the double itself
# aclnnMatmul / aclnnAddmm of tests/fake_cann called directly (ctypes), so that what the kernels are
# tested against is itself checked against the documents: shapes, broadcasting, dtype deduction,
# product rules and status codes.

ACL = {F32: 0, F16: 1, BF16: 27}
NULLPTR, INVALID, FIND_KERNEL = 161001, 161002, 561003


class Double:
    def __init__(self, lib64):
        self.lib = ctypes.CDLL(str(lib64 / "libascendcl.so"))
        self.lib.aclCreateTensor.restype = ctypes.c_void_p
        self.lib.aclCreateScalar.restype = ctypes.c_void_p
        self.lib.aclGetRecentErrMsg.restype = ctypes.c_char_p
        self.keep = []

    def tensor(self, array, shape=None, strides=None):
        """An aclTensor over `array`'s memory: its own shape, or a view (shape, strides in elements)."""
        shape = list(array.shape if shape is None else shape)
        if strides is None:
            strides = [int(s // array.itemsize) for s in array.strides]
        i64 = ctypes.c_int64 * max(len(shape), 1)
        storage = (ctypes.c_int64 * 1)(array.size)
        self.keep.append(array)
        return ctypes.c_void_p(self.lib.aclCreateTensor(i64(*shape), len(shape), ACL[array.dtype], i64(*strides), 0, 2,
                                                        storage, 1, ctypes.c_void_p(array.ctypes.data)))

    def scalar(self, value):
        v = ctypes.c_float(value)
        self.keep.append(v)
        return ctypes.c_void_p(self.lib.aclCreateScalar(ctypes.byref(v), 0))

    def call(self, api, *args):
        """Both phases; (status, message) of the first that fails, else (0, "")."""
        size, executor = ctypes.c_uint64(0), ctypes.c_void_p()
        status = getattr(self.lib, api + "GetWorkspaceSize")(*args, ctypes.byref(size), ctypes.byref(executor))
        if status == 0:
            workspace = ctypes.create_string_buffer(max(size.value, 1))
            status = getattr(self.lib, api)(workspace, size, executor, None)
        message = self.lib.aclGetRecentErrMsg() if status else b""
        return status, (message or b"").decode()


@pytest.fixture
def double(fake) -> Double:
    return Double(build())


def _rand(shape, dtype=F32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("a_shape,b_shape,out_shape", [
    ((5, 7), (7, 3), (5, 3)),
    ((2, 1, 3, 4), (5, 4, 6), (2, 5, 3, 6)),  # batch broadcast
    ((4,), (4, 6), (6,)),  # 1-D self: (1, K), the padded M leaves the output
    ((3, 4), (4,), (3,)),  # 1-D mat2: (K, 1)
])
def test_double_matmul_computes_self_at_mat2(double, a_shape, b_shape, out_shape):
    a, b = _rand(a_shape, seed=1), _rand(b_shape, seed=2)
    out = np.zeros(out_shape, F32)
    status, message = double.call("aclnnMatmul", double.tensor(a), double.tensor(b), double.tensor(out),
                                  ctypes.c_int8(0))
    assert status == 0, message
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_double_matmul_reads_a_transposed_view(double):
    a, w = _rand((5, 8), F16, 1), _rand((3, 8), F16, 2)  # W stored [N, K]
    out = np.zeros((5, 3), F16)
    status, _ = double.call("aclnnMatmul", double.tensor(a), double.tensor(w, (8, 3), (1, 8)), double.tensor(out),
                            ctypes.c_int8(0))
    assert status == 0
    want = (a.astype(np.float32) @ w.astype(np.float32).T).astype(F16)
    np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_double_addmm_is_beta_self_plus_alpha_product(double):
    bias, a, b = _rand((6,), seed=3), _rand((4, 5), seed=4), _rand((5, 6), seed=5)
    out = np.zeros((4, 6), F32)
    status, message = double.call("aclnnAddmm", double.tensor(bias), double.tensor(a), double.tensor(b),
                                  double.scalar(0.5), double.scalar(2.0), double.tensor(out), ctypes.c_int8(0))
    assert status == 0, message
    np.testing.assert_allclose(out, 0.5 * bias + 2.0 * (a @ b), rtol=1e-5, atol=1e-5)


MATMUL_REFUSALS = {
    "bf16-with-f16": ("Ascend910B3", (BF16, F16, BF16), 0, {}, INVALID, "cannot be deduced"),
    "reduce-dims": ("Ascend910B3", (F32, F32, F32), 0, {"b_shape": (5, 3)}, INVALID, "the Reduce dims differ"),
    "out-shape": ("Ascend910B3", (F32, F32, F32), 0, {"out_shape": (4, 4)}, INVALID, "out shape [4,4] must be [4,3]"),
    "out-strided": ("Ascend910B3", (F32, F32, F32), 0, {"out_strides": (1, 4)}, INVALID, "out must be contiguous"),
    "rank-7": ("Ascend910B3", (F32, F32, F32), 0, {"a_shape": (1,) * 5 + (4, 6), "out_shape": (1,) * 5 + (4, 3)},
               INVALID, "1 to 6 dimensions"),
    "a2-bf16-fp16-mode": ("Ascend910B3", (BF16, BF16, BF16), 2, {}, INVALID, "USE_FP16"),
    "a2-hf32-needs-f32": ("Ascend910B3", (F16, F16, F16), 3, {}, INVALID, "USE_HF32"),
    "310p-f32-keep": ("Ascend310P3", (F32, F32, F32), 0, {}, INVALID, "cubeMathType 0 is not supported for FLOAT32"),
    "910-bf16": ("Ascend910A", (BF16, BF16, BF16), 0, {}, INVALID, "BFLOAT16 is not supported"),
    "310b": ("Ascend310B1", (F16, F16, F16), 0, {}, FIND_KERNEL, "not supported on Ascend310B1"),
    "mode-5": ("Ascend910B3", (F16, F16, F16), 5, {}, INVALID, "cubeMathType 5 is not 0-4"),
}


@pytest.mark.parametrize("case", MATMUL_REFUSALS.values(), ids=MATMUL_REFUSALS.keys())
def test_double_matmul_refuses_what_the_doc_excludes(double, fake, case):
    soc, (ta, tb, to), cube, shapes, status, reason = case
    fake.soc(soc)
    a = _rand(shapes.get("a_shape", (4, 6)), ta)
    b = _rand(shapes.get("b_shape", (6, 3)), tb)
    out = np.zeros(shapes.get("out_shape", (4, 3)), to)
    out_tensor = double.tensor(out, out.shape, shapes["out_strides"]) if "out_strides" in shapes else double.tensor(out)
    got, message = double.call("aclnnMatmul", double.tensor(a), double.tensor(b), out_tensor, ctypes.c_int8(cube))
    assert got == status and reason in message, (got, message)
    (logged,) = fake.calls("aclnnMatmulGetWorkspaceSize")
    assert logged["status"] == status and logged["cubeMathType"] == cube


def test_double_matmul_null_and_addmm_argument_checks(double, fake):
    a, b, out = _rand((4, 6)), _rand((6, 3)), np.zeros((4, 3), F32)
    assert double.call("aclnnMatmul", double.tensor(a), None, double.tensor(out), ctypes.c_int8(0))[0] == NULLPTR
    one = double.scalar(1.0)

    def args(bias, cube, beta=one):
        return (double.tensor(bias), double.tensor(a), double.tensor(b), beta, double.scalar(1.0),
                double.tensor(out), ctypes.c_int8(cube))

    status, message = double.call("aclnnAddmm", *args(_rand((2, 3)), 0))
    assert status == INVALID and "does not broadcast" in message
    h, hb, hout = _rand((4, 6), F16), _rand((6, 3), F16), np.zeros((4, 3), F16)
    status, message = double.call("aclnnAddmm", double.tensor(_rand((3,), F16)), double.tensor(h), double.tensor(hb),
                                  one, one, double.tensor(hout), ctypes.c_int8(4))
    assert status == INVALID and "self cannot be broadcast" in message  # USE_FP32_ADD with float16
    assert double.lib.aclDestroyScalar(one) == 0
    status, message = double.call("aclnnAddmm", *args(_rand((3,)), 0, beta=one))
    assert status == INVALID and "beta is not a live aclScalar" in message


# ----------------------------------------------------------------------------- otfuse diff --provider cann
# The fused model through otfuse.ascend_ep.create_session, the original on CPU. Here in the
# test-only fake mode ($OTFUSE_ASCEND_FAKE_MODE=1: the Ascend kernels on CPU against the double),
# and on the CPU fallback that a machine without onnxruntime-cann gets.


@pytest.fixture(scope="module")
def fused_llama(tmp_path_factory):
    out = tmp_path_factory.mktemp("llama") / "llama_fused.onnx"
    otfuse.fuse(fixture_path("llama"), out, only=["norm", "norm_linear", "rope", "attention"])
    return out


def test_diff_provider_cann_runs_the_ascend_kernels(library, fake, monkeypatch, fused_llama, tmp_path):
    monkeypatch.setenv(ascend_ep.FAKE_MODE_ENV, "1")
    json_path = tmp_path / "diff.json"
    result = cli_runner().invoke(cli, ["diff", str(fixture_path("llama")), str(fused_llama), "--provider", "cann",
                                      "--dims", "batch=2,seq=5", "--per-fusion", "--json", str(json_path)])
    assert result.exit_code == 0, result.output
    assert "fused model ran on: CPUExecutionProvider" in result.stdout and "PASS" in result.stdout
    assert result.stderr == ""  # fake mode: no fallback warning
    assert fake.calls("aclnnAddRmsNorm") and fake.calls(MATMUL)
    assert not fake.calls("aclnnFusedInferAttentionScoreV3")  # float32 attention stays on its CPU kernel
    assert '"fused_providers": [\n    "CPUExecutionProvider"\n  ]' in json_path.read_text()


def test_diff_api_takes_providers(library, fake, monkeypatch, fused_llama):
    monkeypatch.setenv(ascend_ep.FAKE_MODE_ENV, "1")
    result = otfuse.diff(fixture_path("llama"), fused_llama, dims={"batch": 1, "seq": 4}, providers="cann")
    assert result.ok and result.fused_providers == ["CPUExecutionProvider"]
    nodes = [n for n in onnx.load(fused_llama).graph.node if n.op_type.endswith("Linear")]
    projections = sum(len(next(a.ints for a in n.attribute if a.name == "out_features")) for n in nodes)
    assert len(fake.calls(MATMUL)) == projections  # llama's projections have no bias
    fake.clear()
    cpu = otfuse.diff(fixture_path("llama"), fused_llama, dims={"batch": 1, "seq": 4},
                      providers=["CPUExecutionProvider"])
    assert cpu.ok and not fake.calls(MATMUL)  # a plain provider list: the CPU kernels
    with pytest.raises(OtfuseError, match="providers must be 'cpu', 'cann' or a list"):
        otfuse.diff(fixture_path("llama"), fused_llama, providers="npu")


def test_diff_passes_the_device_to_create_session(fake, monkeypatch, fused_llama):
    seen = []
    real = ascend_ep.create_session

    def recording(path, **kwargs):
        seen.append(kwargs)
        return real(path, fake_mode=True, **kwargs)

    monkeypatch.setattr(ascend_ep, "create_session", recording)
    result = cli_runner().invoke(cli, ["diff", str(fixture_path("llama")), str(fused_llama), "--provider", "cann",
                                      "--device-id", "3", "--dims", "batch=1,seq=3"])
    assert result.exit_code == 0, result.output
    # otfuse diff also hands over the session options of its ORT level (both models run at one).
    assert [{k: v for k, v in kwargs.items() if k != "sess_options"} for kwargs in seen] == [{"device_id": 3}]
    assert fake.calls(MATMUL)


@pytest.mark.skipif(HAS_CANN_PROVIDER, reason="onnxruntime-cann is installed")
def test_diff_provider_cann_falls_back_to_cpu_with_the_warning(fake, fused_llama):
    result = cli_runner().invoke(cli, ["diff", str(fixture_path("llama")), str(fused_llama), "--provider", "cann",
                                      "--dims", "batch=1,seq=3", "--per-fusion"])
    assert result.exit_code == 0, result.output
    # one line, naming the user's file (not --per-fusion's temporary copy)
    assert result.stderr == (f"otfuse: warning: otfuse.ascend_ep: running {fused_llama} on CPU: "
                             "CANNExecutionProvider is not available: onnxruntime-cann is not installed\n")
    cpu = ", ".join(otfuse_session.cpu_providers(fused_llama))  # the plugin EP too where *NormLinear nodes are
    assert f"fused model ran on: {cpu}\n" in result.stdout and "PASS" in result.stdout
    assert fake.calls() == []  # the CPU kernels ran: nothing of the CANN runtime was touched
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert otfuse.diff(fixture_path("llama"), fused_llama, dims={"batch": 1, "seq": 3}, providers="cann").ok
    assert [str(w.message) for w in caught if w.category is RuntimeWarning] == [
        (f"otfuse.ascend_ep: running {fused_llama} on CPU: CANNExecutionProvider is not available: "
         "onnxruntime-cann is not installed")]


def test_diff_reports_a_failure_on_the_ascend_path(fake, monkeypatch, fused_llama):
    monkeypatch.setenv(ascend_ep.FAKE_MODE_ENV, "1")
    fake.fail("aclnnMatmul", 561002, "tiling (injected)")
    result = cli_runner().invoke(cli, ["diff", str(fixture_path("llama")), str(fused_llama), "--provider", "cann",
                                      "--dims", "batch=1,seq=3"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"otfuse: error: running {fused_llama} failed: ")
    assert "aclnnMatmul returned 561002 (ACLNN_ERR_INNER_TILING_ERROR): tiling (injected)" in result.stderr


# ----------------------------------------------------------------------------- verify-ops


def _numpy_runner(op, inputs, attrs):
    """What a device that follows the contract returns: Y_1..Y_n, [S], Yn (as the torch_npu runner)."""
    first, n, transposed, has_bias = verify._norm_linear_layout(op, attrs)
    weights = inputs[first:first + n]
    extra = iter(inputs[first + n:])
    biases = [next(extra) if flag else None for flag in has_bias]
    eps = attrs.get("epsilon", verify._DEFAULT_EPSILON[op])
    if op == "RMSNormLinear":
        ys, yn = reference.rms_norm_linear(inputs[0], inputs[1], weights, biases, transposed, eps)
        return ys + [yn]
    if op == "AddRMSNormLinear":
        ys, s, yn = reference.add_rms_norm_linear(*inputs[:3], weights, biases, transposed, eps)
        return ys + [s, yn]
    if op == "LayerNormLinear":
        ys, yn = reference.layer_norm_linear(*inputs[:3], weights, biases, transposed, eps)
        return ys + [yn]
    ys, s, yn = reference.add_layer_norm_linear(*inputs[:4], weights, biases, transposed, eps)
    return ys + [s, yn]


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "llama_fp16"])
def test_verify_ops_covers_norm_linear(tmp_path, name):
    out = tmp_path / f"{name}_fused.onnx"
    otfuse.fuse(fixture_path(name), out, only=["norm", "norm_linear"])
    checks = verify.verify_ops(out, dims={"batch": 2, "seq": 3}, runner=_numpy_runner)
    linear = [c for c in checks if c.case.op.endswith("Linear")]
    assert linear and all(c.ok for c in linear), [(c.case.op, c.error, [o.to_dict() for o in c.outputs])
                                                  for c in linear if not c.ok]
    for check in linear:
        n = len(check.case.attrs["out_features"])
        assert [o.name for o in check.outputs][:n] == [f"Y{i + 1}" for i in range(n)]
        assert len(check.outputs) == check.case.n_outputs
        weights = check.case.inputs[verify._norm_linear_layout(check.case.op, check.case.attrs)[0]]
        assert weights.std() < 0.1  # random weights of the model's shape, not the model's


def test_verify_ops_reports_a_wrong_projection(tmp_path):
    out = tmp_path / "llama_fused.onnx"
    otfuse.fuse(fixture_path("llama"), out, only=["norm", "norm_linear"])

    def off_by_ten_percent(op, inputs, attrs):
        results = _numpy_runner(op, inputs, attrs)
        return [(results[0].astype(np.float32) * 1.1).astype(results[0].dtype)] + results[1:]

    checks = verify.verify_ops(out, dims={"batch": 1, "seq": 3}, runner=off_by_ten_percent)
    linear = [c for c in checks if c.case.op.endswith("Linear")]
    assert linear
    for check in linear:
        assert [o.ok for o in check.outputs] == [False] + [True] * (len(check.outputs) - 1)
