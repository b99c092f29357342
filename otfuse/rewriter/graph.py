"""A read-only index over one ONNX graph: who produces and who consumes each value, which values
are constants, and what type and shape each value has.

Constants are read lazily (and only when a pattern needs their value, e.g. an epsilon); weights in
external data are read tensor by tensor from their file, never as a whole model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from otfuse.rewriter.model_io import external_info, is_external
from otfuse.rewriter.shape_folding import MAX_FOLDED_ELEMENTS, fold_static_values

Dim = int | str | None  # a static size, a symbolic name, or unknown

# Shape inference sees initializers up to this size with their data (shape-like constants);
# larger ones keep only their type and dims, so inference never touches weight bytes.
_SMALL_INITIALIZER_BYTES = 4096


@dataclass(frozen=True)
class ValueType:
    elem_type: int  # onnx.TensorProto.DataType; 0 when unknown
    shape: tuple[Dim, ...] | None  # None when the rank is unknown

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)


def _type_from_proto(type_proto: onnx.TypeProto) -> ValueType | None:
    if not type_proto.HasField("tensor_type"):
        return None
    tensor = type_proto.tensor_type
    shape: tuple[Dim, ...] | None = None
    if tensor.HasField("shape"):
        dims: list[Dim] = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param") and dim.dim_param and not dim.dim_param.startswith("unk__"):
                dims.append(dim.dim_param)  # 'unk__N' is shape inference's name for "unknown"
            else:
                dims.append(None)
        shape = tuple(dims)
    return ValueType(tensor.elem_type, shape)


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
        self.types = self._infer_types()
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

        folded = fold_static_values(list(self.graph.node), small_constant, self.shape)
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

    # -- types -------------------------------------------------------------------------------
    def _infer_types(self) -> dict[str, ValueType]:
        types: dict[str, ValueType] = {}
        for tensor in self.graph.initializer:
            types[tensor.name] = ValueType(tensor.data_type, tuple(int(d) for d in tensor.dims))
        skeleton = _skeleton_for_inference(self.model)
        try:
            inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=False, data_prop=True)
            graph = inferred.graph
        except Exception:  # noqa: BLE001 - inference is best effort; declared types still count
            graph = self.graph
        for info in list(graph.input) + list(graph.value_info) + list(graph.output):
            value_type = _type_from_proto(info.type)
            if value_type is not None:
                types.setdefault(info.name, value_type)
        self._skeleton: onnx.ModelProto | None = skeleton  # for _refine_shapes, run once if needed
        for info in list(self.graph.input) + list(self.graph.value_info) + list(self.graph.output):
            value_type = _type_from_proto(info.type)
            if value_type is not None and info.name not in types:
                types[info.name] = value_type
        for name, tensor in self._constant_tensors.items():
            if isinstance(tensor, np.ndarray) and name not in types:
                elem = onnx.helper.np_dtype_to_tensor_dtype(tensor.dtype)
                types[name] = ValueType(elem, tuple(tensor.shape))
        return types

    def value_type(self, name: str) -> ValueType | None:
        value_type = self.types.get(name)
        if value_type is not None and self._skeleton is not None and _lacks_dims(value_type):
            self._refine_shapes()
            value_type = self.types.get(name)
        return value_type

    def _refine_shapes(self) -> None:
        """Symbolic inference fills in what onnx's left unknown: slow-ish (Python per node), so it
        runs only when a pattern asks for a tensor of rank >= 4 with unknown dims (TorchScript
        exports; the dynamo exporter declares those shapes)."""
        skeleton, self._skeleton = self._skeleton, None
        _fill_unknown_dims(self.types, _symbolic_value_info(skeleton))

    def elem_type(self, name: str) -> int:
        value_type = self.types.get(name)
        return value_type.elem_type if value_type else 0

    def shape(self, name: str) -> tuple[Dim, ...] | None:
        value_type = self.value_type(name)
        return value_type.shape if value_type else None

    def rank(self, name: str) -> int | None:
        shape = self.shape(name)
        return None if shape is None else len(shape)


def _symbolic_value_info(skeleton: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """ONNX Runtime's symbolic shape inference, which works out what onnx's leaves unknown in
    TorchScript exports: ``Reshape(x, Concat(B, S, -1, D))`` with B, S symbolic, or ``Expand`` to
    a shape computed by ``Where(Equal(shape, -1), 1, shape)``. Run as its ``infer_shapes`` does,
    minus the debug file that one writes into the working folder when some node is unknown (our
    own ops): what it inferred before stopping still holds. Best effort: no result on failure.
    Nodes of other domains (our fused ops) are cut out, their declared outputs entering as inputs.
    Its import needs sympy, a declared dependency of otfuse (onnxruntime no longer installs it): a
    missing sympy is an error, never a quiet fallback that fuses less."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        inference = SymbolicShapeInference(2**31 - 1, auto_merge=False, guess_output_rank=False, verbose=0)
        inference._preprocess(_without_custom_nodes(skeleton))
        while inference.run_:
            inference._infer_impl()
        return list(inference.out_mp_.graph.value_info)
    except Exception:  # noqa: BLE001 - an unsupported op or version: keep onnx's shapes
        return []


