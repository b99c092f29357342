"""How many norms, attentions and RoPE applications an exported graph spells, counted on the ONNX
graph as the exporter wrote it (rules in models/README.md). One copy for the exporter, which checks
the counts against the ones derived from the torch model, and for tests/models/test_fixtures.py,
which checks the committed fixtures against their manifest. Needs onnx only (no torch)."""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import numpy_helper


def scalar_constant(proto: onnx.ModelProto, name: str) -> float | None:
    tensors = [init for init in proto.graph.initializer if init.name == name]
    tensors += [a.t for n in proto.graph.node if n.op_type == "Constant" and n.output[0] == name
                for a in n.attribute if a.name == "value"]  # TorchScript exports
    for tensor in tensors:
        value = numpy_helper.to_array(tensor)
        return float(value.reshape(-1)[0]) if value.size == 1 else None
    return None


def graph_structure_counts(proto: onnx.ModelProto) -> dict[str, int]:
    """Count the structures as the exporter spelled them (see models/README.md). The exporter
    requires these to equal the model-derived `expected`."""
    nodes = proto.graph.node
    producer = {out: n for n in nodes for out in n.output}
    ops = Counter(n.op_type for n in nodes)
    decomposed_rms = 0
    for n in nodes:
        if n.op_type != "ReduceMean":
            continue
        pow_node = producer.get(n.input[0])
        if pow_node is None or pow_node.op_type != "Pow" or scalar_constant(proto, pow_node.input[1]) != 2.0:
            continue
        src = producer.get(pow_node.input[0])
        if src is None or src.op_type != "Sub":  # Sub -> Pow -> ReduceMean would be a LayerNorm variance
            decomposed_rms += 1
    return {
        "rmsnorm": decomposed_rms + ops["RMSNormalization"],
        "layernorm": ops["LayerNormalization"],
        "attention": ops["Softmax"] + ops["Attention"],
        "rotary_applications": rotary_application_count(nodes),
    }


def rotary_application_count(nodes) -> int:
    """RoPE applied to one tensor = one `RotaryEmbedding`, or one rotation `Neg` (rotate_half /
    rotate_every_two) followed forward to the `Add` of x*cos + rot*sin; the `Add`s of the
    sections of a multi-axis RoPE, concatenated by one `Concat`, count once together."""
    consumers: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    ends: set[str] = set()  # the Add closing each rotation (the Neg's own output if none does)
    for n in nodes:
        if n.op_type != "Neg":
            continue
        node, end = n, n.output[0]
        for _ in range(6):  # Neg [-> Unsqueeze] -> Concat [-> Reshape] -> Mul -> Add
            users = consumers.get(node.output[0], [])
            if len(users) != 1:
                break
            node = users[0]
            if node.op_type == "Add":
                end = node.output[0]
                break
        ends.add(end)
    applications = set()
    for end in ends:
        users = consumers.get(end, [])
        if len(users) == 1 and users[0].op_type == "Concat" and sum(i in ends for i in users[0].input) >= 2:
            end = users[0].output[0]  # sections concatenated: one application
        applications.add(end)
    return len(applications) + sum(1 for n in nodes if n.op_type == "RotaryEmbedding") + pair_rotations(nodes)


def pair_rotations(nodes) -> int:
    """Rotations on explicit lane pairs (models/meta_rope.py): `Sub(Mul(x0, c), Mul(x1, s))` with
    x0 and x1 two Gather / Slice / Split outputs of one tensor, one per rotation."""
    producer = {out: n for n in nodes for out in n.output}
    count = 0
    for n in nodes:
        muls = [producer.get(i) for i in n.input] if n.op_type == "Sub" else []
        if len(muls) != 2 or any(m is None or m.op_type != "Mul" for m in muls):
            continue
        lanes = [{producer[i].input[0] for i in m.input if i in producer
                  and producer[i].op_type in ("Gather", "Slice", "Split")} for m in muls]
        count += bool(lanes[0] & lanes[1])
    return count
