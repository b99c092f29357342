"""Realistic, seeded inputs for a model, built from its graph inputs alone (weights never loaded).

Dimensions
  ``--dims`` maps names to sizes (``batch=2,seq=64``). A key is either an exact symbolic dim name
  of the model (``sequence_length=64``) or one of the classes ``batch``, ``seq``, ``past``,
  ``total``. Exact names win. A symbolic dim is classified by its name, case-insensitively:

  * an expression (``past_sequence_length + 1``) is evaluated from its resolved names;
  * contains ``total`` (or ``all_seq``) -> ``total``, default ``past + seq``;
  * contains ``past``/``cache``/``history`` -> ``past`` (cached length), default ``seq`` when
    the model has past key/value inputs (so the cache is non-empty), else 0;
  * contains ``seq``/``len``/``token``/``step``/``time``/``position`` -> ``seq``, default 16;
  * contains ``batch`` or is ``b``/``n``/``bs``/``bsz`` -> ``batch``, default 1;
  * any other name -> 1.

  An unnamed dim (or an exporter-made one: ``unk__7``, ``s0``, ``dim_2``,
  ``input_ids_dynamic_axes_1``) is classified by position:
  axis 0 is ``batch``; the last axis of a 2-D token input (ids, mask, positions, token types) is
  ``seq`` (``total`` for a mask when the model has past key/values); axis 2 of a 4-D past key/value is ``past``; axis 1 of a 3-D float input is ``seq``;
  anything else is 1. A name resolves once, so every input that shares it gets the same size.

Values, by input name and element type
  * ``*mask*`` -> ones (``True`` for bool), except a 2-D integer or bool mask ``[B, T]`` with
    ``B >= 2``: batch row ``b`` ends in ``min(b, T - 1)`` zeros (right padding), so that the
    padding a fusion claims is exercised by every diff and every validation, while every query
    row still sees a key (a row that sees none is degenerate: docs/ops.md, ``empty_rows``);
  * ``position_ids``/``cache_position`` (integer, name contains ``position``) -> ``arange`` over
    the last axis, broadcast;
  * ``token_type_ids``/``segment_ids`` -> zeros;
  * other integers (``input_ids`` ...) -> uniform in ``[0, vocab)``, ``vocab`` being the first dim
    of the embedding table: the initializer (or Constant) a ``Gather`` indexes with this input,
    possibly through Cast/Reshape/Unsqueeze/Squeeze/Flatten/Identity; 100 when none is found;
  * float past key/values (name contains ``past``/``cache``/``key_values``) -> normal * 0.1;
  * other floats -> standard normal * 0.5;
  * bool -> ``True``.

Each input draws from its own generator seeded by ``(seed, name)``, so adding an input does not
change the others.
"""

from __future__ import annotations

import ast
import operator
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from otfuse.errors import OtfuseError
from otfuse.rewriter.model_io import graph_inputs, load_model

DEFAULT_BATCH = 1
DEFAULT_SEQ = 16
DEFAULT_OTHER = 1
DEFAULT_VOCAB = 100
DIM_CLASSES = ("batch", "seq", "past", "total")

_INDEX_PASSTHROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"}
# Exporter-made names that say nothing about the dim (ORT's unk__N, dynamo's sN, legacy torch's
# <input>_dynamic_axes_N): classify these by position instead.
_ANONYMOUS_DIM = re.compile(r"^(unk__\d+|s\d+|dim_?\d+|\d+|.*dynamic_axes_\d+)?$")
_TOKEN_INPUT = re.compile(r"ids|mask|position|token_type")
_PAST_INPUT = re.compile(r"past|cache|key_values|present")


@dataclass(frozen=True)
class InputSpec:
    name: str
    elem_type: int  # onnx.TensorProto.DataType
    shape: tuple  # ints, symbolic names (str), or None for an unknown dim

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.elem_type))

    def describe(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name} {onnx.TensorProto.DataType.Name(self.elem_type).lower()}[{dims}]"


def parse_dims(text: str | None) -> dict[str, int]:
    """``"batch=2,seq=64"`` -> ``{"batch": 2, "seq": 64}``; empty/None -> ``{}``."""
    dims: dict[str, int] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not re.fullmatch(r"\d+", value):
            raise OtfuseError(f"bad --dims entry '{part}': expected NAME=INT[,NAME=INT...], e.g. batch=2,seq=64")
        dims[name] = int(value)
    return dims


