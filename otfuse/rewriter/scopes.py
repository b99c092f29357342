"""A control-flow body (``If``'s branches, ``Loop``'s and ``Scan``'s ``body``) as a standalone model
the passes can run on, and its result put back in the body.

The passes rewrite ``model.graph``. A body reads values of the graphs around it by name (outer
scope). ``open_scope`` copies the body into a model of its own where each such value is declared:
an outer initializer (or a small outer constant) becomes an initializer of the copy, so a rule
can read its value (an epsilon, a rotary table); any other outer value becomes a graph input, typed
and shaped by the enclosing graph's dimension engine where it knows them. Graph inputs are never
removed by a pass and their producers are out of reach, so a match cannot extend into the
enclosing graph, and nothing the enclosing graph computes is removed. ``close_scope`` writes the
copy's nodes back into the body, without the declarations it added, and checks that every value
the new body reads is its own or visible from outside.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from otfuse.errors import InternalError

# An outer constant that is not an initializer (a Constant node's, a folded shape) is declared in
# the copy with its value only up to this many elements; larger ones are inputs (weights need
# no value, only a type).
MAX_COPIED_CONSTANT = 4096


@dataclass
class Body:
    """One graph attribute of a node: ``label`` names it in reports, with its enclosing bodies
    (``"If 'optimum::if' then_branch"``, ``"Loop 'l' body / If 'i' else_branch"``)."""

    owner: onnx.NodeProto
    attribute: str
    graph: onnx.GraphProto  # the attribute's graph itself: close_scope rewrites it in place
    label: str


def bodies(graph: onnx.GraphProto, enclosing: str = "") -> Iterator[Body]:
    """The bodies of ``graph``'s nodes (not nested ones: those are bodies of the bodies)."""
    for node in graph.node:
        for attribute in node.attribute:
            subgraphs = ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else
                         list(attribute.graphs) if attribute.type == onnx.AttributeProto.GRAPHS else [])
            for position, sub in enumerate(subgraphs):
                which = attribute.name if len(subgraphs) == 1 else f"{attribute.name}[{position}]"
                label = f"{node.op_type} {node.name or node.output[0]!r} {which}"
                yield Body(node, attribute.name, sub, f"{enclosing} / {label}" if enclosing else label)


def defined_names(graph: onnx.GraphProto) -> set[str]:
    """The values ``graph`` itself defines: its inputs, initializers and node outputs."""
    return ({i.name for i in graph.input} | {t.name for t in graph.initializer}
            | {out for node in graph.node for out in node.output if out})


def free_values(graph: onnx.GraphProto) -> list[str]:
    """The outer-scope values ``graph`` reads (its nested bodies' included), in first-read order."""
    own = defined_names(graph)
    found: dict[str, None] = {}
    for node in graph.node:
        for name in node.input:
            if name and name not in own:
                found.setdefault(name)
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
                for name in free_values(sub):
                    if name not in own:
                        found.setdefault(name)
    for out in graph.output:
        if out.name and out.name not in own:
            found.setdefault(out.name)
    return list(found)


@dataclass
class Scope:
    """A body as a model (``model``), and what ``open_scope`` declared in it for outer values."""

    model: onnx.ModelProto
    body: Body
    outer_inputs: list[str] = field(default_factory=list)
    outer_constants: list[str] = field(default_factory=list)
    original_names: set[str] = field(default_factory=set)


def open_scope(model: onnx.ModelProto, outer, body: Body) -> Scope:
    """``body`` as a model with ``model``'s opsets; ``outer`` is the GraphIndex of the graph around
    the body (its types, shapes and constants declare the outer values)."""
    graph = onnx.GraphProto()
    graph.CopyFrom(body.graph)
    graph.name = graph.name or body.attribute
    scope_model = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    scope_model.ir_version = model.ir_version
    scope = Scope(scope_model, body, original_names=_all_names(body.graph))
    declared_inputs = []
    for name in free_values(body.graph):
        tensor = outer_constant(outer, name)
        if tensor is not None:
            scope_model.graph.initializer.append(tensor)
            scope.outer_constants.append(name)
        else:
            declared_inputs.append(outer_value_info(outer, name))
            scope.outer_inputs.append(name)
    # Outer values first: a Loop's or Scan's formal inputs stay where the body put them, after.
    formal = list(scope_model.graph.input)
    del scope_model.graph.input[:]
    scope_model.graph.input.extend(declared_inputs + formal)
    return scope


