"""Reading an activation spelled out in plain ONNX as what it computes: y = P(x, K(Q(x))) with K one
of Tanh, Erf, Sigmoid and P, Q polynomials with scalar constant coefficients.

Exporters write the same GELU in many orders: ``0.5 * x * (1 + tanh(c * (x + k * x**3)))``,
``x * 0.5 * ...``, BLOOM's ``(c * x) * (1 + k * x * x)``, ``x / sqrt(2)`` or ``x * 0.7071``,
``pow(x, 3)`` or ``x * x * x``, ``sqrt(2/pi)`` as a number or as ``Sqrt(2/pi)``. Instead of one
pattern per order, the nodes between x and the output are read as polynomials (``Mul``, ``Add``,
``Sub``, ``Neg``, ``Div`` by a constant, ``Pow`` by a small integer, ``Identity``), and the rule
compares their coefficients with the activation's. That is exact by construction: two spellings
are accepted only if they compute the same polynomial.

Where the region stops: at constants, at K, and at any value read by more than one node (x is
one: the outer product and K's argument both read it). An interior value read twice therefore
ends the region early, and the match is refused rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.rule import Refuse

POLYNOMIAL_OPS = frozenset({"Mul", "Add", "Sub", "Neg", "Div", "Pow", "Identity"})
TRANSCENDENTAL_OPS = frozenset({"Tanh", "Erf", "Sigmoid"})
MAX_DEGREE = 6

# A polynomial in x (power i) and K's output T (power j): {(i, j): coefficient}.
Poly = dict[tuple[int, int], float]


@dataclass
class Region:
    """The nodes a root computes from x and K, and what they compute."""

    outer: list[onnx.NodeProto] = field(default_factory=list)  # from the root up to x and K
    inner: list[onnx.NodeProto] = field(default_factory=list)  # K's argument, from K up to x
    k: onnx.NodeProto | None = None
    leaves: set[str] = field(default_factory=set)  # non-constant values the outer part reads
    inner_leaves: set[str] = field(default_factory=set)

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return self.outer + ([self.k] if self.k is not None else []) + self.inner


def _is_fanout(graph: GraphIndex, value: str) -> bool:
    return len(graph.uses(value)) != 1 or graph.is_graph_output(value)


def collect(graph: GraphIndex, root: onnx.NodeProto) -> Region:
    """The region of ``root``: its polynomial nodes, at most one K, and the values it reads."""
    region = Region()

    def walk(value: str, inner: bool) -> None:
        if not value or graph.is_constant(value):
            return
        node = graph.producer.get(value)
        leaves = region.inner_leaves if inner else region.leaves
        if node is None or _is_fanout(graph, value):
            leaves.add(value)
        elif node.op_type in POLYNOMIAL_OPS and node.domain in ("", "ai.onnx"):
            (region.inner if inner else region.outer).append(node)
            for name in node.input:
                walk(name, inner)
        elif node.op_type in TRANSCENDENTAL_OPS and not inner and region.k is None:
            region.k = node
            walk(node.input[0], True)
        else:
            leaves.add(value)

    region.outer.append(root)
    for name in root.input:
        walk(name, False)
    return region


def _scalar(graph: GraphIndex, value: str) -> float:
    array = graph.constant_value(value)
    if array is None or array.size != 1:
        shape = graph.constant_shape(value)
        raise Refuse(f"constant {value!r} of shape {list(shape or [])} is not a scalar")
    number = float(np.asarray(array, dtype=np.float64).reshape(-1)[0])
    if not np.isfinite(number):
        raise Refuse(f"constant {value!r} is {number}")
    return number


def _add(a: Poly, b: Poly, sign: float = 1.0) -> Poly:
    out = dict(a)
    for key, c in b.items():
        out[key] = out.get(key, 0.0) + sign * c
    return out


def _mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for (i, j), c in a.items():
        for (k, m), d in b.items():
            if i + k > MAX_DEGREE or j + m > MAX_DEGREE:
                raise Refuse(f"a polynomial of degree above {MAX_DEGREE}")
            out[(i + k, j + m)] = out.get((i + k, j + m), 0.0) + c * d
    return out


def evaluate(graph: GraphIndex, value: str, x: str, t: str | None) -> Poly:
    """What ``value`` computes as a polynomial in x and T (the output ``t`` of K)."""
    memo: dict[str, Poly] = {}

    def poly(name: str) -> Poly:
        if name == x:
            return {(1, 0): 1.0}
        if t is not None and name == t:
            return {(0, 1): 1.0}
        if graph.is_constant(name):
            return {(0, 0): _scalar(graph, name)}
        if name in memo:
            return memo[name]
        node = graph.producer.get(name)
        if node is None or node.op_type not in POLYNOMIAL_OPS:
            raise Refuse(f"{name!r} is neither x, the {'activation' if t else 'argument'}, nor a polynomial of them")
        memo[name] = _node_poly(graph, node, poly)
        return memo[name]

    return poly(value)


def _node_poly(graph: GraphIndex, node: onnx.NodeProto, poly) -> Poly:
    op, ins = node.op_type, list(node.input)
    if op == "Identity":
        return poly(ins[0])
    if op == "Neg":
        return {k: -c for k, c in poly(ins[0]).items()}
    if op == "Add":
        return _add(poly(ins[0]), poly(ins[1]))
    if op == "Sub":
        return _add(poly(ins[0]), poly(ins[1]), -1.0)
    if op == "Mul":
        return _mul(poly(ins[0]), poly(ins[1]))
    if op == "Div":
        if not graph.is_constant(ins[1]):
            raise Refuse(f"{node.op_type} ({node.name}) divides by a non-constant")
        divisor = _scalar(graph, ins[1])
        if divisor == 0.0:
            raise Refuse(f"{node.op_type} ({node.name}) divides by zero")
        return {k: c / divisor for k, c in poly(ins[0]).items()}
    # Pow: a constant, small, non-negative integer exponent.
    if not graph.is_constant(ins[1]):
        raise Refuse(f"Pow ({node.name}) has a non-constant exponent")
    exponent = _scalar(graph, ins[1])
    if exponent != int(exponent) or not 0 <= exponent <= MAX_DEGREE:
        raise Refuse(f"Pow ({node.name}) raises to {exponent}, not a small non-negative integer")
    result: Poly = {(0, 0): 1.0}
    base = poly(ins[0])
    for _ in range(int(exponent)):
        result = _mul(result, base)
    return result


def matches(got: Poly, want: Poly, rtol: float) -> bool:
    """The same monomials with coefficients equal within ``rtol`` (of the largest), others ~0."""
    scale = max([abs(c) for c in want.values()] + [1e-30])
    for key in set(got) | set(want):
        g, w = got.get(key, 0.0), want.get(key, 0.0)
        if abs(g - w) > rtol * max(abs(w), scale if w == 0.0 else 0.0):
            return False
    return True


def describe(p: Poly, variable: str = "x") -> str:
    """'0.5*x + 0.5*x*T', for near-miss messages."""
    terms = []
    for (i, j), c in sorted(p.items()):
        if c == 0.0:
            continue
        factors = [f"{c:.8g}"] + [variable] * i + ["T"] * j
        terms.append("*".join(factors) if len(factors) > 1 else factors[0])
    return " + ".join(terms) or "0"
