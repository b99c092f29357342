"""The pattern language and its matcher on graphs of a few nodes, without any family: the order
``Either`` tries its alternatives in, ``Absent`` optional inputs, operand commutation, one pattern
object meaning one node, and which failure becomes the near miss (the deepest, from a rule's
anchor op on)."""

from __future__ import annotations

import numpy as np
from graphs import F32, GraphBuilder

from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.passes import NEAR_MISS_MIN_DEPTH, run_pass
from otfuse.rewriter.pattern import Absent, Const, Either, Matcher, Var, op
from otfuse import ops
from otfuse.rewriter.rule import Fusion, Refuse, RewriteContext, Rule

SHAPE = ["batch", 4]


def _graph(build) -> tuple[GraphIndex, str]:
    """A graph whose output is what ``build(b, x)`` returns for the input x; (index, output)."""
    b = GraphBuilder()
    x = b.input("x", F32, SHAPE)
    out = build(b, x)
    b.output(out, F32, SHAPE)
    return GraphIndex(b.model()), out


def _matches(pattern, build):
    graph, out = _graph(build)
    matcher = Matcher(graph)
    return list(matcher.matches(pattern, out)), matcher


def _half(b: GraphBuilder) -> str:
    return b.const(np.array(0.5, np.float32), "half")


# -- Either ----------------------------------------------------------------------------------------
def test_either_yields_its_alternatives_in_order():
    """Both alternatives fit Div(x, 0.5): the first one written is the first match (so a rule
    puts its most specific spelling first), then the next."""
    pattern = Either(op.Div(Var("x"), Const("scale"), _bind="div"), op.Div(Var("x"), Var("any"), _bind="div"))
    found, _ = _matches(pattern, lambda b, x: b.node("Div", [x, _half(b)]))
    assert [sorted(m.values) for m in found] == [["scale", "x"], ["any", "x"]]


def test_either_falls_through_to_a_later_alternative():
    pattern = Either(op.Div(Var("x"), Const("d")), op.Mul(Var("x"), Const("m")))
    found, _ = _matches(pattern, lambda b, x: b.node("Mul", [x, _half(b)]))
    assert [sorted(m.values) for m in found] == [["m", "x"]]


def test_either_of_a_value_and_nothing_makes_a_node_optional():
    """``Either(op.Cast(v), v)``: with the Cast there, the match takes it first; without, v itself."""
    pattern = op.Neg(Either(op.Cast(Var("v"), _bind="cast"), Var("v")))
    with_cast, _ = _matches(pattern, lambda b, x: b.node("Neg", [b.node("Cast", [x], to=F32)]))
    without, _ = _matches(pattern, lambda b, x: b.node("Neg", [x]))
    assert with_cast[0].has("cast") and len(with_cast[0].covered) == 2
    assert not without[0].has("cast") and without[0].value("v") == "x"


# -- Absent ----------------------------------------------------------------------------------------
def _clip_without_min(b: GraphBuilder, x: str) -> str:
    return b.node("Clip", [x, "", b.const(np.array(6.0, np.float32), "max")])


def test_absent_matches_a_left_out_optional_input_and_nothing_else():
    found, _ = _matches(op.Clip(Var("x"), Absent(), Const("max")), _clip_without_min)
    assert [m.value("max") for m in found] == ["max_1"]
    given, matcher = _matches(op.Clip(Var("x"), Absent(), Const("max")),
                              lambda b, x: b.node("Clip", [x, _half(b), b.const(np.array(6.0, np.float32))]))
    assert given == [] and matcher.best_failure.reason == "an optional input that must be absent is given"


def test_no_other_pattern_matches_a_left_out_input():
    found, matcher = _matches(op.Clip(Var("x"), Var("min"), Const("max")), _clip_without_min)
    assert found == [] and matcher.best_failure.reason == "an optional input is missing"


def test_either_with_absent_is_an_optional_input():
    pattern = op.Clip(Var("x"), Either(Var("min"), Absent()), Const("max"))
    left_out, _ = _matches(pattern, _clip_without_min)
    given, _ = _matches(pattern, lambda b, x: b.node("Clip", [x, _half(b), b.const(np.array(6.0, np.float32))]))
    assert not left_out[0].has("min") and given[0].value("min") == "half_1"


def test_the_number_of_inputs_must_match():
    """Trailing optional inputs left out entirely (not as empty names) are not ``Absent``: the
    node has fewer inputs than the pattern."""
    found, matcher = _matches(op.Clip(Var("x"), Absent(), Absent()), lambda b, x: b.node("Clip", [x]))
    assert found == [] and "has 1 inputs, expected 3" in matcher.best_failure.reason


# -- commutation -----------------------------------------------------------------------------------
def test_commutative_ops_match_either_operand_order():
    pattern = op.Add(Var("x"), Const("c"))
    found, _ = _matches(pattern, lambda b, x: b.node("Add", [_half(b), x]))
    assert [(m.value("x"), m.value("c")) for m in found] == [("x", "half_1")]


