"""A small declarative pattern language for ONNX subgraphs, and its backtracking matcher.

A pattern is a tree of values written the way the model computes them::

    x = Var("x")
    ms = op.ReduceMean(op.Mul(x, x), _bind="reduce")
    pattern = op.Div(x, op.Sqrt(op.Add(ms, Const("eps"))))

- ``Var(name)`` matches any value; every use of one name must be the same graph value.
- ``Const(name, where=...)`` matches a constant (initializer or Constant node); ``where`` is a
  check of its numpy value that raises ``Refuse`` when the value is not acceptable.
- ``op.<OpType>(*inputs, _bind=..., _as=..., attr=expected)`` matches a node (bound under
  ``_bind``; its matched output value under ``_as``); attribute expectations are a literal,
  ``ANY`` or a check (raising ``Refuse``). ``Add``/``Mul``/``Max``/``Min``/``Sum`` try both operand orders.
- ``Either(a, b, ..., tag="form", tags=("a", "b", ...))`` tries alternatives in order (the first
  that completes the match wins); with a ``tag``, the match records which one it took
  (``match.tag("form")``), so a rule reads the spelling instead of probing its bindings.
- ``Absent()`` matches a left-out optional input (an empty name); no other pattern does.
- ``op.<OpType>(..., _optional_tail=True)`` also matches a node with fewer inputs: the inputs it
  leaves out are matched as empty names, so each pattern there must accept one (``Absent`` or
  ``Either(Var(...), Absent())``). Optional trailing inputs are stated once, not enumerated.
- Re-using one pattern object at two places means "the same node": the exporter computed it once.

The matcher walks from the pattern's root (the output) towards its inputs and records why each
candidate failed, keeping the reason from the deepest attempt: that is what the report shows as a
near miss. Matching never looks at tensor or node names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.refuse import Refuse

COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Equal"})


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()


class Pattern:
    """Base class of pattern values."""


@dataclass(eq=False)
class Var(Pattern):
    name: str


@dataclass(eq=False)
class Const(Pattern):
    name: str
    where: Callable[[np.ndarray], None] | None = None  # raises Refuse


@dataclass(eq=False)
class Op(Pattern):
    op_type: str
    inputs: tuple[Pattern, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    bind: str | None = None
    domain: str = ""
    output_index: int = 0
    value_as: str | None = None  # also bind the matched output value under this name
    optional_tail: bool = False  # a node may have fewer inputs: the missing ones are empty names


@dataclass(eq=False)
class Absent(Pattern):
    """Matches a missing optional input (an empty name) and nothing else: ``Either(Var("mask"),
    Absent())`` is an optional input that may be left out before inputs that are given."""


@dataclass(eq=False)
class Either(Pattern):
    """Alternatives tried in order; ``tag`` records which one matched (as ``tags[i]``)."""

    alternatives: tuple[Pattern, ...]
    tag: str | None = None
    tags: tuple[str, ...] = ()

    def __init__(self, *alternatives: Pattern, tag: str | None = None, tags: tuple[str, ...] = ()):
        self.alternatives = tuple(alternatives)
        self.tag, self.tags = tag, tuple(tags)
        if (tag is None) != (not self.tags) or (tag is not None and len(self.tags) != len(self.alternatives)):
            raise ValueError(f"Either: tag {tag!r} needs one name per alternative, got {self.tags}")


class _OpBuilder:
    """``op.Mul(a, b, _bind="scaled")`` builds ``Op("Mul", (a, b), bind="scaled")``."""

    def __getattr__(self, op_type: str) -> Callable[..., Op]:
        def build(*inputs: Pattern, _bind: str | None = None, _domain: str = "",
                  _output: int = 0, _as: str | None = None, _optional_tail: bool = False, **attrs: Any) -> Op:
            return Op(op_type, tuple(inputs), attrs, _bind, _domain, _output, _as, _optional_tail)

        return build


op = _OpBuilder()


def scalar_equal(expected: float, tol: float = 0.0) -> Callable[[np.ndarray], None]:
    """A ``Const.where`` check: exactly one element equal to ``expected``."""

    def check(value: np.ndarray) -> None:
        if value.size != 1:
            raise Refuse(f"expected the scalar {expected}, got shape {list(value.shape)}")
        got = float(np.asarray(value, dtype=np.float64).reshape(-1)[0])
        if abs(got - expected) > tol:
            raise Refuse(f"expected {expected}, got {got}")

    return check


# -- match state --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Match:
    """A structural match: bound values and the graph nodes it covers (in match order)."""

    values: dict[str, str]  # Var/Const name -> graph value name
    nodes: dict[str, onnx.NodeProto]  # _bind name -> graph node
    covered: tuple[onnx.NodeProto, ...]  # every matched node, each once; the root first
    shared: dict[int, str]  # id(pattern Op) -> graph value it matched (same-node rule)
    tags: dict[str, str] = field(default_factory=dict)  # Either tag -> the alternative taken

    def value(self, name: str) -> str:
        return self.values[name]

    def has(self, name: str) -> bool:
        return name in self.values or name in self.nodes

    def node(self, name: str) -> onnx.NodeProto:
        return self.nodes[name]

    def tag(self, name: str) -> str | None:
        """Which alternative of the ``Either`` tagged ``name`` matched (None: not reached)."""
        return self.tags.get(name)

    @property
    def root(self) -> onnx.NodeProto:
        return self.covered[0]

    def _with(self, **changes: Any) -> "Match":
        return Match(**{**self.__dict__, **changes})


EMPTY_MATCH = Match({}, {}, (), {}, {})


@dataclass
class Failure:
    depth: int
    reason: str
    covered: tuple[onnx.NodeProto, ...]


class Matcher:
    """Enumerates the structural matches of a pattern rooted at one graph value."""

    def __init__(self, graph: GraphIndex):
        self.graph = graph
        self.best_failure: Failure | None = None

    def fail(self, state: Match, reason: str) -> None:
        # Progress = nodes and leaves matched so far; on a tie the later failure has read further.
        depth = len(state.covered) + len(state.values)
        if self.best_failure is None or depth >= self.best_failure.depth:
            self.best_failure = Failure(depth, reason, state.covered)

    def matches(self, pattern: Pattern, value: str) -> Iterator[Match]:
        yield from self._match(pattern, value, EMPTY_MATCH)

    def _match(self, pattern: Pattern, value: str, state: Match) -> Iterator[Match]:
        if not value or isinstance(pattern, Absent):
            yield from self._match_absent(pattern, value, state)
        elif isinstance(pattern, Var):
            yield from self._match_var(pattern, value, state)
        elif isinstance(pattern, Const):
            yield from self._match_const(pattern, value, state)
        elif isinstance(pattern, Either):
            yield from self._match_either(pattern, value, state)
        elif isinstance(pattern, Op):
            yield from self._match_op(pattern, value, state)
        else:  # pragma: no cover - programming error in a pattern
            raise TypeError(f"not a pattern: {pattern!r}")

    def _match_absent(self, pattern: Pattern, value: str, state: Match) -> Iterator[Match]:
        """A missing input matches only ``Absent`` (alone or as an alternative), and vice versa."""
        if isinstance(pattern, Absent):
            if value:
                self.fail(state, "an optional input that must be absent is given")
            else:
                yield state
        elif isinstance(pattern, Either):
            yield from self._match_either(pattern, value, state)
        else:
            self.fail(state, "an optional input is missing")

    def _match_either(self, pattern: Either, value: str, state: Match) -> Iterator[Match]:
        for index, alternative in enumerate(pattern.alternatives):
            tagged = state
            if pattern.tag is not None:
                taken = state.tags.get(pattern.tag)
                if taken is not None and taken != pattern.tags[index]:
                    self.fail(state, f"'{pattern.tag}' must be one alternative, found {taken!r} and "
                                     f"{pattern.tags[index]!r}")
                    continue
                tagged = state._with(tags={**state.tags, pattern.tag: pattern.tags[index]})
            yield from self._match(alternative, value, tagged)

    def _bind_value(self, name: str, value: str, state: Match) -> Match | None:
        bound = state.values.get(name)
        if bound is None:
            return state._with(values={**state.values, name: value})
        return state if bound == value else None

    def _match_var(self, pattern: Var, value: str, state: Match) -> Iterator[Match]:
        new_state = self._bind_value(pattern.name, value, state)
        if new_state is None:
            self.fail(state, f"'{pattern.name}' must be one value, but two different values meet here")
            return
        yield new_state

    def _match_const(self, pattern: Const, value: str, state: Match) -> Iterator[Match]:
        if not self.graph.is_constant(value):
            self.fail(state, f"'{pattern.name}' is not a constant")
            return
        if pattern.where is not None:
            try:
                pattern.where(self.graph.constant_value(value))
            except Refuse as refusal:
                self.fail(state, f"'{pattern.name}': {refusal}")
                return
        new_state = self._bind_value(pattern.name, value, state)
        if new_state is None:
            self.fail(state, f"'{pattern.name}' must be one constant, but two differ")
            return
        yield new_state

    def _match_op(self, pattern: Op, value: str, state: Match) -> Iterator[Match]:
        seen = state.shared.get(id(pattern))
        if seen is not None:
            if seen == value:
                yield state
            else:
                self.fail(state, f"{pattern.op_type} must be one node used twice, found two nodes")
            return
        node = self.graph.producer.get(value)
        if node is None:
            self.fail(state, f"expected {pattern.op_type}, found a graph input or constant")
            return
        if node.op_type != pattern.op_type or _domain(node) != pattern.domain:
            self.fail(state, f"expected {pattern.op_type}, found {node.op_type} ({node.name})")
            return
        if pattern.output_index >= len(node.output) or node.output[pattern.output_index] != value:
            self.fail(state, f"{node.op_type} ({node.name}): a different output is used")
            return
        try:
            _check_attrs(pattern, node)
        except Refuse as refusal:
            self.fail(state, f"{node.op_type} ({node.name}): {refusal}")
            return
        inputs = tuple(node.input)
        if len(inputs) < len(pattern.inputs) and pattern.optional_tail:
            inputs += ("",) * (len(pattern.inputs) - len(inputs))
        if len(inputs) != len(pattern.inputs):
            expected = f"at most {len(pattern.inputs)}" if pattern.optional_tail else f"{len(pattern.inputs)}"
            self.fail(state, f"{node.op_type} ({node.name}): has {len(node.input)} inputs, expected {expected}")
            return
        covered = state.covered if any(n is node for n in state.covered) else state.covered + (node,)
        nodes = {**state.nodes, pattern.bind: node} if pattern.bind else state.nodes
        if pattern.bind and pattern.bind in state.nodes and state.nodes[pattern.bind] is not node:
            self.fail(state, f"'{pattern.bind}' must be one node, found two")
            return
        entered = state._with(covered=covered, nodes=nodes,
                              shared={**state.shared, id(pattern): value})
        if pattern.value_as:
            entered = self._bind_value(pattern.value_as, value, entered)
            if entered is None:
                self.fail(state, f"'{pattern.value_as}' must be one value, found two")
                return
        orders = [inputs]
        if node.op_type in COMMUTATIVE and len(inputs) == 2 and inputs[0] != inputs[1]:
            orders.append((inputs[1], inputs[0]))
        for order in orders:
            yield from self._match_inputs(pattern.inputs, order, entered)

    def _match_inputs(self, patterns: tuple[Pattern, ...], values: tuple[str, ...],
                      state: Match) -> Iterator[Match]:
        if not patterns:
            yield state
            return
        head, rest = patterns[0], patterns[1:]
        for after_head in self._match(head, values[0], state):
            yield from self._match_inputs(rest, values[1:], after_head)


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain == "ai.onnx" else node.domain


def _check_attrs(pattern: Op, node: onnx.NodeProto) -> None:
    actual = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    for name, expected in pattern.attrs.items():
        if expected is ANY:
            continue
        got = actual.get(name)
        if callable(expected):
            try:
                expected(got)
            except Refuse as refusal:
                raise Refuse(f"attribute {name}: {refusal}") from None
        elif got != expected:
            raise Refuse(f"attribute {name} is {got!r}, expected {expected!r}")


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """An attribute's Python value, or ``default`` when absent."""
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """Every attribute's Python value, strings as ``str`` (onnx gives bytes)."""
    values = {}
    for attribute in node.attribute:
        value = onnx.helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        values[attribute.name] = value
    return values


def attr_is(expected: Any, default: Any = None) -> Callable[[Any], None]:
    """An attribute expectation that treats an absent attribute as ``default``."""

    def check(value: Any) -> None:
        got = default if value is None else value
        if got != expected:
            raise Refuse(f"is {got!r}, expected {expected!r}")

    return check
