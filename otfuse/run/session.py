"""ONNX Runtime sessions that can run fused models, and a run helper that handles bfloat16.

``InferenceSession`` is a drop-in ``onnxruntime.InferenceSession`` with the otfuse custom-op
library registered. ``baseline_session`` runs a model exactly as written (no ORT graph
optimisations), the reference ``otfuse diff`` compares against. ``open_session`` is what the CLI
uses: every load failure becomes a one-line :class:`~otfuse.errors.ModelLoadError`.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from otfuse.domain import OP_DOMAIN
from otfuse.errors import ModelLoadError, OtfuseError

DEFAULT_PROVIDERS = ["CPUExecutionProvider"]
# Marks options our library was already registered in (registering twice makes ORT fail).
_REGISTERED_KEY = "otfuse.custom_ops_library"
# The library's plugin execution provider (kernels/cpu/norm_linear_ep.cc): the *NormLinear nodes
# on it pack their weights once (ORT then frees the initializers); everything else stays
# on the CPU EP. Needs ORT >= 1.24; OTFUSE_NORM_LINEAR_EP=0 turns it off.
EP_NAME = "OtfuseCPUExecutionProvider"
_EP_REGISTRATION = "otfuse"
_EP_KEY = "otfuse.plugin_ep"
_NORM_LINEAR_MARK = b"NormLinear"  # RMSNormLinear, AddRMSNormLinear, LayerNormLinear, AddLayerNormLinear


class LibraryNotAvailable(OtfuseError):
    """The model uses otfuse ops but the custom-op library could not be found."""


def find_library() -> tuple[str | None, str]:
    """(path, "") when the custom-op library exists, else (None, why not)."""
    try:
        from otfuse.run.library import library_path

        path = library_path()
    except Exception as e:  # not built / not installed: only fatal if the model needs it
        return None, " ".join(str(e).split()) or type(e).__name__
    if not path or not Path(path).is_file():
        return None, f"{path} does not exist (build the kernels: pip install -e .)"
    return str(path), ""


def library_status() -> tuple[str | None, bool, str]:
    """(path, loads, message) for ``otfuse info``."""
    path, why = find_library()
    if path is None:
        return None, False, why
    try:
        ort.SessionOptions().register_custom_ops_library(path)
    except Exception as e:
        return path, False, " ".join(str(e).split())
    return path, True, "loads"


def _register_library(options: ort.SessionOptions) -> str:
    """Register the library in ``options``; return why it was not, or ""."""
    try:
        options.get_session_config_entry(_REGISTERED_KEY)
        return ""
    except RuntimeError:
        pass  # not registered yet
    path, why = find_library()
    if path is None:
        return why
    try:
        options.register_custom_ops_library(path)
    except Exception as e:
        raise OtfuseError(f"cannot load the otfuse custom-op library {path}: {' '.join(str(e).split())}") from None
    options.add_session_config_entry(_REGISTERED_KEY, path)
    return ""


# Set once per process by plugin_ep_devices: whether the library is registered as an EP library.
_ep_registered = False
# Sessions created in several threads at once register the library once (a second registration fails).
_ep_lock = threading.Lock()


def _ort_has_kernel_ep_api() -> bool:
    """ORT >= 1.24: the plugin-EP kernel API (OrtKernelImpl::PrePackWeight) exists."""
    try:
        major, minor = (int(part) for part in ort.__version__.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (1, 24) and hasattr(ort, "register_execution_provider_library")


def _ep_route_wanted() -> bool:
    """This ORT has the plugin-EP kernel API and OTFUSE_NORM_LINEAR_EP is not 0."""
    return os.environ.get("OTFUSE_NORM_LINEAR_EP", "1") != "0" and _ort_has_kernel_ep_api()


def plugin_ep_devices(path: str) -> list:
    """The library's EP devices, the library registered as an EP library once per process; [] when
    this ORT has no plugin-EP kernel API (< 1.24: its custom ops alone then run every node) or
    OTFUSE_NORM_LINEAR_EP=0."""
    global _ep_registered
    if not _ep_route_wanted():
        return []
    with _ep_lock:
        devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
        if not devices and not _ep_registered:
            try:
                ort.register_execution_provider_library(_EP_REGISTRATION, path)
            except Exception as e:
                raise OtfuseError(f"cannot register {path} as an execution provider library: {' '.join(str(e).split())}") from None
            _ep_registered = True
            devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    return devices


def _config_entry(options: ort.SessionOptions, key: str) -> str | None:
    try:
        return options.get_session_config_entry(key)
    except RuntimeError:
        return None  # not set


def mentions_norm_linear(path_or_bytes) -> bool:
    """Whether the serialized model holds the name of a ``*NormLinear`` op: node op types are stored
    as plain bytes, so one search of the file (mapped, never read into Python objects) answers for
    the main graph and every body. A weight that happens to hold the bytes only costs the EP."""
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return _NORM_LINEAR_MARK in bytes(path_or_bytes)
    try:
        with open(os.fspath(path_or_bytes), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(_NORM_LINEAR_MARK) >= 0
    except (OSError, TypeError, ValueError):
        return False  # unreadable or empty: ORT's own load reports it


def cpu_providers(path_or_bytes=None) -> list[str]:
    """What ``InferenceSession(model, providers=["CPUExecutionProvider"])`` runs on here: the plugin
    EP first where it is in use (``plugin_ep_devices``, a model with a ``*NormLinear`` node; None:
    as if it had one), then ORT's CPU EP."""
    path, _ = find_library()
    wants_ep = path_or_bytes is None or mentions_norm_linear(path_or_bytes)
    return ([EP_NAME] if path and wants_ep and plugin_ep_devices(path) else []) + ["CPUExecutionProvider"]


