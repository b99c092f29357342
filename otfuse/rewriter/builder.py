"""Small plain-ONNX nodes a rewrite puts in front of its fused node (a table Concat, a Gather by
position ids, a Reshape to heads), collected with their constants for one ``Replacement``."""

from __future__ import annotations

import numpy as np
import onnx

from otfuse.rewriter.rule import Replacement, RewriteContext


class PlainNodes:
    def __init__(self, ctx: RewriteContext, root: onnx.NodeProto):
        self.ctx, self.root = ctx, root
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def node(self, op_type: str, inputs: list[str], output: str | None = None, **attrs) -> str:
        """Add ``op_type(inputs)``; its output is ``output`` or a fresh name after the root."""
        base = f"{self.root.output[0]}/{op_type.lower()}"
        out = output or self.ctx.unique_name(base)
        self.nodes.append(onnx.helper.make_node(op_type, inputs, [out], name=self.ctx.unique_name(base), **attrs))
        return out

    def constant(self, value: np.ndarray) -> str:
        tensor = self.ctx.constant(f"{self.root.output[0]}/const", value)
        self.initializers.append(tensor)
        return tensor.name

    def ints(self, values: list[int]) -> str:
        return self.constant(np.array(values, dtype=np.int64))

    def replacement(self, *fused: onnx.NodeProto) -> Replacement:
        """The helper nodes and ``fused`` (any order: the pass re-sorts the graph)."""
        return Replacement(self.nodes + list(fused), self.initializers)
