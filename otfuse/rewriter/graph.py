"""A read-only index over one ONNX graph: who produces and who consumes each value, which values
are constants, and what type and shape each value has (the dimension engine, ``dims``).

Constants are read lazily (and only when a pattern needs their value, e.g. an epsilon); weights in
external data are read tensor by tensor from their file, never as a whole model.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from otfuse.rewriter.dims import DimEngine
from otfuse.rewriter.dims.values import MAX_ITEMS as MAX_VALUE_ITEMS
from otfuse.rewriter.model_io import external_info, is_external
from otfuse.rewriter.shape_folding import MAX_FOLDED_ELEMENTS, fold_static_values

Dim = int | str  # a static size, or a symbolic expression (``dims.SymDim``, a str)

_SHAPE_LIKE_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL,
                     onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT8}


@dataclass(frozen=True)
class ValueType:
    elem_type: int  # onnx.TensorProto.DataType; 0 when unknown
    shape: tuple[Dim, ...] | None  # None when the rank is unknown

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)


def _subgraph_references(graph: onnx.GraphProto) -> set[str]:
    """Every value name a subgraph reads (its own values included; a superset is safe)."""
    names: set[str] = set()
    for node in graph.node:
        names.update(name for name in node.input if name)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                names |= _subgraph_references(sub)
    names.update(out.name for out in graph.output)
    return names


def _constant_node_tensor(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return None  # handled through the TensorProto path
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    return None


class GraphIndex:
    """Producers, consumers, constants and types of the values of ``model.graph``."""

    def __init__(self, model: onnx.ModelProto, base_dir: Path | None = None):
        self.model = model
        self.graph = model.graph
        self.base_dir = base_dir
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        self.initializers: dict[str, onnx.TensorProto] = {i.name: i for i in self.graph.initializer}
        self.graph_outputs = {o.name for o in self.graph.output}
        self.graph_inputs = {i.name for i in self.graph.input}
        self._constant_tensors: dict[str, onnx.TensorProto | np.ndarray] = {}
        self._values: dict[str, np.ndarray] = {}
        for node in self.graph.node:
            for name in node.output:
                if name:
                    self.producer[name] = node
            used = {name for name in node.input if name}
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    used |= _subgraph_references(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        used |= _subgraph_references(sub)
            for name in used:
                self.consumers.setdefault(name, []).append(node)
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
                self._register_constant_node(node)
        for name, tensor in self.initializers.items():
            # An initializer that is also a graph input can be overridden at run time.
            if name not in self.graph_inputs:
                self._constant_tensors[name] = tensor
        self.dims = DimEngine(model, self._constant_facts)
        self.folded = self._fold_static_values()

    # -- structure -------------------------------------------------------------------------
    def _register_constant_node(self, node: onnx.NodeProto) -> None:
        for attr in node.attribute:
            if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                self._constant_tensors[node.output[0]] = attr.t
                return
        value = _constant_node_tensor(node)
        if value is not None:
            self._constant_tensors[node.output[0]] = value

    def uses(self, name: str) -> list[onnx.NodeProto]:
        return self.consumers.get(name, [])

    def is_graph_output(self, name: str) -> bool:
        return name in self.graph_outputs

    def _fold_static_values(self) -> set[str]:
        """Canonicalisation: values known before run time count as constants (shape_folding.py)."""

        def small_constant(name: str) -> np.ndarray | None:
            size = self.constant_size(name)
            return self.constant_value(name) if size is not None and size <= MAX_FOLDED_ELEMENTS else None

        folded = fold_static_values(list(self.graph.node), small_constant, self.dims.known_value,
                                    lambda name: name in self._constant_tensors, self.elem_type)
        names = set()
        for name, value in folded.items():
            if name not in self._constant_tensors:
                self._constant_tensors[name] = value
                self._values[name] = value
                names.add(name)
        return names

    # -- constants ---------------------------------------------------------------------------
    def is_constant(self, name: str) -> bool:
        return name in self._constant_tensors

    def constant_tensor(self, name: str) -> onnx.TensorProto | None:
        tensor = self._constant_tensors.get(name)
        return tensor if isinstance(tensor, onnx.TensorProto) else None

    def constant_shape(self, name: str) -> tuple[int, ...] | None:
        tensor = self._constant_tensors.get(name)
        if tensor is None:
            return None
        if isinstance(tensor, np.ndarray):
            return tuple(tensor.shape)
        return tuple(int(d) for d in tensor.dims)

    def constant_size(self, name: str) -> int | None:
        shape = self.constant_shape(name)
        return None if shape is None else int(np.prod(shape, dtype=np.int64))

    def constant_value(self, name: str) -> np.ndarray | None:
        """The constant's value, reading external data for this tensor only."""
        if name in self._values:
            return self._values[name]
        tensor = self._constant_tensors.get(name)
        if tensor is None:
            return None
        if isinstance(tensor, np.ndarray):
            value = tensor
        elif is_external(tensor):
            value = read_external_tensor(tensor, self.base_dir)
        else:
            value = numpy_helper.to_array(tensor)
        self._values[name] = value
        return value

    def scalar_value(self, name: str) -> float | None:
        """A constant holding exactly one number, as a Python float; else None."""
        size = self.constant_size(name)
        if size != 1:
            return None
        value = self.constant_value(name)
        return float(np.asarray(value, dtype=np.float64).reshape(-1)[0])

    # -- types and shapes (the dimension engine) -------------------------------------------------
    def _constant_facts(self, name: str) -> tuple | None:
        """(elem type, dims, value or None) of a constant, for the dimension engine: the value only
        for small integer tensors (shapes, axes, indices), never for weights."""
        tensor = self._constant_tensors.get(name)
        if tensor is None:
            return None
        if isinstance(tensor, np.ndarray):
            elem = onnx.helper.np_dtype_to_tensor_dtype(tensor.dtype)
            return elem, tuple(tensor.shape), tensor if tensor.size <= MAX_VALUE_ITEMS else None
        dims = tuple(int(d) for d in tensor.dims)
        small = math.prod(dims) <= MAX_VALUE_ITEMS
        readable = tensor.data_type in _SHAPE_LIKE_TYPES and small
        return tensor.data_type, dims, self.constant_value(name) if readable else None

    def value_type(self, name: str) -> ValueType | None:
        """The type as a declaration can state it: dims that are fresh unknowns are left blank."""
        elem, shape = self.dims.elem_type(name), self.dims.declarable_shape(name)
        if not elem and shape is None:
            return None
        return ValueType(elem, shape)

    def elem_type(self, name: str) -> int:
        return self.dims.elem_type(name)

    def shape(self, name: str) -> tuple[Dim, ...] | None:
        """ints for static dims, ``SymDim`` (text) for the rest, canonical: provably equal dims
        compare equal (``dims.same`` for dims from elsewhere)."""
        return self.dims.shape(name)

    def proven_shape(self, name: str) -> tuple[Dim, ...] | None:
        """As ``shape``, without the assumption that dynamic dims meeting in a broadcast are equal:
        for a check whose fused op does not broadcast (``dims.DimEngine``)."""
        return self.dims.proven_shape(name)

    def rank(self, name: str) -> int | None:
        shape = self.shape(name)
        return None if shape is None else len(shape)