def input_specs(model: onnx.ModelProto | str | os.PathLike) -> list[InputSpec]:
    if not isinstance(model, onnx.ModelProto):
        model = load_model(model).model
    specs = []
    for vi in graph_inputs(model):
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not t.elem_type:
            raise OtfuseError(f"input '{vi.name}' is not a typed tensor; otfuse cannot generate it (pass --inputs)")
        # paddle2onnx writes -1 for a dim it leaves open: symbolic, like a missing one. (A 0 is a
        # real empty dim: ORT insists on it.)
        shape = tuple(
            (d.dim_value if d.dim_value >= 0 else None) if d.HasField("dim_value") else (d.dim_param or None)
            for d in t.shape.dim
        )
        specs.append(InputSpec(vi.name, t.elem_type, shape))
    return specs


class DimResolver:
    """Turns symbolic/unknown dims into sizes, following the rules in the module docstring."""

    def __init__(self, overrides: dict[str, int] | None = None, has_past: bool = False):
        self.overrides = dict(overrides or {})
        self.has_past = has_past
        self.used: set[str] = set()
        self.resolved: dict[str, int] = {}  # symbolic name -> size, so shared names agree
        # A size given for a model's own dim name also sizes its class, so derived dims agree:
        # --dims past_seq=4,seq=3 makes a 'total_seq' mask 7 long.
        for name, value in list(self.overrides.items()):
            cls = _classify_name(name) if name not in DIM_CLASSES else None
            if cls in DIM_CLASSES and cls not in self.overrides:
                self.overrides[cls] = value
                self.used.add(cls)

    def cls_value(self, cls: str) -> int:
        if cls in self.overrides:
            self.used.add(cls)
            return self.overrides[cls]
        if cls == "batch":
            return DEFAULT_BATCH
        if cls == "seq":
            return DEFAULT_SEQ
        if cls == "past":
            return self.cls_value("seq") if self.has_past else 0
        if cls == "total":
            return self.cls_value("past") + self.cls_value("seq")
        return DEFAULT_OTHER

    def size(self, dim, *, spec: InputSpec, axis: int) -> int:
        if isinstance(dim, int):
            return dim
        if dim and dim in self.overrides:
            self.used.add(dim)
            return self.overrides[dim]
        if dim and dim in self.resolved:
            return self.resolved[dim]
        if dim and not _ANONYMOUS_DIM.match(dim.strip()) and re.search(r"[-+*/]", dim):
            value = self._evaluate(dim, spec=spec, axis=axis)
        elif dim and not _ANONYMOUS_DIM.match(dim.strip()):
            value = self.cls_value(_classify_name(dim))
        else:
            value = self.cls_value(_classify_position(spec, axis, self.has_past))
        if dim:
            self.resolved[dim] = value
        return value

    def check_all_used(self, specs: list[InputSpec]) -> None:
        unknown = sorted(set(self.overrides) - self.used - set(DIM_CLASSES))
        if unknown:
            names = sorted({d for s in specs for d in s.shape if isinstance(d, str)})
            raise OtfuseError(
                f"--dims names no dimension of the model: {', '.join(unknown)} "
                f"(symbolic dims: {', '.join(names) or 'none'}; classes: {', '.join(DIM_CLASSES)})"
            )

    def _evaluate(self, expr: str, *, spec: InputSpec, axis: int) -> int:
        try:
            tree = ast.parse(expr.strip(), mode="eval")
            return int(_eval_int(tree.body, lambda name: self.size(name, spec=spec, axis=axis)))
        except (SyntaxError, ValueError, ZeroDivisionError):
            return self.cls_value(_classify_name(expr))


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Div: operator.floordiv}


def _eval_int(node, lookup) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return lookup(node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_int(node.left, lookup), _eval_int(node.right, lookup))
    raise ValueError(f"unsupported dim expression {ast.dump(node)}")


def _classify_name(name: str) -> str:
    n = name.lower()
    if "total" in n or "all_seq" in n:
        return "total"
    if any(k in n for k in ("past", "cache", "history")):
        return "past"
    if any(k in n for k in ("seq", "len", "token", "step", "time", "position")):
        return "seq"
    if "batch" in n or n in ("b", "n", "bs", "bsz"):
        return "batch"
    return "other"


def position_class(spec: InputSpec, axis: int, has_past: bool) -> str:
    """The class (``batch``, ``seq``, ``past``, ``total`` or ``other``) an unnamed dim at ``axis``
    of ``spec`` gets, by the rules in the module docstring."""
    return _classify_position(spec, axis, has_past)


def has_past_inputs(specs: list[InputSpec]) -> bool:
    return any(_is_past_input(s) for s in specs)


