"""Canonicalisation: exact rewrites of plain ONNX that put a graph in the form the families'
patterns state, run before the families that need them (``Family.canonicalise``). They fuse
nothing and change no value: ``shape_reads`` moves ``Shape`` reads to tensors with the same dims,
``no_ops`` drops Casts to the input's own type and Slices that keep every element.
Imports only the engine (``otfuse/rewriter/``) and ``domain``."""

from otfuse.canonicalise.no_ops import NoOpsPass
from otfuse.canonicalise.shape_reads import ShapeReadsPass

__all__ = ["NoOpsPass", "ShapeReadsPass"]
