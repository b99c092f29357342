"""Canonicalisation: exact rewrites of plain ONNX that put a graph in the form the families'
patterns state, run before the families that need them (``Family.canonicalise``). They fuse
nothing and change no value: ``shape_reads`` moves ``Shape`` reads to tensors with the same dims.
Imports only the engine (``otfuse/rewriter/``) and ``domain``."""

from otfuse.canonicalise.shape_reads import ShapeReadsPass

__all__ = ["ShapeReadsPass"]
