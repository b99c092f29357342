"""otfuse's dimension engine: symbolic shapes and shape values of every value of a graph
(``engine.DimEngine``), in a canonical form with equalities learned from the graph
(``facts.Facts``), so that two dims are provably equal exactly when they compare equal."""

from otfuse.rewriter.dims import ops_compute, ops_contrib, ops_elementwise, ops_fused, ops_shape  # noqa: F401 - rules
from otfuse.rewriter.dims.engine import DimEngine, SymDim, same_dim
from otfuse.rewriter.dims.expr import Expr, parse

__all__ = ["DimEngine", "Expr", "SymDim", "parse", "same_dim"]
