"""Fuzz cases of the rotary family: RotaryEmbedding, RotaryEmbeddingQK (docs/ops.md)."""

from __future__ import annotations

import numpy as np

from otfuse.verify import reference

from .case import (F32, F64, FLOAT_TYPES, I64, INT64_MAX, MISSING_INPUT, TYPE_MISMATCH, X_TYPE_ERROR, Case, Empty,
                   chance, dims, environment, other_float, pick, values)

OPS = ("RotaryEmbedding", "RotaryEmbeddingQK")
# Ascend: aclnnRotaryPositionEmbedding takes only some cos/sin broadcast forms (docs/ops.md).
ASCEND_FORM_REFUSAL = r"aclnnRotaryPositionEmbedding cannot (express|take) .*\(run this node on CPU\)"


def split_even(rng: np.random.Generator, total: int) -> list[int]:
    """`total` (even) cut into a few even widths, zeros allowed."""
    cuts = sorted(int(c) * 2 for c in rng.integers(0, total // 2 + 1, size=int(rng.integers(1, 4))))
    bounds = [0] + cuts + [total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def broadcast_shape(rng: np.random.Generator, lead: list[int], r: int) -> list[int]:
    """A cos/sin shape that broadcasts to lead + [r]: some leading dims dropped, others 1 or kept."""
    kept = lead[int(rng.integers(0, len(lead) + 1)):]
    return [d if chance(rng, 0.5) else 1 for d in kept] + [r]


def _attrs(rng: np.random.Generator, d: int) -> tuple[dict, int]:
    attrs = {}
    if chance(rng, 0.5):
        attrs["mode"] = pick(rng, ["half", "interleaved"])
    if d % 2 or chance(rng, 0.4):
        attrs["rotary_dim"] = 2 * int(rng.integers(0 if d % 2 == 0 else 1, d // 2 + 1))
    r = attrs.get("rotary_dim") or d
    if chance(rng, 0.3) and r > 0:
        attrs["sections"] = split_even(rng, r)
    return attrs, r


def _expected(op: str, tensors: list[np.ndarray], cos, sin, attrs: dict) -> list[np.ndarray]:
    kw = {"mode": attrs.get("mode", "half"), "rotary_dim": attrs.get("rotary_dim", 0),
          "sections": attrs.get("sections", ())}
    if op == "RotaryEmbedding":
        return [reference.rotary_embedding(tensors[0], cos, sin, **kw)]
    return list(reference.rotary_embedding_qk(tensors[0], tensors[1], cos, sin, **kw))


def valid(rng: np.random.Generator, op: str, backend: str) -> Case:
    rank = int(rng.integers(2, 6))
    d = int(pick(rng, [0, 2, 4, 6, 8, 16, 18, 5, 7, 34, 64, 128, 128, 130]))  # 128: aclnnApplyRotaryPosEmbV2
    lead = dims(rng, rank - 1, high=5)
    attrs, r = _attrs(rng, d)
    t = pick(rng, FLOAT_TYPES)
    cos_shape = broadcast_shape(rng, lead, r)
    c_type = pick(rng, [t, F32])
    cos, sin = values(rng, cos_shape, c_type), values(rng, cos_shape, c_type)
    tensors = [values(rng, lead + [d], t)]
    if op == "RotaryEmbeddingQK":
        # K may differ from Q along the dims cos/sin broadcast over (the heads, typically).
        k_lead = list(lead)
        offset = len(lead) - (len(cos_shape) - 1)
        for j in range(len(lead)):
            if j < offset or cos_shape[j - offset] == 1:
                k_lead[j] = int(rng.integers(1, 5)) if chance(rng, 0.5) else lead[j]
        tensors.append(values(rng, k_lead + [d], t))
    return Case(op, tensors + [cos, sin], attrs, len(tensors), expected=_expected(op, tensors, cos, sin, attrs),
                may_refuse=ASCEND_FORM_REFUSAL if backend == "ascend" else None, env=environment(rng),
                threads=int(rng.integers(1, 3)), note=f"valid X {lead + [d]} cos {cos_shape}")


def invalid(rng: np.random.Generator, op: str, backend: str) -> Case:
    base = valid(rng, op, backend)
    count = base.n_outputs
    tensors, (cos, sin) = list(base.inputs[:count]), base.inputs[count:]
    attrs = dict(base.attrs)
    x = tensors[0]
    d = x.shape[-1]
    r = attrs.get("rotary_dim") or d
    mutations = ["x_rank1", "cos_rank", "cos_last", "cos_dim", "cos_scalar", "sin_shape", "sin_dtype", "cos_dtype",
                 "mode", "mode_int", "rotary_dim_odd", "rotary_dim_large", "odd_d", "sections_odd", "sections_sum",
                 "sections_overflow", "x_dtype", "missing_cos", "huge_empty"]
    if op == "RotaryEmbeddingQK":
        mutations += ["k_last", "k_dtype"]
    mutation = pick(rng, mutations)
    error, by_ort = None, False
    if mutation == "x_rank1":
        tensors = [values(rng, [d], x.dtype) for _ in tensors]
        cos, sin = values(rng, [r], cos.dtype), values(rng, [r], cos.dtype)
        error = r"has shape \[\d+\]; expected rank >= 2"
    elif mutation == "cos_rank":
        cos = values(rng, [1] * x.ndim + [r], cos.dtype)
        sin = values(rng, cos.shape, cos.dtype)
        error = r"cos has shape .* more than \w's rank"
    elif mutation == "cos_last":  # 1: broadcastable, but the contract wants exactly r lanes
        cos = values(rng, list(cos.shape[:-1]) + [pick(rng, [r + 2, 1]) if r != 1 else 3], cos.dtype)
        sin = values(rng, cos.shape, cos.dtype)
        error = r"cos has shape .* but its last dim must be r"
    elif mutation == "cos_dim":
        shape = [1] * (x.ndim - 1) + [r]
        j = int(rng.integers(x.ndim - 1))
        shape[j] = x.shape[j] + 1 if x.shape[j] != 0 else 2
        cos, sin = values(rng, shape, cos.dtype), values(rng, shape, cos.dtype)
        error = r"cos has shape .*does not broadcast"
    elif mutation == "cos_scalar":
        cos, sin = np.ones((), cos.dtype), np.ones((), cos.dtype)
        error = r"cos must have rank >= 1"
    elif mutation == "sin_shape":
        sin = values(rng, [2] + list(cos.shape), cos.dtype)
        error = r"sin has shape .* but must equal cos\.shape"
    elif mutation == "sin_dtype":
        sin = sin.astype(pick(rng, [t for t in FLOAT_TYPES + (F64,) if t != cos.dtype]))
        error = r"sin has element type .* but cos has"
    elif mutation == "cos_dtype":
        cos = cos.astype(pick(rng, [I64, F64, other_float(rng, x.dtype)]))
        sin = sin.astype(cos.dtype)
        error = r"cos has element type"
    elif mutation == "mode":
        attrs["mode"] = pick(rng, ["full", "", "HALF"])
        error = r"attribute 'mode' must be \"half\" or \"interleaved\""
    elif mutation == "mode_int":
        attrs["mode"] = 1
        error = r"attribute 'mode' must be a string"
    elif mutation == "rotary_dim_odd":
        attrs["rotary_dim"] = int(pick(rng, [1, 3, -2, -1, INT64_MAX]))
        error = r"attribute 'rotary_dim' must be even and >= 0"
    elif mutation == "rotary_dim_large":
        attrs["rotary_dim"] = int(pick(rng, [d + 2 - d % 2, 2**62]))
        attrs.pop("sections", None)
        error = r"rotary_dim \d+ is larger than"
    elif mutation == "odd_d":
        tensors = [values(rng, list(t.shape[:-1]) + [2 * (d // 2) + 1], t.dtype) for t in tensors]
        attrs.pop("rotary_dim", None)
        attrs.pop("sections", None)
        error = r"which is odd; r must be even"
    elif mutation == "sections_odd":
        attrs["sections"] = pick(rng, [[1, r - 1], [-2, r + 2], [3]])
        error = r"sections' .* must hold even widths >= 0"
    elif mutation == "sections_sum":
        attrs["sections"] = [r + 2]
        error = r"sections' .* sums to"
    elif mutation == "sections_overflow":
        attrs["sections"] = [2**62] * 4  # the sum wraps to 0
        attrs.pop("rotary_dim", None)
        error = r"sections' sum overflows int64"
    elif mutation == "x_dtype":
        tensors = [t.astype(F64) for t in tensors]
        error, by_ort = X_TYPE_ERROR, True
    elif mutation == "missing_cos":
        cos = None
        error, by_ort = MISSING_INPUT, True
    elif mutation == "huge_empty":
        tensors = [Empty((0, 2**62, 4), F32) for _ in tensors]
        cos, sin = np.ones(4, np.float32), np.zeros(4, np.float32)
        attrs = {}
        error = r"overflow int64"
    elif mutation == "k_last":
        tensors[1] = values(rng, list(tensors[1].shape[:-1]) + [d + 2], x.dtype)
        error = r"Q has head dim \d+ \(last dim\) but K has"
    elif mutation == "k_dtype":
        tensors[1] = tensors[1].astype(pick(rng, [t for t in (np.float16, np.float32) if t != x.dtype]))
        error, by_ort = TYPE_MISMATCH, True
    return Case(op, tensors + [cos, sin], attrs, count, error=error, by_ort=by_ort, env=base.env,
                threads=base.threads, note=f"invalid: {mutation}")
