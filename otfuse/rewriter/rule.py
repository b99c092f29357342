"""A rewrite rule: a pattern, the checks structure alone cannot express, and the replacement."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from otfuse.domain import OP_DOMAIN
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Match, Pattern


@dataclass
class Replacement:
    """What a rule puts in place of the matched nodes."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)


class RewriteContext:
    """What a rule's check and rewrite may use: the graph index and fresh, unique names."""

    def __init__(self, graph: GraphIndex):
        self.graph = graph
        self._taken = {n.name for n in graph.graph.node} | set(graph.producer) | set(graph.initializers)
        self._taken |= graph.graph_inputs
        self.memo: dict = {}  # per-pass results rules share (e.g. one mask analysis for all layers)

    def unique_name(self, base: str) -> str:
        name, counter = base, 1
        while name in self._taken:
            counter += 1
            name = f"{base}_{counter}"
        self._taken.add(name)
        return name

    def fused_node(self, op_type: str, inputs: Iterable[str], outputs: Iterable[str],
                   root: onnx.NodeProto, **attributes) -> onnx.NodeProto:
        """A node in the otfuse domain, named after the node it replaces (for reports and diffs)."""
        name = self.unique_name(f"{root.name or root.output[0]}/{op_type}")
        return onnx.helper.make_node(op_type, list(inputs), list(outputs), name=name,
                                     domain=OP_DOMAIN, **attributes)

    def constant(self, base: str, value: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(value, self.unique_name(base))


class Refuse(Exception):
    """Raised by a rule's ``check`` (or any helper it calls) to refuse a match; the message is the
    near-miss reason. Same as returning the reason, from however deep the check found it."""


class Rule:
    """Subclasses set the class attributes and implement ``check`` and ``rewrite``.

    ``exports`` names pattern values that the fused node also outputs, so other nodes may keep
    using them (e.g. the residual sum of AddRMSNorm); every other interior value must be private.
    """

    name: str = ""
    family: str = ""
    pattern: Pattern
    exports: tuple[str, ...] = ()
    # Op types that make a failed candidate worth reporting: a candidate that never reached one
    # (a Mul that merely looks like the end of a norm) is not a near miss.
    anchor_ops: frozenset[str] = frozenset()
    # The op this rule fuses into; where a larger rule's is refused and a smaller one's fused at
    # the same root, the report lists the larger one's reason as a downgrade.
    fused_op: str = ""
    # For a rule that combines fused nodes (a fold): what stays fused when it is refused, so its
    # refusal is reported as a downgrade.
    kept_when_refused: str = ""

    def grow(self, ctx: RewriteContext, match: Match) -> Match | str | None:
        """Extend a structural match downstream, for fan-out rules whose pattern matches one node
        (the root) and whose fusion also takes some of its consumers (``Match.grown``). Return the
        grown match, a reason (reported as a near miss), or None (not a candidate; silent). The
        pass then applies the usual checks to the grown match: no overlap with other fusions, no
        interior value leaking (against ``produced_values``), no interior value read."""
        return match

    def produced_values(self, graph: GraphIndex, match: Match, root_value: str) -> set[str] | None:
        """Values of the (grown) match that the replacement produces; every other value computed
        inside the match must be private. None: the root's value and ``exports``."""
        return None

    def check(self, ctx: RewriteContext, match: Match) -> str | None:
        """Return (or raise :class:`Refuse` with) why this structural match must not be fused;
        None accepts it."""
        return None

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Rule {self.name} ({self.family})>"
