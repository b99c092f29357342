"""numpy reference of every fused op in docs/ops.md, one function per op.

The tests compare the kernels against these. They follow the contract literally: inputs are
widened to float32, all arithmetic is float32, and the result is rounded to the input's type
once (numpy float16 and ml_dtypes.bfloat16 both round to nearest even). The activation family's
references are the exact formulas evaluated in float64 (``*_exact``), then rounded once: what
the kernels' error bounds in docs/ops.md are measured against.
"""

from __future__ import annotations

import math

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


# ---- attention family ----


def _heads_bnsd(x: np.ndarray, layout: str, heads: int, name: str) -> np.ndarray:
    """Q, K or V as [B, N, S, D] from its layout (BSND may be rank 3, [B, S, N*D])."""
    if layout == "BNSD":
        if x.ndim != 4:
            raise ValueError(f"{name} shape {x.shape}: layout BNSD needs rank 4")
        out = x
    elif layout == "BSND":
        if x.ndim == 3:
            if x.shape[2] % heads:
                raise ValueError(f"{name} shape {x.shape}: last dim is not a multiple of {heads} heads")
            x = x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads)
        if x.ndim != 4:
            raise ValueError(f"{name} shape {x.shape}: layout BSND needs rank 4 or 3")
        out = x.transpose(0, 2, 1, 3)
    else:
        raise ValueError(f"layout must be 'BNSD' or 'BSND', got {layout!r}")
    if out.shape[1] != heads:
        raise ValueError(f"{name} shape {x.shape} has {out.shape[1]} heads, expected {heads}")
    return out


def alibi_positions_of(key_padding_mask: np.ndarray | None, mode: str, b: int, sq: int,
                       skv: int) -> tuple[np.ndarray, np.ndarray]:
    """(k_pos [B, 1, 1, Skv], q_pos [1, 1, Sq, 1]) as int64 (docs/ops.md, "ALiBi")."""
    if mode == "index":
        return np.arange(skv)[None, None, None, :], (skv - sq + np.arange(sq))[None, None, :, None]
    if mode != "mask_cumsum":
        raise ValueError(f"alibi_positions must be 'index' or 'mask_cumsum', got {mode!r}")
    m = np.ones((b, skv), np.int64) if key_padding_mask is None else key_padding_mask.astype(np.int64)
    k_pos = (np.cumsum(m, axis=-1) - 1) * m
    return k_pos[:, None, None, :], np.zeros((1, 1, sq, 1), np.int64)


