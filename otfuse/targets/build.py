"""What a target emitter writes for one fused node: plain nodes in the target's domains, fresh
value names and initializers. ``CannotExpress`` is its refusal: the site then stays as the
original graph wrote it (lowering.py), reported as "target <t> cannot express ...".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.rule import RewriteContext
from otfuse.targets.opset import OpsetTooLow

MS_DOMAIN = "com.microsoft"


class CannotExpress(Exception):
    """The target's op does not compute what the fused node computes (the reason, without the
    "target ... cannot express" prefix the lowering adds)."""


class Emitter:
    """Builds the replacement of one fused node ``node``: ``self.nodes`` and ``self.initializers``,
    every name fresh in the graph (``names``, the rewriter's context, is shared by all emitters of
    one lowering) and unused by the original graph (``reserved``: a site put back may bring its
    values back)."""

    def __init__(self, graph: GraphIndex, node: onnx.NodeProto, names: RewriteContext, target: str,
                 reserved: frozenset[str] = frozenset()):
        self.graph, self.node, self.target = graph, node, target
        self._names, self._reserved = names, reserved
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.opsets: dict[str, int] = {}  # domain -> the least version the emitted nodes need
        self.max_opset = 10**6  # the default-domain opset the model can be raised to (opset.py)
        self.per_head_rows: set[str] = set()  # row masks an emitter made with a head axis (attention.py)

    def fresh(self, base: str) -> str:
        name = self._names.unique_name(base)
        while name in self._reserved:
            name = self._names.unique_name(base)
        return name

    def _base(self, op_type: str) -> str:
        return f"{self.node.name or self.node.output[0]}/{op_type}"

    def op(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | int = 1, *, domain: str = "",
           opset: int = 0, **attributes) -> list[str]:
        """``op_type(inputs)``; ``outputs``: names to write (graph values) or how many fresh ones."""
        names = ([self.fresh(self._base(op_type)) for _ in range(outputs)] if isinstance(outputs, int)
                 else list(outputs))
        attributes = {k: v for k, v in attributes.items() if v is not None}
        self.nodes.append(onnx.helper.make_node(op_type, list(inputs), names, name=self.fresh(self._base(op_type)),
                                                domain=domain, **attributes))
        if domain == "" and opset > self.max_opset:
            raise OpsetTooLow(f"{op_type} needs opset {opset}")
        if opset:
            self.opsets[domain] = max(self.opsets.get(domain, 0), opset)
        return names

    def op1(self, op_type: str, inputs: Sequence[str], output: str | None = None, **kw) -> str:
        return self.op(op_type, inputs, [output] if output else 1, **kw)[0]

    def constant(self, value, base: str = "const") -> str:
        tensor = numpy_helper.from_array(np.asarray(value), self.fresh(self._base(base)))
        self.initializers.append(tensor)
        return tensor.name

    def ints(self, values: Sequence[int]) -> str:
        return self.constant(np.asarray(values, dtype=np.int64), "ints")

    def dim_range(self, value: str, start: int, end: int) -> str:
        """The 1-D int64 ``value.shape[start:end]``."""
        # Shape + Slice, not Shape's start/end (opset 15): the model may be older.
        return self.op1("Slice", [self.op1("Shape", [value]), self.ints([start]), self.ints([end]), self.ints([0])])

    def cast(self, value: str, elem_type: int) -> str:
        return self.op1("Cast", [value], to=elem_type)
