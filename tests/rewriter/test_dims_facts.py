"""Equalities the dimension engine learns (otfuse/rewriter/dims/facts.py): solved for one atom
where they can be, classes of whole expressions where not, and the canonical form after both."""

from __future__ import annotations

from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.dims.expr import parse
from otfuse.rewriter.dims.facts import Facts


def _facts(*fresh: str) -> Facts:
    facts = Facts()
    for name in ("batch", "seq", "past", "heads"):
        facts.register(name, fresh=False)
    for name in fresh:
        facts.register(name, fresh=True)
    return facts


def test_a_fresh_unknown_is_solved_from_a_product():
    facts = _facts("u")
    facts.learn(parse("64*u"), parse("64*batch*seq"))
    assert facts.canonical(parse("u")) == parse("batch*seq")
    assert facts.canonical(parse("u + 1")) == parse("batch*seq + 1")


def test_named_dims_are_kept_over_fresh_ones():
    facts = _facts("x.dim0")
    facts.learn(parse("batch"), parse("'x.dim0'"))
    assert facts.canonical(parse("'x.dim0'")) == parse("batch")
    assert facts.canonical(parse("batch")) == parse("batch")


def test_a_quotient_is_solved_when_a_later_fact_fixes_it():
    """[b, s, 64] -> Reshape [b2, s2, -1, 16] gives (64*b*s)//(16*b2*s2) heads; [b2, heads, s2, 16]
    -> Reshape [b2, s2, 64] then says heads * 16 == 64."""
    facts = _facts()
    heads = E.floordiv(parse("64*batch*seq"), parse("16*past*heads"))
    facts.learn(E.product([parse("past"), heads, parse("heads"), E.const(16)]), parse("64*past*heads"))
    assert facts.canonical(heads) == E.const(4)


def test_what_cannot_be_solved_joins_a_class():
    facts = _facts()
    facts.learn(parse("batch*seq"), parse("past*heads"))
    assert facts.equal(parse("batch*seq"), parse("heads*past"))
    assert not facts.equal(parse("batch"), parse("past"))


def test_bindings_reach_into_quotients_and_classes():
    facts = _facts("u", "v")
    facts.learn(parse("u*v"), parse("batch*seq"))  # a class
    facts.learn(parse("u"), parse("batch"))  # now u*v == batch*v, so v == seq
    assert facts.equal(parse("v"), parse("seq"))
    q = E.floordiv(parse("batch*seq"), parse("u"))
    assert facts.canonical(q) == parse("seq")


def test_two_different_numbers_are_a_conflict_not_a_fact():
    facts = _facts()
    assert facts.learn(E.const(4), E.const(4))
    assert not facts.learn(E.const(4), E.const(8))
    assert facts.conflicts == [(E.const(4), E.const(8))]
    assert facts.canonical(E.const(4)) == E.const(4)


def test_a_named_dim_equal_to_a_number_becomes_the_number():
    facts = _facts()
    facts.learn(parse("heads"), E.const(8))
    assert facts.canonical(parse("2*heads")) == E.const(16)


def test_a_broadcast_is_settled_by_a_product_of_its_arguments():
    """[b1, s1] + [b2, s2] reshaped to [b2, s1] (no -1): the sum did not broadcast."""
    facts = _facts()
    b1, b2, s1, s2 = (parse(n) for n in ("batch", "past", "seq", "heads"))
    total = E.product([E.broadcast(b1, b2), E.broadcast(s1, s2), E.const(64)])
    facts.learn(total, E.product([b2, s1, E.const(64)]))
    assert facts.canonical(E.broadcast(b1, b2)) == b2
    assert facts.canonical(E.broadcast(s1, s2)) == s1
    assert not facts.equal(b1, b2)  # b1 may still be 1


def test_a_product_that_does_not_name_the_arguments_says_only_what_the_broadcast_is():
    facts = _facts()
    b1, b2, s1 = parse("batch"), parse("past"), parse("seq")
    facts.learn(E.mul(E.broadcast(b1, b2), s1), E.mul(parse("heads"), s1))
    assert facts.canonical(E.broadcast(b1, b2)) == parse("heads")
    assert not facts.equal(b1, parse("heads")) and not facts.equal(b2, parse("heads"))
