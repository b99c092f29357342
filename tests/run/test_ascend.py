"""otfuse.ascend_ep on a machine without NPU, CANN or onnxruntime-cann: runtime discovery (and
that the Python and C++ searches agree), backends(), create_session's CPU fallback and the
provider options it would pass, and ``otfuse info`` / ``otfuse verify-ops``."""

from __future__ import annotations

import importlib.util
import warnings
from typing import ClassVar

import numpy as np
import pytest
from cli_runner import cli_runner
from fake_cann import build, fake_mode_options
from fixtures import fixture_path
from kernels.norm.test_cpu import build_model

import otfuse
import otfuse.ascend_ep
import otfuse.run.session
from otfuse.cli import cli
from otfuse.errors import OtfuseError
from otfuse.run import ascend as ascend_ep
from otfuse.run.cann_runtime import DEFAULT_DIRS, find_cann_runtime
from otfuse.run.feeds import make_feeds
from otfuse.verify import ops_on_npu as verify
from otfuse.verify import reference

HAS_CANN_PROVIDER = ascend_ep.CANN_PROVIDER in __import__("onnxruntime").get_available_providers()
HAS_TORCH_NPU = importlib.util.find_spec("torch_npu") is not None


def _runtime_dir(tmp_path, name):
    """A directory that looks like a CANN lib64 (the test double under the real names)."""
    d = tmp_path / name
    d.mkdir()
    for lib in ("libascendcl.so", "libnnopbase.so", "libopapi.so"):
        (d / lib).symlink_to(build() / lib)
    return d


# ----------------------------------------------------------------------------- discovery


def test_the_public_name_is_an_alias_of_run_ascend():
    """README documents ``otfuse.ascend_ep.create_session``: the same objects as otfuse.run.ascend."""
    for name in [*ascend_ep.__all__, "FAKE_MODE_KEY", "FAKE_MODE_ENV", "FP32_ATTENTION_KEY", "FP32_ATTENTION"]:
        assert getattr(otfuse.ascend_ep, name) is getattr(ascend_ep, name), name
    assert otfuse.ascend_ep.FAKE_MODE_KEY == "otfuse.ascend_ep.fake_mode"  # the key the library reads


def test_search_order(tmp_path):
    home, toolkit, ld = (tmp_path / n for n in ("home", "toolkit", "ld"))
    for d in (home, toolkit):
        d.mkdir()
    ld_dir = _runtime_dir(tmp_path, "ld")
    env = {"ASCEND_HOME_PATH": str(home), "ASCEND_TOOLKIT_HOME": str(toolkit), "LD_LIBRARY_PATH": f"/nowhere:{ld}"}
    found = find_cann_runtime(env)
    assert found.found and found.directory == ld_dir and found.origin == "$LD_LIBRARY_PATH"
    assert found.searched[:3] == (f"{home}/lib64 ($ASCEND_HOME_PATH/lib64)",
                                  f"{toolkit}/lib64 ($ASCEND_TOOLKIT_HOME/lib64)", "/nowhere ($LD_LIBRARY_PATH)")
    (toolkit / "lib64").symlink_to(ld_dir, target_is_directory=True)
    assert find_cann_runtime(env).origin == "$ASCEND_TOOLKIT_HOME/lib64"  # earlier in the order
    pinned = find_cann_runtime({**env, "OTFUSE_CANN_LIB_DIR": str(home)})  # the pin is the only place
    assert not pinned.found and pinned.searched == (f"{home} ($OTFUSE_CANN_LIB_DIR)",)


def test_not_found_and_incomplete(tmp_path):
    missing = find_cann_runtime({"OTFUSE_CANN_LIB_DIR": str(tmp_path)})
    assert not missing.found and missing.describe() == f"not found (looked in {tmp_path} ($OTFUSE_CANN_LIB_DIR))"
    (tmp_path / "libascendcl.so").symlink_to(build() / "libascendcl.so")
    partial = find_cann_runtime({"OTFUSE_CANN_LIB_DIR": str(tmp_path)})
    assert not partial.found and "has libascendcl.so but no libnnopbase.so" in partial.describe()


def test_test_double_is_recognised_by_its_marker_symbol():
    fake = find_cann_runtime({"OTFUSE_CANN_LIB_DIR": str(build())})
    assert fake.found and fake.is_test_double and "test double, not CANN" in fake.describe()
    unmarked = find_cann_runtime({"OTFUSE_CANN_LIB_DIR": str(build().parent / "lib64_unmarked")})
    assert unmarked.found and not unmarked.is_test_double