def _without_custom_nodes(skeleton: onnx.ModelProto) -> onnx.ModelProto:
    declared = {info.name: info for info in list(skeleton.graph.value_info) + list(skeleton.graph.output)}
    custom = [node for node in skeleton.graph.node if node.domain not in ("", "ai.onnx")]
    if not custom:
        return skeleton
    model = onnx.ModelProto()
    model.CopyFrom(skeleton)
    del model.graph.node[:]
    model.graph.node.extend(n for n in skeleton.graph.node if n.domain in ("", "ai.onnx"))
    model.graph.input.extend(declared[out] for node in custom for out in node.output if out in declared)
    return model


def _lacks_dims(value_type: ValueType) -> bool:
    shape = value_type.shape
    return shape is None or (len(shape) >= 4 and None in shape)


def _fill_unknown_dims(types: dict[str, ValueType], infos: list[onnx.ValueInfoProto]) -> None:
    """Replace unknown dims (or an unknown rank) by symbolic inference's, never a known one."""
    for info in infos:
        found, known = _type_from_proto(info.type), types.get(info.name)
        if found is None or found.shape is None or known is None or found.elem_type != known.elem_type:
            continue
        if known.shape is None:
            types[info.name] = found
        elif len(known.shape) == len(found.shape) and None in known.shape:
            shape = tuple(f if k is None else k for k, f in zip(known.shape, found.shape))
            types[info.name] = ValueType(known.elem_type, shape)


def _skeleton_for_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model that shape inference can read cheaply: big weights keep dims only."""
    skeleton = onnx.ModelProto()
    skeleton.ir_version = model.ir_version
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    graph = skeleton.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    declared_inputs = {i.name for i in model.graph.input}
    for tensor in model.graph.initializer:
        if not is_external(tensor) and tensor.ByteSize() <= _SMALL_INITIALIZER_BYTES:
            graph.initializer.append(tensor)
        elif tensor.name not in declared_inputs:
            # A data-less initializer would be invalid: describe the weight as a typed input.
            graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
    return skeleton


def read_external_tensor(tensor: onnx.TensorProto, base_dir: Path | None) -> np.ndarray:
    """Read one external tensor's bytes (offset/length) from its data file."""
    if base_dir is None:
        raise ValueError(f"tensor {tensor.name!r} is external but the model folder is unknown")
    info = external_info(tensor)
    offset = int(info.get("offset", 0))
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    count = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
    with open(Path(base_dir) / info["location"], "rb") as handle:
        handle.seek(offset)
        data = handle.read(count * np.dtype(dtype).itemsize)
    return np.frombuffer(data, dtype=dtype).reshape(tuple(tensor.dims)).copy()
