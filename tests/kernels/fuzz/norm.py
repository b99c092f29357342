"""Fuzz cases of the norm family: RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm (docs/ops.md)."""

from __future__ import annotations

import numpy as np

from otfuse.verify import reference

from .case import (F32, F64, FLOAT_TYPES, I64, INT64_MAX, INT64_MIN, MISSING_INPUT, TYPE_MISMATCH, X_TYPE_ERROR, Case, Empty, chance, dims,
                   environment, other_float, pick, values)

OPS = ("RMSNorm", "AddRMSNorm", "LayerNorm", "AddLayerNorm")


def _kind(op: str) -> tuple[bool, bool]:
    return op.startswith("Add"), "Layer" in op


def _expected(op: str, inputs: list, attrs: dict, omit: frozenset) -> list[np.ndarray]:
    add, layer = _kind(op)
    kw = {k: attrs[k] for k in ("epsilon", "axis") if k in attrs}
    if add:
        a, b, scale, *bias = inputs
        if layer:
            out = reference.add_layer_norm(a, b, scale, bias[0] if bias else None, **kw)
        else:
            out = reference.add_rms_norm(a, b, scale, **kw)
    else:
        x, scale, *bias = inputs
        out = (reference.layer_norm(x, scale, bias[0] if bias else None, **kw) if layer
               else reference.rms_norm(x, scale, **kw),)
    return [o for i, o in enumerate(out) if i not in omit]


def valid(rng: np.random.Generator, op: str, backend: str) -> Case:
    add, layer = _kind(op)
    rank = int(rng.integers(1, 5))
    shape = dims(rng, rank)
    if chance(rng, 0.3):
        shape[-1] = int(rng.integers(7, 300))  # vector bodies and scalar tails
    axis = int(rng.integers(-rank, rank))
    t = pick(rng, FLOAT_TYPES)
    # aclnnAddRmsNorm takes gamma of the input's type only (a documented refusal, not fuzzed here).
    w_type = t if backend == "ascend" and add and not layer else pick(rng, [t, F32])
    row = shape[axis % rank:]
    inputs = [values(rng, shape, t, 2.0, 0.5) for _ in range(2 if add else 1)]
    inputs.append(values(rng, row, w_type, 0.5, 1.0))
    if layer and chance(rng, 0.7):
        # aclnn LayerNorm forms take both weights of one type; the CPU kernel mixes them.
        inputs.append(values(rng, row, w_type if backend == "ascend" else pick(rng, [t, F32]), 0.5))
    elif layer and chance(rng, 0.5):
        inputs.append(None)  # bias as an empty name
    attrs = {}
    if axis != -1 or chance(rng, 0.5):
        attrs["axis"] = axis
    if chance(rng, 0.6):
        attrs["epsilon"] = float(pick(rng, [1e-6, 1e-5, 1e-3, 0.5, 1.0, 1e30] + ([] if layer else [0.0])))
    omit = frozenset({1}) if add and chance(rng, 0.3) else frozenset()
    ref_inputs = [i for i in inputs if i is not None]
    return Case(op, inputs, attrs, 2 if add else 1, omit, _expected(op, ref_inputs, attrs, omit),
                env=environment(rng), threads=int(rng.integers(1, 3)), note=f"valid {shape} axis {axis}")


def _empty_with_huge_dims(op: str, add: bool, layer: bool) -> Case:
    """[0, 2**62, 4]: zero elements, but its strides (2**62 * 4) overflow int64."""
    x = Empty((0, 2**62, 4), F32)
    inputs = [x, x] if add else [x]
    inputs += [np.ones(4, np.float32)] + ([np.zeros(4, np.float32)] if layer else [])
    return Case(op, inputs, {}, 2 if add else 1, error=r"overflow int64", note="empty X with dims 2**62 x 4")