def alibi_bias(slopes: np.ndarray, key_padding_mask: np.ndarray | None, mode: str, b: int, sq: int,
               skv: int, round_half: int = 0) -> np.ndarray:
    """slope_h * (k_pos - q_pos) as [B, N, Sq, Skv] float32: the difference of two integers, then
    one float32 product (as the kernel evaluates it). ``round_half`` (alibi_round = 1, "mask_cumsum"
    only): float16(slope_h * float16(k_pos)), float16 exports' bias, both roundings to nearest even."""
    slopes = np.asarray(slopes)
    if slopes.ndim != 1:
        raise ValueError(f"alibi_slopes must be [N], got shape {slopes.shape}")
    k_pos, q_pos = alibi_positions_of(key_padding_mask, mode, b, sq, skv)
    distance = (k_pos - q_pos).astype(_F32)
    if round_half:
        if mode != "mask_cumsum":
            raise ValueError("alibi_round = 1 needs alibi_positions = 'mask_cumsum'")
        distance = distance.astype(np.float16).astype(_F32)
        return (slopes.astype(_F32)[None, :, None, None] * distance).astype(np.float16).astype(_F32)
    return slopes.astype(_F32)[None, :, None, None] * distance


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_bias: np.ndarray | None = None,
    key_padding_mask: np.ndarray | None = None,
    past_key: np.ndarray | None = None,
    past_value: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    *,
    num_heads: int,
    kv_num_heads: int | None = None,
    scale: float = 0.0,
    causal: int = 0,
    window: int = 0,
    softcap: float = 0.0,
    layout: str = "BNSD",
    output_layout: str | None = None,
    empty_rows: str = "zero",
    alibi_positions: str = "index",
    alibi_round: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Attention (docs/ops.md, "Attention family"), naive: materialises the [B, N, Sq, Skv] scores.

    Returns (Y, present_key, present_value). Scores, softmax and P·V are float32; Y is rounded to
    Q's type once. Rows with no visible key are 0 (`empty_rows="zero"`) or the float32 mean of V
    over all Skv keys (`empty_rows="uniform"`; 0 when Skv = 0). ``sinks`` ([N] float32): head h's
    logit joins every row's softmax denominator as a key of value 0, so a row of a head with a
    finite sink is never empty (it is 0 when it sees no other key); -inf is no sink.
    """
    if empty_rows not in ("zero", "uniform"):
        raise ValueError(f"empty_rows must be 'zero' or 'uniform', got {empty_rows!r}")
    kv_num_heads = kv_num_heads or num_heads
    if num_heads % kv_num_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of kv_num_heads {kv_num_heads}")
    if window and not causal:
        raise ValueError("window > 0 needs causal = 1")
    output_layout = output_layout or layout
    q4 = _heads_bnsd(q, layout, num_heads, "Q")
    k4 = _heads_bnsd(k, layout, kv_num_heads, "K")
    v4 = _heads_bnsd(v, layout, kv_num_heads, "V")
    if (past_key is None) != (past_value is None):
        raise ValueError("past_key and past_value must be given together")
    present_k = k4 if past_key is None else np.concatenate([past_key, k4], axis=2)
    present_v = v4 if past_value is None else np.concatenate([past_value, v4], axis=2)
    b, n, sq, d = q4.shape
    skv = present_k.shape[2]
    group = num_heads // kv_num_heads
    k32 = np.repeat(present_k.astype(_F32), group, axis=1)
    v32 = np.repeat(present_v.astype(_F32), group, axis=1)
    scale = _F32(scale) if scale else _F32(1.0 / np.sqrt(d)) if d else _F32(1.0)
    scores = np.matmul(q4.astype(_F32), k32.transpose(0, 1, 3, 2)) * scale
    if softcap:
        scores = _F32(softcap) * np.tanh(scores / _F32(softcap))
    if alibi_slopes is not None:
        if np.shape(alibi_slopes) != (n,):
            raise ValueError(f"alibi_slopes shape {np.shape(alibi_slopes)} != [N] = {(n,)}")
        scores = scores + alibi_bias(alibi_slopes, key_padding_mask, alibi_positions, b, sq, skv, alibi_round)
    if attn_bias is not None:
        scores = scores + np.broadcast_to(attn_bias.astype(_F32), (b, n, sq, skv))
    visible = np.ones((b, n, sq, skv), bool)
    if key_padding_mask is not None:
        if key_padding_mask.shape != (b, skv):
            raise ValueError(f"key_padding_mask shape {key_padding_mask.shape} != [B, Skv] = {(b, skv)}")
        visible &= (key_padding_mask != 0)[:, None, None, :]
    if causal:
        t = (skv - sq) + np.arange(sq)[:, None]  # absolute position of each query row
        j = np.arange(skv)[None, :]
        band = j <= t
        if window:
            band &= t - j < window  # j > t - window, without wrapping int64 for huge windows
        visible &= band
    scores = np.where(visible, scores, _F32(-np.inf)).astype(_F32)
    sink = np.full((1, n, 1, 1), -np.inf, _F32)
    if sinks is not None:
        if np.shape(sinks) != (n,):
            raise ValueError(f"sinks shape {np.shape(sinks)} != [N] = {(n,)}")
        sink = np.asarray(sinks, _F32).reshape(1, n, 1, 1)
        if np.isnan(sink).any() or (sink == np.inf).any():
            raise ValueError("sinks must be finite or -inf")
    with np.errstate(invalid="ignore"):
        m = scores.max(axis=-1, keepdims=True) if skv else np.full((b, n, sq, 1), -np.inf, _F32)
        m = np.maximum(m, sink)  # the sink is one more key every row sees
        empty = m == -np.inf  # no visible key: the row is 0, or the mean of V over all keys
        p = np.exp(scores - np.where(empty, _F32(0), m)).astype(_F32)
        sink_p = np.where(empty | (sink == -np.inf), _F32(0), np.exp(sink - np.where(empty, _F32(0), m)))
        l = p.sum(axis=-1, keepdims=True, dtype=_F32) + sink_p.astype(_F32)
        y = np.matmul(p, v32) / np.where(empty, _F32(1), l)
    if empty_rows == "uniform" and skv:
        fill = v32.sum(axis=2, keepdims=True, dtype=_F32) / _F32(skv)  # [B, N, 1, Dv]
    else:
        fill = _F32(0)
    y = np.where(empty, fill, y).astype(_F32)
    if output_layout == "BSND":
        y = y.transpose(0, 2, 1, 3)
        if layout == "BSND" and q.ndim == 3:
            y = y.reshape(b, sq, n * y.shape[-1])
    elif output_layout != "BNSD":
        raise ValueError(f"output_layout must be 'BNSD' or 'BSND', got {output_layout!r}")
    return y.astype(q.dtype), present_k, present_v


def rope_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    attn_bias: np.ndarray | None = None,
    key_padding_mask: np.ndarray | None = None,
    past_key: np.ndarray | None = None,
    past_value: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    *,
    num_heads: int,
    kv_num_heads: int | None = None,
    rotary_mode: str = "half",
    rotary_dim: int = 0,
    rotary_sections=(),
    layout: str = "BNSD",
    **attention_attrs,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RopeAttention: Attention of RotaryEmbedding(Q) and RotaryEmbedding(K) (the new keys only;
    past keys are already rotated), cos/sin broadcast against the rank-4 view of Q and K in
    `layout`. The rotated Q and K are rounded to T, as the unfused RotaryEmbedding stores them."""
    kv_num_heads = kv_num_heads or num_heads

    def rotated(x: np.ndarray, heads: int) -> np.ndarray:
        # the head size spelled out: numpy cannot infer a -1 dim of an empty array
        x4 = x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads) if layout == "BSND" and x.ndim == 3 else x
        return rotary_embedding(x4, cos, sin, rotary_mode, rotary_dim, rotary_sections).reshape(x.shape)

    return attention(rotated(q, num_heads), rotated(k, kv_num_heads), v, attn_bias, key_padding_mask, past_key,
                     past_value, alibi_slopes, sinks, num_heads=num_heads, kv_num_heads=kv_num_heads, layout=layout,
                     **attention_attrs)


