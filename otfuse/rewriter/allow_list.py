"""What a rule that re-targets an existing op (standard or contrib) models, stated as data.

A rule that turns an ONNX ``Attention`` into ``otfuse.Attention`` models one op at some versions,
with some attributes, inputs and outputs. Anything else (a newer op version, an attribute it has
never heard of, an optional input or output it does not translate) must be refused, never dropped:
a silently dropped ``left_window_size`` changed every output of a model. ``require_allowed`` raises
``Refuse`` naming what is not modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import onnx
import onnx.defs

from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.refuse import Refuse

AttributeCheck = Callable[[object], None]  # raises Refuse saying why the value is not modelled


@dataclass(frozen=True)
class OpAllowList:
    """``versions``: the op versions (``since_version`` of the schema in effect) modelled.
    ``ort_builtin_below``: for default-domain ops that ORT also registers itself before ONNX had
    them (LayerNormalization before opset 17), the model opsets below which ORT's op is meant.
    For another ``domain`` (ORT's contrib ops, which have no ONNX schema), ``versions`` are the
    domain opsets modelled.
    ``attributes``: every attribute the rule models; a check (or None: the rule reads it itself).
    ``inputs``: how many inputs are modelled; ``outputs``: how many outputs may be used.
    ``formals``: the op's input and output names, for ops whose schema the ``onnx`` package does
    not know (ORT's contrib ops, domain ``com.microsoft``), so near misses name them."""

    op_type: str
    versions: frozenset[int]
    attributes: Mapping[str, AttributeCheck | None]
    inputs: int
    outputs: int
    domain: str = ""
    ort_builtin_below: int = 0
    notes: Mapping[str, str] = field(default_factory=dict)  # attribute -> why it is refused
    formals: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # (inputs, outputs) by name


# ORT's contrib ops (com.microsoft) have no schema in the onnx package; every one of them is at
# version 1 of that domain, which is what models import.
CONTRIB_DOMAIN = "com.microsoft"


def only(*allowed) -> AttributeCheck:
    """An attribute check: the value must be one of ``allowed``."""

    def check(value) -> None:
        if value not in allowed:
            raise Refuse(f"is {value!r}, modelled only as {', '.join(map(repr, allowed))}")

    return check


def model_opset(graph: GraphIndex, domain: str) -> int | None:
    for entry in graph.model.opset_import:
        if entry.domain == domain or (domain == "" and entry.domain == "ai.onnx"):
            return int(entry.version)
    return None


def op_version(graph: GraphIndex, node: onnx.NodeProto, allow: OpAllowList) -> int:
    """The version of ``node``'s op in effect in this model, or refuse when it is not modelled."""
    opset = model_opset(graph, allow.domain)
    label = f"{allow.op_type} (opset {opset})"
    if opset is None:
        raise Refuse(f"{label}: the model imports no opset for domain {allow.domain!r}")
    if allow.domain == CONTRIB_DOMAIN:
        if opset not in allow.versions:
            raise Refuse(f"{label}: only versions {sorted(allow.versions)} of {CONTRIB_DOMAIN} are modelled")
        return opset
    if allow.domain == "" and opset < allow.ort_builtin_below:
        return 0  # ORT's own op of that name (no ONNX schema): the rule models it as such
    if allow.domain not in ("", "ai.onnx"):
        raise Refuse(f"{label}: domain {allow.domain!r} has no version rule here")
    if allow.domain == "" and opset > onnx.defs.onnx_opset_version():
        raise Refuse(f"{label}: newer than the ONNX this otfuse runs with knows "
                     f"({onnx.defs.onnx_opset_version()}), so its semantics are not modelled")
    try:
        version = onnx.defs.get_schema(allow.op_type, opset, allow.domain).since_version
    except onnx.defs.SchemaError:
        raise Refuse(f"{label}: no such op at this opset") from None
    if version not in allow.versions:
        raise Refuse(f"{allow.op_type}-{version}: only versions {sorted(allow.versions)} are modelled")
    return version


def require_allowed(graph: GraphIndex, node: onnx.NodeProto, allow: OpAllowList) -> int:
    """Refuse ``node`` unless everything it states is modelled; return the op version in effect
    (0 for ORT's own default-domain op below ``ort_builtin_below``)."""
    version = op_version(graph, node, allow)
    for attribute in node.attribute:
        if attribute.name not in allow.attributes:
            why = allow.notes.get(attribute.name, "not modelled by this rule")
            raise Refuse(f"{allow.op_type} attribute {attribute.name!r}: {why}")
        check = allow.attributes[attribute.name]
        try:
            if check:
                check(onnx.helper.get_attribute_value(attribute))
        except Refuse as refusal:
            raise Refuse(f"{allow.op_type} attribute {attribute.name!r} {refusal}") from None
    inputs, outputs = _formals(graph, allow)
    for position, name in enumerate(node.input):
        if position >= allow.inputs and name:
            raise Refuse(f"{allow.op_type} input {_formal(inputs, position)} ({name!r}) is not modelled")
    for position, name in enumerate(node.output):
        if position >= allow.outputs and name and (graph.uses(name) or graph.is_graph_output(name)):
            raise Refuse(f"{allow.op_type} output {_formal(outputs, position)} ({name!r}) is used "
                         f"but not modelled")
    return version


def _formals(graph: GraphIndex, allow: OpAllowList) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if any(allow.formals):
        return allow.formals
    try:
        schema = onnx.defs.get_schema(allow.op_type, model_opset(graph, allow.domain) or 1, allow.domain)
    except onnx.defs.SchemaError:
        return (), ()
    return tuple(f.name for f in schema.inputs), tuple(f.name for f in schema.outputs)


def _formal(formals: tuple[str, ...], position: int) -> str:
    """The schema's name of an input or output (``qk_matmul_output``), else its position."""
    return formals[position] if position < len(formals) else f"#{position}"
