"""The Ascend (CANN) norm kernels, end to end inside ONNX Runtime sessions, against otfuse's CPU
test double of the CANN runtime (tests/fake_cann) — there is no NPU and no CANN here.

How the Ascend code path runs in a CPU session: with the session config entry
``otfuse.ascend_ep.fake_mode=1`` (set before the library is registered), the library registers its
Ascend kernel classes under the CPU EP in place of the CPU norm kernels (TEST ONLY; every other op
keeps its CPU kernel). The Ascend kernels then load the "CANN runtime" from $OTFUSE_CANN_LIB_DIR —
the test double, which implements the documented acl/aclnn calls on host memory, checks their
arguments as the docs say CANN does, and logs every call. So everything but the NPU runs: runtime
discovery and dlopen, aclTensor construction, attribute translation, scratch outputs, the
two-phase call with a workspace from ORT's allocator, error reporting. The results are diffed
against the CPU kernels, op by op and on every exported fixture.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fake_cann import FakeCann, build, fake_mode_options
from fixtures import fixture_entries, fixture_path
from kernels.norm.test_cpu import (
    BF16,
    DTYPES,
    F16,
    F32,
    N_OUTPUTS,
    OPS,
    assert_close,
    build_model,
    op_inputs,
)

import otfuse
from otfuse.verify.diff import compare_arrays, tolerance_for
from otfuse.run.feeds import make_feeds
from otfuse.run.session import run

NODE = "fused_norm_0"  # the node name build_model gives
APIS = {"RMSNorm": "aclnnRmsNorm", "AddRMSNorm": "aclnnAddRmsNorm", "LayerNorm": "aclnnLayerNorm",
        "AddLayerNorm": "aclnnAddLayerNorm"}


def _session(model: onnx.ModelProto, library: str, ascend: bool) -> ort.InferenceSession:
    if ascend:
        options = fake_mode_options(library)
    else:
        options = ort.SessionOptions()
        options.register_custom_ops_library(library)
        options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _feeds(inputs) -> dict:
    return {(f"in{i}_f32" if a.dtype == BF16 else f"in{i}"): (a.astype(F32) if a.dtype == BF16 else a)
            for i, a in enumerate(inputs) if a is not None}


def run_op(library, op, inputs, attrs=None, omit_outputs=(), ascend=True) -> list[np.ndarray]:
    model = build_model(op, inputs, N_OUTPUTS[op], inputs[0].dtype, attrs or {}, omit_outputs)
    results = _session(model, library, ascend).run(None, _feeds(inputs))
    return [r.astype(BF16) if inputs[0].dtype == BF16 else r for r in results]


def check_against_cpu(library, op, inputs, attrs=None, omit_outputs=()):
    got = run_op(library, op, inputs, attrs, omit_outputs, ascend=True)
    want = run_op(library, op, inputs, attrs, omit_outputs, ascend=False)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w)
    if len(got) == 2:  # S: the same rounded sum on both paths, bit for bit
        np.testing.assert_array_equal(got[1].view(np.uint8), want[1].view(np.uint8))


def assert_one_clean_call(fake: FakeCann, op: str):
    """Phase one then phase two, once each, with the workspace phase one asked for, on ORT's
    allocator (no aclrtMalloc), and every aclTensor / aclIntArray released."""
    api = APIS[op]
    (phase1,) = fake.calls(api + "GetWorkspaceSize")
    (phase2,) = fake.calls(api)
    assert phase1["status"] == 0
    assert phase2["workspace_size"] == phase1["workspace_size"] > 0 and phase2["workspace"]
    assert not fake.calls("aclrtMalloc")
    assert len(fake.calls("aclCreateTensor")) == len(fake.calls("aclDestroyTensor")) > 0
    assert len(fake.calls("aclCreateIntArray")) == len(fake.calls("aclDestroyIntArray"))
    return phase1


# ----------------------------------------------------------------------------- numerics vs CPU

CASES = {"rows": ((2, 5, 64), -1), "rank1": ((33,), -1), "axis-2": ((3, 4, 6, 5), -2), "wide": ((3, 1000), -1)}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", OPS)
def test_ascend_kernels_match_cpu_kernels(library, fake, op, dtype, case):
    shape, axis = case
    rng = np.random.default_rng(zlib.crc32(f"{op}{dtype.name}{shape}".encode()))
    inputs = op_inputs(op, rng, shape, dtype, axis=axis)
    check_against_cpu(library, op, inputs, {"axis": axis})
    fake.clear()
    run_op(library, op, inputs, {"axis": axis})
    assert_one_clean_call(fake, op)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["RMSNorm", "LayerNorm", "AddLayerNorm"])
def test_float32_weights_with_half_inputs(library, fake, op, dtype):
    # aclnnRmsNorm / LayerNorm / AddLayerNorm list (fp16|bf16 x, fp32 gamma) among their dtype pairs
    inputs = op_inputs(op, np.random.default_rng(1), (6, 48), dtype, weight_dtype=F32)
    check_against_cpu(library, op, inputs)
    gamma = "weight" if op == "LayerNorm" else "gamma"
    assert fake.calls(APIS[op] + "GetWorkspaceSize")[0][gamma]["dtype"] == "float32"


@pytest.mark.parametrize("op", ["LayerNorm", "AddLayerNorm"])
def test_layer_norms_without_bias(library, fake, op):
    inputs = op_inputs(op, np.random.default_rng(2), (4, 40), F16, with_bias=False)
    check_against_cpu(library, op, inputs)


@pytest.mark.parametrize("op", ["AddRMSNorm", "AddLayerNorm"])
def test_residual_sum_output_left_out(library, fake, op):
    inputs = op_inputs(op, np.random.default_rng(3), (5, 32), BF16)
    check_against_cpu(library, op, inputs, omit_outputs=(1,))
    (phase1,) = fake.calls(APIS[op] + "GetWorkspaceSize")[-1:]
    assert phase1["xOut"] == {"shape": [5, 32], "dtype": "bfloat16"}  # scratch: always passed


def test_empty_input_makes_no_aclnn_call(library, fake):
    x = np.zeros((0, 16), F32)
    (y,) = run_op(library, "RMSNorm", [x, np.ones(16, F32)])
    assert y.shape == (0, 16)
    assert not fake.calls("aclnnRmsNormGetWorkspaceSize")


# ----------------------------------------------------------------------------- argument mapping


def test_rms_norm_arguments(library, fake):
    inputs = op_inputs("RMSNorm", np.random.default_rng(4), (2, 3, 4, 8), F16, axis=-2)
    run_op(library, "RMSNorm", inputs, {"axis": -2, "epsilon": 1e-5})
    call = assert_one_clean_call(fake, "RMSNorm")
    assert call["x"] == call["yOut"] == {"shape": [2, 3, 4, 8], "dtype": "float16"}
    assert call["gamma"] == {"shape": [4, 8], "dtype": "float16"}  # gamma rank = rank - axis
    assert call["rstdOut"] == {"shape": [2, 3, 1, 1], "dtype": "float32"}  # scratch
    assert call["epsilon"] == pytest.approx(float(np.float32(1e-5)), rel=0, abs=0)
    (created,) = [c for c in fake.calls("aclCreateTensor") if c["shape"] == [2, 3, 4, 8]][:1]
    assert created["strides"] == [96, 32, 8, 1] and created["format"] == 2 and created["offset"] == 0


def test_add_rms_norm_arguments(library, fake):
    inputs = op_inputs("AddRMSNorm", np.random.default_rng(5), (3, 16), F32)
    run_op(library, "AddRMSNorm", inputs)
    call = assert_one_clean_call(fake, "AddRMSNorm")
    assert call["x1"] == call["x2"] == call["yOut"] == call["xOut"] == {"shape": [3, 16], "dtype": "float32"}
    assert call["rstdOut"] == {"shape": [3, 1], "dtype": "float32"}
    assert call["epsilon"] == pytest.approx(1e-6)  # the default of the contract


def test_layer_norm_arguments(library, fake):
    inputs = op_inputs("LayerNorm", np.random.default_rng(6), (2, 5, 6), BF16, axis=1, with_bias=False)
    run_op(library, "LayerNorm", inputs, {"axis": 1})
    call = assert_one_clean_call(fake, "LayerNorm")
    assert call["normalizedShape"] == [5, 6]
    assert call["weight"] == {"shape": [5, 6], "dtype": "bfloat16"}
    assert call["bias"] is None and call["meanOut"] is None and call["rstdOut"] is None
    assert call["eps"] == pytest.approx(1e-5)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_add_layer_norm_arguments(library, fake, with_bias):
    inputs = op_inputs("AddLayerNorm", np.random.default_rng(7), (4, 24), F16, weight_dtype=F32, with_bias=with_bias)
    run_op(library, "AddLayerNorm", inputs)
    call = assert_one_clean_call(fake, "AddLayerNorm")
    assert call["gamma"] == call["beta"] == {"shape": [24], "dtype": "float32"}
    assert call["biasOptional"] is None and call["additionalOutput"] is True
    assert call["meanOut"] == call["rstdOut"] == {"shape": [4, 1], "dtype": "float32"}
    memsets = fake.calls("aclrtMemsetAsync")
    if with_bias:
        assert not memsets
    else:  # aclnnAddLayerNorm requires beta: a zeroed float32 row on the stream
        assert [(m["count"], m["value"]) for m in memsets] == [(24 * 4, 0)]


# ----------------------------------------------------------------------------- real exported models

NORM_FIXTURES = sorted(n for n, e in fixture_entries().items()
                       if e.get("expected", {}).get("rmsnorm") or e.get("expected", {}).get("layernorm"))


@pytest.mark.parametrize("name", NORM_FIXTURES)
def test_fixture_fused_norms_on_ascend_path_match_cpu(tmp_path, library, fake, name):
    out = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(fixture_path(name), out, only=["norm"])
    if not report.fusions:
        pytest.skip("no norm to fuse")
    fused = onnx.load(out)
    feeds = make_feeds(fused, dims={"batch": 2, "seq": 7, "past": 3}, seed=0)
    names = [o.name for o in fused.graph.output]
    cpu = run(_session(fused, library, ascend=False), feeds, names)
    fake.clear()
    ascend = run(_session(fused, library, ascend=True), feeds, names)
    for output in names:
        rtol, atol = tolerance_for(cpu[output].dtype)
        row = compare_arrays(output, cpu[output], ascend[output], rtol, atol)
        assert row.ok, row.to_dict()
    executed = sum(len(fake.calls(api)) for api in APIS.values())
    assert executed == sum(report.fusions.get(op, 0) for op in APIS) > 0
    assert len(fake.calls("aclCreateTensor")) == len(fake.calls("aclDestroyTensor"))


def test_other_families_keep_their_cpu_kernels_in_fake_mode(tmp_path, library, fake):
    out = tmp_path / "llama_fused.onnx"
    # norm_linear would absorb the norms into RMSNormLinear nodes: leave it out
    report = otfuse.fuse(fixture_path("llama"), out, only=["norm", "rope", "attention"])
    assert set(report.fusions) - set(APIS), report.fusions  # something besides the norms
    fused = onnx.load(out)
    feeds = make_feeds(fused, dims={"batch": 1, "seq": 5}, seed=1)
    names = [o.name for o in fused.graph.output]
    cpu = run(_session(fused, library, ascend=False), feeds, names)
    ascend = run(_session(fused, library, ascend=True), feeds, names)
    for output in names:
        rtol, atol = tolerance_for(cpu[output].dtype)
        assert compare_arrays(output, cpu[output], ascend[output], rtol, atol).ok
    assert fake.calls("aclnnRmsNorm") and fake.calls("aclnnAddRmsNorm")


def test_plain_sessions_never_touch_the_cann_runtime(library, fake):
    inputs = op_inputs("RMSNorm", np.random.default_rng(8), (2, 8), F32)
    run_op(library, "RMSNorm", inputs, ascend=False)
    assert fake.calls() == []  # the CANN-EP kernels are registered, but only a CANN session picks them


# ----------------------------------------------------------------------------- errors


def _model(op="RMSNorm", dtype=F32, shape=(2, 8)):
    inputs = op_inputs(op, np.random.default_rng(9), shape, dtype)
    return build_model(op, inputs, N_OUTPUTS[op], dtype, {}), inputs


def test_missing_runtime_fails_session_creation_naming_op_node_and_places(library, monkeypatch, tmp_path):
    monkeypatch.setenv("OTFUSE_CANN_LIB_DIR", str(tmp_path))
    model, _ = _model()
    with pytest.raises(Exception) as info:
        _session(model, library, ascend=True)
    message = str(info.value)
    assert f"RMSNorm (node '{NODE}')" in message
    assert "CANN runtime not found: no libascendcl.so in" in message and str(tmp_path) in message
    assert "set_env.sh" in message


def test_runtime_search_follows_ascend_home_path(library, monkeypatch, tmp_path, fake):
    # ASCEND_HOME_PATH/lib64 is where the CANN toolkit's set_env.sh points; no pin set
    home = tmp_path / "toolkit"
    home.mkdir()
    (home / "lib64").symlink_to(build(), target_is_directory=True)
    monkeypatch.delenv("OTFUSE_CANN_LIB_DIR")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(home))
    model, inputs = _model()
    _session(model, library, ascend=True).run(None, _feeds(inputs))
    assert fake.calls("aclnnRmsNorm")


def test_incomplete_runtime_is_reported(library, monkeypatch, tmp_path):
    (tmp_path / "libascendcl.so").symlink_to(build() / "libascendcl.so")
    monkeypatch.setenv("OTFUSE_CANN_LIB_DIR", str(tmp_path))
    model, _ = _model()
    with pytest.raises(Exception, match="is incomplete: it has libascendcl.so but no libnnopbase.so"):
        _session(model, library, ascend=True)


def test_fake_mode_refuses_a_runtime_that_is_not_the_test_double(library, monkeypatch):
    monkeypatch.setenv("OTFUSE_CANN_LIB_DIR", str(build().parent / "lib64_unmarked"))
    model, _ = _model()
    with pytest.raises(Exception, match="fake_mode is test-only.*holds a real CANN runtime"):
        _session(model, library, ascend=True)


def test_fake_mode_value_is_checked(library):
    options = ort.SessionOptions()
    options.add_session_config_entry("otfuse.ascend_ep.fake_mode", "yes")
    with pytest.raises(Exception, match="otfuse.ascend_ep.fake_mode must be 0 or 1, got 'yes'"):
        options.register_custom_ops_library(library)


@pytest.mark.parametrize("phase", ["GetWorkspaceSize", ""])
def test_aclnn_status_becomes_an_ort_error_with_the_cann_message(library, fake, phase):
    fake.fail(f"aclnnAddRmsNorm{phase}", 561002, "tiling failed for this shape (injected)")
    model, inputs = _model("AddRMSNorm")
    session = _session(model, library, ascend=True)
    with pytest.raises(Exception) as info:
        session.run(None, _feeds(inputs))
    message = str(info.value)
    assert (f"AddRMSNorm (node '{NODE}'): aclnnAddRmsNorm{phase} returned 561002 (ACLNN_ERR_INNER_TILING_ERROR): "
            "tiling failed for this shape (injected)") in message
    assert len(fake.calls("aclCreateTensor")) == len(fake.calls("aclDestroyTensor"))  # released on error too


def test_tensor_creation_failure_is_reported(library, fake):
    fake.fail("aclCreateTensor", 1, "no descriptor (injected)")
    model, inputs = _model("LayerNorm")
    with pytest.raises(Exception, match=r"LayerNorm \(node 'fused_norm_0'\): aclCreateTensor failed for X \[2, 8\]: "
                                        r"no descriptor \(injected\)"):
        _session(model, library, ascend=True).run(None, _feeds(inputs))


def test_add_rms_norm_refuses_float32_gamma_with_half_input(library, fake):
    # aclnnAddRmsNorm: "gamma ... The data type must be the same as that of x1"; the CPU kernel
    # accepts it (docs/ops.md), so the Ascend kernel says why it cannot
    inputs = op_inputs("AddRMSNorm", np.random.default_rng(10), (4, 16), F16, weight_dtype=F32)
    with pytest.raises(Exception, match="scale is float32 but A is float16; aclnnAddRmsNorm needs gamma of the "
                                        r"input's type \(store scale as float16, or run this node on CPU\)"):
        run_op(library, "AddRMSNorm", inputs)
    assert not fake.calls("aclnnAddRmsNormGetWorkspaceSize")  # refused before CANN


def test_layer_norm_refuses_mixed_weight_types(library, fake):
    inputs = op_inputs("LayerNorm", np.random.default_rng(11), (4, 24), F16)
    inputs[-1] = inputs[-1].astype(F32)  # fp16 scale, fp32 bias: fine on CPU, not for aclnnLayerNorm
    run_op(library, "LayerNorm", inputs, ascend=False)
    with pytest.raises(Exception, match="scale is float16 but bias is float32; aclnnLayerNorm needs both"):
        run_op(library, "LayerNorm", inputs)


def test_rank_above_eight_is_refused(library, fake):
    inputs = op_inputs("RMSNorm", np.random.default_rng(12), (1,) * 8 + (8,), F32)
    with pytest.raises(Exception, match=r"aclnnRmsNorm takes inputs of rank 1 to 8; X has rank 9"):
        run_op(library, "RMSNorm", inputs)


# Product lines other than Atlas A2/A3 (aclrtGetSocName), as the aclnn documents restrict them.
PRODUCT_CASES = {
    "310P-bf16": ("Ascend310P3", "RMSNorm", BF16, (2, 64), "bfloat16 is not supported on this product"),
    "310P-layernorm": ("Ascend310P3", "LayerNorm", F16, (2, 64), "this operator is not supported on this product"),
    "310P-short-row": ("Ascend310P3", "RMSNorm", F16, (2, 8),
                       "the last axis must be at least 32 bytes on this product, got 8 x float16"),
    "310P-f32-gamma": ("Ascend310P3", "AddLayerNorm", F16, (2, 64),
                       r"the weights must have the input's type \(float16\)"),
    "910-rmsnorm": ("Ascend910A", "AddRMSNorm", F32, (2, 64), "this operator is not supported on this product"),
    "310B-bf16": ("Ascend310B1", "LayerNorm", BF16, (2, 64), "bfloat16 is not supported on this product"),
}


@pytest.mark.parametrize("case", PRODUCT_CASES.values(), ids=PRODUCT_CASES.keys())
def test_product_limits_are_refused_with_the_product_named(library, fake, case):
    soc, op, dtype, shape, reason = case
    fake.soc(soc)
    weight = F32 if case is PRODUCT_CASES["310P-f32-gamma"] else None
    inputs = op_inputs(op, np.random.default_rng(13), shape, dtype, weight_dtype=weight)
    with pytest.raises(Exception, match=rf"{APIS[op]} on .* \({soc}\): {reason}"):
        run_op(library, op, inputs)
    assert not fake.calls(APIS[op] + "GetWorkspaceSize")


@pytest.mark.parametrize("soc, op, dtype", [("Ascend310P3", "RMSNorm", F16), ("Ascend310P3", "AddLayerNorm", F32),
                                            ("Ascend910A", "LayerNorm", F32), ("Ascend910_9391", "AddRMSNorm", BF16)])
def test_what_a_product_supports_runs(library, fake, soc, op, dtype):
    fake.soc(soc)
    check_against_cpu(library, op, op_inputs(op, np.random.default_rng(14), (3, 64), dtype))


def test_contract_checks_still_apply(library, fake):
    x = np.ones((2, 8), F32)
    with pytest.raises(Exception, match=r"scale has shape \[4\] but must equal X.shape\[axis:\] = \[8\]"):
        run_op(library, "RMSNorm", [x, np.ones(4, F32)])
