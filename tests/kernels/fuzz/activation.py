"""Fuzz cases of the activation family: Gelu, QuickGelu, SiLU, ReluSquared, SwiGLU, GeGLU (docs/ops.md)."""

from __future__ import annotations

import numpy as np
from cpu_isa import cpu_isas

from otfuse.verify import reference

from .case import (F64, FLOAT_TYPES, I64, MISSING_INPUT, TYPE_MISMATCH, X_TYPE_ERROR, Case, Empty, chance, dims,
                   environment, other_float, pick, values)

OPS = ("Gelu", "QuickGelu", "SiLU", "ReluSquared", "SwiGLU", "GeGLU")
GATED = ("SwiGLU", "GeGLU")
SPECIAL = [np.nan, 0.0, -0.0, 30.0, -30.0, 1e4, -1e4]
# The limits at infinities are the CPU kernels' contract (docs/ops.md); what aclnn gives there is not
# documented, and the CANN test double computes the textbook formula (inf * 0 = NaN).
INFINITIES = [np.inf, -np.inf]


def _data(rng: np.random.Generator, shape: list[int], t: np.dtype, backend: str) -> np.ndarray:
    """Normal values of a few units, now and then special ones (NaN, signed zeros, saturating
    magnitudes, on CPU infinities) scattered in."""
    x = values(rng, shape, t, float(pick(rng, [1.0, 3.0, 8.0])))
    if x.size and chance(rng, 0.3):
        flat = x.reshape(-1)
        at = rng.integers(0, flat.size, size=int(rng.integers(1, 6)))
        flat[at] = np.asarray(pick(rng, SPECIAL + (INFINITIES if backend == "cpu" else [])), np.float32).astype(t)
    return x


def _attributes(rng: np.random.Generator, op: str, two_inputs: bool) -> dict:
    attrs = {}
    if op in ("Gelu", "GeGLU") and chance(rng, 0.6):
        attrs["approximate"] = pick(rng, ["none", "tanh"])
    if op == "QuickGelu" and chance(rng, 0.7):
        attrs["alpha"] = float(pick(rng, [1.702, 1.0, -0.37, 0.0, 2.5e-3, 40.0]))
    if op in GATED and not two_inputs and chance(rng, 0.6):
        attrs["gate_half"] = int(pick(rng, [0, 1]))
    return attrs


def _expected(op: str, inputs: list[np.ndarray], attrs: dict) -> np.ndarray:
    x = inputs[0]
    if op == "Gelu":
        return reference.gelu(x, attrs.get("approximate", "none"))
    if op == "QuickGelu":
        return reference.quick_gelu(x, attrs.get("alpha", 1.702))
    if op == "SiLU":
        return reference.silu(x)
    if op == "ReluSquared":
        return reference.relu_squared(x)
    b = inputs[1] if len(inputs) > 1 else None
    if op == "SwiGLU":
        return reference.swiglu(x, b, attrs.get("gate_half", 0))
    return reference.geglu(x, b, attrs.get("gate_half", 0), attrs.get("approximate", "none"))


def _environment(rng: np.random.Generator, backend: str) -> dict[str, str]:
    """The baseline loops now and then (OTFUSE_CPU_ISA), or any variant this CPU runs (OTFUSE_ACTIVATION_ISA)."""
    env = environment(rng)
    if backend == "cpu" and not env and chance(rng, 0.4):
        env = {"OTFUSE_ACTIVATION_ISA": pick(rng, list(cpu_isas()))}
    return env