# ---- Norm + Linear family ----


def _projections(normed: np.ndarray, weights, biases=None, transposed=None) -> list[np.ndarray]:
    """Y_i = round_T(float32(normed) @ float32(W_i) + float32(bias_i)): the normalised rows as
    rounded to T, one float32 GEMM per projection, one rounding at the end."""
    transposed = list(transposed) if transposed is not None else [False] * len(weights)
    biases = list(biases) if biases is not None else [None] * len(weights)
    if not (len(weights) == len(transposed) == len(biases)):
        raise ValueError("weights, biases and transposed must have one entry per projection")
    a = normed.astype(_F32)
    outputs = []
    for w, bias, t in zip(weights, biases, transposed):
        w32 = w.astype(_F32).T if t else w.astype(_F32)
        if w32.ndim != 2 or w32.shape[0] != a.shape[-1]:
            raise ValueError(f"weight shape {w.shape} (transposed={bool(t)}) does not match K={a.shape[-1]}")
        y = np.matmul(a, w32)
        if bias is not None:
            if tuple(bias.shape) != (w32.shape[1],):
                raise ValueError(f"bias shape {bias.shape} != [{w32.shape[1]}]")
            y = y + bias.astype(_F32)
        outputs.append(y.astype(normed.dtype))
    return outputs


def rms_norm_linear(x, scale, weights, biases=None, transposed=None, epsilon=1e-6):
    """RMSNormLinear: Yn = RMSNorm(X) (rounded to T); returns ([Y_i], Yn)."""
    normed = rms_norm(x, scale, epsilon, -1)
    return _projections(normed, weights, biases, transposed), normed


def add_rms_norm_linear(a, b, scale, weights, biases=None, transposed=None, epsilon=1e-6):
    """AddRMSNormLinear: S = A + B; Yn = RMSNorm(S); returns ([Y_i], S, Yn)."""
    normed, s = add_rms_norm(a, b, scale, epsilon, -1)
    return _projections(normed, weights, biases, transposed), s, normed


def layer_norm_linear(x, scale, norm_bias, weights, biases=None, transposed=None, epsilon=1e-5):
    """LayerNormLinear: Yn = LayerNorm(X) (rounded to T); returns ([Y_i], Yn)."""
    normed = layer_norm(x, scale, norm_bias, epsilon, -1)
    return _projections(normed, weights, biases, transposed), normed


def add_layer_norm_linear(a, b, scale, norm_bias, weights, biases=None, transposed=None, epsilon=1e-5):
    """AddLayerNormLinear: S = A + B; Yn = LayerNorm(S); returns ([Y_i], S, Yn)."""
    normed, s = add_layer_norm(a, b, scale, norm_bias, epsilon, -1)
    return _projections(normed, weights, biases, transposed), s, normed


