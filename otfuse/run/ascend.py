"""Run fused models on Ascend NPUs: ONNX Runtime's CANN execution provider + otfuse's Ascend kernels.

``create_session`` opens a model with ``CANNExecutionProvider`` (then CPU) and the otfuse custom-op
library, whose Ascend kernels ORT picks for the nodes the CANN EP claims (each norm op is one aclnn
call; docs/ops.md). Where onnxruntime-cann, the CANN toolkit or an NPU is missing it falls back to
the CPU kernels with one warning saying why. ``backends`` reports what this machine has.

What is verified where: the CPU kernels by the test suite; the Ascend kernels only against
otfuse's CPU test double of the CANN runtime (tests/fake_cann), never on hardware here. On an
Ascend machine, ``otfuse verify-ops --device npu MODEL`` compares them with torch_npu.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from importlib import metadata

from otfuse.errors import OtfuseError
from otfuse.run.cann_runtime import CannRuntimeLocation, find_cann_runtime

CANN_PROVIDER = "CANNExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
# TEST ONLY: with this session config entry set to "1" before the library is registered, the
# Ascend kernels replace the CPU kernels under the CPU EP, backed by the CANN test double.
FAKE_MODE_KEY = "otfuse.ascend_ep.fake_mode"
# TEST ONLY: "1" makes create_session (and so ``otfuse diff --provider cann``) use that fake mode.
FAKE_MODE_ENV = "OTFUSE_ASCEND_FAKE_MODE"
# float32 Attention / RopeAttention on the NPU (docs/ops.md, "float32 policy"): "cpu" (default: the
# CPU kernel runs them), or "float16" / "bfloat16" (FIA in that type, cast around it). Read when the
# library is registered.
FP32_ATTENTION_KEY = "otfuse.ascend_ep.fp32_attention"
FP32_ATTENTION = ("cpu", "float16", "bfloat16")
ARENA_STRATEGIES = ("kNextPowerOfTwo", "kSameAsRequested")

__all__ = [
    "CANN_PROVIDER",
    "Backend",
    "CannRuntimeLocation",
    "backends",
    "cann_unavailable_reason",
    "create_session",
    "find_cann_runtime",
    "provider_options",
]


@dataclass(frozen=True)
class Backend:
    name: str
    available: bool
    detail: str


def _onnxruntime_cann() -> tuple[str | None, bool]:
    """(installed onnxruntime-cann version or None, CANNExecutionProvider available in onnxruntime)."""
    import onnxruntime

    try:
        version = metadata.version("onnxruntime-cann")
    except metadata.PackageNotFoundError:
        version = None
    return version, CANN_PROVIDER in onnxruntime.get_available_providers()


def backends() -> list[Backend]:
    """CPU kernels (always), the CANN runtime (found or not, and where), onnxruntime-cann."""
    from otfuse.run.session import library_status

    path, loads, message = library_status()
    cpu = Backend("CPU kernels", loads, f"{path}" if loads else f"{path or 'library not found'}: {message}")
    runtime = find_cann_runtime()
    cann = Backend("CANN runtime", runtime.found and not runtime.is_test_double, runtime.describe())
    version, provider = _onnxruntime_cann()
    if version and provider:
        ort_detail = f"onnxruntime-cann {version}, {CANN_PROVIDER} available"
    elif version:
        ort_detail = (f"onnxruntime-cann {version} installed but {CANN_PROVIDER} is not available in the "
                      "imported onnxruntime")
    elif provider:
        ort_detail = f"{CANN_PROVIDER} available (onnxruntime built with CANN)"
    else:
        ort_detail = "not installed (pip uninstall onnxruntime && pip install onnxruntime-cann)"
    return [cpu, cann, Backend("onnxruntime-cann", provider, ort_detail)]


def cann_unavailable_reason() -> str:
    """Why a CANN session cannot even be tried here, or "" when it can."""
    version, provider = _onnxruntime_cann()
    if not provider:
        return (f"{CANN_PROVIDER} is not available: onnxruntime-cann is not installed"
                if version is None else
                f"{CANN_PROVIDER} is not available although onnxruntime-cann {version} is installed "
                "(another onnxruntime package shadows it?)")
    runtime = find_cann_runtime()
    if not runtime.found:
        return f"CANN runtime {runtime.describe()}; install the CANN toolkit and source its set_env.sh"
    if runtime.is_test_double:
        return f"the CANN runtime found is otfuse's CPU test double ({runtime.directory}), not CANN"
    return ""


def _option_value(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def provider_options(device_id=0, npu_mem_limit=None, arena_extend_strategy=None, enable_cann_graph=False,
                     precision_mode=None, **extra) -> dict[str, str]:
    """CANNExecutionProvider options as ORT expects them (strings; see ORT's CANN EP page)."""
    if arena_extend_strategy is not None and arena_extend_strategy not in ARENA_STRATEGIES:
        raise OtfuseError(f"arena_extend_strategy must be one of {', '.join(ARENA_STRATEGIES)}, "
                          f"got {arena_extend_strategy!r}")
    options = {"device_id": str(int(device_id)), "enable_cann_graph": _option_value(bool(enable_cann_graph))}
    if npu_mem_limit is not None:
        options["npu_mem_limit"] = str(int(npu_mem_limit))
    if arena_extend_strategy is not None:
        options["arena_extend_strategy"] = arena_extend_strategy
    if precision_mode is not None:
        options["precision_mode"] = str(precision_mode)
    options.update({key: _option_value(value) for key, value in extra.items()})
    return options


def create_session(path, device_id=0, npu_mem_limit=None, arena_extend_strategy=None, enable_cann_graph=False,
                   precision_mode=None, *, sess_options=None, fallback=True, fp32_attention=None, fake_mode=None,
                   **provider_opts):
    """An ``otfuse.InferenceSession`` for ``path`` on ``CANNExecutionProvider`` (then CPU).

    ``enable_cann_graph`` defaults to False: the otfuse nodes are custom ops, which CANN's graph
    engine does not know, so the model runs op by op (ORT's single-operator mode). Any other
    keyword is passed to the CANN EP as a provider option (``op_select_impl_mode`` ...).

    When onnxruntime-cann, the CANN toolkit or an NPU is missing, the session runs on CPU with one
    ``RuntimeWarning`` saying why; with ``fallback=False`` that raises ``OtfuseError`` instead.

    ``fp32_attention`` ("cpu", "float16" or "bfloat16"): how float32 Attention / RopeAttention
    nodes run; by default ("cpu") on the CPU kernel, since the NPU's fused attention takes
    float16/bfloat16 only. The other two opt in to running them there in that type (within that
    type's tolerance, not float32's).

    ``fake_mode`` (TEST ONLY; default: ``$OTFUSE_ASCEND_FAKE_MODE == "1"``): no CANN EP; the session
    runs the Ascend kernels on CPU against otfuse's CPU test double of the CANN runtime
    (tests/fake_cann, found through ``$OTFUSE_CANN_LIB_DIR``), by the session config entry
    ``otfuse.ascend_ep.fake_mode=1``. Session creation fails when the runtime found is not the double.
    """
    import onnxruntime as ort

    from otfuse.run.session import InferenceSession

    if fp32_attention is not None:
        if fp32_attention not in FP32_ATTENTION:
            raise OtfuseError(f"fp32_attention must be one of {', '.join(FP32_ATTENTION)}, got {fp32_attention!r}")
        sess_options = sess_options if sess_options is not None else ort.SessionOptions()
        sess_options.add_session_config_entry(FP32_ATTENTION_KEY, fp32_attention)

    options = provider_options(device_id, npu_mem_limit, arena_extend_strategy, enable_cann_graph, precision_mode,
                               **provider_opts)
    if fake_mode is None:
        fake_mode = os.environ.get(FAKE_MODE_ENV, "") == "1"
    if fake_mode:
        sess_options = sess_options if sess_options is not None else ort.SessionOptions()
        sess_options.add_session_config_entry(FAKE_MODE_KEY, "1")  # before the library is registered
        return InferenceSession(path, sess_options=sess_options, providers=[CPU_PROVIDER])
    reason = cann_unavailable_reason()
    if not reason:
        try:
            return InferenceSession(path, sess_options=sess_options, providers=[(CANN_PROVIDER, options), CPU_PROVIDER])
        except OtfuseError:
            raise
        except Exception as e:  # noqa: BLE001  (no NPU, driver trouble, kernel creation failed ...)
            reason = f"creating a {CANN_PROVIDER} session failed: {' '.join(str(e).split())}"
    if not fallback:
        raise OtfuseError(f"cannot run {path} on the NPU: {reason}")
    warnings.warn(f"otfuse.ascend_ep: running {path} on CPU: {reason}", RuntimeWarning, stacklevel=2)
    return InferenceSession(path, sess_options=sess_options, providers=[CPU_PROVIDER])
