"""Apply rules to a graph: match every candidate root, replace accepted matches, keep order valid.

One pass runs one family's rules over a fresh index of the graph. Roots are visited from the
graph's outputs backwards, so the largest match (the one that absorbs trailing Casts, a residual
Add, ...) claims its nodes first; at one root the accepted match covering most nodes wins. A node
belongs to at most one fusion per pass. After the pass the graph is topologically re-sorted and
the constants that only the fused nodes used are dropped.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import onnx

from otfuse.domain import OP_DOMAIN, OP_DOMAIN_VERSION
from otfuse.rewriter.graph import GraphIndex, index_for
from otfuse.rewriter.pattern import Failure, Match, Matcher
from otfuse.rewriter.rule import Fusion, NotCandidate, Refuse, Replacement, RewriteContext, Rule
from otfuse.rewriter.interior_shapes import rebase_shape_reads

# A failed candidate is reported as a near miss when it failed a semantic check, or when its
# partial match reached one of the rule's anchor ops and got this deep.
NEAR_MISS_MIN_DEPTH = 3
_CHECK_FAILURE_DEPTH = 10_000


@dataclass
class NearMiss:
    """A site left unfused, or fused less than fully: ``fused_as`` names what was fused there
    instead of ``pattern`` (a downgrade: AddLayerNorm refused, LayerNorm fused)."""

    pattern: str
    location: str
    reason: str
    nodes: tuple[str, ...]
    fused_as: str = ""
    fused_nodes: tuple[str, ...] = ()  # earlier fusions the refused match held (a rotation pair)

    def to_dict(self) -> dict:
        out = {"pattern": self.pattern, "location": self.location, "reason": self.reason}
        if self.fused_as:
            out["fused_as"] = self.fused_as
        return out


def unique_sites(misses: list[tuple[str, NearMiss]], final_nodes: set[str]) -> list[tuple[str, NearMiss]]:
    """(family, miss) pairs without a later report of a downgrade already reported (the fold pass
    retries the RopeAttention an attention pass downgraded, on the same rotation node), nor a
    downgrade a later pass undid (the fold absorbed the rotation after all: it is not in
    ``final_nodes``, the names of the final model's nodes)."""
    seen: dict[tuple[str, str], set[str]] = {}
    kept = []
    for family, miss in misses:
        if miss.fused_as and any(name not in final_nodes for name in miss.fused_nodes):
            continue
        names = {name for name in miss.nodes if name}
        key = (family, miss.pattern)  # a part fused less than fully is not that site's downgrade
        if miss.fused_as and names & seen.get(key, set()):
            continue
        if miss.fused_as:
            seen.setdefault(key, set()).update(names)
        kept.append((family, miss))
    return kept


@dataclass
class PassResult:
    fusions: Counter = field(default_factory=Counter)
    near_misses: list[NearMiss] = field(default_factory=list)


def _node_label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} {node.name or node.output[0]!r}"


def _private_value_leak(graph: GraphIndex, fusion: Fusion) -> None:
    """Refuse the fusion when an interior value is needed outside it."""
    inside = {id(node) for node in fusion.covers}
    for node in fusion.covers:
        for value in node.output:
            if not value or value in fusion.produces:
                continue
            if graph.is_graph_output(value):
                raise Refuse(f"interior value {value!r} of {_node_label(node)} is a graph output")
            for user in graph.uses(value):
                if id(user) not in inside and not _only_feeds(graph, user, inside):
                    raise Refuse(f"interior value {value!r} of {_node_label(node)} is also used by "
                                 f"{_node_label(user)}")


def _only_feeds(graph: GraphIndex, node: onnx.NodeProto, inside: set[int], depth: int = 8) -> bool:
    """Whether ``node`` only serves the match (e.g. ``Shape(x) -> Gather -> Div`` computing a
    Slice bound inside it): then it dies with the match and is removed as dead code."""
    if depth == 0:
        return False
    for out in node.output:
        if not out:
            continue
        if graph.is_graph_output(out):
            return False
        for user in graph.uses(out):
            if id(user) not in inside and not _only_feeds(graph, user, inside, depth - 1):
                return False
    return True


