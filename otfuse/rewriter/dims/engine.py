"""The dimension engine: element type, symbolic shape and (for small integer tensors) symbolic
value of every value of a graph, in one pass over the nodes in order.

Graph inputs give the first symbols: a named dim is that name (``'past_seq + seq'`` is parsed as
the sum), an unnamed, ``-1``, ``0`` or ``unk__N`` dim is a fresh unknown named after where it
is (``input_ids.dim1``). Each node's outputs follow from its inputs by the op's rule
(``ops_*.py``), which also records what the op implies about its inputs (MatMul's inner dims
agree, Concat's other axes agree, two dims that broadcast and are provably not 1 are equal,
Reshape's element count is kept): these are the equalities ``facts.Facts`` solves. An op without
a rule asks onnx's own inference for that one node, on the engine's shapes; declared value_info
adds its dims as further equalities. Nothing else is read: no whole-model inference, no weights.

Two views of the same facts. The *proven* one holds in every run the graph allows. The *assumed*
one adds the exporters' convention (torch's, and ONNX Runtime's symbolic inference): two dims
that meet in a broadcast, neither provably 1, are equal. The families see the assumed view
(``shape``): what they derive from it (head counts, a table broadcasting over x) the fused
kernels check at run time, so a wrong assumption is an error, never a wrong result. A check whose
claim nothing checks at run time asks for the proven view (``proven_shape``): a residual Add the
fused op will not broadcast, a Reshape that must restore x's shape, a Shape read moved to
another tensor.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import onnx

from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.dims import values as V
from otfuse.rewriter.dims.expr import Expr
from otfuse.rewriter.dims.facts import Facts

Shape = tuple[Expr, ...]
Out = tuple[int, Shape | None, np.ndarray | None]  # (elem type, shape, symbolic value) of one output
Handler = Callable[["NodeContext"], list[Out] | None]
HANDLERS: dict[tuple[str, str], Handler] = {}

_STANDARD = ("", "ai.onnx")


def handles(*op_types: str, domain: str = ""):
    """Register a shape rule for ``op_types`` of ``domain`` ('' is the standard domain)."""
    def register(fn: Handler) -> Handler:
        for op_type in op_types:
            HANDLERS[(domain, op_type)] = fn
        return fn
    return register


class SymDim(str):
    """A dim that is not a number, as its canonical text; ``.expr`` is the expression."""

    expr: Expr

    def __new__(cls, expr: Expr):
        dim = super().__new__(cls, expr.text)
        dim.expr = expr
        return dim


def _is_blank_param(text: str) -> bool:
    return not text or text.startswith("unk__") or text.strip() in ("?", "-1", "None")


class NodeContext:
    """What an op rule sees of one node: its inputs' facts, attributes, and the engine's facts."""

    __slots__ = ("engine", "node", "opset")

    def __init__(self, engine: DimEngine, node: onnx.NodeProto, opset: int):
        self.engine, self.node, self.opset = engine, node, opset

    def has(self, i: int) -> bool:
        return i < len(self.node.input) and bool(self.node.input[i])

    @property
    def inputs(self) -> int:
        return len(self.node.input)

    def shape(self, i: int) -> Shape | None:
        return self.engine.expr_shape(self.node.input[i]) if self.has(i) else None

    def rank(self, i: int) -> int | None:
        shape = self.shape(i)
        return None if shape is None else len(shape)

    def elem(self, i: int) -> int:
        return self.engine.elem_type(self.node.input[i]) if self.has(i) else 0

    def value(self, i: int) -> np.ndarray | None:
        if not self.has(i):
            return None
        value = self.engine.values.get(self.node.input[i])
        if value is None:
            return None
        return V.unary(self.engine.facts.canonical, value)

    def ints(self, i: int) -> list[int] | None:
        return V.numbers(self.value(i))

    def items(self, i: int) -> list[Expr | None] | None:
        """A 1-D input's items (None where unknown), e.g. a Reshape target; None if its length is
        unknown."""
        value = self.value(i)
        if value is not None and value.ndim <= 1:
            return list(value.reshape(-1))
        shape = self.shape(i)
        if shape is not None and len(shape) == 1 and shape[0].value is not None:
            return [None] * shape[0].value
        return None

    def attr(self, name: str, default=None):
        for attribute in self.node.attribute:
            if attribute.name == name:
                return onnx.helper.get_attribute_value(attribute)
        return default

    def learn(self, a: Expr, b: Expr) -> None:
        """A fact the op implies in every valid run."""
        self.engine.facts.learn(a, b)
        self.engine.assumed.learn(a, b)

    def assume(self, a: Expr, b: Expr) -> None:
        """Two dims that broadcast, neither provably 1, taken as equal (the exporters' convention):
        in the assumed view only."""
        self.engine.assumed.learn(a, b)

    def canonical(self, e: Expr) -> Expr:
        return self.engine.facts.canonical(e)

    def fresh(self, output: int, axis: int) -> Expr:
        return self.engine.fresh(f"{self.node.output[output]}.dim{axis}")

    def fresh_shape(self, output: int, rank: int) -> Shape:
        return tuple(self.fresh(output, axis) for axis in range(rank))


class DimEngine:
    """Facts about every value of ``graph`` (onnx.GraphProto). ``constant(name)`` gives a constant's
    (elem type, dims, numpy value or None when it is large); None for a non-constant."""

    def __init__(self, model: onnx.ModelProto, constant: Callable[[str], tuple | None]):
        self.model = model
        self.graph = model.graph
        self.facts = Facts()  # what every valid run satisfies
        self.assumed = Facts()  # that, and broadcasts of two dims not provably 1 taken as equal
        self.elems: dict[str, int] = {}
        self.shapes: dict[str, Shape | None] = {}
        self.values: dict[str, np.ndarray] = {}
        self._rendered: dict[str, tuple | None] = {}
        self._constant = constant
        self.opsets = {e.domain or "": e.version for e in model.opset_import}
        self.opsets.setdefault("", self.opsets.get("ai.onnx", 0))
        self.declared = {vi.name: vi for vi in itertools.chain(self.graph.output, self.graph.value_info)}
        self.unmodelled: set[str] = set()  # op types whose outputs came from onnx or declarations
        self._named: set[Expr] = set()  # declared dims whose symbols are registered
        self._read_inputs()
        for node in self.graph.node:
            self._visit(node)

    # -- symbols -------------------------------------------------------------------------------
    def fresh(self, name: str) -> Expr:
        self._register(name, fresh=True)
        return E.sym(name)

    def _register(self, name: str, fresh: bool) -> None:
        self.facts.register(name, fresh)
        self.assumed.register(name, fresh)

    def _declared_dim(self, dim: onnx.TensorShapeProto.Dimension, where: str, fresh_blank: bool) -> Expr | None:
        kind = dim.WhichOneof("value")
        if kind == "dim_value" and dim.dim_value > 0:
            return E.const(dim.dim_value)
        if kind == "dim_param" and not _is_blank_param(dim.dim_param):
            parsed = E.parse(dim.dim_param)
            if parsed not in self._named:
                self._named.add(parsed)
                for name in parsed.symbols():
                    self._register(name, fresh=False)
            return parsed
        return self.fresh(where) if fresh_blank else None

    def _declared_shape(self, type_proto: onnx.TypeProto, name: str, fresh_blank: bool = True):
        tensor = type_proto.tensor_type
        if not tensor.HasField("shape"):
            return None
        return tuple([self._declared_dim(d, f"{name}.dim{axis}", fresh_blank) for axis, d in enumerate(tensor.shape.dim)])

    def _read_inputs(self) -> None:
        for vi in self.graph.input:
            found = self._constant(vi.name)
            if found is not None:  # an initializer (not overridable: GraphIndex decides)
                self._set_constant(vi.name, found)
                continue
            if vi.type.HasField("tensor_type"):
                self.elems[vi.name] = vi.type.tensor_type.elem_type
                self.shapes[vi.name] = self._declared_shape(vi.type, vi.name)
        for tensor in self.graph.initializer:
            if tensor.name not in self.shapes:
                found = self._constant(tensor.name)
                if found is not None:
                    self._set_constant(tensor.name, found)

    def _set_constant(self, name: str, found: tuple) -> None:
        elem, dims, value = found
        self.elems[name] = elem
        self.shapes[name] = tuple(E.const(d) for d in dims)
        if value is not None:
            symbolic = V.from_numbers(value)
            if symbolic is not None:
                self.values[name] = symbolic

    # -- the walk ------------------------------------------------------------------------------
    def _visit(self, node: onnx.NodeProto) -> None:
        domain = "" if node.domain in _STANDARD else node.domain
        outs = None
        if node.op_type == "Constant" and domain == "":
            found = self._constant(node.output[0]) if node.output else None
            if found is not None:
                self._set_constant(node.output[0], found)
                return
        handler = HANDLERS.get((domain, node.op_type))
        if handler is not None:
            try:
                outs = handler(NodeContext(self, node, self.opsets.get(domain, 0)))
            except (ValueError, IndexError, TypeError, KeyError, AttributeError, ZeroDivisionError, OverflowError):
                outs = None  # a node that breaks the op's rules: nothing known about its outputs
        if outs is None:
            self.unmodelled.add(node.op_type)
            outs = self._onnx_inferred(node, domain)
        for index, name in enumerate(node.output):
            if not name:
                continue
            elem, shape, value = outs[index] if outs is not None and index < len(outs) else (0, None, None)
            self._record(name, elem, shape, value)

    def _record(self, name: str, elem: int, shape: Shape | None, value: np.ndarray | None) -> None:
        declared = self.declared.get(name)
        if declared is not None and declared.type.HasField("tensor_type"):
            elem = elem or declared.type.tensor_type.elem_type
            stated = self._declared_shape(declared.type, name, fresh_blank=shape is None)
            if shape is None:
                shape = stated
            elif stated is not None and len(stated) == len(shape):
                for have, want in zip(shape, stated):
                    if want is not None and want != have:  # the exporter's word, like an input's dim names
                        self.facts.learn(have, want)
                        self.assumed.learn(have, want)
        self.elems[name] = elem
        self.shapes[name] = shape
        if value is not None and not isinstance(value, np.ndarray):
            value = V.of_items([value], ())  # numpy hands 0-d results back as the item itself
        if value is not None and value.size <= V.MAX_ITEMS:
            self.values[name] = value

    def _onnx_inferred(self, node: onnx.NodeProto, domain: str) -> list[Out] | None:
        """onnx's inference for this one node, fed the engine's types (symbolic dims as text)."""
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opsets.get(domain, 1), node.domain)
        except Exception:  # noqa: BLE001 - no schema (another domain, a function): nothing known
            return None
        by_text: dict[str, Expr] = {}
        types, data = {}, {}
        for name in node.input:
            if not name or name in types:
                continue
            elem = self.elems.get(name, 0)
            if not elem:
                return None
            shape = self.expr_shape(name)
            dims = None
            if shape is not None:
                dims = []
                for d in shape:
                    if d.value is not None:
                        dims.append(d.value)
                    else:
                        by_text[d.text] = d
                        dims.append(d.text)
            types[name] = onnx.helper.make_tensor_type_proto(elem, dims)
            known = self.known_value(name)
            if known is not None:
                data[name] = onnx.numpy_helper.from_array(known, name)
        try:
            inferred = onnx.shape_inference.infer_node_outputs(
                schema, node, types, data, opset_imports=list(self.model.opset_import),
                ir_version=self.model.ir_version or onnx.IR_VERSION)
        except Exception:  # noqa: BLE001 - onnx refuses the node as typed: nothing known
            return None
        outs: list[Out] = []
        for index, name in enumerate(node.output):
            proto = inferred.get(name)
            if proto is None or not proto.HasField("tensor_type"):
                outs.append((0, None, None))
                continue
            shape = None
            if proto.tensor_type.HasField("shape"):
                shape = []
                for axis, d in enumerate(proto.tensor_type.shape.dim):
                    if d.HasField("dim_value") and d.dim_value >= 0:
                        shape.append(E.const(d.dim_value))
                    elif d.HasField("dim_param") and d.dim_param in by_text:
                        shape.append(by_text[d.dim_param])
                    else:
                        shape.append(self.fresh(f"{name}.dim{axis}"))
                shape = tuple(shape)
            outs.append((proto.tensor_type.elem_type, shape, None))
        return outs

    # -- queries (the two views: see the module docstring) ---------------------------------------
    def elem_type(self, name: str) -> int:
        return self.elems.get(name, 0)

    def expr_shape(self, name: str, proven: bool = True) -> Shape | None:
        shape = self.shapes.get(name)
        if shape is None:
            return None
        canonical = (self.facts if proven else self.assumed).canonical
        return tuple(canonical(d) for d in shape)

    def shape(self, name: str) -> tuple | None:
        """The shape as ints (static dims) and SymDim (the rest), canonical in the assumed view:
        dims equal in it compare equal."""
        if name in self._rendered:
            return self._rendered[name]
        shape = self.expr_shape(name, proven=False)
        rendered = None if shape is None else tuple(render(d) for d in shape)
        self._rendered[name] = rendered
        return rendered

    def proven_shape(self, name: str) -> tuple | None:
        """As ``shape``, with only what every valid run satisfies."""
        shape = self.expr_shape(name, proven=True)
        return None if shape is None else tuple(render(d) for d in shape)

    def declarable_shape(self, name: str) -> tuple | None:
        """The shape as a value_info can state it (proven view): ints, expression texts, None for
        a dim that involves a fresh unknown (its name means nothing outside this engine)."""
        shape = self.expr_shape(name, proven=True)
        if shape is None:
            return None
        return tuple(d.value if d.value is not None else
                     (None if any(self.facts.is_fresh(n) for n in d.symbols()) else d.text) for d in shape)

    def value(self, name: str) -> np.ndarray | None:
        value = self.values.get(name)
        return None if value is None else V.unary(self.assumed.canonical, value)

    def known_value(self, name: str) -> np.ndarray | None:
        """The value as numbers, when every item is known in the proven view (a Shape of static
        dims, shape arithmetic over them)."""
        value = self.values.get(name)
        if value is None:
            return None
        return V.to_numpy(V.unary(self.facts.canonical, value), self.elems.get(name, 0))

    def dim_expr(self, dim, proven: bool = False) -> Expr | None:
        """An expression for a dim as the families hold it: int, SymDim, text or Expr."""
        facts = self.facts if proven else self.assumed
        if dim is None:
            return None
        if isinstance(dim, SymDim):
            return facts.canonical(dim.expr)
        if isinstance(dim, Expr):
            return facts.canonical(dim)
        if isinstance(dim, (int, np.integer)):
            return E.const(int(dim))
        if isinstance(dim, str):
            return facts.canonical(E.parse(dim))
        return None

    def same(self, a, b, proven: bool = False) -> bool:
        """Equal dims (in the assumed view, or the proven one)."""
        x, y = self.dim_expr(a, proven), self.dim_expr(b, proven)
        return x is not None and y is not None and x == y


def render(e: Expr) -> int | SymDim:
    value = e.value
    return value if value is not None else SymDim(e)


def same_dim(a, b) -> bool:
    """Two dims provably equal, without a graph's facts (ints, SymDim, expression text)."""
    def expr_of(d):
        if d is None:
            return None
        if isinstance(d, SymDim):
            return d.expr
        if isinstance(d, (int, np.integer)):
            return E.const(int(d))
        if isinstance(d, str):
            return E.parse(d)
        return d if isinstance(d, Expr) else None
    x, y = expr_of(a), expr_of(b)
    return x is not None and y is not None and x == y