def test_python_and_kernel_search_the_same_places(tmp_path, monkeypatch):
    env = {"ASCEND_HOME_PATH": str(tmp_path / "a"), "ASCEND_TOOLKIT_HOME": str(tmp_path / "b"),
           "LD_LIBRARY_PATH": f"{tmp_path / 'c'}:{tmp_path / 'd'}"}
    if find_cann_runtime(env).found:
        pytest.skip("a CANN runtime is installed in a default location")
    monkeypatch.delenv("OTFUSE_CANN_LIB_DIR", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    searched = ", ".join(find_cann_runtime(env).searched)
    assert searched.endswith(", ".join(f"{d} (default location)" for d in DEFAULT_DIRS))
    model = build_model("RMSNorm", [np.ones((2, 4), np.float32), np.ones(4, np.float32)], 1, np.dtype(np.float32), {})
    import onnxruntime as ort

    with pytest.raises(Exception) as info:
        ort.InferenceSession(model.SerializeToString(), fake_mode_options(otfuse.library_path()),
                             providers=["CPUExecutionProvider"])
    assert f"no libascendcl.so in {searched}." in str(info.value)


# ----------------------------------------------------------------------------- backends


def test_backends_report(monkeypatch):
    monkeypatch.setenv("OTFUSE_CANN_LIB_DIR", str(build()))
    cpu, cann, ort_cann = ascend_ep.backends()
    assert (cpu.name, cpu.available) == ("CPU kernels", True) and cpu.detail == otfuse.library_path()
    assert cann.name == "CANN runtime" and not cann.available and "test double" in cann.detail
    assert ort_cann.name == "onnxruntime-cann" and ort_cann.available == HAS_CANN_PROVIDER
    if not HAS_CANN_PROVIDER:
        assert "pip install onnxruntime-cann" in ort_cann.detail


def test_info_prints_the_backends(monkeypatch, tmp_path):
    monkeypatch.setenv("OTFUSE_CANN_LIB_DIR", str(tmp_path))
    result = cli_runner().invoke(cli, ["info"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    i = lines.index("backends:")
    assert lines[i + 1].split()[:3] == ["CPU", "kernels", "yes"]
    assert lines[i + 2].split()[:3] == ["CANN", "runtime", "no"] and f"looked in {tmp_path}" in lines[i + 2]
    assert lines[i + 3].split()[0] == "onnxruntime-cann"


# ----------------------------------------------------------------------------- create_session


@pytest.fixture(scope="module")
def fused_llama(tmp_path_factory):
    out = tmp_path_factory.mktemp("llama") / "llama_fused.onnx"
    otfuse.fuse(fixture_path("llama"), out, only=["norm"])
    return out


@pytest.mark.skipif(HAS_CANN_PROVIDER, reason="onnxruntime-cann is installed")
def test_create_session_falls_back_to_cpu_with_one_warning(fused_llama):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = ascend_ep.create_session(fused_llama, device_id=0)
    assert [str(w.message) for w in caught if w.category is RuntimeWarning] == [
        (f"otfuse.ascend_ep: running {fused_llama} on CPU: CANNExecutionProvider is not available: "
         "onnxruntime-cann is not installed")]
    assert session.get_providers() == otfuse.run.session.cpu_providers(fused_llama)  # the plugin EP in front for *NormLinear nodes
    feeds = make_feeds(fused_llama, dims={"batch": 1, "seq": 3})
    logits = session.run(None, feeds)[0]
    expected = otfuse.InferenceSession(str(fused_llama)).run(None, feeds)[0]
    np.testing.assert_array_equal(logits, expected)


def test_create_session_without_fallback_raises(fused_llama, monkeypatch):
    monkeypatch.setattr(ascend_ep, "cann_unavailable_reason", lambda: "no NPU here (test)")
    with pytest.raises(OtfuseError, match="cannot run .* on the NPU: no NPU here"):
        ascend_ep.create_session(fused_llama, fallback=False)


class _Recorder:
    """Stands in for otfuse.run.session.InferenceSession: records the providers it was given."""

    calls: ClassVar[list] = []
    fail_cann: ClassVar[str] = ""

    def __init__(self, path, sess_options=None, providers=None):
        _Recorder.calls.append(providers)
        if self.fail_cann and providers[0][0] == ascend_ep.CANN_PROVIDER:
            raise RuntimeError(self.fail_cann)


@pytest.fixture
def recorder(monkeypatch):
    _Recorder.calls = []
    _Recorder.fail_cann = ""
    monkeypatch.setattr(otfuse.run.session, "InferenceSession", _Recorder)
    monkeypatch.setattr(ascend_ep, "cann_unavailable_reason", lambda: "")  # as on an Ascend machine
    return _Recorder


def test_create_session_passes_the_cann_provider_options(recorder):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ascend_ep.create_session("m.onnx", device_id=1, npu_mem_limit=2 << 30, arena_extend_strategy="kSameAsRequested",
                                 precision_mode="allow_fp32_to_fp16", op_select_impl_mode="high_precision")
    assert recorder.calls == [[(ascend_ep.CANN_PROVIDER, {
        "device_id": "1", "enable_cann_graph": "0", "npu_mem_limit": str(2 << 30),
        "arena_extend_strategy": "kSameAsRequested", "precision_mode": "allow_fp32_to_fp16",
        "op_select_impl_mode": "high_precision"}), "CPUExecutionProvider"]]


def test_failed_cann_session_falls_back_with_the_reason(recorder):
    recorder.fail_cann = "aclrtSetDevice failed (no NPU)"
    with pytest.warns(RuntimeWarning, match=r"creating a CANNExecutionProvider session failed: aclrtSetDevice failed"):
        ascend_ep.create_session("m.onnx", enable_cann_graph=True)
    assert recorder.calls[0][0][1]["enable_cann_graph"] == "1"
    assert recorder.calls[1] == ["CPUExecutionProvider"]


def test_bad_arena_strategy():
    with pytest.raises(OtfuseError, match="arena_extend_strategy must be one of kNextPowerOfTwo, kSameAsRequested"):
        ascend_ep.provider_options(arena_extend_strategy="grow")


# ----------------------------------------------------------------------------- verify-ops


@pytest.mark.skipif(HAS_TORCH_NPU, reason="torch_npu is installed")
def test_verify_ops_without_torch_npu_is_skipped(fused_llama):
    result = cli_runner().invoke(cli, ["verify-ops", "--device", "npu", str(fused_llama)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("skipped: torch_npu not installed")


def _reference_runner(scale=1.0):
    def runner(op, inputs, attrs):
        args = [a for a in inputs if a is not None]
        if op == "RMSNorm":
            outs = [reference.rms_norm(*args, **attrs)]
        elif op == "AddRMSNorm":
            outs = list(reference.add_rms_norm(*args, **attrs))
        elif op == "LayerNorm":
            outs = [reference.layer_norm(*args, **attrs)]
        else:
            outs = list(reference.add_layer_norm(*args, **attrs))
        return [(o.astype(np.float32) * scale).astype(o.dtype) for o in outs]
    return runner


def test_verify_ops_cases_follow_the_model(fused_llama):
    cases = verify.collect_cases(fused_llama, dims={"batch": 2, "seq": 3})
    assert sorted((c.op, len(c.nodes)) for c in cases) == [("AddRMSNorm", 4), ("RMSNorm", 1)]
    add = next(c for c in cases if c.op == "AddRMSNorm")
    assert add.inputs[0].shape == add.inputs[1].shape == (2, 3, add.inputs[2].shape[0])


@pytest.mark.parametrize("name", ["llama_fp16", "bert"])
def test_verify_ops_with_a_device_that_agrees(tmp_path, monkeypatch, name):
    out = tmp_path / f"{name}_fused.onnx"
    otfuse.fuse(fixture_path(name), out, only=["norm"])
    monkeypatch.setattr(verify, "torch_npu_runner", lambda device_id: _reference_runner())
    result = cli_runner().invoke(cli, ["verify-ops", "--device", "npu", str(out), "--dims", "batch=2,seq=5"])
    assert result.exit_code == 0, result.output
    assert "PASS: " in result.stdout and "FAIL" not in result.stdout


def test_verify_ops_reports_a_mismatch_and_a_device_error(fused_llama, monkeypatch):
    wrong = _reference_runner(scale=1.1)

    def runner(op, inputs, attrs):
        if op == "RMSNorm":
            raise RuntimeError("aclnnRmsNorm returned 561103")
        return wrong(op, inputs, attrs)

    checks = verify.verify_ops(fused_llama, runner=runner)
    by_op = {c.case.op: c for c in checks}
    assert by_op["RMSNorm"].error == "RuntimeError: aclnnRmsNorm returned 561103" and not by_op["RMSNorm"].outputs
    assert [(o.name, o.ok) for o in by_op["AddRMSNorm"].outputs] == [("Y", False), ("S", False)]
    monkeypatch.setattr(verify, "torch_npu_runner", lambda device_id: runner)
    result = cli_runner().invoke(cli, ["verify-ops", "--device", "npu", str(fused_llama)])
    assert result.exit_code == 1, result.output
    assert "ERROR" in result.stdout and "FAIL: 0/2 distinct op(s) match" in result.stdout


def test_verify_ops_needs_fused_nodes(monkeypatch):
    monkeypatch.setattr(verify, "torch_npu_runner", lambda device_id: _reference_runner())
    result = cli_runner().invoke(cli, ["verify-ops", "--device", "npu", str(fixture_path("llama"))])
    assert result.exit_code == 2
    assert "no fused norm, norm + linear, rotary, attention or activation nodes to verify" in result.stderr


def test_verify_ops_npu_runner_refuses_softcap_as_the_kernel_does():
    """The Ascend kernel refuses softcap > 0 (FIA has none); the torch_npu runner must report the
    same refusal, not a mismatch from ignoring the cap (checked before torch is touched)."""
    q = np.zeros((1, 1, 2, 4), np.float32)
    with pytest.raises(ValueError, match="soft-capping"):
        verify._attention_on_npu(None, None, q, q, q, None, None, None, None, {"num_heads": 1, "softcap": 5.0})