def _reads_interior(graph: GraphIndex, covers: tuple[onnx.NodeProto, ...], replacement: Replacement,
                    positions: dict[int, int], rebuilt: frozenset[str] = frozenset()) -> None:
    """Refuse a replacement that cannot take the match's place: an input of one of its nodes is
    computed inside the match, or from a value the match computes through nodes outside it
    (``Shape(interior) -> ... -> mask``, ``CastLike(w, residual_sum)`` as a norm's scale). The fused
    node would read a value that disappears, or its own output: a cycle. The shape reads the
    replacement ``rebuilt`` from outside values (interior_shapes.py) end the walk."""
    covered = {id(node) for node in covers}
    first = min(positions.get(id(node), 0) for node in covers)
    made_by = {out: index for index, node in enumerate(replacement.nodes) for out in node.output if out}
    for index, node in enumerate(replacement.nodes):
        for name in node.input:
            if not name or made_by.get(name, index) != index:
                continue  # wired from another node of the replacement
            source = _match_value_upstream(graph, name, covered, first, positions, rebuilt)
            if source == name:
                raise Refuse(f"the fused node would read {name!r}, which is computed inside the match")
            if source is not None:
                raise Refuse(f"the fused node would read {name!r}, which is computed from {source!r} "
                             f"inside the match")


def _materialise_static_inputs(ctx: RewriteContext, covers: tuple[onnx.NodeProto, ...], replacement: Replacement,
                               positions: dict[int, int]) -> None:
    """A replacement input known before run time (``GraphIndex.folded``: ``CastLike(w, sum)``
    is w in the sum's type, whatever the sum holds) that is computed from the match becomes an
    initializer of its value: its only tie to the match is a type or a shape, not data."""
    graph = ctx.graph
    covered = {id(node) for node in covers}
    first = min(positions.get(id(node), 0) for node in covers)
    for node in replacement.nodes:
        for position, name in enumerate(node.input):
            if name in graph.folded and _match_value_upstream(graph, name, covered, first, positions):
                tensor = ctx.constant(f"{name}_static", graph.constant_value(name))
                replacement.initializers.append(tensor)
                node.input[position] = tensor.name


def _match_value_upstream(graph: GraphIndex, name: str, covered: set[int], first: int,
                          positions: dict[int, int], provided: set[str] = frozenset()) -> str | None:
    """The first value produced by a covered node that ``name`` depends on, or None. Nodes placed
    before the match's first node (in topological order) cannot depend on it: the walk stops there,
    and at the values the replacement itself ``provided`` (a rebuilt shape read)."""
    for value, producer in _walk_upstream(graph, name, covered, first, positions, provided):
        if id(producer) in covered:
            return value
    return None


def _values_upstream(graph: GraphIndex, name: str, covered: set[int], first: int,
                     positions: dict[int, int]) -> set[str]:
    """Every value ``name`` depends on that is computed after the match's first node, the walk not
    entering covered nodes (their outputs are included)."""
    values = {name}
    for _, producer in _walk_upstream(graph, name, covered, first, positions):
        if id(producer) not in covered:
            values.update(_node_reads(producer))
    return values


def _walk_upstream(graph: GraphIndex, name: str, covered: set[int], first: int, positions: dict[int, int],
                   provided: set[str] = frozenset()):
    """(value, producer) for ``name`` and every value it depends on through nodes placed after the
    match's first node; the walk does not enter covered nodes nor the values in ``provided``."""
    pending, seen = [name], {name}
    while pending:
        value = pending.pop()
        producer = None if value in provided and value != name else graph.producer.get(value)
        if producer is None or positions.get(id(producer), first) < first and id(producer) not in covered:
            continue
        yield value, producer
        if id(producer) in covered:
            continue
        for parent in _node_reads(producer):
            if parent not in seen:
                seen.add(parent)
                pending.append(parent)


def _with_rebased_shape_reads(ctx: RewriteContext, fusion: Fusion, replacement: Replacement,
                              positions: dict[int, int]) -> Fusion:
    """The fusion grown by the Shape reads of its interior that interior_shapes.py rebuilt."""
    graph = ctx.graph
    first = min(positions.get(id(node), 0) for node in fusion.covers)
    taken = rebase_shape_reads(graph, fusion.covers, fusion.produces, replacement,
                               lambda name, covered: _values_upstream(graph, name, covered, first, positions),
                               ctx.unique_name)
    if not taken:
        return fusion
    made = {out for node in taken for out in node.output if out}
    return dataclasses.replace(fusion, covers=fusion.covers + taken, produces=fusion.produces | made)


def topological_positions(nodes: Sequence[onnx.NodeProto]) -> dict[int, int]:
    """Each node's index in a topological order of ``nodes`` (Kahn; ties in list order). Nodes on
    a cycle of an invalid input get no position."""
    producer = {out: index for index, node in enumerate(nodes) for out in node.output if out}
    waiting = [0] * len(nodes)
    dependents: dict[int, list[int]] = {}
    for index, node in enumerate(nodes):
        for dep in {producer[name] for name in _node_reads(node) if name in producer}:
            waiting[index] += 1
            dependents.setdefault(dep, []).append(index)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    positions: dict[int, int] = {}
    while ready:
        index = heapq.heappop(ready)
        positions[id(nodes[index])] = len(positions)
        for dependent in dependents.get(index, []):
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                heapq.heappush(ready, dependent)
    return positions


