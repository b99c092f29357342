"""What one fuzz case is, and the random pieces the family generators share."""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I64 = np.dtype(np.int64)
I32 = np.dtype(np.int32)
BOOL = np.dtype(bool)
FLOAT_TYPES = (F32, F16, BF16)
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

# What ORT itself says when it refuses a node before any kernel sees it (a schema check).
X_TYPE_ERROR = r"Type 'tensor\(double\)' of input parameter \(in0\) of operator"  # no kernel for that T
# Inputs of one T given two types (a double one has no kernel at all).
TYPE_MISMATCH = r"type inferencing error\]: no kernel def match|Type 'tensor\(double\)' of input parameter"
MISSING_INPUT = r"has input size \d+ not in range|input \d+ is marked single but has an empty string"


@dataclass(frozen=True)
class Const:
    """An input given as a constant initializer (the norm + linear weights are packed from those)."""

    array: np.ndarray


@dataclass(frozen=True)
class Empty:
    """A zero-element input of any shape, made in the graph: numpy cannot hold [0, 2**62, 4]."""

    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class ShapeOnly:
    """An expected output known only by its shape (an empty output too large for numpy)."""

    shape: tuple[int, ...]


Input = np.ndarray | Const | Empty | None
Expected = np.ndarray | ShapeOnly


@dataclass
class Case:
    op: str
    inputs: list[Input]         # in the op's order; None = absent (an empty name), trailing ones dropped
    attrs: dict
    n_outputs: int              # outputs the node declares
    omit: frozenset[int] = frozenset()  # outputs left unnamed
    expected: list[Expected] | None = None  # valid case: the named outputs, in order
    error: str | None = None    # invalid case: a regex the ORT error must match
    by_ort: bool = False        # refused by ORT itself (a type or arity check), not by the kernel
    may_refuse: str | None = None  # valid case: a documented refusal (regex) the backend may give instead
    env: dict[str, str] = field(default_factory=dict)  # kernel knobs, read at session creation
    threads: int = 1
    note: str = ""              # what was generated or mutated, for failure messages

    def describe(self) -> str:
        shapes = [None if i is None else list(_shape(i)) for i in self.inputs]
        return f"{self.op} {self.note}: inputs {shapes}, attrs {self.attrs}, env {self.env}"


def _shape(spec: Input) -> tuple[int, ...]:
    if isinstance(spec, Const):
        return spec.array.shape
    return spec.shape


def dtype_of(spec: Input) -> np.dtype:
    if isinstance(spec, Const):
        return spec.array.dtype
    return np.dtype(spec.dtype)


def pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def chance(rng: np.random.Generator, p: float) -> bool:
    return bool(rng.random() < p)


def values(rng: np.random.Generator, shape, dtype, scale: float = 1.0, offset: float = 0.0) -> np.ndarray:
    """Random values of `dtype` (float or integer), exactly representable in it."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iub":
        return np.asarray(rng.integers(0, 2, size=shape)).astype(dtype)
    return np.asarray(rng.standard_normal(shape) * scale + offset, np.float32).astype(dtype)  # 0-d: an array too


def dims(rng: np.random.Generator, rank: int, high: int = 6, zero: float = 0.05) -> list[int]:
    """A random shape: small dims, now and then a zero."""
    return [0 if chance(rng, zero) else int(rng.integers(1, high + 1)) for _ in range(rank)]


def other_float(rng: np.random.Generator, dtype: np.dtype) -> np.dtype:
    """A float type other than `dtype` and float32 (a half type of the wrong kind), or float64."""
    return pick(rng, [t for t in (F16, BF16, F64) if t not in (dtype, F32)])


def environment(rng: np.random.Generator) -> dict[str, str]:
    """The baseline row loops now and then, instead of the AVX2 ones."""
    return {"OTFUSE_CPU_ISA": "baseline"} if chance(rng, 0.3) else {}
