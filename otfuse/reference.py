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


def _rotary_lanes(x: np.ndarray, rotary_dim: int, sections) -> tuple[int, tuple[int, ...]]:
    """r and the section widths (one section of r when none are given), checked as the kernel does."""
    if x.ndim < 2:
        raise ValueError(f"rotary input must have rank >= 2, got shape {x.shape}")
    d = x.shape[-1]
    if rotary_dim < 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and >= 0, got {rotary_dim}")
    if rotary_dim > d:
        raise ValueError(f"rotary_dim {rotary_dim} is larger than the last dim D = {d}")
    r = rotary_dim or d
    if r % 2:
        raise ValueError(f"r = {r} must be even")
    widths = tuple(int(w) for w in sections)
    if any(w < 0 or w % 2 for w in widths):
        raise ValueError(f"sections {list(widths)} must hold even widths >= 0")
    if widths and sum(widths) != r:
        raise ValueError(f"sections {list(widths)} sum to {sum(widths)}, not r = {r}")
    return r, widths or (r,)


def _rotate(rot: np.ndarray, mode: str, widths: tuple[int, ...]) -> np.ndarray:
    """M x: the signed permutation of the rotary lanes (docs/ops.md, "Rotary embedding family")."""
    m = np.empty_like(rot)
    if mode == "interleaved":
        m[..., 0::2] = -rot[..., 1::2]
        m[..., 1::2] = rot[..., 0::2]
        return m
    if mode != "half":
        raise ValueError(f"mode must be 'half' or 'interleaved', got {mode!r}")
    start = 0
    for w in widths:
        h = w // 2
        m[..., start:start + h] = -rot[..., start + h:start + w]
        m[..., start + h:start + w] = rot[..., start:start + h]
        start += w
    return m


def rotary_embedding(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, mode: str = "half", rotary_dim: int = 0, sections=()
) -> np.ndarray:
    """RotaryEmbedding: Y = cos * X + sin * (M X) on the first r lanes of the last axis, the rest
    unchanged; cos/sin ([..., r]) broadcast to X.shape[:-1] + [r] (numpy rules, aligned right)."""
    r, widths = _rotary_lanes(x, rotary_dim, sections)
    if cos.shape != sin.shape:
        raise ValueError(f"sin shape {sin.shape} != cos shape {cos.shape}")
    if cos.ndim < 1 or cos.shape[-1] != r:
        raise ValueError(f"cos shape {cos.shape}: the last dim must be r = {r}")
    target = x.shape[:-1] + (r,)
    try:
        c = np.broadcast_to(cos, target).astype(_F32)
        s = np.broadcast_to(sin, target).astype(_F32)
    except ValueError:
        raise ValueError(f"cos/sin shape {cos.shape} does not broadcast to X.shape[:-1] + [r] = {target}") from None
    x32 = x.astype(_F32)
    rot = x32[..., :r]
    y = x32.copy()
    y[..., :r] = c * rot + s * _rotate(rot, mode, widths)
    return y.astype(x.dtype)


def rotary_embedding_qk(
    q: np.ndarray, k: np.ndarray, cos: np.ndarray, sin: np.ndarray, mode: str = "half", rotary_dim: int = 0,
    sections=(),
) -> tuple[np.ndarray, np.ndarray]:
    """RotaryEmbeddingQK: (RotaryEmbedding(Q), RotaryEmbedding(K)) with the same cos/sin; Q and K
    may have different head counts but the same last dim."""
    if q.ndim < 1 or k.ndim < 1 or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"Q shape {q.shape} and K shape {k.shape} must have the same last dim")
    return (rotary_embedding(q, cos, sin, mode, rotary_dim, sections),
            rotary_embedding(k, cos, sin, mode, rotary_dim, sections))
