"""Pair the q and k rotations of one attention into one ``RotaryEmbeddingQK`` node.

Two ``RotaryEmbedding`` nodes pair when they use the same cos, sin and attributes, rotate the
same head dim, neither depends on the other (so one node can compute both without a cycle: this
is what keeps layer l's q from pairing with layer l+1's k), and their inputs meet within a few
ops upstream (the same projection input). Unpaired rotations stay single.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import onnx

from otfuse import ops
from otfuse.domain import OP_DOMAIN
from otfuse.rewriter.graph import GraphIndex, index_for
from otfuse.rewriter.passes import PassResult, apply_replacements
from otfuse.rewriter.pattern import attributes
from otfuse.rewriter.rule import Fusion, Replacement, RewriteContext, emit

_ANCESTOR_HOPS = 6


def _upstream(graph: GraphIndex, value: str, hops: int) -> set[str]:
    """Values computed within ``hops`` ops above ``value`` (constants and inputs excluded)."""
    seen, frontier = set(), [value]
    for _ in range(hops):
        next_frontier = []
        for name in frontier:
            node = graph.producer.get(name)
            if node is None:
                continue
            for parent in node.input:
                if parent and parent not in seen and not graph.is_constant(parent):
                    seen.add(parent)
                    next_frontier.append(parent)
        frontier = next_frontier
    return seen


def _reaches(graph: GraphIndex, start: onnx.NodeProto, target: onnx.NodeProto) -> bool:
    """Whether any output of ``start`` flows (through any path) into ``target``."""
    stack, seen = list(start.output), set()
    while stack:
        value = stack.pop()
        for user in graph.uses(value):
            if user is target:
                return True
            if id(user) not in seen:
                seen.add(id(user))
                stack.extend(out for out in user.output if out)
    return False


def _attrs(node: onnx.NodeProto) -> tuple:
    return tuple(sorted((a.name, str(onnx.helper.get_attribute_value(a))) for a in node.attribute))


def _identity(graph: GraphIndex, name: str, depth: int = 3) -> tuple:
    """What a value is, as far as equality goes: constants by content, small computations by
    structure. Two exports may give q and k separate but identical cos tables."""
    if graph.is_constant(name):
        size = graph.constant_size(name)
        if size is not None and size <= 65536:
            value = graph.constant_value(name)
            return ("const", str(value.dtype), value.shape, hashlib.sha1(value.tobytes()).hexdigest())
    node = graph.producer.get(name)
    if node is None or depth == 0:
        return ("value", name)
    return (node.op_type, node.domain, _attrs(node), list(node.output).index(name),
            tuple(_identity(graph, parent, depth - 1) for parent in node.input))


def _key(graph: GraphIndex, node: onnx.NodeProto) -> tuple:
    return (_identity(graph, node.input[1]), _identity(graph, node.input[2]), _attrs(node))


class PairQKPass:
    """Merges pairable RotaryEmbedding nodes (see the module docstring)."""

    def run(self, model: onnx.ModelProto, base_dir: Path | None) -> PassResult:
        graph = index_for(model, base_dir)
        rotations = [n for n in model.graph.node if n.op_type == "RotaryEmbedding" and n.domain == OP_DOMAIN]
        if len(rotations) < 2:
            return PassResult()
        ctx = RewriteContext(graph)
        paired: set[int] = set()
        replacements: dict[int, Replacement] = {}
        for index, first in enumerate(rotations):
            if id(first) in paired:
                continue
            partner = self._partner(graph, first, rotations[index + 1:], paired)
            if partner is None:
                continue
            paired |= {id(first), id(partner)}
            call = ops.RotaryEmbeddingQK(Q=first.input[0], K=partner.input[0], cos=first.input[1],
                                         sin=first.input[2], Q_out=first.output[0], K_out=partner.output[0],
                                         **attributes(first))
            replacements[id(first)] = emit(ctx, Fusion(call, (first, partner)))
        if not replacements:
            return PassResult()
        apply_replacements(model, list(model.graph.node), paired, replacements, graph)
        return PassResult(fusions=Counter({"RotaryEmbeddingQK": len(replacements)}))

    def _partner(self, graph: GraphIndex, first: onnx.NodeProto, later: list[onnx.NodeProto],
                 paired: set[int]) -> onnx.NodeProto | None:
        first_head = (graph.shape(first.input[0]) or [None])[-1]
        near_first = _upstream(graph, first.input[0], _ANCESTOR_HOPS) | {first.input[0]}
        for other in later:
            if id(other) in paired or _key(graph, other) != _key(graph, first):
                continue
            if first_head is None or (graph.shape(other.input[0]) or [None])[-1] != first_head:
                continue
            near_other = _upstream(graph, other.input[0], _ANCESTOR_HOPS) | {other.input[0]}
            if not near_first & near_other:
                continue
            if _reaches(graph, first, other) or _reaches(graph, other, first):
                continue
            return other
        return None
