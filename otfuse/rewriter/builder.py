"""What a fusion adds beside its fused node: plain ONNX nodes (a table Concat, a Gather by position
ids, a Reshape to heads), fresh value names and new initializers.

A rule describes them while it analyses a match (``Helpers``), without naming anything; the pass
names them only when it emits the fusion (``Namer``), in the order the rule made them, so a
candidate refused later takes no names and the names do not depend on how often a rule looked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper


@dataclass(frozen=True, eq=False)
class Fresh:
    """A new value name: ``base``, or ``base_2``, ... when that is taken."""

    base: str


@dataclass(frozen=True, eq=False)
class NewTensor:
    """A new initializer named after ``base``: ``value``, or the graph constant ``source`` with
    new ``dims`` (the same bytes; an external tensor keeps pointing at its file)."""

    base: str
    value: np.ndarray | None = None
    source: str | None = None
    dims: tuple[int, ...] | None = None


@dataclass(frozen=True)
class OutputName:
    """A plain node named after its output: ``suffix`` "" is the output's name itself, else a
    fresh name ``output + suffix``."""

    suffix: str = ""


@dataclass(frozen=True, eq=False)
class PlainNode:
    """``op_type(inputs)`` with one output (a name in the graph, or ``Fresh``). Inputs are graph
    value names or other helpers (a ``PlainNode`` stands for its output). ``after``: placed after
    the fused node in the replacement (a Reshape of its output back to the graph's shape)."""

    op_type: str
    inputs: tuple
    attributes: dict = field(default_factory=dict)
    output: str | Fresh = ""
    name: str | OutputName = ""  # a base for a fresh node name, or OutputName
    after: bool = False


Helper = Fresh | NewTensor | PlainNode
Value = str | Helper  # what a fused node or a plain node reads: a graph value, or a helper's output


class Helpers:
    """Records the helpers a rule makes, in order, with the default names of the node they are
    made for (``root``): ``{root output}/{op_type}`` for nodes, ``{root output}/const`` for
    constants."""

    def __init__(self, root: onnx.NodeProto):
        self.base = root.output[0]
        self.items: list[Helper] = []

    def node(self, op_type: str, inputs: Sequence, output: str | Fresh | None = None, *,
             name: str | OutputName | None = None, after: bool = False, **attributes) -> PlainNode:
        base = f"{self.base}/{op_type.lower()}"
        node = PlainNode(op_type, tuple(inputs), attributes, Fresh(base) if output is None else output,
                         base if name is None else name, after)
        self.items.append(node)
        return node

    def fresh(self, base: str) -> Fresh:
        value = Fresh(base)
        self.items.append(value)
        return value

    def constant(self, value: np.ndarray, base: str | None = None) -> NewTensor:
        tensor = NewTensor(f"{self.base}/const" if base is None else base, value=value)
        self.items.append(tensor)
        return tensor

    def ints(self, values: Sequence[int]) -> NewTensor:
        return self.constant(np.array(values, dtype=np.int64))

    def float32(self, value: float) -> NewTensor:
        return self.constant(np.array(value, dtype=np.float32))

    def add(self, item: Helper) -> Helper:
        """Record a helper made elsewhere (``checks.row_parameter``) at this point of the order."""
        self.items.append(item)
        return item


class Namer:
    """Names helpers (each once, on first use) and builds their nodes and initializers."""

    def __init__(self, ctx, graph):
        self.ctx, self.graph = ctx, graph
        self.names: dict[int, str] = {}
        self.nodes: list[tuple[onnx.NodeProto, bool]] = []  # (node, after the fused node)
        self.initializers: list[onnx.TensorProto] = []

    def value(self, item) -> str:
        """The graph value name of ``item`` (a name, or a helper: named now if not yet)."""
        if isinstance(item, str):
            return item
        if id(item) not in self.names:
            self.names[id(item)] = self._make(item)
        return self.names[id(item)]

    def _make(self, item: Helper) -> str:
        if isinstance(item, Fresh):
            return self.ctx.unique_name(item.base)
        if isinstance(item, NewTensor):
            tensor = self._tensor(item)
            self.initializers.append(tensor)
            return tensor.name
        if isinstance(item, PlainNode):
            return self._node(item)
        raise TypeError(f"not a helper: {item!r}")

    def _tensor(self, item: NewTensor) -> onnx.TensorProto:
        if item.value is not None:
            return numpy_helper.from_array(item.value, self.ctx.unique_name(item.base))
        stored = self.graph.constant_tensor(item.source)
        if stored is None:  # a Constant node's value: a new initializer with the same values
            array = self.graph.constant_value(item.source).reshape(item.dims)
            return numpy_helper.from_array(array, self.ctx.unique_name(item.base))
        tensor = onnx.TensorProto()
        tensor.CopyFrom(stored)
        tensor.name = self.ctx.unique_name(item.base)
        del tensor.dims[:]
        tensor.dims.extend(item.dims)
        return tensor

    def _node(self, item: PlainNode) -> str:
        inputs = [self.value(i) for i in item.inputs]
        output = self.value(item.output)
        if isinstance(item.name, OutputName):
            name = output if not item.name.suffix else self.ctx.unique_name(output + item.name.suffix)
        else:
            name = self.ctx.unique_name(item.name)
        self.nodes.append((onnx.helper.make_node(item.op_type, inputs, [output], name=name, **item.attributes),
                           item.after))
        return output