def _try_root(graph: GraphIndex, ctx: RewriteContext, rules: Sequence[Rule],
              root: onnx.NodeProto, claimed: set[int], positions: dict[int, int]):
    """The accepted (rule, fusion, replacement) at ``root`` that covers the most nodes (earlier
    rules win ties), and the deepest failure: the reason nothing was fused, or, next to an
    accepted fusion, a larger rule's refusal (a downgrade when it would have fused another op).
    Taking the largest match matters when a smaller rule also fits: a LayerNorm without bias
    contains an exact RMSNorm of ``x - mean``."""
    best_failure: tuple[Rule, Failure] | None = None
    accepted = None
    for rule in rules:
        matcher = Matcher(graph)
        for match in matcher.matches(rule.pattern, root.output[0]):
            found = _try_match(graph, ctx, rule, match, matcher, accepted, claimed, positions)
            if found is _CANNOT_BEAT:
                break
            if found is not None:
                accepted = (rule, *found)
                break
        failure = matcher.best_failure
        if failure and (best_failure is None or failure.depth > best_failure[1].depth):
            best_failure = (rule, failure)
    if accepted is not None:
        return (*accepted, _downgrade(accepted, best_failure))
    return None, None, None, best_failure


_CANNOT_BEAT = object()


def _keep_refusal(matcher: Matcher, covered, refusal: Refuse) -> None:
    """Keep the refusal of the largest match tried (on a tie the later): a smaller alternative
    that is refused after a larger one (repeat_kv read as it is, after its expansion was refused)
    must not hide the larger one's reason."""
    depth = _CHECK_FAILURE_DEPTH + len(covered)
    if matcher.best_failure is None or depth >= matcher.best_failure.depth:
        matcher.best_failure = Failure(depth, str(refusal), covered)


def _try_match(graph: GraphIndex, ctx: RewriteContext, rule: Rule, match: Match, matcher: Matcher,
               accepted, claimed: set[int], positions: dict[int, int]):
    """(fusion, replacement) for one structural match; None when it is refused (the reason kept
    in ``matcher.best_failure``), or _CANNOT_BEAT when it covers no more than ``accepted``."""
    def beats(covers) -> bool:
        return accepted is None or len(covers) > len(accepted[1].covers)

    def overlaps(state: Match) -> bool:
        if any(id(node) in claimed for node in state.covered):
            matcher.fail(state, "overlaps a fusion already made")
            return True
        return False

    if not beats(match.covered):
        return _CANNOT_BEAT
    if overlaps(match):
        return None
    ctx.match, ctx.partials = match, []
    try:
        fusion = rule.analyse(ctx, match)
        if ctx.partials:
            fusion = dataclasses.replace(fusion, partial=fusion.partial + tuple(ctx.partials))
    except NotCandidate:
        return None
    except Refuse as refusal:
        _keep_refusal(matcher, refusal.covers or match.covered, refusal)
        return None
    finally:
        ctx.match = None
    if len(fusion.covers) != len(match.covered):  # grown by a fan-out rule
        if not beats(fusion.covers):
            return _CANNOT_BEAT
        if overlaps(match._with(covered=fusion.covers)):
            return None
    try:
        _private_value_leak(graph, fusion)
    except Refuse as refusal:
        _keep_refusal(matcher, fusion.covers, refusal)
        return None
    replacement = rule.emit(ctx, fusion)
    _materialise_static_inputs(ctx, fusion.covers, replacement, positions)
    grown = _with_rebased_shape_reads(ctx, fusion, replacement, positions)
    if grown is not fusion and overlaps(match._with(covered=grown.covers)):
        return None
    rebuilt, fusion = grown.produces - fusion.produces, grown
    try:
        _reads_interior(graph, fusion.covers, replacement, positions, rebuilt)
    except Refuse as refusal:
        _keep_refusal(matcher, fusion.covers, refusal)
        return None
    return fusion, replacement


def _downgrade(accepted, failure: tuple[Rule, Failure] | None) -> tuple[Rule, Failure] | None:
    """The refusal of a rule that would have fused more, into another op, than what was accepted."""
    if failure is None:
        return None
    rule, refused = failure
    kept, fusion = accepted[0], accepted[1]
    if refused.depth < _CHECK_FAILURE_DEPTH or len(refused.covered) <= len(fusion.covers):
        return None
    bigger, smaller = rule.fused_op, kept.fused_op
    return failure if bigger and smaller and bigger != smaller else None


