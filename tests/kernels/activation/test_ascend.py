"""The Ascend (CANN) activation kernels inside ONNX Runtime sessions, against otfuse's CPU test
double of the CANN runtime (tests/fake_cann; no NPU here): each op against the CPU kernel and the
exact formula, the aclnn calls and arguments from the call log (which call for which form, the
2-D views, strided halves, beta = alpha), the product rules, empty tensors, injected failures."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.ascend_sessions import close, one_clean_call, seeded, session
from kernels.norm.test_cpu import BF16, F16, F32, build_model
from otfuse.verify import reference

DTYPES = [F32, F16, BF16]
TOL = {F32: 1e-5, F16: 2e-3, BF16: 1.6e-2}  # rtol = atol against the exact formula


def run(library, op, inputs, attrs=None, ascend=True) -> np.ndarray:
    dtype = inputs[0].dtype
    model = build_model(op, inputs, 1, dtype, attrs or {})
    feeds = {(f"in{i}_f32" if a.dtype == BF16 else f"in{i}"): (a.astype(F32) if a.dtype == BF16 else a)
             for i, a in enumerate(inputs)}
    (y,) = session(model, library, ascend).run(None, feeds)
    return y.astype(BF16) if dtype == BF16 else y


def exact(op, inputs, attrs) -> np.ndarray:
    args = [a.astype(np.float32) for a in inputs]
    if op == "Gelu":
        return reference.gelu_exact(args[0], attrs.get("approximate", "none"))
    if op == "QuickGelu":
        return reference.quick_gelu_exact(args[0], attrs.get("alpha", 1.702))
    if op == "SiLU":
        return reference.silu_exact(args[0])
    b = args[1] if len(args) > 1 else None
    if op == "SwiGLU":
        return reference.swiglu_exact(args[0], b, attrs.get("gate_half", 0))
    return reference.geglu_exact(args[0], b, attrs.get("gate_half", 0), attrs.get("approximate", "none"))


def check(library, op, inputs, attrs=None) -> np.ndarray:
    attrs = attrs or {}
    got = run(library, op, inputs, attrs)
    want = run(library, op, inputs, attrs, ascend=False)
    close(got, want)
    tol = TOL[got.dtype]
    np.testing.assert_allclose(got.astype(np.float64), exact(op, inputs, attrs), rtol=tol, atol=tol)
    return got


def data(rng, shape, dtype, scale=3.0):
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)


CASES = {  # name -> (op, attrs, input shapes, the aclnn calls made, in order)
    "gelu": ("Gelu", {}, [(3, 5, 7)], ["aclnnGeluV2"]),
    "gelu_tanh": ("Gelu", {"approximate": "tanh"}, [(4, 33)], ["aclnnGeluV2"]),
    "quick_gelu": ("QuickGelu", {"alpha": 1.702}, [(2, 40)], ["aclnnSwish"]),
    "silu": ("SiLU", {}, [(6, 16)], ["aclnnSilu"]),
    "swiglu_split_gate_first": ("SwiGLU", {}, [(3, 4, 64)], ["aclnnSwiGlu"]),
    "swiglu_split_gate_second": ("SwiGLU", {"gate_half": 1}, [(3, 64)], ["aclnnSilu", "aclnnInplaceMul"]),
    "swiglu_two_inputs": ("SwiGLU", {}, [(2, 3, 24), (2, 3, 24)], ["aclnnSilu", "aclnnInplaceMul"]),
    "geglu_split_gate_second": ("GeGLU", {"gate_half": 1}, [(5, 32)], ["aclnnGeGlu"]),
    "geglu_split_gate_first": ("GeGLU", {"approximate": "tanh"}, [(5, 32)], ["aclnnGeluV2", "aclnnInplaceMul"]),
    "geglu_two_inputs": ("GeGLU", {"approximate": "tanh"}, [(4, 48), (4, 48)], ["aclnnGeluV2", "aclnnInplaceMul"]),
}


def calls_made(fake) -> list[str]:
    return [c["fn"] for c in fake.calls() if c["fn"].startswith("aclnn") and c["fn"].endswith("GetWorkspaceSize")]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", CASES)
def test_matches_cpu_and_formula(library, fake, name, dtype):
    op, attrs, shapes, apis = CASES[name]
    rng = seeded("ascend", name, dtype.name)
    check(library, op, [data(rng, s, dtype) for s in shapes], attrs)
    assert calls_made(fake) == [api + "GetWorkspaceSize" for api in apis]
    for api in set(apis):
        one_clean_call(fake, api, apis.count(api))


def test_views_and_arguments(library, fake):
    rng = seeded("views")
    x = data(rng, (2, 3, 5), F32)
    check(library, "Gelu", [x], {"approximate": "tanh"})
    (gelu,) = fake.calls("aclnnGeluV2GetWorkspaceSize")
    assert gelu["approximate"] == 1 and gelu["x"]["shape"] == [6, 5] and gelu["y"]["shape"] == [6, 5]
    fake.clear()
    check(library, "QuickGelu", [x], {"alpha": -0.5})
    (swish,) = fake.calls("aclnnSwishGetWorkspaceSize")
    assert swish["betaOptional"] == {"value": -0.5, "dtype": "float32"}
    fake.clear()
    check(library, "SwiGLU", [data(rng, (4, 2 * 7), F32)], {"gate_half": 1})
    (silu,) = fake.calls("aclnnSiluGetWorkspaceSize")
    (mul,) = fake.calls("aclnnInplaceMulGetWorkspaceSize")
    assert silu["self"] == {"shape": [4, 7], "dtype": "float32", "strides": [14, 1], "offset": 7}
    assert mul["other"] == {"shape": [4, 7], "dtype": "float32", "strides": [14, 1], "offset": 0}
    assert mul["selfRef"] == {"shape": [4, 7], "dtype": "float32"}
    fake.clear()
    check(library, "SwiGLU", [data(rng, (4, 2 * 8), F16)])
    (swiglu,) = fake.calls("aclnnSwiGluGetWorkspaceSize")
    assert swiglu["dim"] == -1 and swiglu["x"]["shape"] == [4, 16] and swiglu["out"]["shape"] == [4, 8]
    fake.clear()
    check(library, "GeGLU", [data(rng, (3, 2 * 9), BF16)], {"gate_half": 1, "approximate": "tanh"})
    (geglu,) = fake.calls("aclnnGeGluGetWorkspaceSize")
    assert geglu["approximate"] == 1 and geglu["outGelu"]["shape"] == [3, 9]


@pytest.mark.parametrize("shape", [(), (1, 1, 1, 1, 1, 1, 1, 1, 2, 3)], ids=["rank0", "rank10"])
def test_any_rank_runs_as_a_2d_view(library, fake, shape):
    x = np.full(shape, -0.75, np.float32)
    check(library, "SiLU", [x])
    (silu,) = fake.calls("aclnnSiluGetWorkspaceSize")
    assert len(silu["self"]["shape"]) == 2


def test_empty_tensors_make_no_call(library, fake):
    y = run(library, "GeGLU", [np.zeros((0, 8), np.float32)])
    assert y.shape == (0, 4)
    assert calls_made(fake) == []


def test_atlas_inference_products(library, fake):
    fake.soc("Ascend310P3")
    rng = seeded("310p")
    check(library, "SwiGLU", [data(rng, (3, 2 * 8), F16)])  # no aclnnSwiGlu there: two calls
    assert calls_made(fake) == ["aclnnSiluGetWorkspaceSize", "aclnnInplaceMulGetWorkspaceSize"]
    fake.clear()
    check(library, "GeGLU", [data(rng, (3, 2 * 8), F16)], {"gate_half": 1})
    assert calls_made(fake) == ["aclnnGeGluGetWorkspaceSize"]
    with pytest.raises(Exception, match="takes float16 or float32, not bfloat16"):
        run(library, "Gelu", [data(rng, (4, 4), BF16)])


def test_atlas_training_products_have_no_geglu_call(library, fake):
    fake.soc("Ascend910A")
    rng = seeded("910a")
    check(library, "GeGLU", [data(rng, (2, 2 * 16), F32)], {"gate_half": 1})
    assert calls_made(fake) == ["aclnnGeluV2GetWorkspaceSize", "aclnnInplaceMulGetWorkspaceSize"]


def test_atlas_200i_500_a2_is_refused(library, fake):
    fake.soc("Ascend310B1")
    with pytest.raises(Exception, match="aclnnSilu is not supported on Atlas 200I/500 A2"):
        run(library, "SwiGLU", [np.ones((2, 8), np.float32)])
    assert calls_made(fake) == []


def test_cann_failure_names_the_call(library, fake):
    fake.fail("aclnnGeluV2", 561103, "device says no")
    with pytest.raises(Exception, match=r"aclnnGeluV2.*561103|561103.*aclnnGeluV2"):
        run(library, "Gelu", [np.ones((2, 3), np.float32)])


def _numpy_runner(op, inputs, attrs):
    """verify_ops' runner as the exact formulas (what torch_npu's counterparts compute)."""
    return [exact(op, [a for a in inputs if a is not None], attrs).astype(inputs[0].dtype)]


@pytest.mark.parametrize("name, op", [("llama", "SwiGLU"), ("gpt2", "Gelu"), ("gemma2", "GeGLU")])
def test_verify_ops_covers_the_activations(tmp_path, name, op):
    import otfuse
    from fixtures import fixture_path
    from otfuse.verify import ops_on_npu as verify

    out = tmp_path / f"{name}_fused.onnx"
    otfuse.fuse(fixture_path(name), out, only=["activation"])
    checks = verify.verify_ops(out, dims={"batch": 2, "seq": 3}, runner=_numpy_runner)
    assert {c.case.op for c in checks} == {op}
    for check in checks:
        assert check.ok, (check.case.op, check.error, [o.to_dict() for o in check.outputs])


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_squared_has_no_ascend_kernel_and_runs_on_cpu(library, fake, dtype):
    # No aclnn square is documented: no Ascend kernel is registered, so the fake-mode session keeps
    # the CPU kernel (as ORT places the node on the CPU EP beside the CANN EP) and makes no call.
    x = data(seeded("relu2"), (3, 17), dtype)
    got = run(library, "ReluSquared", [x])
    np.testing.assert_array_equal(got, reference.relu_squared(x))
    assert calls_made(fake) == []
