"""Lower a model fused in the otfuse domain to a target's ops (``ort``: ONNX Runtime's contrib ops,
``onnx``: standard opset-23 ops), site by site.

Each otfuse node is the ``Fusion`` its rule's analysis made (inputs, outputs and attributes by
contract name); the target's emitter (norm.py, rope.py, attention.py) writes the target ops that
compute exactly that, or raises ``CannotExpress``. A refused site goes back to the original graph's
nodes (restore.py), and the report lists it: "target ort cannot express ...". A ``RopeAttention``
whose attention cannot be expressed keeps its rotations when the rope family had fused them as a
``RotaryEmbeddingQK`` (the ``ledger`` of fused nodes recorded after each family names the rotated
values): only the attention goes back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from otfuse import ops
from otfuse.domain import OP_DOMAIN
from otfuse.errors import OtfuseError
from otfuse.rewriter.graph import GraphIndex, forget_indexes, index_for
from otfuse.rewriter.passes import _toposort
from otfuse.rewriter.rule import RewriteContext
from otfuse.targets import activation, attention, norm, opset, rope
from otfuse.targets.build import MS_DOMAIN, CannotExpress, Emitter
from otfuse.targets.call import FusedCall, read_call
from otfuse.targets.restore import reads, restore_sites

TARGETS = ("otfuse", "ort", "onnx")

EMITTERS: dict[str, dict[str, Callable[[Emitter, FusedCall], None]]] = {
    "ort": {**norm.ORT, **rope.ORT, **attention.ORT, **activation.ORT},
    "onnx": {**norm.ONNX, **rope.ONNX, **attention.ONNX, **activation.ONNX},
}


def writes(target: str, ops) -> bool:
    """Whether ``target`` has an emitter for any of ``ops`` (a family's ``emits``). A family it has
    none for is left out of the target's default families: each of its sites would go back to the
    original nodes, taking along what an earlier family fused there and the target does write
    (norm_linear's norm)."""
    return target == "otfuse" or any(op in EMITTERS.get(target, {}) for op in ops)


# What the emitters read of each op: an input or attribute the contract gains later is refused until
# an emitter models it, never silently dropped.
_ATTENTION_INPUTS = {"Q", "K", "V", "attn_bias", "key_padding_mask", "past_key", "past_value", "alibi_slopes",
                     "sinks"}
_ATTENTION_ATTRIBUTES = {"num_heads", "kv_num_heads", "scale", "causal", "window", "softcap", "layout",
                         "output_layout", "empty_rows", "alibi_positions"}
_ROTARY_ATTRIBUTES = {"mode", "rotary_dim", "sections"}
MODELLED: dict[str, tuple[set[str], set[str]]] = {
    "RMSNorm": ({"X", "scale"}, {"epsilon", "axis"}),
    "AddRMSNorm": ({"A", "B", "scale"}, {"epsilon", "axis"}),
    "LayerNorm": ({"X", "scale", "bias"}, {"epsilon", "axis"}),
    "AddLayerNorm": ({"A", "B", "scale", "bias"}, {"epsilon", "axis"}),
    "RotaryEmbedding": ({"X", "cos", "sin"}, _ROTARY_ATTRIBUTES),
    "RotaryEmbeddingQK": ({"Q", "K", "cos", "sin"}, _ROTARY_ATTRIBUTES),
    "Attention": (_ATTENTION_INPUTS, _ATTENTION_ATTRIBUTES),
    "RopeAttention": (_ATTENTION_INPUTS | {"cos", "sin"},
                      _ATTENTION_ATTRIBUTES | {"rotary_mode", "rotary_dim", "rotary_sections"}),
    "Gelu": ({"X"}, {"approximate"}),
    "QuickGelu": ({"X"}, {"alpha"}),
    "SiLU": ({"X"}, set()),
    "ReluSquared": ({"X"}, set()),
    "SwiGLU": ({"A", "B"}, {"gate_half"}),
    "GeGLU": ({"A", "B"}, {"approximate", "gate_half"}),
}


def require_modelled(call: FusedCall, target: str) -> None:
    """Refuse a call that gives an input, or sets an attribute away from its default, that no
    emitter of ``target`` reads."""
    inputs, attributes = MODELLED[call.op]
    extra = sorted(name for name, value in call.inputs.items() if value and name not in inputs)
    if extra:
        raise CannotExpress(f"{call.op}'s {', '.join(extra)}: no {target} emitter models it")
    contract = ops.get(call.op)
    for attribute in contract.attributes:
        if attribute.name not in attributes and call.attributes.get(attribute.name) != attribute.default:
            raise CannotExpress(f"{call.op}'s attribute {attribute.name} = {call.attributes.get(attribute.name)!r}: "
                                f"no {target} emitter models it")


@dataclass
class Lowered:
    sites: Counter = field(default_factory=Counter)  # otfuse op -> sites the target expresses
    target_ops: Counter = field(default_factory=Counter)  # "domain.op" -> nodes written
    near_misses: list[dict] = field(default_factory=list)


class Ledger:
    """The otfuse nodes present after each family (``record``): what a later fold absorbed."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.rotations: dict[tuple[str, ...], tuple[str, ...]] = {}
        # What the input graph computes and holds: dead code among it is not the lowering's to drop.
        self.original_values = frozenset(_taken_names(model))

    def record(self, family: str, model: onnx.ModelProto) -> None:
        for node in model.graph.node:
            if node.domain == OP_DOMAIN and node.op_type == "RotaryEmbeddingQK":
                attrs = tuple(sorted((a.name, str(onnx.helper.get_attribute_value(a))) for a in node.attribute))
                self.rotations[(*node.input, *(str(a) for a in attrs))] = tuple(node.output)

    def rotation_outputs(self, call: FusedCall) -> tuple[str, str] | None:
        node = _rotation_of(call)
        attrs = tuple(sorted((a.name, str(onnx.helper.get_attribute_value(a))) for a in node.attribute))
        q, k, cos, sin = node.input
        found = self.rotations.get((q, k, cos, sin, *(str(a) for a in attrs)))
        if found is not None:
            return found[0], found[1]
        found = self.rotations.get((k, q, cos, sin, *(str(a) for a in attrs)))  # the pair held k first
        return None if found is None else (found[1], found[0])


def _rotation_of(call: FusedCall, outputs=("", "")) -> onnx.NodeProto:
    """The RotaryEmbeddingQK a RopeAttention folded (fold_rope.py), as the rope family wrote it."""
    a = call.attributes
    rotary = {"mode": a["rotary_mode"], "rotary_dim": a["rotary_dim"]}
    if a["rotary_sections"]:
        rotary["sections"] = list(a["rotary_sections"])
    inputs = [call.input(n) for n in ("Q", "K", "cos", "sin")]
    return onnx.helper.make_node("RotaryEmbeddingQK", inputs, list(outputs), name=call.node.name,
                                 domain=OP_DOMAIN, **rotary)


def _miss(target: str, node: onnx.NodeProto, reason: str, fused_as: str = "") -> dict:
    miss = {"pattern": f"{node.op_type} (target {target})", "location": f"{node.op_type} {node.name!r}",
            "reason": f"target {target} cannot express {node.op_type}: {reason}",
            "family": ops.get(node.op_type).family}
    if fused_as:
        miss["fused_as"] = fused_as
    return miss


def _taken_names(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    return ({n.name for n in g.node} | {o for n in g.node for o in n.output} | {i.name for i in g.input}
            | {t.name for t in g.initializer} | {o.name for o in g.output})


def _emit(graph: GraphIndex, node: onnx.NodeProto, names: RewriteContext, target: str, limit: int,
          ledger: Ledger, call: FusedCall | None = None) -> Emitter:
    op = call.op if call is not None else node.op_type
    if op not in EMITTERS[target]:  # norm_linear's (a norm and its projections)
        raise CannotExpress(f"no {target} op is mapped to it (docs/ops.md, \"Targets\")")
    em = Emitter(graph, node, names, target, ledger.original_values)
    em.max_opset = limit
    call = call or read_call(node)
    require_modelled(call, target)
    EMITTERS[target][op](em, call)
    return em


def lower(model: onnx.ModelProto, target: str, base_dir, load_original: Callable[[], onnx.ModelProto],
          ledger: Ledger) -> Lowered:
    """Rewrite ``model`` (fused, in place) into ``target``'s ops; sites it cannot express go back to
    ``load_original()``'s nodes."""
    result = Lowered()
    fused = [node for node in model.graph.node if node.domain == OP_DOMAIN]
    if not fused:
        return result
    graph = index_for(model, base_dir)
    names = RewriteContext(graph)  # fresh names for every emitter
    limit, raise_refusal = opset.reachable(model, target)
    replaced: dict[int, Emitter] = {}
    back: list[onnx.NodeProto] = []  # refused sites: every output restored
    partly: list[onnx.NodeProto] = []  # RopeAttention whose rotations stay: outputs restored
    for node in fused:
        try:
            replaced[id(node)] = _emit(graph, node, names, target, limit, ledger)
            result.sites[node.op_type] += 1
            continue
        except CannotExpress as refusal:
            reason = str(refusal)
        except opset.OpsetTooLow as refusal:
            reason = f"{refusal}: {raise_refusal}"
        kept = _unfold(graph, node, names, target, limit, ledger)
        if kept is not None:
            replaced[id(node)] = kept
            partly.append(node)
            result.sites["RotaryEmbeddingQK"] += 1
            result.near_misses.append(_miss(target, node, reason, fused_as="RotaryEmbeddingQK (target ops)"))
        else:
            back.append(node)
            result.near_misses.append(_miss(target, node, reason))
    _rewrite(model, fused, replaced, back + partly, load_original, ledger.original_values)
    _require_no_otfuse_op(model, target, result.near_misses)
    needed = max([em.opsets.get("", 0) for em in replaced.values()] + [0])
    opset.raise_to(model, needed)
    if any(em.opsets.get(MS_DOMAIN) for em in replaced.values()):
        _import(model, MS_DOMAIN, 1)
    if not any(n.domain == OP_DOMAIN for n in model.graph.node):
        kept_imports = [o for o in model.opset_import if o.domain != OP_DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(kept_imports)
    for em in replaced.values():
        for n in em.nodes:
            result.target_ops[f"{n.domain or 'ai.onnx'}.{n.op_type}"] += 1
    forget_indexes()
    return result


class TargetRefused(OtfuseError):
    """A ``--target ort|onnx`` model would keep an otfuse op (the input held one the target cannot
    express): refused, so a target model never needs otfuse's library."""


def _require_no_otfuse_op(model: onnx.ModelProto, target: str, misses: list[dict]) -> None:
    left = [n for n in model.graph.node if n.domain == OP_DOMAIN]
    if not left:
        return
    node = left[0]
    why = next((m["reason"] for m in misses if m["location"] == f"{node.op_type} {node.name!r}"),
               f"target {target} cannot express {node.op_type}")
    raise TargetRefused(f"the input already holds otfuse's {node.op_type} {node.name!r} (and {len(left) - 1} "
                        f"more otfuse nodes); {why}, and a target {target} model must not need otfuse's library "
                        f"(fuse the unfused model with --target {target} instead)")


def _unfold(graph: GraphIndex, node: onnx.NodeProto, names: RewriteContext, target: str, limit: int,
            ledger: Ledger) -> Emitter | None:
    """The rotations of a refused RopeAttention, written to the values the rope family named."""
    if node.op_type != "RopeAttention":
        return None
    call = read_call(node)
    rotated = ledger.rotation_outputs(call)
    if rotated is None:
        return None
    rotation = _rotation_of(call, rotated)
    try:
        return _emit(graph, node, names, target, limit, ledger, read_call(rotation))
    except (CannotExpress, opset.OpsetTooLow):
        return None


def _import(model: onnx.ModelProto, domain: str, version: int) -> None:
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(domain, version))


def _rewrite(model, fused, replaced, restored, load_original, original_values: set[str]) -> None:
    g = model.graph
    nodes: list[onnx.NodeProto] = []
    positions: list[int] = []
    dropped = {id(n) for n in fused}
    for position, node in enumerate(g.node):
        if id(node) in replaced:
            nodes += replaced[id(node)].nodes
            positions += [position] * len(replaced[id(node)].nodes)
            g.initializer.extend(replaced[id(node)].initializers)
        elif id(node) not in dropped:
            nodes.append(node)
            positions.append(position)
    if restored:
        outputs = {o for node in restored for o in node.output if o}
        for node in restored:  # the rotated q/k an unfolded RopeAttention writes are not its outputs
            if id(node) in replaced:
                outputs -= set(o for n in replaced[id(node)].nodes for o in n.output)
        available = ({i.name for i in g.input} | {t.name for t in g.initializer}
                     | {o for n in nodes for o in n.output if o})
        original = load_original()
        back, tensors = restore_sites(g, original.graph, outputs, available)
        first = min(positions) if positions else 0
        nodes += back
        positions += [first] * len(back)
        have = {t.name for t in g.initializer}
        g.initializer.extend(t for t in tensors if t.name not in have)
    ordered = _toposort(nodes, positions, g)
    del g.node[:]
    g.node.extend(_drop_dead(g, ordered, original_values))
    _drop_unread_initializers(g, original_values)
    alive = {o for n in g.node for o in n.output}
    kept = [v for v in g.value_info if v.name in alive]
    del g.value_info[:]
    g.value_info.extend(kept)


def _drop_dead(g: onnx.GraphProto, nodes: list[onnx.NodeProto], original: set[str]) -> list[onnx.NodeProto]:
    """Nodes otfuse made that nothing reads any more (the helpers of a fused node that went back),
    transitively; the input's own dead code stays."""
    outputs = {o.name for o in g.output}
    while True:
        read = {name for n in nodes for name in reads(n)} | outputs
        alive = [n for n in nodes if any(o in read or o in original for o in n.output if o)]
        if len(alive) == len(nodes):
            return nodes
        nodes = alive


def _drop_unread_initializers(g: onnx.GraphProto, original: set[str]) -> None:
    read = {name for n in g.node for name in reads(n)} | {o.name for o in g.output} | {i.name for i in g.input}
    kept = [t for t in g.initializer if t.name in read or t.name in original]
    if len(kept) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(kept)
