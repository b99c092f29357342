"""Fuse inside control-flow bodies: every ``If`` branch, ``Loop`` / ``Scan`` body, recursively.

After the main graph is fused (and lowered to its target), each body is opened as a model of its
own (``rewriter/scopes.py``: its outer-scope values declared as inputs, or as initializers when
they are constants, typed and shaped by the enclosing graph), the same families and the same
lowering run on it, and it is written back. Every near miss made in a body names the body in its
``location``; a site the boundary cuts (half of it in the enclosing graph) is found by a dry run
over the body with the enclosing producers of its inputs copied in, and reported, never fused: a
fused node cannot span two scopes. No family is special-cased here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from otfuse import ops
from otfuse.domain import OP_DOMAIN
from otfuse.rewriter.graph import GraphIndex, forget_indexes
from otfuse.rewriter.scopes import (Body, Scope, bodies, close_scope, defined_names, open_scope, outer_constant,
                                    outer_value_info, reads)
from otfuse.targets import opset
from otfuse.targets.lowering import Ledger, lower

# (model, families, base_dir, after_family) -> (fusions, near misses): pipeline.fuse_families
FuseFamilies = Callable[..., tuple[Counter, list[dict]]]

CONTROL_FLOW = ("If", "Loop", "Scan")
# How far up the enclosing graph a dry run follows a body's inputs to find a site the boundary cuts.
STRADDLE_DEPTH = 8
STRADDLE_MAX_NODES = 256


@dataclass
class BodyOutcome:
    fusions: Counter = field(default_factory=Counter)  # over every body
    by_body: dict[str, dict[str, int]] = field(default_factory=dict)  # body label -> fused ops
    near_misses: list[dict] = field(default_factory=list)
    target_ops: Counter = field(default_factory=Counter)


def fuse_bodies(model: onnx.ModelProto, families: list[str], base_dir: Path | None, fuse_families: FuseFamilies,
                target: str = "otfuse") -> BodyOutcome:
    """Fuse (and lower to ``target``) every body of ``model``'s graph, nested ones too, in place."""
    outcome = BodyOutcome()
    _fuse_level(model, model, families, base_dir, fuse_families, target, set(), "", outcome)
    return outcome


def _fuse_level(root: onnx.ModelProto, model: onnx.ModelProto, families, base_dir, fuse_families, target,
                visible: set[str], enclosing: str, outcome: BodyOutcome) -> None:
    found = []
    for body in bodies(model.graph, enclosing):
        if body.owner.op_type in CONTROL_FLOW and body.owner.domain in ("", "ai.onnx"):
            found.append(body)
        else:  # another op's graph (ORT's BeamSearch decoder, ...): its meaning is that op's
            outcome.near_misses.append({"pattern": "body", "location": body.label, "family": "", "body": body.label,
                                        "reason": f"a graph attribute of {body.owner.domain or 'ai.onnx'}."
                                                  f"{body.owner.op_type}: only If, Loop and Scan bodies are fused"})
    if not found:
        return
    index = GraphIndex(model, base_dir)  # the graph around these bodies, as fused
    visible = visible | defined_names(model.graph)
    released: set[str] = set()
    for body in found:
        scope = open_scope(root, index, body)
        original = _copy(scope.model)
        fusions, misses, target_ops = _fuse_scope(root, scope.model, original, families, base_dir, fuse_families,
                                                  target)
        misses += _straddling_sites(index, model.graph, scope, original, families, base_dir, fuse_families)
        # Nested bodies live in the scope's nodes: fuse them before the scope goes back.
        _fuse_level(root, scope.model, families, base_dir, fuse_families, target, visible, body.label, outcome)
        close_scope(root, scope, visible)
        outcome.fusions.update(fusions)
        outcome.target_ops.update(target_ops)
        if +fusions:
            outcome.by_body[body.label] = dict(sorted((+fusions).items()))
        outcome.near_misses += [_in_body(miss, body) for miss in misses]
        released.update(scope.outer_constants)
    _drop_released_initializers(model.graph, released)
    forget_indexes()


def _drop_released_initializers(graph: onnx.GraphProto, released: set[str]) -> None:
    """The enclosing graph's initializers that only the fused bodies' nodes read (an epsilon, now
    an attribute): dropped. Nothing else is: the input's own dead code is not ours to touch."""
    if not released:
        return
    read = reads(graph) | {i.name for i in graph.input}
    kept = [t for t in graph.initializer if t.name not in released or t.name in read]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