def invalid(rng: np.random.Generator, op: str, backend: str) -> Case:
    add, layer = _kind(op)
    base = valid(rng, op, backend)
    x = base.inputs[0]
    rank = x.ndim
    axis = base.attrs.get("axis", -1) % rank
    scale_at = 2 if add else 1
    row = list(x.shape[axis:])
    inputs = list(base.inputs)
    attrs = dict(base.attrs)
    mutations = ["scale_shape", "scale_rank", "axis", "epsilon", "epsilon_int", "axis_float", "scalar",
                 "scale_dtype", "x_dtype", "missing_scale", "too_few_inputs", "huge_empty"]
    if layer:
        mutations += ["bias_shape", "bias_dtype"]
    if add:
        mutations += ["b_shape", "b_dtype"]
    if backend == "ascend":
        mutations.append("rank9")
    mutation = pick(rng, mutations)
    error, by_ort = None, False
    if mutation == "scale_shape":
        bad = row[:] if row else [1]
        bad[int(rng.integers(len(bad)))] += int(rng.integers(1, 3))
        inputs[scale_at] = values(rng, bad, F32)
        error = r"scale has shape"
    elif mutation == "scale_rank":
        inputs[scale_at] = values(rng, [1] + row, F32)
        error = r"scale has shape"
    elif mutation == "bias_shape":
        inputs = inputs[:scale_at + 1] + [values(rng, row + [2], F32)]
        error = r"bias has shape"
    elif mutation == "b_shape":
        inputs[1] = values(rng, list(x.shape) + [1], x.dtype) if chance(rng, 0.5) else values(rng, [1], x.dtype)
        error = r"B has shape"
    elif mutation == "axis":
        attrs["axis"] = int(pick(rng, [rank, -rank - 1, 2**62, -(2**62), INT64_MAX, INT64_MIN]))
        error = r"axis -?\d+ is out of range"
    elif mutation == "epsilon":
        attrs["epsilon"] = float(pick(rng, [-1e-3, float("nan"), float("inf"), -float("inf")]))
        error = r"attribute 'epsilon' must be a finite number >= 0"
    elif mutation == "epsilon_int":
        attrs["epsilon"] = 1
        error = r"attribute 'epsilon' must be a float"
    elif mutation == "axis_float":
        attrs["axis"] = 1.5
        error = r"attribute 'axis' must be an int"
    elif mutation == "scalar":
        inputs[:scale_at] = [np.asarray(i.flat[0] if i.size else 1, i.dtype).reshape(()) for i in inputs[:scale_at]]
        inputs[scale_at] = np.ones((), inputs[scale_at].dtype)
        inputs = inputs[:scale_at + 1]
        attrs.pop("axis", None)
        error = r"axis -1 is out of range for a rank-0 input"
        if backend == "ascend":
            error += r"|takes inputs of rank 1 to 8; \w has rank 0"
    elif mutation == "scale_dtype":
        inputs[scale_at] = values(rng, row, pick(rng, [I64, F64, other_float(rng, x.dtype)]))
        error = r"scale has element type"
    elif mutation == "bias_dtype":
        inputs = inputs[:scale_at + 1] + [values(rng, row, pick(rng, [I64, F64, other_float(rng, x.dtype)]))]
        error = r"bias has element type"
    elif mutation == "x_dtype":
        inputs[:scale_at] = [i.astype(F64) for i in inputs[:scale_at]]
        error, by_ort = X_TYPE_ERROR, True
    elif mutation == "b_dtype":
        inputs[1] = inputs[1].astype(other_float(rng, x.dtype) if x.dtype != F32 else pick(rng, [np.float16, F64]))
        error, by_ort = TYPE_MISMATCH, True
    elif mutation == "missing_scale":
        inputs[scale_at] = None
        error, by_ort = MISSING_INPUT, True
    elif mutation == "too_few_inputs":
        inputs = inputs[:scale_at]
        error, by_ort = MISSING_INPUT, True
    elif mutation == "huge_empty":
        return _empty_with_huge_dims(op, add, layer)
    elif mutation == "rank9":
        shape = [1] * 8 + [3]
        inputs[:scale_at] = [values(rng, shape, x.dtype) for _ in range(scale_at)]
        inputs[scale_at] = values(rng, [3], inputs[scale_at].dtype)
        inputs = inputs[:scale_at + 1]
        attrs.pop("axis", None)
        error = r"takes inputs of rank 1 to 8"
    return Case(op, inputs, attrs, base.n_outputs, base.omit, error=error, by_ort=by_ort, env=base.env,
                threads=base.threads, note=f"invalid: {mutation}")
