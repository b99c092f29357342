"""Where a family's sites are, independently of whether any rule matched them.

A rule reports a near miss only for a candidate it began to match. A site no rule began to match
(a spelling nobody wrote a pattern for, an op another tool fused) would otherwise leave no trace
in the report. Each family describes its sites by a few structural signatures (``SiteSignature``):
after the families ran, every node still in the graph that carries one and that no near miss names
is reported as an unfused site.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import onnx


class GraphScan:
    """Producers and consumers of a model's values, for site signatures."""

    def __init__(self, model: onnx.ModelProto):
        self.nodes = list(model.graph.node)
        self.producer = {out: node for node in self.nodes for out in node.output if out}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)

    def parent(self, node: onnx.NodeProto, index: int = 0) -> onnx.NodeProto | None:
        return self.producer.get(node.input[index]) if len(node.input) > index else None

    def parents(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        return [self.producer[name] for name in node.input if name in self.producer]

    def readers(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        return [user for out in node.output if out for user in self.consumers.get(out, [])]

    def reaches(self, start: onnx.NodeProto, ops: set[str], through: set[str], upstream: bool,
                depth: int = 6) -> bool:
        """Whether a node of type ``ops`` is within ``depth`` steps of ``start`` (upstream: its
        inputs' producers; else its readers), passing only nodes of type ``through``."""
        frontier = [start]
        for _ in range(depth):
            following = []
            for node in frontier:
                for near in (self.parents(node) if upstream else self.readers(node)):
                    if near.op_type in ops:
                        return True
                    if near.op_type in through:
                        following.append(near)
            frontier = following
        return False


@dataclass(frozen=True)
class SiteSignature:
    """A site's anchor node: ``op_types`` (any domain), and a structural test around it."""

    what: str  # "attention (MatMul -> Softmax -> MatMul)", for the report
    op_types: frozenset[str]
    test: Callable[[GraphScan, onnx.NodeProto], bool] = lambda scan, node: True


def unfused_sites(model: onnx.ModelProto, signatures: Iterable[tuple[str, SiteSignature]],
                  reported: set[str]) -> list[dict]:
    """A near miss for every anchor still in ``model`` that no near miss names (``reported``: node
    names and locations of the near misses made): (family, signature) pairs give the families."""
    signatures = list(signatures)
    if not signatures:
        return []
    scan = GraphScan(model)
    found = []
    for node in scan.nodes:
        if node.domain == "otfuse":
            continue
        label = f"{node.op_type} {node.name or node.output[0]!r}"
        if (node.name and node.name in reported) or label in reported:
            continue
        for family, signature in signatures:
            if node.op_type in signature.op_types and signature.test(scan, node):
                found.append({"pattern": f"{family} site", "location": label, "family": family,
                              "reason": f"{signature.what}: no {family} rule matched this site"})
                break
    return found
