"""numpy reference of every fused op in docs/ops.md, one function per op.

The tests compare the kernels against these. They follow the contract literally: inputs are
widened to float32, all arithmetic is float32, and the result is rounded to the input's type
once (numpy float16 and ml_dtypes.bfloat16 both round to nearest even).
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32


def _normalised_axes(x: np.ndarray, axis: int) -> tuple[int, ...]:
    rank = x.ndim
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    first = axis % rank
    return tuple(range(first, rank))


def _check_weights(name: str, w: np.ndarray | None, x: np.ndarray, axes: tuple[int, ...]) -> None:
    if w is not None and tuple(w.shape) != tuple(x.shape[axes[0]:]):
        raise ValueError(f"{name} shape {w.shape} != x.shape[axis:] {x.shape[axes[0]:]}")


def _rms_norm_f32(x32: np.ndarray, scale: np.ndarray, epsilon: float, axes: tuple[int, ...]) -> np.ndarray:
    mean_sq = np.mean(x32 * x32, axis=axes, keepdims=True, dtype=_F32)
    return x32 / np.sqrt(mean_sq + _F32(epsilon)) * scale.astype(_F32)


def _layer_norm_f32(
    x32: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, epsilon: float, axes: tuple[int, ...]
) -> np.ndarray:
    mean = np.mean(x32, axis=axes, keepdims=True, dtype=_F32)
    centred = x32 - mean
    var = np.mean(centred * centred, axis=axes, keepdims=True, dtype=_F32)
    y = centred / np.sqrt(var + _F32(epsilon)) * scale.astype(_F32)
    if bias is not None:
        y = y + bias.astype(_F32)
    return y


def _residual_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A + B computed in float32 and stored as A's type (the unfused Add's output)."""
    if a.shape != b.shape:
        raise ValueError(f"A shape {a.shape} != B shape {b.shape}")
    return (a.astype(_F32) + b.astype(_F32)).astype(a.dtype)


def rms_norm(x: np.ndarray, scale: np.ndarray, epsilon: float = 1e-6, axis: int = -1) -> np.ndarray:
    """RMSNorm: Y = X / sqrt(mean(X^2) + epsilon) * scale, over axes [axis, rank)."""
    axes = _normalised_axes(x, axis)
    _check_weights("scale", scale, x, axes)
    return _rms_norm_f32(x.astype(_F32), scale, epsilon, axes).astype(x.dtype)


def add_rms_norm(
    a: np.ndarray, b: np.ndarray, scale: np.ndarray, epsilon: float = 1e-6, axis: int = -1
) -> tuple[np.ndarray, np.ndarray]:
    """AddRMSNorm: S = A + B (rounded to A's type); Y = RMSNorm(S). Returns (Y, S)."""
    s = _residual_sum(a, b)
    return rms_norm(s, scale, epsilon, axis), s


def layer_norm(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None, epsilon: float = 1e-5, axis: int = -1
) -> np.ndarray:
    """LayerNorm: Y = (X - mean) / sqrt(var + epsilon) * scale + bias (biased variance)."""
    axes = _normalised_axes(x, axis)
    _check_weights("scale", scale, x, axes)
    _check_weights("bias", bias, x, axes)
    return _layer_norm_f32(x.astype(_F32), scale, bias, epsilon, axes).astype(x.dtype)


def add_layer_norm(
    a: np.ndarray,
    b: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray | None = None,
    epsilon: float = 1e-5,
    axis: int = -1,
) -> tuple[np.ndarray, np.ndarray]:
    """AddLayerNorm: S = A + B (rounded to A's type); Y = LayerNorm(S). Returns (Y, S)."""
    s = _residual_sum(a, b)
    return layer_norm(s, scale, bias, epsilon, axis), s