def outer_constant(outer, name: str) -> onnx.TensorProto | None:
    """The outer value as an initializer of the scope when the enclosing graph knows it before run
    time (an initializer that no input overrides; a small Constant or folded shape), else None."""
    if outer is None or not outer.is_constant(name):
        return None
    tensor = outer.constant_tensor(name)
    if tensor is not None and name in outer.initializers:
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)  # external data stays a reference into the same files
        return copy
    size = outer.constant_size(name)
    if size is None or size > MAX_COPIED_CONSTANT:
        return None
    value = outer.constant_value(name)
    return None if value is None else numpy_helper.from_array(np.asarray(value), name)


def outer_value_info(outer, name: str) -> onnx.ValueInfoProto:
    """The outer value's type: its element type and its shape in the enclosing graph's terms (a
    dim the engine only knows by a symbol of its own keeps that symbol's name, so values that
    share the dim still share it in the body)."""
    if outer is None:
        return onnx.helper.make_empty_tensor_value_info(name)
    elem = outer.elem_type(name)
    exprs = outer.dims.expr_shape(name, proven=True)
    if not elem and exprs is None:
        return onnx.helper.make_empty_tensor_value_info(name)
    shape = None if exprs is None else [d.value if d.value is not None else d.text for d in exprs]
    return onnx.helper.make_tensor_value_info(name, elem, shape)


def close_scope(model: onnx.ModelProto, scope: Scope, visible_outside: set[str]) -> None:
    """Write ``scope.model``'s graph back into its body; ``visible_outside``: every value the body
    may read from the graphs around it. The opsets the scope gained are imported by ``model``."""
    body, graph = scope.body.graph, scope.model.graph
    added = set(scope.outer_inputs) | set(scope.outer_constants)
    formal = [i for i in graph.input if i.name not in added]
    if [i.name for i in formal] != [i.name for i in body.input] or \
            [o.name for o in graph.output] != [o.name for o in body.output]:
        raise InternalError(f"{scope.body.label}: a pass changed the body's inputs or outputs")
    _rename_clashes(graph, scope.original_names | added, visible_outside)
    own = defined_names(graph) - added
    missing = sorted({name for name in reads(graph) if name not in own and name not in visible_outside})
    if missing:
        raise InternalError(f"{scope.body.label}: the fused body would read {missing[:3]}, which it cannot see")
    initializers = [t for t in graph.initializer if t.name not in added]
    made = {out for node in graph.node for out in node.output if out}
    value_info = [v for v in graph.value_info if v.name in made]
    del body.node[:]
    body.node.extend(graph.node)
    del body.initializer[:]
    body.initializer.extend(initializers)
    del body.value_info[:]
    body.value_info.extend(value_info)
    have = {entry.domain for entry in model.opset_import}
    for entry in scope.model.opset_import:
        if entry.domain not in have:
            model.opset_import.append(onnx.helper.make_opsetid(entry.domain, entry.version))


def reads(graph: onnx.GraphProto) -> set[str]:
    """Every name ``graph``'s nodes, nested bodies and outputs read."""
    names = {o.name for o in graph.output}
    for node in graph.node:
        names.update(name for name in node.input if name)
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
                names.update(free_values(sub))
    return names


def _all_names(graph: onnx.GraphProto) -> set[str]:
    names = defined_names(graph) | {node.name for node in graph.node}
    for node in graph.node:
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
                names |= _all_names(sub)
    return names


def _rename_clashes(graph: onnx.GraphProto, original: set[str], outside: set[str]) -> None:
    """``original``: the body's names and the outer values declared in the scope. A value the passes made in the body (a fresh initializer, a helper's output) under a name an
    enclosing graph already uses would shadow that value: give it a name of its own."""
    taken = original | outside | _all_names(graph)
    renamed: dict[str, str] = {}
    for name in sorted(defined_names(graph) - original):
        if name in outside:
            new, counter = f"{name}__body", 1
            while new in taken:
                counter += 1
                new = f"{name}__body{counter}"
            taken.add(new)
            renamed[name] = new
    if not renamed:
        return
    for tensor in graph.initializer:
        tensor.name = renamed.get(tensor.name, tensor.name)
    for node in graph.node:
        for position, name in enumerate(node.input):
            node.input[position] = renamed.get(name, name)
        for position, name in enumerate(node.output):
            node.output[position] = renamed.get(name, name)
    for info in graph.value_info:
        info.name = renamed.get(info.name, info.name)
