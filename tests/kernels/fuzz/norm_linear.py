"""Fuzz cases of the norm + linear family: RMSNormLinear, AddRMSNormLinear, LayerNormLinear,
AddLayerNormLinear (docs/ops.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cpu_isa import cpu_isas

from otfuse.verify import reference

from .case import (F32, F64, FLOAT_TYPES, I64, MISSING_INPUT, X_TYPE_ERROR, Case, Const, Empty, chance, dims,
                   environment, other_float, pick, values)

OPS = ("RMSNormLinear", "AddRMSNormLinear", "LayerNormLinear", "AddLayerNormLinear")


@dataclass
class Draw:
    op: str
    add: bool
    layer: bool
    t: np.dtype
    lead: list[int]
    k: int
    widths: list[int]
    transposed: list[int]
    has_bias: list[int]
    const: bool
    keep: bool  # Yn is an output
    omit_sum: bool
    attrs: dict = field(default_factory=dict)
    x: list = field(default_factory=list)  # X, or A and B
    scale: np.ndarray | None = None
    norm_bias: np.ndarray | None = None  # LayerNorm forms; None: an empty name
    weights: list = field(default_factory=list)
    biases: list = field(default_factory=list)  # one per has_bias entry that is 1

    @property
    def n_outputs(self) -> int:
        return len(self.widths) + (1 if self.add else 0) + (1 if self.keep else 0)

    def inputs(self) -> list:
        wrap = Const if self.const else (lambda a: a)
        lead = self.x + [self.scale] + ([self.norm_bias] if self.layer else [])
        return lead + [wrap(w) if isinstance(w, np.ndarray) else w for w in self.weights] + [Const(b) for b in self.biases]

    def case(self, expected=None, **kw) -> Case:
        omit = frozenset({len(self.widths)}) if self.add and self.omit_sum else frozenset()
        return Case(self.op, self.inputs(), self.attrs, self.n_outputs, omit, expected, **kw)


def draw(rng: np.random.Generator, op: str, backend: str) -> Draw:
    add, layer = op.startswith("Add"), "Layer" in op
    ascend = backend == "ascend"
    t = pick(rng, FLOAT_TYPES)
    k = int(pick(rng, [1, 2, 3, 7, 16, 33, 64, 130, 257]))
    count = int(rng.integers(1, 4))
    w = Draw(op, add, layer, t, dims(rng, int(rng.integers(0, 3)), high=5), k,
             [int(pick(rng, [1, 3, 16, 17, 33, 40])) for _ in range(count)],
             [int(chance(rng, 0.4)) for _ in range(count)], [int(chance(rng, 0.5)) for _ in range(count)],
             chance(rng, 0.7), chance(rng, 0.4), False)
    w.omit_sum = add and w.keep and chance(rng, 0.5)  # S unnamed, Yn after it (S itself is always an output)
    shape = w.lead + [k]
    w.x = [values(rng, shape, t, 2.0, 0.5) for _ in range(2 if add else 1)]
    # aclnnAddRmsNorm takes gamma of the input's type; aclnn LayerNorm forms one type for both weights.
    w_type = t if ascend and add and not layer else pick(rng, [t, F32])
    w.scale = values(rng, [k], w_type, 0.5, 1.0)
    if layer and chance(rng, 0.7):
        w.norm_bias = values(rng, [k], w_type if ascend else pick(rng, [t, F32]), 0.5)
    w.weights = [values(rng, [n, k] if tr else [k, n], t, 0.1) for n, tr in zip(w.widths, w.transposed)]
    w.biases = [values(rng, [n], pick(rng, [t, F32]), 0.1) for n, b in zip(w.widths, w.has_bias) if b]
    w.attrs = {"out_features": list(w.widths)}
    if any(w.transposed) or chance(rng, 0.3):
        w.attrs["transposed"] = list(w.transposed)
    if any(w.has_bias) or chance(rng, 0.3):
        w.attrs["has_bias"] = list(w.has_bias)
    if chance(rng, 0.3):
        w.attrs["axis"] = -1
    if chance(rng, 0.5):
        w.attrs["epsilon"] = float(pick(rng, [1e-6, 1e-5, 0.1, 1.0]))
    return w


def expected(w: Draw) -> list[np.ndarray]:
    eps = {"epsilon": w.attrs["epsilon"]} if "epsilon" in w.attrs else {}
    biases = iter(w.biases)
    per_projection = [next(biases) if b else None for b in w.has_bias]
    tail = (w.weights, per_projection, w.transposed)
    if w.add and w.layer:
        ys, s, yn = reference.add_layer_norm_linear(*w.x, w.scale, w.norm_bias, *tail, **eps)
    elif w.add:
        ys, s, yn = reference.add_rms_norm_linear(*w.x, w.scale, *tail, **eps)
    elif w.layer:
        (ys, yn), s = reference.layer_norm_linear(*w.x, w.scale, w.norm_bias, *tail, **eps), None
    else:
        (ys, yn), s = reference.rms_norm_linear(*w.x, w.scale, *tail, **eps), None
    return ys + ([s] if w.add and not w.omit_sum else []) + ([yn] if w.keep else [])


def valid(rng: np.random.Generator, op: str, backend: str) -> Case:
    w = draw(rng, op, backend)
    if backend == "cpu" and chance(rng, 0.3):
        # More rows than the lead dims give: the [N, K] lane form's several vectors and chunks, and
        # past kStreamMaxRows (64) / kStreamMaxRowsAvx512 (256) the paired-tile streams, the deep
        # in-place tasks ([K, N]) and the packed ones (common/gemm.h), which no draw reached
        # before.
        w.lead = [int(pick(rng, [5, 16, 17, 33, 48, 64, 65, 100, 257, 300]))]
        w.x = [values(rng, w.lead + [w.k], w.t, 2.0, 0.5) for _ in w.x]
    env = environment(rng)
    if backend == "cpu" and not env and chance(rng, 0.3) and "avx2" in cpu_isas():
        # Each micro-kernel variant the CPU runs, whichever the dispatch prefers (AVX-512 at half rate
        # takes AVX2 by default).
        env = {"OTFUSE_GEMM_ISA": pick(rng, [isa for isa in ("avx2", "avx512") if isa in cpu_isas()])}
    if backend == "cpu" and chance(rng, 0.3):
        env = dict(env, OTFUSE_NORM_LINEAR_GEMM=pick(rng, ["own", "ort"]))  # float32 weights: either GEMM
    return w.case(expected(w), env=env, threads=int(rng.integers(1, 3)),
                  note=f"valid X {w.lead + [w.k]} widths {w.widths} {'const' if w.const else 'fed'} weights")


MUTATIONS = {
    "out_features_missing": ({"out_features": None}, r"attribute 'out_features' is required"),
    "out_features_zero": ({"out_features": "zero"}, r"every entry of 'out_features' must be > 0"),
    "transposed_length": ({"transposed": "long"}, r"attribute 'transposed' has \d+ entries"),
    "has_bias_two": ({"has_bias": "two"}, r"attribute 'has_bias' entries must be 0 or 1"),
    "axis": ({"axis": 0}, r"attribute 'axis' must be -1"),
    "epsilon": ({"epsilon": -1.0}, r"attribute 'epsilon' must be a finite number >= 0"),
}


def _mutate_attributes(w: Draw, mutation: str) -> str:
    changes, error = MUTATIONS[mutation]
    for name, value in changes.items():
        if value is None:
            w.attrs.pop(name)
        elif value == "zero":
            w.attrs[name] = [0] + w.widths[1:]
        elif value == "long":
            w.attrs[name] = list(w.transposed) + [0]
        elif value == "two":
            w.attrs[name] = [2] + w.has_bias[1:]
        else:
            w.attrs[name] = value
    return error


def invalid(rng: np.random.Generator, op: str, backend: str) -> Case:
    w = draw(rng, op, backend)
    mutations = list(MUTATIONS) + ["bias_missing", "w_shape", "w_dtype", "w_rank", "bias_shape", "bias_dtype",
                                   "k_zero", "scalar", "outputs_many", "scale_shape", "huge_empty", "huge_width",
                                   "x_dtype", "missing_scale"]
    if w.layer:
        mutations.append("norm_bias_shape")
    if w.add:
        mutations.append("b_shape")
    mutation = pick(rng, mutations)
    by_ort = False
    if mutation in MUTATIONS:
        error = _mutate_attributes(w, mutation)
    elif mutation == "bias_missing":
        w.has_bias[0] = 1
        w.attrs["has_bias"] = list(w.has_bias)
        w.biases = w.biases[:sum(w.has_bias) - 1]
        error = r"expected \d+ inputs \(\d+ norm inputs, \d+ weights, \d+ biases\), got"
    elif mutation == "w_shape":
        w.weights[0] = values(rng, [w.k + 1, w.widths[0]], w.t)
        w.transposed[0] = 0
        w.attrs["transposed"] = list(w.transposed)
        error = r"W\d has shape"  # (constant weights take K from W1, so W2 may be the one that differs)
    elif mutation == "w_dtype":
        w.weights[-1] = w.weights[-1].astype(pick(rng, [I64, F64, other_float(rng, w.t)] + ([F32] if w.t != F32 else [])))
        error = r"W\d has element type"
    elif mutation == "w_rank":
        w.weights[0] = values(rng, [1] + list(w.weights[0].shape), w.t)
        error = r"W1 (must be a matrix|has shape)"
    elif mutation == "bias_shape":
        w.has_bias[0] = 1
        w.attrs["has_bias"] = list(w.has_bias)
        w.biases = [values(rng, [w.widths[0] + 1], w.t)] + [values(rng, [n], w.t) for n, b in
                                                             zip(w.widths[1:], w.has_bias[1:]) if b]
        error = r"bias1 has shape"
    elif mutation == "bias_dtype":
        w.has_bias = [1] * len(w.widths)
        w.attrs["has_bias"] = list(w.has_bias)
        w.biases = [values(rng, [n], pick(rng, [I64, F64, other_float(rng, w.t)])) for n in w.widths]
        error = r"bias1 has element type"
    elif mutation == "k_zero":
        w.k = 0
        w.x = [values(rng, w.lead + [0], w.t) for _ in w.x]
        w.scale = values(rng, [0], w.scale.dtype)
        w.norm_bias = None
        w.weights = [values(rng, [n, 0] if tr else [0, n], w.t) for n, tr in zip(w.widths, w.transposed)]
        error = r"has an empty last dimension"
    elif mutation == "scalar":
        w.x = [np.ones((), w.t) for _ in w.x]
        error = r"must have rank >= 1"
    elif mutation == "outputs_many":
        w.keep = True
        return Case(op, w.inputs(), w.attrs, w.n_outputs + 1, error=r"expected \d+ or \d+ outputs, got \d+",
                    env=environment(rng), note=f"invalid: {mutation}")
    elif mutation == "scale_shape":
        w.scale = values(rng, [w.k + 1], w.scale.dtype)
        error = r"scale has shape"
    elif mutation == "norm_bias_shape":
        w.norm_bias = values(rng, [1, w.k], w.scale.dtype)
        error = r"norm_bias has shape"
    elif mutation == "b_shape":
        w.x[1] = values(rng, [1] + list(w.x[0].shape), w.t)
        error = r"B has shape"
    elif mutation == "huge_empty":  # [0, 2**62, 4]: its strides overflow
        w.k = 4
        w.x = [Empty((0, 2**62, 4), F32) for _ in w.x]
        w.scale = values(rng, [4], F32)
        w.norm_bias = values(rng, [4], F32) if w.norm_bias is not None else None
        w.weights = [values(rng, [n, 4] if tr else [4, n], F32) for n, tr in zip(w.widths, w.transposed)]
        w.biases = [b.astype(F32) for b in w.biases]
        error = r"overflow int64"
    elif mutation == "huge_width":
        w.attrs["out_features"] = [2**62] + w.widths[1:]
        error = r"W1 has shape"
    elif mutation == "x_dtype":
        w.x = [x.astype(F64) for x in w.x]
        error, by_ort = X_TYPE_ERROR, True
    else:  # missing_scale
        w.scale = None
        error, by_ort = MISSING_INPUT, True
    return w.case(error=error, by_ort=by_ort, env=environment(rng), note=f"invalid: {mutation}")