def _add_plugin_ep(options: ort.SessionOptions) -> bool:
    """Put the plugin EP in ``options`` (once: marked like the library); whether they have it."""
    if _config_entry(options, _EP_KEY) is not None:
        return True
    if not _ep_route_wanted():
        return False  # before has_providers: older ORT lacks it too
    if options.has_providers():
        return False  # the caller chose providers in the options: leave them
    if _config_entry(options, "otfuse.ascend_ep.fake_mode") == "1":
        return False  # TEST ONLY mode (otfuse.run.ascend): the Ascend kernels' doubles take the nodes on the CPU EP
    devices = plugin_ep_devices(find_library()[0])
    if not devices:
        return False
    options.add_provider_for_devices(devices, {})
    options.add_session_config_entry(_EP_KEY, "1")
    return True


def _cpu_only(providers) -> bool:
    """ORT's CPU EP alone, without options of its own (the EP route adds it by default: options
    given for it would be dropped, so they keep the custom-op route)."""
    names = [p[0] if isinstance(p, (tuple, list)) else p for p in providers]
    options = [p[1] for p in providers if isinstance(p, (tuple, list)) and len(p) > 1]
    return names == ["CPUExecutionProvider"] and not any(options)


def _options_have_providers(options: ort.SessionOptions) -> bool:
    has_providers = getattr(options, "has_providers", None)  # ORT >= 1.22
    return bool(has_providers and has_providers())


class InferenceSession(ort.InferenceSession):
    """``onnxruntime.InferenceSession`` that can run ``otfuse`` nodes (CPU provider by default).

    With the CPU provider alone (no options of its own) and ORT >= 1.24, the library's plugin EP
    (``EP_NAME``) runs the ``*NormLinear`` nodes, their weights packed once
    (``plugin_ep_devices``). Providers already set in ``sess_options`` are kept as they are.

    When the library is not built, models without otfuse nodes still load; a model that needs
    it fails with :class:`LibraryNotAvailable` instead of ORT's "unknown op" error.

    ORT's memory pattern is off unless ``mem_pattern=True``: after the first run it keeps one
    block as large as all of a run's planned activations for the session's life, so a prefill's
    peak RSS grows by that block (+0.8 GB at 8192 tokens of bench/e2e_llama.py's model) for ~1 %
    of time; with dynamic shapes it is replanned whenever a shape changes anyway.
    """

    def __init__(self, path_or_bytes, sess_options=None, providers=None, mem_pattern: bool = False, **kwargs):
        options = sess_options if sess_options is not None else ort.SessionOptions()
        options.enable_mem_pattern = bool(mem_pattern)
        missing = _register_library(options)
        # The caller chose providers in the options (add_provider_for_devices, say): ORT runs those
        # unless given a providers list, which would replace them (with a warning).
        chosen_in_options = not providers and _options_have_providers(options) and _config_entry(options, _EP_KEY) is None
        providers = providers or DEFAULT_PROVIDERS
        try:
            if chosen_in_options:
                super().__init__(path_or_bytes, sess_options=options, **kwargs)
            # Only a model with a node for it gets the EP: any other keeps ORT's CPU EP alone (no
            # second provider in the partitioning, no "nodes not assigned to the preferred EP" warning).
            elif not missing and _cpu_only(providers) and mentions_norm_linear(path_or_bytes) and _add_plugin_ep(options):
                # The plugin EP first, ORT's CPU EP after it for every other node.
                super().__init__(path_or_bytes, sess_options=options, **kwargs)
            else:
                super().__init__(path_or_bytes, sess_options=options, providers=providers, **kwargs)
        except Exception as e:
            if missing and OP_DOMAIN in str(e):
                raise LibraryNotAvailable(f"the model uses otfuse ops but the custom-op library is not available: {missing}") from e
            raise