def _fused_names(nodes) -> tuple[str, ...]:
    return tuple(node.name for node in nodes if node.domain == OP_DOMAIN and node.name)


def _is_near_miss(rule: Rule, failure: Failure) -> bool:
    if failure.depth >= _CHECK_FAILURE_DEPTH:
        return True
    reached_anchor = any(node.op_type in rule.anchor_ops for node in failure.covered)
    return reached_anchor and failure.depth >= NEAR_MISS_MIN_DEPTH


class Pass(Protocol):
    """One step of a family: rewrites ``model`` in place and says what it fused."""

    def run(self, model: onnx.ModelProto, base_dir: Path | None) -> PassResult: ...


@dataclass
class RulePass:
    """Match ``rules`` at every root of the graph (``run_pass``)."""

    rules: Sequence[Rule]

    def run(self, model: onnx.ModelProto, base_dir: Path | None) -> PassResult:
        return run_pass(model, self.rules, base_dir)


def run_pass(model: onnx.ModelProto, rules: Sequence[Rule], base_dir: Path | None) -> PassResult:
    """Fuse every match of ``rules`` in ``model.graph`` (in place)."""
    result = PassResult()
    if not rules:
        return result
    graph = index_for(model, base_dir)
    ctx = RewriteContext(graph)
    nodes = list(model.graph.node)
    positions = topological_positions(nodes)
    claimed: set[int] = set()
    replacements: dict[int, Replacement] = {}
    misses: list[NearMiss] = []
    for root in reversed(nodes):
        if id(root) in claimed or not root.output or not root.output[0]:
            continue
        rule, fusion, replacement, failure = _try_root(graph, ctx, rules, root, claimed, positions)
        if rule is not None and failure is not None:
            larger, refused = failure
            kept = [n.op_type for n in refused.covered if n.domain == OP_DOMAIN] + [rule.fused_op]
            misses.append(NearMiss(larger.name, _node_label(root), refused.reason,
                                   tuple(n.name for n in refused.covered), fused_as=" + ".join(kept),
                                   fused_nodes=_fused_names(refused.covered)))
        if rule is not None:
            for what, reason in fusion.partial:
                misses.append(NearMiss(f"{rule.name}: {what}", _node_label(root), reason,
                                       tuple(n.name for n in fusion.covers), fused_as=rule.fused_op or fusion.op))
            claimed.update(id(node) for node in fusion.covers)
            replacements[id(root)] = replacement
            for node in replacement.nodes:
                if node.domain == OP_DOMAIN:  # helper nodes a rule adds (a Concat of tables) are not fusions
                    result.fusions[node.op_type] += 1
            for node in fusion.covers:
                if node.domain == OP_DOMAIN:  # a fused node absorbed by a larger fusion (norm -> norm + linear)
                    result.fusions[node.op_type] -= 1
        elif failure is not None and _is_near_miss(*failure):
            misses.append(NearMiss(failure[0].name, _node_label(root), failure[1].reason,
                                   tuple(n.name for n in failure[1].covered),
                                   fused_as=failure[0].kept_when_refused,
                                   fused_nodes=_fused_names(failure[1].covered)))
    if replacements:
        apply_replacements(model, nodes, claimed, replacements, graph)
    fused_names = {n.name for n in nodes if id(n) in claimed}
    # A candidate whose nodes ended up inside another fusion was not really missed (a downgrade
    # was: the smaller fusion holds its nodes).
    result.near_misses = [m for m in reversed(misses) if m.fused_as or not m.nodes
                          or sum(n in fused_names for n in m.nodes) * 2 < len(m.nodes)]
    return result


def apply_replacements(model: onnx.ModelProto, nodes: list[onnx.NodeProto], claimed: set[int],
                       replacements: dict[int, Replacement], graph: GraphIndex | None = None) -> None:
    """Drop the ``claimed`` nodes, put each replacement where its root was, re-sort, tidy up."""
    if not any(entry.domain == OP_DOMAIN for entry in model.opset_import):
        # Imported at once: later passes' shape inference must know the domain.
        model.opset_import.append(onnx.helper.make_opsetid(OP_DOMAIN, OP_DOMAIN_VERSION))
    new_nodes: list[onnx.NodeProto] = []
    positions: list[int] = []
    for position, node in enumerate(nodes):
        if id(node) in replacements:
            for fused in replacements[id(node)].nodes:
                new_nodes.append(fused)
                positions.append(position)
        if id(node) not in claimed:  # a root the fusion does not cover stays (norm/wide_scale.py)
            new_nodes.append(node)
            positions.append(position)
    for replacement in replacements.values():
        model.graph.initializer.extend(replacement.initializers)
    released = {name for node in nodes if id(node) in claimed for name in node.input if name}
    if graph is not None:
        _declare_fused_output_types(model.graph, graph, replacements)
    ordered = _toposort(new_nodes, positions, model.graph)
    ordered = _drop_released_constants(model.graph, ordered, released)
    del model.graph.node[:]
    model.graph.node.extend(ordered)
    _drop_stale_value_info(model.graph)


