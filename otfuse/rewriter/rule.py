"""The rule protocol: a pattern, and ``analyse(ctx, match)`` that either returns the ``Fusion`` to
make or raises ``Refuse`` with the reason; ``emit(ctx, fusion)`` then builds the nodes.

    def analyse(ctx, match) -> Fusion:
        x, y = match.value("x"), match.root.output[0]
        checks.require_float_io(ctx.graph, x, y)                     # raises Refuse
        return Fusion(ops.RMSNorm(X=x, scale=match.value("scale"), Y=y, epsilon=eps), match.covered)

    RULE = Rule("RMSNorm", family="norm", pattern=..., analyse=analyse, anchor_ops={"ReduceMean"})

The pass (passes.py) calls ``analyse`` once per structural match and hands the same ``Fusion`` to
the leak checks and to ``emit``: every fact is computed once, and a refusal is always an
exception, from however deep the rule found it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from otfuse.domain import OP_DOMAIN
from otfuse.ops import Call
from otfuse.rewriter.builder import Helpers, Namer, PlainNode
from otfuse.rewriter.dim_binder import Dims, bind_dims
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Match, Pattern
from otfuse.rewriter.refuse import NotCandidate, Refuse

__all__ = ["Fusion", "NotCandidate", "Refuse", "Replacement", "RewriteContext", "Rule", "emit"]


@dataclass
class Replacement:
    """What a rule puts in place of the matched nodes."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)


class RewriteContext:
    """What a rule's analyse and emit may use: the graph index, fresh unique names, a per-pass
    memo, and the match being analysed (``dims`` reads values by its binding names)."""

    def __init__(self, graph: GraphIndex):
        self.graph = graph
        self._taken = {n.name for n in graph.graph.node} | set(graph.producer) | set(graph.initializers)
        self._taken |= graph.graph_inputs
        self.memo: dict = {}  # per-pass results rules share (e.g. one mask analysis for all layers)
        self.match: Match | None = None  # set by the pass before each analyse
        # Parts of the match being analysed fused less than fully, (what, reason), noted by shared
        # checks (a mask kept as a bias): the pass adds them to the accepted Fusion's ``partial``.
        self.partials: list[tuple[str, str]] = []

    def fused_less_than_fully(self, what: str, reason: str) -> None:
        """Report a part of the current match that the fused node takes in a weaker form."""
        self.partials.append((what, reason))

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

    def dims(self, **specs: str | tuple[str, str]) -> Dims:
        """Bind the dims of several values at once (rewriter/dim_binder.py):
        ``ctx.dims(q="B N Sq D", k=(keys, "B Nkv Skv D"))``; a label alone names a value of the
        match being analysed. Refuses naming the value and the two dims that disagree."""
        return bind_dims(self.graph, self.match, specs)


@dataclass(frozen=True)
class Fusion:
    """What a rule decided to make of a match: one ``ops`` call (inputs, outputs and attributes
    by contract name, checked and ordered by ``otfuse/ops.py``), the nodes it replaces (``covers``,
    the root first: the match, grown by fan-out rules), the graph values the replacement
    produces (``produces``: by default the call's outputs and the helpers' that are graph values;
    every other value computed inside ``covers`` must be private) and its helpers (plain nodes,
    fresh names and initializers, named in this order when it is emitted)."""

    call: Call
    covers: tuple[onnx.NodeProto, ...]
    helpers: tuple = ()
    produces: frozenset[str] | None = None
    # Parts fused less than fully, each (what, reason): reported as downgrades next to the fusion
    # (an ALiBi bias kept materialised because its run contradicted the claim).
    partial: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.helpers, Helpers):
            object.__setattr__(self, "helpers", tuple(self.helpers.items))
        object.__setattr__(self, "covers", tuple(self.covers))
        if self.produces is None:
            made = [o for o in self.call.outputs if isinstance(o, str)]
            made += [h.output for h in self.helpers if isinstance(h, PlainNode) and isinstance(h.output, str)]
            object.__setattr__(self, "produces", frozenset(name for name in made if name))

    @property
    def op(self) -> str:
        return self.call.op

    @property
    def inputs(self) -> Mapping[str, object]:
        return self.call.named_inputs

    @property
    def outputs(self) -> Mapping[str, object]:
        return self.call.named_outputs

    @property
    def attributes(self) -> Mapping[str, object]:
        return self.call.attributes

    @property
    def root(self) -> onnx.NodeProto:
        return self.covers[0]


def emit(ctx: RewriteContext, fusion: Fusion) -> Replacement:
    """The default emit: the helpers, named in the order the rule made them, then one fused node
    named after the root; nodes in that order, those marked ``after`` behind the fused node."""
    namer = Namer(ctx, ctx.graph)
    for helper in fusion.helpers:
        namer.value(helper)
    inputs = [namer.value(v) for v in fusion.call.inputs]
    outputs = [namer.value(v) for v in fusion.call.outputs]
    fused = ctx.fused_node(fusion.op, inputs, outputs, fusion.root, **fusion.attributes)
    before = [node for node, after in namer.nodes if not after]
    behind = [node for node, after in namer.nodes if after]
    return Replacement(before + [fused] + behind, namer.initializers)


Analyse = Callable[[RewriteContext, Match], Fusion]
Emit = Callable[[RewriteContext, Fusion], Replacement]


@dataclass(frozen=True, eq=False)
class Rule:
    """A rule: ``name`` (the report's), ``pattern``, ``analyse``, ``family`` and ``emit``.

    ``anchor_ops``: op types that make a failed candidate worth reporting: a candidate that never
    reached one (a Mul that merely looks like the end of a norm) is not a near miss.
    """

    name: str
    pattern: Pattern
    analyse: Analyse
    family: str = ""
    anchor_ops: frozenset[str] = frozenset()
    emit: Emit = emit
    # The op this rule fuses into; where a larger rule's is refused and a smaller one's fused at
    # the same root, the report lists the larger one's reason as a downgrade.
    fused_op: str = ""
    # For a rule that combines fused nodes (a fold): what stays fused when it is refused, so its
    # refusal is reported as a downgrade.
    kept_when_refused: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "anchor_ops", frozenset(self.anchor_ops))

    def __repr__(self) -> str:
        return f"<Rule {self.name} ({self.family})>"
