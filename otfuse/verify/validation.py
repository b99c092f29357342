"""Is the fused model valid? onnx.checker says so for standard models; for inputs it rejects but
ONNX Runtime runs (ORT's own ops written in the default domain, LayerNormalization before opset
17, graph outputs declared without a shape), otfuse must not throw its work away: such a model is
accepted when the checker finds nothing new in it and ONNX Runtime loads it.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from otfuse.errors import InternalError, ModelLoadError
from otfuse.rewriter.model_io import LoadedModel, check_model

# Loading a session is how ORT's acceptance is checked; above this the weights would be read.
_ORT_CHECK_MAX_BYTES = 1 << 30


def validate_fused(model: onnx.ModelProto, loaded: LoadedModel, ort_ops: bool = False) -> list[str]:
    """Raise ``InternalError`` when the fused model is invalid and the input was not; return
    notes for the report when the input itself is not standard ONNX. ``ort_ops``: the model was
    written with ONNX Runtime's ops (target ``ort``), some of which ORT registers in the default
    domain (SimplifiedLayerNormalization), where the checker cannot know them: ORT must load it."""
    fused_error = _checker_error(model, loaded.base_dir)
    if fused_error is None:
        return []
    if ort_ops:
        ort_error = _ort_load_error(model, loaded)
        if ort_error:
            raise InternalError(f"ONNX Runtime does not load the ort-target model ({ort_error}){_old_ort_hint()}; "
                                "nothing was written")
        checked = "ONNX Runtime loads it" if ort_error == "" else "it is too large to load here"
        return [f"onnx.checker does not know ONNX Runtime's ops ({fused_error}); accepted because {checked}"]
    original = onnx.load(str(loaded.path), load_external_data=False)
    input_error = _checker_error(original, loaded.base_dir)
    if input_error is None:
        raise InternalError(f"the fused model fails onnx.checker ({fused_error}); nothing was written")
    ort_error = _ort_load_error(model, loaded)
    if ort_error:
        raise InternalError(f"the fused model fails onnx.checker ({fused_error}) and ONNX Runtime "
                            f"does not load it ({ort_error}); nothing was written")
    if ort_error is None and fused_error != input_error:  # too large to load: the checker must agree
        raise InternalError(f"the fused model fails onnx.checker ({fused_error}) where the input "
                            f"failed with ({input_error}); nothing was written")
    checked = ("ONNX Runtime loads the fused model" if ort_error == "" else
               "the checker finds nothing new in the fused model (too large to load here)")
    return [f"the input is not standard ONNX (onnx.checker: {input_error}); accepted because {checked}"]


# The contrib ops' schemas the ort target writes: GroupQueryAttention's `causal` attribute (every
# mask but the causal one goes to attention_bias with causal = 0) exists from ORT 1.30 on.
ORT_TARGET_MIN_VERSION = (1, 30)


def _old_ort_hint() -> str:
    import onnxruntime

    try:
        version = tuple(int(part) for part in onnxruntime.__version__.split(".")[:2])
    except ValueError:
        return ""
    if version >= ORT_TARGET_MIN_VERSION:
        return ""
    needed = ".".join(map(str, ORT_TARGET_MIN_VERSION))
    return f"; the ort target writes ONNX Runtime >= {needed}'s contrib ops, this is onnxruntime {onnxruntime.__version__}"


def _checker_error(model: onnx.ModelProto, base_dir: Path) -> str | None:
    try:
        check_model(model, base_dir)  # external data resolves against the model's folder, not the cwd
    except (onnx.checker.ValidationError, ModelLoadError) as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
    return None


def _ort_load_error(model: onnx.ModelProto, loaded: LoadedModel) -> str | None:
    """"" when ONNX Runtime (with the otfuse library) loads ``model``, its one-line error when it
    does not, None when the model is too large to check that way (weights in external data)."""
    if loaded.external_files or model.ByteSize() > _ORT_CHECK_MAX_BYTES:
        return None
    import onnxruntime as ort

    from otfuse.run.session import InferenceSession, baseline_options

    try:
        InferenceSession(model.SerializeToString(), sess_options=baseline_options())
    except (ort.capi.onnxruntime_pybind11_state.Fail, RuntimeError, ValueError) as exc:
        return " ".join(str(exc).split())[:300]
    except Exception as exc:  # noqa: BLE001 - any refusal by ORT is the answer we asked for
        return " ".join(str(exc).split())[:300] or type(exc).__name__
    return ""