# -- activation family: the exact formulas, in float64, rounded to the input's type once --------
_ERFC = np.frompyfunc(math.erfc, 1, 1)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _times_sigmoid(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """x * sigmoid(t) in float64, as x * e^t / (1 + e^t) where t < 0 (no cancellation, no overflow);
    an infinite x whose sigmoid goes to 0 gives the limit 0."""
    e = np.exp(-np.abs(t))
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.where(t < 0, x * e, x) / (1.0 + e)
        return np.where(np.isinf(x) & (t < 0), np.copysign(0.0, x), y)


def gelu_exact(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """Gelu in float64: x * Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2 ("none"), or
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) ("tanh")."""
    x64 = np.asarray(x, dtype=np.float64)
    if approximate == "tanh":
        with np.errstate(over="ignore", invalid="ignore"):
            t = 2.0 * _SQRT_2_OVER_PI * (x64 + 0.044715 * x64 ** 3)
        return _times_sigmoid(x64, np.where(np.isnan(t), x64, t))
    if approximate != "none":
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    phi = np.asarray(_ERFC(-x64 / math.sqrt(2.0)), dtype=np.float64) / 2.0  # rank 0: frompyfunc gives a float
    with np.errstate(invalid="ignore"):
        return np.where(np.isneginf(x64), -0.0, x64 * phi)


def quick_gelu_exact(x: np.ndarray, alpha: float = 1.702) -> np.ndarray:
    """QuickGelu in float64: x * sigmoid(alpha * x), alpha as a float32 attribute."""
    x64 = np.asarray(x, dtype=np.float64)
    alpha = float(np.float32(alpha))
    with np.errstate(invalid="ignore"):
        return _times_sigmoid(x64, alpha * x64 if alpha else np.zeros_like(x64))


def silu_exact(x: np.ndarray) -> np.ndarray:
    """SiLU in float64: x * sigmoid(x)."""
    x64 = np.asarray(x, dtype=np.float64)
    return _times_sigmoid(x64, x64)


def relu_squared_exact(x: np.ndarray) -> np.ndarray:
    """ReluSquared in float64: max(x, 0)^2 (NaN stays NaN)."""
    x64 = np.asarray(x, dtype=np.float64)
    r = np.where(x64 > 0.0, x64, np.where(np.isnan(x64), x64, 0.0))
    return r * r


def _gate_and_up(a: np.ndarray, b: np.ndarray | None, gate_half: int) -> tuple[np.ndarray, np.ndarray]:
    if b is not None:
        if gate_half != 0:
            raise ValueError("gate_half applies to the one-input form only")
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"A {a.dtype}{list(a.shape)} and B {b.dtype}{list(b.shape)} differ")
        return a, b
    if a.ndim == 0 or a.shape[-1] % 2:
        raise ValueError(f"A alone needs an even last dimension, got shape {list(a.shape)}")
    if gate_half not in (0, 1):
        raise ValueError(f"gate_half must be 0 or 1, got {gate_half}")
    halves = np.split(a, 2, axis=-1)
    return halves[gate_half], halves[1 - gate_half]


def swiglu_exact(a: np.ndarray, b: np.ndarray | None = None, gate_half: int = 0) -> np.ndarray:
    """SwiGLU in float64: SiLU(gate) * up; gate, up = A, B, or the halves of A's last axis."""
    gate, up = _gate_and_up(a, b, gate_half)
    return silu_exact(gate) * up.astype(np.float64)


def geglu_exact(a: np.ndarray, b: np.ndarray | None = None, gate_half: int = 0,
                approximate: str = "none") -> np.ndarray:
    """GeGLU in float64: Gelu(gate) * up."""
    gate, up = _gate_and_up(a, b, gate_half)
    return gelu_exact(gate, approximate) * up.astype(np.float64)


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    return gelu_exact(x, approximate).astype(x.dtype)


def quick_gelu(x: np.ndarray, alpha: float = 1.702) -> np.ndarray:
    return quick_gelu_exact(x, alpha).astype(x.dtype)


def silu(x: np.ndarray) -> np.ndarray:
    return silu_exact(x).astype(x.dtype)


def relu_squared(x: np.ndarray) -> np.ndarray:
    return relu_squared_exact(x).astype(x.dtype)


def swiglu(a: np.ndarray, b: np.ndarray | None = None, gate_half: int = 0) -> np.ndarray:
    return swiglu_exact(a, b, gate_half).astype(a.dtype)


def geglu(a: np.ndarray, b: np.ndarray | None = None, gate_half: int = 0, approximate: str = "none") -> np.ndarray:
    return geglu_exact(a, b, gate_half, approximate).astype(a.dtype)