_last_index: tuple | None = None  # (nodes, fingerprint, index) of the graph indexed last


def _fingerprint(model: onnx.ModelProto, base_dir: Path | None) -> tuple:
    """What a GraphIndex depends on besides the node objects (rules key on their identity): their
    contents, the interface, declared types and initializer names. The initializers' bytes are not
    read: a pass only adds or drops initializers, never rewrites one in place."""
    graph = model.graph
    return (id(model), str(base_dir), b"".join(n.SerializeToString() for n in graph.node),
            b"".join(v.SerializeToString() for v in graph.input),
            b"".join(v.SerializeToString() for v in graph.output),
            b"".join(v.SerializeToString() for v in graph.value_info),
            tuple(t.name for t in graph.initializer), tuple((e.domain, e.version) for e in model.opset_import))


def index_for(model: onnx.ModelProto, base_dir: Path | None = None) -> GraphIndex:
    """A GraphIndex of ``model``: the last one built when the graph has not changed since (a pass
    that fused nothing), so each pass starts from an index of the graph as it is."""
    global _last_index
    nodes = list(model.graph.node)
    fingerprint = _fingerprint(model, base_dir)
    if _last_index is not None and len(_last_index[0]) == len(nodes) and \
            all(a is b for a, b in zip(_last_index[0], nodes)) and _last_index[1] == fingerprint:
        return _last_index[2]
    index = GraphIndex(model, base_dir)
    _last_index = (nodes, fingerprint, index)
    return index


def forget_indexes() -> None:
    """Drop the index kept by ``index_for`` (and the model it holds)."""
    global _last_index
    _last_index = None


# Small external tensors (shapes, axes) are read by every pass's index: kept by file identity.
_SMALL_EXTERNAL_ELEMENTS = 4096
_small_external: dict[tuple, np.ndarray] = {}


def read_external_tensor(tensor: onnx.TensorProto, base_dir: Path | None) -> np.ndarray:
    """Read one external tensor's bytes (offset/length) from its data file."""
    if base_dir is None:
        raise ValueError(f"tensor {tensor.name!r} is external but the model folder is unknown")
    info = external_info(tensor)
    offset = int(info.get("offset", 0))
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    count = math.prod(tensor.dims)
    path = Path(base_dir) / info["location"]
    key = None
    if count <= _SMALL_EXTERNAL_ELEMENTS:
        stat = os.stat(path)
        key = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size, offset, count, tensor.data_type,
               tuple(tensor.dims))
        cached = _small_external.get(key)
        if cached is not None:
            return cached.copy()
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(count * np.dtype(dtype).itemsize)
    value = np.frombuffer(data, dtype=dtype).reshape(tuple(tensor.dims)).copy()
    if key is not None and len(_small_external) < 100_000:
        _small_external[key] = value.copy()
    return value