def _toposort(nodes: list[onnx.NodeProto], positions: list[int],
              graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Stable topological order: ready nodes leave in their original position order."""
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    producer_of = {out: index for index, node in enumerate(nodes) for out in node.output if out}
    waiting_on: list[int] = []
    dependents: dict[int, list[int]] = {}
    for index, node in enumerate(nodes):
        deps = {producer_of[name] for name in _node_reads(node)
                if name not in available and name in producer_of}
        waiting_on.append(len(deps))
        for dep in deps:
            dependents.setdefault(dep, []).append(index)
    ready = [(positions[i], i) for i, count in enumerate(waiting_on) if count == 0]
    heapq.heapify(ready)
    ordered: list[onnx.NodeProto] = []
    while ready:
        _, index = heapq.heappop(ready)
        ordered.append(nodes[index])
        for dependent in dependents.get(index, []):
            waiting_on[dependent] -= 1
            if waiting_on[dependent] == 0:
                heapq.heappush(ready, (positions[dependent], dependent))
    if len(ordered) != len(nodes):
        raise RuntimeError("otfuse produced a cyclic graph; this is a bug in a rule")
    return ordered


def _node_reads(node: onnx.NodeProto) -> set[str]:
    names = {name for name in node.input if name}
    for attribute in node.attribute:
        subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs
        for sub in subgraphs:
            for inner in sub.node:
                names |= _node_reads(inner)
    return names


def _drop_released_constants(graph: onnx.GraphProto, nodes: list[onnx.NodeProto],
                             released: set[str]) -> list[onnx.NodeProto]:
    """Remove what only the replaced nodes read: initializers, and nodes (Constants, shape
    arithmetic) left without any reader, transitively. Other dead code is not ours to touch."""
    graph_inputs = {i.name for i in graph.input}
    graph_outputs = {o.name for o in graph.output}
    reads: dict[str, int] = {}
    for node in nodes:
        for name in _node_reads(node):
            reads[name] = reads.get(name, 0) + 1
    producer = {out: node for node in nodes for out in node.output if out}
    dead_nodes: set[int] = set()
    dead_values: set[str] = set()
    pending = [name for name in released if not reads.get(name) and name not in graph_outputs]
    while pending:
        name = pending.pop()
        if name in dead_values:
            continue
        dead_values.add(name)
        node = producer.get(name)
        if node is None or id(node) in dead_nodes:
            continue
        if any(reads.get(out) or out in graph_outputs for out in node.output if out):
            continue
        dead_nodes.add(id(node))
        for parent in _node_reads(node):
            reads[parent] -= 1
            if not reads[parent] and parent not in graph_outputs:
                pending.append(parent)
    keep_inits = [t for t in graph.initializer if t.name not in dead_values or t.name in graph_inputs]
    if len(keep_inits) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep_inits)
    return [n for n in nodes if id(n) not in dead_nodes]


def _declare_fused_output_types(model_graph: onnx.GraphProto, graph: GraphIndex,
                                replacements: dict[int, Replacement]) -> None:
    """Fused outputs keep the names, and so the types, of what they replace: declare them, since
    shape inference cannot see through our ops and later passes (and ORT) rely on them."""
    declared = {v.name for v in list(model_graph.value_info) + list(model_graph.output)}
    for replacement in replacements.values():
        for node in replacement.nodes:
            for name in node.output:
                value_type = graph.value_type(name)
                if not name or name in declared or value_type is None or not value_type.elem_type:
                    continue
                shape = None if value_type.shape is None else list(value_type.shape)
                model_graph.value_info.append(
                    onnx.helper.make_tensor_value_info(name, value_type.elem_type, shape))
                declared.add(name)


def _drop_stale_value_info(graph: onnx.GraphProto) -> None:
    alive = {out for node in graph.node for out in node.output}
    kept = [info for info in graph.value_info if info.name in alive]
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)