# ORT's graph optimisation levels by the names `otfuse diff --ort-opt` takes.
OPT_LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session_options(opt_level: str = "disabled") -> ort.SessionOptions:
    """Options at one of ``OPT_LEVELS``. ``otfuse diff`` runs both models at the same level, so
    ORT's own session-time rewrites (its QDQ fusion, say) cannot show up as otfuse's."""
    if opt_level not in OPT_LEVELS:
        raise OtfuseError(f"unknown ORT optimisation level {opt_level!r} (use {', '.join(OPT_LEVELS)})")
    options = ort.SessionOptions()
    options.graph_optimization_level = OPT_LEVELS[opt_level]
    return options


def baseline_options() -> ort.SessionOptions:
    """Options that run the graph as written (no ORT graph optimisations)."""
    return session_options("disabled")


def baseline_session(path_or_bytes, providers=None) -> InferenceSession:
    return InferenceSession(path_or_bytes, sess_options=baseline_options(), providers=providers)


def open_session(path: str | os.PathLike, *, baseline: bool = False, providers=None, shown_as=None,
                 opt_level: str | None = None, library: bool = True) -> ort.InferenceSession:
    """Open ``path`` for running, at ``opt_level`` (``OPT_LEVELS``; ``baseline``: "disabled"; else
    ORT's default); any failure is a one-line OtfuseError naming the file (``shown_as`` when
    ``path`` is a temporary copy). ``library=False``: stock onnxruntime, without otfuse's ops."""
    level = opt_level or ("disabled" if baseline else None)
    options = session_options(level) if level else None
    session_type = InferenceSession if library else ort.InferenceSession
    try:
        return session_type(str(path), sess_options=options, providers=providers or DEFAULT_PROVIDERS)
    except OtfuseError:
        raise
    except Exception as e:
        raise ModelLoadError(f"{shown_as or path}: ONNX Runtime cannot load it: {_ort_message(e)}") from None


def run(session: ort.InferenceSession, feeds: dict[str, np.ndarray], output_names=None) -> dict[str, np.ndarray]:
    """Run and return {output name: array}; bfloat16 (and other ml_dtypes) work both ways,
    which plain ``session.run`` does not support."""
    values = {name: _to_ortvalue(arr) for name, arr in feeds.items()}
    names = list(output_names) if output_names is not None else [o.name for o in session.get_outputs()]
    results = session.run_with_ort_values(names, values)
    return {name: _to_numpy(value) for name, value in zip(names, results)}


def _to_ortvalue(arr: np.ndarray) -> ort.OrtValue:
    arr = np.ascontiguousarray(arr)
    if arr.dtype.type.__module__ != "ml_dtypes":
        return ort.OrtValue.ortvalue_from_numpy(arr)
    elem = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
    # ORT's numpy bridge does not know ml_dtypes: hand over the raw bits with the ONNX type.
    raw = arr.view(np.dtype(f"uint{8 * arr.dtype.itemsize}"))
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, elem)


def _to_numpy(value: ort.OrtValue) -> np.ndarray:
    try:
        return value.numpy()
    except Exception:
        # No numpy type for it in ORT (bfloat16, float8): copy the bytes out while `value` lives.
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.element_type())
        nbytes = value.tensor_size_in_bytes()
        raw = bytes((ctypes.c_uint8 * nbytes).from_address(value.data_ptr())) if nbytes else b""
        return np.frombuffer(raw, dtype=dtype).reshape(value.shape()).copy()


def _ort_message(e: Exception) -> str:
    """ORT's message without the '[ONNXRuntimeError] : 7 : INVALID_PROTOBUF :' prefix, on one line."""
    text = " ".join(str(e).split())
    if text.startswith("[ONNXRuntimeError]"):
        text = text.split(":", 3)[-1].strip()
    return text or type(e).__name__