def test_commutation_tries_both_orders_when_both_fit():
    found, _ = _matches(op.Mul(Var("a"), Var("b")), lambda b, x: b.node("Mul", [x, _half(b)]))
    assert [(m.value("a"), m.value("b")) for m in found] == [("x", "half_1"), ("half_1", "x")]


def test_non_commutative_ops_keep_their_operand_order():
    found, matcher = _matches(op.Sub(Var("x"), Const("c")), lambda b, x: b.node("Sub", [_half(b), x]))
    assert found == [] and matcher.best_failure.reason == "'c' is not a constant"


# -- one pattern object, one node -------------------------------------------------------------------
def test_one_pattern_object_used_twice_must_be_one_node():
    negated = op.Neg(Var("x"), _bind="neg")
    pattern = op.Mul(negated, negated)
    once, _ = _matches(pattern, lambda b, x: (lambda n: b.node("Mul", [n, n]))(b.node("Neg", [x])))
    twice, matcher = _matches(pattern, lambda b, x: b.node("Mul", [b.node("Neg", [x]), b.node("Neg", [x])]))
    assert len(once) == 1 and len(once[0].covered) == 2  # the Neg covered once
    assert twice == [] and matcher.best_failure.reason == "Neg must be one node used twice, found two nodes"


def test_two_equal_pattern_objects_may_be_two_nodes():
    """Written twice, the same spelling matches two nodes computing the same thing."""
    pattern = op.Mul(op.Neg(Var("x")), op.Neg(Var("x")))
    found, _ = _matches(pattern, lambda b, x: b.node("Mul", [b.node("Neg", [x]), b.node("Neg", [x])]))
    assert len(found) == 2 and all(len(m.covered) == 3 for m in found)  # both operand orders


def test_one_var_name_is_one_value():
    pattern = op.Mul(Var("x"), Var("x"))
    found, matcher = _matches(pattern, lambda b, x: b.node("Mul", [x, b.node("Neg", [x])]))
    assert found == [] and matcher.best_failure.reason == "'x' must be one value, but two different values meet here"


# -- the near miss: the deepest failure, reported from the anchor op on ------------------------------
def _scaled_sqrt(b: GraphBuilder, x: str, eps_constant: bool = True) -> str:
    eps = b.const(np.array(1e-6, np.float32), "eps") if eps_constant else b.node("Abs", [x])
    return b.node("Div", [x, b.node("Sqrt", [b.node("Add", [b.node("Mul", [x, x]), eps])])])


_CHAIN = op.Div(Var("x"), op.Sqrt(op.Add(op.Mul(Var("x"), Var("x")), Const("eps"))))


def test_the_deepest_failure_is_kept():
    """A chain failing at its last leaf reports that leaf, not the shallower attempts (here the
    commuted orders of the Add and Mul, which fail earlier)."""
    found, matcher = _matches(_CHAIN, lambda b, x: _scaled_sqrt(b, x, eps_constant=False))
    assert found == []
    assert matcher.best_failure.reason == "'eps' is not a constant"
    assert [n.op_type for n in matcher.best_failure.covered] == ["Div", "Sqrt", "Add", "Mul"]


def _chain_rule(refuse: str | None = None) -> Rule:
    """Fuses the chain into an RMSNorm-shaped node unless told to refuse (the near miss then)."""
    def analyse(ctx: RewriteContext, match):
        if refuse:
            raise Refuse(refuse)
        call = ops.RMSNorm(X=match.value("x"), scale=match.value("eps"), Y=match.root.output[0], epsilon=0.0)
        return Fusion(call, match.covered)

    return Rule("chain", _CHAIN, analyse, "test", frozenset({"Sqrt"}))


def _near_misses(build, rule: Rule):
    b = GraphBuilder()
    x = b.input("x", F32, SHAPE)
    out = build(b, x)
    b.output(out, F32, SHAPE)
    return [m.reason for m in run_pass(b.model(), [rule], None).near_misses]


def test_a_structural_failure_past_the_anchor_is_a_near_miss():
    assert NEAR_MISS_MIN_DEPTH == 3
    misses = _near_misses(lambda b, x: _scaled_sqrt(b, x, eps_constant=False), _chain_rule())
    assert misses == ["'eps' is not a constant"]


def test_a_failure_before_the_anchor_is_not_a_near_miss():
    """Div(x, Exp(...)) looks like the chain's root only: it never reached a Sqrt."""
    misses = _near_misses(lambda b, x: b.node("Div", [x, b.node("Exp", [b.node("Add", [x, x])])]), _chain_rule())
    assert misses == []


def test_a_refused_check_is_always_a_near_miss():
    assert _near_misses(_scaled_sqrt, _chain_rule(refuse="eps too large")) == ["eps too large"]
    assert _near_misses(_scaled_sqrt, _chain_rule()) == []  # accepted: fused, nothing missed
