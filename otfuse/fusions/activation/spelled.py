"""GELU (erf and tanh forms), QuickGELU and SiLU spelled out in plain ONNX, in any order of their
factors (polynomial.py reads what the nodes compute):

    GELU, erf:   0.5 * x * (1 + erf(x / sqrt2))                        -> Gelu(approximate="none")
    GELU, tanh:  0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))  -> Gelu(approximate="tanh")
                 (HF gelu_new / gelu_pytorch_tanh, GPT-2 / GPT-J / Phi NewGELU, BLOOM's bloom_gelu
                 (c x)(1 + k x x), and x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)))
    QuickGELU:   x * sigmoid(alpha * x)                                -> QuickGelu(alpha)
    SiLU:        x * sigmoid(x)                                        -> SiLU

The constants must be the activation's to the precision of x's type (a few roundings of it);
QuickGELU takes whatever alpha the graph multiplies by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import onnx

from otfuse import ops
from otfuse.fusions.activation import polynomial as P
from otfuse.rewriter import checks
from otfuse.rewriter.pattern import Either, Match, Var, op
from otfuse.rewriter.rule import Fusion, NotCandidate, Refuse, RewriteContext, Rule

FAMILY = "activation"
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_KAPPA = 0.044715
# Coefficient tolerance: a few roundings of the constants, which are stored in x's type.
_RTOL = {onnx.TensorProto.FLOAT: 2.0 ** -21, onnx.TensorProto.FLOAT16: 2.0 ** -8,
         onnx.TensorProto.BFLOAT16: 2.0 ** -6}
_HALF_X_TIMES_ONE_PLUS_T = {(1, 0): 0.5, (1, 1): 0.5}
_X_TIMES_T = {(1, 1): 1.0}
_TANH_ARGUMENT = {(1, 0): _SQRT_2_OVER_PI, (3, 0): _SQRT_2_OVER_PI * _KAPPA}
_ERF_ARGUMENT = {(1, 0): 1.0 / math.sqrt(2.0)}


@dataclass(frozen=True)
class Activation:
    """What a region computes: the fused op, its input x, and the op's attributes."""

    op_type: str
    x: str
    attributes: dict = field(default_factory=dict)


def _tanh_gelu_argument(scale: float) -> dict:
    return {key: scale * c for key, c in _TANH_ARGUMENT.items()}


def _identify(k: onnx.NodeProto, outer: P.Poly, inner: P.Poly, x: str, rtol: float) -> Activation | str:
    """The activation ``outer(x, k(inner(x)))`` is, or why it is none of them."""
    kind = k.op_type
    if kind in ("Tanh", "Erf"):
        if not P.matches(outer, _HALF_X_TIMES_ONE_PLUS_T, rtol):
            return f"{kind}: the result is {P.describe(outer)} (T = {kind}(...)); GELU's is 0.5*x + 0.5*x*T"
        want = _TANH_ARGUMENT if kind == "Tanh" else _ERF_ARGUMENT
        if not P.matches(inner, want, rtol):
            return f"{kind}: its argument is {P.describe(inner)}; GELU's is {P.describe(want)}"
        return Activation("Gelu", x, {"approximate": "tanh" if kind == "Tanh" else "none"})
    if not P.matches(outer, _X_TIMES_T, rtol):
        return f"Sigmoid: the result is {P.describe(outer)} (T = Sigmoid(...)); SiLU's is x*T"
    if P.matches(inner, _tanh_gelu_argument(2.0), rtol):
        return Activation("Gelu", x, {"approximate": "tanh"})
    if set(inner) != {(1, 0)}:
        return f"Sigmoid: its argument is {P.describe(inner)}, not alpha*x"
    alpha = inner[(1, 0)]
    if abs(alpha - 1.0) <= rtol:
        return Activation("SiLU", x)
    return Activation("QuickGelu", x, {"alpha": alpha})


def _shared_k(graph, region: P.Region) -> onnx.NodeProto | None:
    """A K whose output is also read outside: the region stopped at it (a leaf read twice)."""
    for leaf in region.leaves:
        node = graph.producer.get(leaf)
        if node is not None and node.op_type in P.TRANSCENDENTAL_OPS and node.input[0] in region.leaves:
            return node
    return None


def identify(graph, root: onnx.NodeProto) -> tuple[Activation, P.Region]:
    """The activation ``root`` completes and its region; raises Refuse (a near miss naming the
    region) or NotCandidate (no activation ends here)."""
    region = P.collect(graph, root)
    k, shared = region.k, None
    if k is None:
        shared = _shared_k(graph, region)
        if shared is None or len(region.leaves) != 2:
            raise NotCandidate()
        k, x = shared, shared.input[0]
    elif len(region.inner_leaves) != 1 or region.leaves != set(region.inner_leaves):
        raise NotCandidate()  # K of several values, or a product that also reads another: not here
    else:
        (x,) = region.inner_leaves
    covers = region.nodes + ([shared] if shared is not None else [])
    try:
        outer = P.evaluate(graph, root.output[0], x, k.output[0])
        inner = P.evaluate(graph, k.input[0], x, None)
    except Refuse as refusal:
        raise Refuse(f"{k.op_type}: {refusal}", covers=covers) from None
    rtol = _RTOL.get(graph.elem_type(x))
    if rtol is None:
        raise Refuse(f"x {x!r} has type {checks.type_name(graph.elem_type(x))}, not float32/float16/bfloat16",
                     covers=covers)
    found = _identify(k, outer, inner, x, rtol)
    if isinstance(found, str):
        raise Refuse(found, covers=covers)
    if shared is not None:
        readers = ", ".join(f"{u.op_type} {u.name!r}" for u in graph.uses(k.output[0]))
        raise Refuse(f"{found.op_type}: the {k.op_type} output {k.output[0]!r} is also read outside it ({readers})",
                     covers=covers)
    return found, region


def _analyse_spelled(ctx: RewriteContext, match: Match) -> Fusion:
    """Any root that ends a polynomial of x and K(x) (polynomial.py): the fusion covers the region."""
    root = match.root
    found, region = identify(ctx.graph, root)
    require_activation_io(ctx.graph, found.x, root.output[0], covers=region.nodes)
    call = ops.get(found.op_type)(X=found.x, Y=root.output[0], **found.attributes)
    return Fusion(call, tuple(region.nodes))


def require_activation_io(graph, x: str, y: str, covers=()) -> None:
    """A float input, the output of its type, and of its rank (no constant broadcast it wider)."""
    try:
        checks.require_float_io(graph, x, y)
    except Refuse as refusal:
        raise Refuse(str(refusal), covers=covers) from None
    rank_x, rank_y = graph.rank(x), graph.rank(y)
    if rank_x is None or rank_y is None:
        raise Refuse(f"the ranks of {x!r} and {y!r} are unknown, so a constant may broadcast the result wider",
                     covers=covers)
    if rank_x != rank_y:
        raise Refuse(f"a constant broadcasts the result to rank {rank_y} (x {x!r} has rank {rank_x})", covers=covers)


SPELLED = Rule("SpelledActivation", Either(op.Mul(Var("a"), Var("b")), op.Div(Var("a"), Var("b"))),
               _analyse_spelled, FAMILY, frozenset(P.TRANSCENDENTAL_OPS))

RULES: list[Rule] = [SPELLED]