def _classify_position(spec: InputSpec, axis: int, has_past: bool) -> str:
    rank, name = len(spec.shape), spec.name.lower()
    is_float = spec.dtype.kind == "f" or spec.dtype.type.__module__ == "ml_dtypes"
    if axis == 0:
        return "batch"
    if is_float and _PAST_INPUT.search(name) and rank == 4 and axis == 2:
        return "past"
    if rank == 2 and axis == 1 and _TOKEN_INPUT.search(name):
        return "total" if has_past and "mask" in name else "seq"
    if is_float and rank == 3 and axis == 1:
        return "seq"
    return "other"


def vocab_size(model: onnx.ModelProto, input_name: str) -> int | None:
    """First dim of the embedding table a Gather indexes with ``input_name``, if any."""
    tables = {t.name: tuple(t.dims) for t in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    tables[node.output[0]] = tuple(attr.t.dims)
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    sizes, frontier, seen = [], [input_name], set()
    while frontier:
        tensor = frontier.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in consumers.get(tensor, []):
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == tensor:
                table = tables.get(node.input[0])
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if table and axis in (0, -len(table)):
                    sizes.append(table[0])
            elif node.op_type in _INDEX_PASSTHROUGH and node.input[0] == tensor:
                frontier.append(node.output[0])
    # Several tables indexed by the same ids: stay inside the smallest.
    return min(sizes) if sizes else None


def make_feeds(
    model: onnx.ModelProto | str | os.PathLike, dims: dict[str, int] | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Generated inputs for every graph input (see the module docstring for the rules)."""
    if not isinstance(model, onnx.ModelProto):
        model = load_model(model).model
    specs = input_specs(model)
    resolver = DimResolver(dims, has_past=has_past_inputs(specs))
    shapes = {s.name: tuple(resolver.size(d, spec=s, axis=i) for i, d in enumerate(s.shape)) for s in specs}
    resolver.check_all_used(specs)
    return {s.name: _make_value(model, s, shapes[s.name], _rng(seed, s.name)) for s in specs}


def _is_past_input(spec: InputSpec) -> bool:
    return bool(_PAST_INPUT.search(spec.name.lower())) and spec.dtype.kind not in "iub"


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _make_value(model: onnx.ModelProto, spec: InputSpec, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    name, dtype = spec.name.lower(), spec.dtype
    if "mask" in name and dtype.kind in "iub" and len(shape) == 2:
        return _right_padded(shape).astype(dtype)
    if dtype == np.bool_:
        return np.ones(shape, dtype=bool)
    if "mask" in name:
        return np.ones(shape, dtype=dtype)
    if dtype.kind in "iu":
        if "position" in name:
            if not shape:
                return np.zeros((), dtype=dtype)
            return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        if "token_type" in name or "segment" in name:
            return np.zeros(shape, dtype=dtype)
        high = vocab_size(model, spec.name) or DEFAULT_VOCAB
        return rng.integers(0, max(high, 1), size=shape).astype(dtype)
    if dtype.kind == "f" or dtype.type.__module__ == "ml_dtypes":
        scale = 0.1 if _PAST_INPUT.search(name) else 0.5
        return (rng.standard_normal(shape) * scale).astype(dtype)
    raise OtfuseError(f"cannot generate input {spec.describe()}: unsupported element type (pass --inputs)")


def _right_padded(shape: tuple) -> np.ndarray:
    """Ones, with batch row b ending in min(b, T - 1) zeros."""
    mask = np.ones(shape, dtype=np.int64)
    batch, total = shape
    for b in range(1, batch):
        pad = min(b, total - 1)
        if pad > 0:
            mask[b, total - pad:] = 0
    return mask


def load_feeds(path: str | os.PathLike, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    """Inputs from an .npz, checked against the model's inputs and cast to their element types."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise OtfuseError(f"--inputs {path}: no such file") from None
    except (OSError, ValueError) as e:
        raise OtfuseError(f"--inputs {path}: not a readable .npz ({' '.join(str(e).split())})") from None
    return check_feeds(arrays, specs, source=str(path))


def check_feeds(arrays: dict[str, np.ndarray], specs: list[InputSpec], source: str = "inputs") -> dict[str, np.ndarray]:
    missing = [s.name for s in specs if s.name not in arrays]
    if missing:
        raise OtfuseError(f"{source} lacks model input(s) {', '.join(missing)} (it has: {', '.join(arrays) or 'nothing'})")
    feeds = {}
    for s in specs:
        arr = np.asarray(arrays[s.name])
        if arr.ndim != len(s.shape) or any(isinstance(d, int) and d != n for d, n in zip(s.shape, arr.shape)):
            raise OtfuseError(f"{source}: '{s.name}' has shape {list(arr.shape)}, the model expects {s.describe()}")
        # npz written from numpy defaults (float64/int64) is the common case: cast, don't refuse.
        feeds[s.name] = arr.astype(s.dtype, copy=False)
    return feeds
