"""Symbolic values of small integer tensors (shapes, sizes, indices) as numpy object arrays whose
items are expressions (``expr.Expr``) or None where the item is not known."""

from __future__ import annotations

import numpy as np
import onnx

from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.dims.expr import Expr

# Values are tracked up to this many items: shape arithmetic, not data.
MAX_ITEMS = 256

INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
             onnx.TensorProto.UINT64, onnx.TensorProto.UINT32, onnx.TensorProto.UINT16, onnx.TensorProto.UINT8}
BOOL = onnx.TensorProto.BOOL
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
               onnx.TensorProto.DOUBLE}


def from_numbers(array: np.ndarray) -> np.ndarray | None:
    """A constant as a symbolic value: integers and bools; floats only when every item is whole."""
    array = np.asarray(array)
    if array.size > MAX_ITEMS:
        return None
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            return None
    elif array.dtype.kind not in "iub":
        return None
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1).tolist()):
        flat[i] = E.const(int(item))
    return out


def of_items(items, shape=None) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out.reshape(shape) if shape is not None else out


def numbers(value: np.ndarray | None) -> list[int] | None:
    """The items as Python ints (flattened), when every one is a known number."""
    if value is None:
        return None
    out = []
    for item in value.reshape(-1):
        n = None if item is None else item.value
        if n is None:
            return None
        out.append(n)
    return out


def to_numpy(value: np.ndarray | None, elem_type: int) -> np.ndarray | None:
    """The value as a numpy array of ``elem_type`` when every item is a number."""
    items = numbers(value)
    if items is None or not elem_type:
        return None
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    except (KeyError, ValueError, TypeError):
        return None
    return np.array(items, dtype=dtype).reshape(value.shape)


def _lifted(fn):
    def apply(*items):
        if any(item is None for item in items):
            return None
        return fn(*items)
    return np.frompyfunc(apply, 2, 1)


def _div(a: Expr, b: Expr) -> Expr | None:
    return E.trunc_div(a, b)


def _mod(a: Expr, b: Expr) -> Expr | None:
    """Known non-negative integers only (TorchScript's `unflatten` computes `Mod(4, 3)`): there
    ONNX's two Mod semantics (fmod 0 / 1) and Python's `%` agree."""
    x, y = a.value, b.value
    if x is None or y is None or x < 0 or y <= 0:
        return None
    return E.const(x % y)


def _compare(op: str):
    def compare(a: Expr, b: Expr) -> Expr | None:
        d = E.sub(a, b).value
        if d is None:
            if op == "eq" and _provably_different(a, b):
                return E.ZERO
            return None
        truth = {"eq": d == 0, "lt": d < 0, "gt": d > 0, "le": d <= 0, "ge": d >= 0}[op]
        return E.ONE if truth else E.ZERO
    return compare


def _provably_different(a: Expr, b: Expr) -> bool:
    """A dim (>= 0) against a negative number, e.g. ``shape == -1`` of ``Where(shape == -1, 1, shape)``."""
    for x, y in ((a, b), (b, a)):
        if x.nonneg and y.value is not None and y.value < 0:
            return True
    return False


def _logical(op: str):
    def logical(a: Expr, b: Expr) -> Expr | None:
        x, y = a.value, b.value
        if op == "and":
            if x == 0 or y == 0:
                return E.ZERO
            return E.ONE if x is not None and y is not None else None
        if x not in (None, 0) or y not in (None, 0):
            return E.ONE
        return E.ZERO if x is not None and y is not None else None
    return logical


BINARY = {
    "Add": _lifted(E.add),
    "Sub": _lifted(E.sub),
    "Mul": _lifted(E.mul),
    "Div": _lifted(_div),
    "Mod": _lifted(_mod),
    "Max": _lifted(lambda a, b: E.maximum(a, b)),
    "Min": _lifted(lambda a, b: E.minimum(a, b)),
    "Equal": _lifted(_compare("eq")),
    "Less": _lifted(_compare("lt")),
    "Greater": _lifted(_compare("gt")),
    "LessOrEqual": _lifted(_compare("le")),
    "GreaterOrEqual": _lifted(_compare("ge")),
    "And": _lifted(_logical("and")),
    "Or": _lifted(_logical("or")),
}


def binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    try:
        result = BINARY[op](a, b)
    except ValueError:  # shapes that do not broadcast
        return None
    result = np.asarray(result, dtype=object)
    return result if result.size <= MAX_ITEMS else None


def unary(fn, a: np.ndarray) -> np.ndarray:
    out = np.empty(a.shape, dtype=object)
    flat, src = out.reshape(-1), a.reshape(-1)
    for i, item in enumerate(src):
        flat[i] = None if item is None else fn(item)
    return out


def where(cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    try:
        c, a, b = np.broadcast_arrays(cond, x, y)
    except ValueError:
        return None
    out = np.empty(c.shape, dtype=object)
    flat = out.reshape(-1)
    for i, (ci, ai, bi) in enumerate(zip(c.reshape(-1), a.reshape(-1), b.reshape(-1))):
        pick = None if ci is None else ci.value
        if pick is None:
            flat[i] = ai if ai is not None and ai == bi else None
        else:
            flat[i] = ai if pick else bi
    return out if out.size <= MAX_ITEMS else None


def as_bool(item: Expr) -> Expr | None:
    if item.value is not None:
        return E.ONE if item.value else E.ZERO
    return E.ONE if E.sub(item, E.ONE).nonneg else None  # provably >= 1