def valid(rng: np.random.Generator, op: str, backend: str) -> Case:
    gated = op in GATED
    two_inputs = gated and chance(rng, 0.4)
    shape = dims(rng, int(rng.integers(0 if not gated or two_inputs else 1, 5)))
    if shape and chance(rng, 0.4):
        shape[-1] = int(rng.integers(1, 300))  # vector bodies and tails of every length
    if gated and not two_inputs:
        shape[-1] *= 2  # the gate and up halves
    t = pick(rng, FLOAT_TYPES)
    inputs = [_data(rng, shape, t, backend) for _ in range(2 if two_inputs else 1)]
    attrs = _attributes(rng, op, two_inputs)
    return Case(op, inputs, attrs, 1, expected=[_expected(op, inputs, attrs)], env=_environment(rng, backend),
                threads=int(rng.integers(1, 3)), note=f"valid {shape} {t.name}{' A, B' if two_inputs else ''}")


def _attribute_mutation(rng: np.random.Generator, op: str, base: Case) -> tuple[dict, str] | None:
    """A bad attribute value for `op`, with the error regex; None when the op has none to spoil."""
    attrs = dict(base.attrs)
    if op in ("Gelu", "GeGLU") and chance(rng, 0.5):
        attrs["approximate"] = pick(rng, ["exact", "", "TANH", "erf"])
        return attrs, r"attribute 'approximate' must be \"none\" or \"tanh\""
    if op == "QuickGelu":
        attrs["alpha"] = float(pick(rng, [np.nan, np.inf, -np.inf]))
        return attrs, r"attribute 'alpha' must be finite"
    if op in GATED:
        if len(base.inputs) > 1:
            attrs["gate_half"] = 1
            return attrs, r"attribute 'gate_half' applies to the one-input form only"
        attrs["gate_half"] = int(pick(rng, [2, -1, 2**62]))
        return attrs, r"attribute 'gate_half' must be 0 or 1"
    return None


def _gated_mutation(rng: np.random.Generator, base: Case, t: np.dtype) -> tuple[list, str, bool]:
    """Gated operands that do not fit: (inputs, error regex, refused by ORT itself)."""
    a = base.inputs[0]
    if len(base.inputs) > 1:
        if chance(rng, 0.5):
            b = values(rng, list(a.shape) + [1] if chance(rng, 0.5) else [a.size + 1], t)
            return [a, b], r"B has shape", False
        return [a, base.inputs[1].astype(other_float(rng, t) if t != np.float32 else np.float16)], TYPE_MISMATCH, True
    odd = list(a.shape[:-1]) + [a.shape[-1] + 1]
    shape = pick(rng, [odd, []])
    return [values(rng, shape, t)], r"A alone must have an even last dimension", False


def invalid(rng: np.random.Generator, op: str, backend: str) -> Case:
    base = valid(rng, op, backend)
    t = base.inputs[0].dtype
    inputs, attrs, by_ort = list(base.inputs), dict(base.attrs), False
    mutation = pick(rng, ["attribute", "x_dtype", "missing_x", "huge_empty"] + (["operands"] * 2 if op in GATED else []))
    if mutation == "attribute" and (spoiled := _attribute_mutation(rng, op, base)) is not None:
        attrs, error = spoiled
    elif mutation == "operands":
        inputs, error, by_ort = _gated_mutation(rng, base, t)
    elif mutation == "missing_x":
        inputs = [None] + inputs[1:] if len(inputs) > 1 else [None, values(rng, [2], t)]
        if op not in GATED:  # a unary op takes one input: the extra one is the refusal
            inputs = [None]
        error, by_ort = MISSING_INPUT + r"|input 'A' is required|input 'X' is required", True
    elif mutation == "huge_empty":
        # [0, 2**62, 4]: no element, but the element count of the rows view must not overflow.
        inputs = [Empty((0, 2**62, 4), t)] + ([Empty((0, 2**62, 4), t)] if len(inputs) > 1 else [])
        attrs = {}
        error = r"overflow"
    else:
        mutation = "x_dtype"
        inputs = [x.astype(pick(rng, [F64, I64])) for x in inputs]
        error, by_ort = X_TYPE_ERROR + r"|Type 'tensor\(int64\)' of input parameter \(in0\)", True
    return Case(op, inputs, attrs, 1, error=error, by_ort=by_ort, env=base.env, threads=base.threads,
                note=f"invalid: {mutation}")