def _fuse_scope(root, scope_model, original, families, base_dir, fuse_families, target):
    """The families on one body, then its lowering to ``target`` as the pipeline does for the
    main graph: (fused sites, near misses, target ops written)."""
    ledger = Ledger(scope_model) if target != "otfuse" else None
    fusions, misses = fuse_families(scope_model, families, base_dir,
                                    after_family=ledger.record if ledger else None)
    target_ops: Counter = Counter()
    if ledger is None or not (fusions or _census(scope_model)):
        return fusions, misses, target_ops
    lowered = lower(scope_model, target, base_dir, lambda: _copy(original), ledger)
    fusions, target_ops = lowered.sites, lowered.target_ops
    misses += lowered.near_misses
    wanted = opset.model_opset(scope_model)
    if fusions and wanted > opset.model_opset(root):
        # The body shares the model's opset: raise it only if every graph's ops keep their meaning.
        refusal = opset.raise_refusal(root, wanted)
        if refusal:
            misses += [{"pattern": f"{op} (target {target})", "location": op, "family": ops.get(op).family,
                        "reason": f"target {target} needs opset {wanted} here, but the model's opset "
                                  f"{opset.model_opset(root)} cannot be raised: {refusal}"}
                       for op in sorted(fusions)]
            fusions, target_ops = Counter(), Counter()
        else:
            opset.raise_to(root, wanted)
    if not fusions:  # every site went back: the body as it was
        scope_model.CopyFrom(original)
    return fusions, misses, target_ops


def _census(model: onnx.ModelProto) -> Counter:
    return Counter(node.op_type for node in model.graph.node if node.domain == OP_DOMAIN)


def _in_body(miss: dict, body: Body) -> dict:
    located = dict(miss)
    located["location"] = f"{body.label}: {miss['location']}"
    located["body"] = body.label
    return located


def _straddling_sites(index: GraphIndex, enclosing: onnx.GraphProto, scope: Scope,
                      original: onnx.ModelProto, families, base_dir, fuse_families) -> list[dict]:
    """Sites cut by the body's boundary: the families run (dry, on a copy) over the body with the
    enclosing nodes that compute its inputs copied in; a fused node there that takes any of those
    nodes is a site half outside the body. Reported where the dry run fused it, with the outer
    nodes it needed."""
    inlined = _outer_producers(index, enclosing, scope.outer_inputs)
    if not inlined:
        return []
    dry = _copy(original)
    made = {out for node in inlined for out in node.output if out}
    kept_inputs = [i for i in dry.graph.input if i.name not in made]
    del dry.graph.input[:]
    dry.graph.input.extend(kept_inputs)
    declared = defined_names(dry.graph)
    for node in inlined:
        for name in node.input:
            if name and name not in made and name not in declared:
                declared.add(name)
                tensor = outer_constant(index, name)
                if tensor is not None:
                    dry.graph.initializer.append(tensor)
                else:
                    dry.graph.input.insert(0, outer_value_info(index, name))
    copies = [_copy_node(node) for node in inlined]
    nodes = copies + list(dry.graph.node)
    del dry.graph.node[:]
    dry.graph.node.extend(nodes)
    try:
        fuse_families(dry, families, base_dir)
    except Exception:  # noqa: BLE001 - a dry run only looks; its failure says nothing about the body
        return []
    still = {out for node in dry.graph.node if node.domain != OP_DOMAIN for out in node.output if out}
    taken = [node for node in inlined if not any(out in still for out in node.output if out)]
    if not taken:
        return []
    fused_really = {(n.op_type, n.name) for n in scope.model.graph.node if n.domain == OP_DOMAIN}
    outer_names = ", ".join(f"{n.op_type} {n.name or n.output[0]!r}" for n in taken[:3])
    more = f" and {len(taken) - 3} more" if len(taken) > 3 else ""
    found = []
    for node in dry.graph.node:
        if node.domain != OP_DOMAIN or (node.op_type, node.name) in fused_really:
            continue
        reads_outer = any(name in made for name in node.input)
        if not reads_outer and not _reads_taken(node, taken):
            continue
        found.append({"pattern": f"{ops.get(node.op_type).family} site", "family": ops.get(node.op_type).family,
                      "location": f"{node.op_type} {node.name!r}",
                      "reason": f"straddles the body boundary: fused as {node.op_type} it would also take "
                                f"{outer_names}{more} of the enclosing graph; a fused node cannot span two scopes, "
                                f"so the site is left as written"})
    return found


def _reads_taken(node: onnx.NodeProto, taken) -> bool:
    # A fused node that replaced the outer nodes reads what they read (their inputs).
    outer_inputs = {name for n in taken for name in n.input if name}
    return any(name in outer_inputs for name in node.input)


def _outer_producers(index: GraphIndex, enclosing: onnx.GraphProto, names: list[str]) -> list[onnx.NodeProto]:
    """The enclosing graph's nodes (no control flow, no constants) that compute ``names``, up to
    STRADDLE_DEPTH steps up, in the enclosing graph's order."""
    picked: dict[int, onnx.NodeProto] = {}
    frontier = list(names)
    for _ in range(STRADDLE_DEPTH):
        following = []
        for name in frontier:
            node = index.producer.get(name)
            if node is None or id(node) in picked or index.is_constant(name) or _has_body(node):
                continue
            if len(picked) >= STRADDLE_MAX_NODES:
                break
            picked[id(node)] = node
            following += [n for n in node.input if n]
        frontier = following
    order = {id(node): position for position, node in enumerate(enclosing.node)}
    return sorted(picked.values(), key=lambda n: order.get(id(n), 0))


def _has_body(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _copy_node(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy
