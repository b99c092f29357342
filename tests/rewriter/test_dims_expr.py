"""The dimension engine's expressions (otfuse/rewriter/dims/expr.py): one canonical form, so
equal polynomials compare equal, and the arithmetic dims need (exact and floor quotients,
max/min, broadcasting) simplifies only what holds for every size >= 0."""

from __future__ import annotations

import pytest

from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.dims.expr import parse, sym

B, S, P = sym("batch"), sym("seq"), sym("past_seq")


def test_sums_and_products_have_one_spelling():
    assert parse("seq + past_seq") == parse("past_seq + seq") == E.add(S, P)
    assert parse("2*batch*seq") == parse("seq*batch*2") == E.mul(E.const(2), E.mul(B, S))
    assert parse("(seq + 1)*(seq - 1)") == parse("seq**2 - 1")
    assert E.add(S, P).text == parse("seq + past_seq").text


def test_text_round_trips_through_the_parser():
    for text in ("batch", "2*batch*seq + 1", "past_seq + seq", "(4*batch*seq)//(3*past_seq)",
                 "max(past_seq, seq)", "broadcast(batch, seq)", "'/model/x.dim2'"):
        e = parse(text)
        assert parse(e.text) == e, text


def test_text_that_is_not_an_expression_is_one_symbol():
    assert parse("seq len").symbols() == {"seq len"}
    assert parse("batch").symbols() == {"batch"}
    assert parse("s0 + s1").symbols() == {"s0", "s1"}


def test_exact_quotients_simplify_and_others_stay_quotients():
    assert E.floordiv(E.product([B, S, E.const(64)]), E.mul(S, E.const(16))) == E.mul(E.const(4), B)
    assert E.floordiv(E.const(7), E.const(2)) == E.const(3)
    q = E.floordiv(E.mul(B, S), P)
    assert q.value is None and isinstance(next(q.atoms()), E.FloorDiv)
    assert E.floordiv(B, E.ZERO) is None
    assert E.floordiv(E.neg(B), E.const(2)) is None  # not a dim: no floor quotient assumed


def test_integer_division_rounds_toward_zero():
    assert E.trunc_div(E.const(-7), E.const(2)) == E.const(-3)
    assert E.trunc_div(E.mul(E.const(6), B), E.const(3)) == E.mul(E.const(2), B)


def test_max_and_min_drop_what_another_argument_bounds():
    assert E.maximum(S, E.ZERO) == S  # a dim is >= 0
    assert E.maximum(E.add(S, E.const(2)), S) == E.add(S, E.const(2))
    assert E.minimum(E.add(S, E.const(2)), S) == S
    assert E.minimum(E.const(2048), S).text == "min(2048, seq)"
    assert E.maximum(E.const(3), E.const(5)) == E.const(5)


def test_broadcast_of_one_axis():
    assert E.broadcast(E.ONE, S) == S
    assert E.broadcast(S, E.const(64)) == E.const(64)  # s is 1 or 64; the result is 64 either way
    assert E.broadcast(S, S) == S
    assert E.broadcast(B, S).text == "broadcast(batch, seq)"
    assert E.broadcast(E.ONE, E.ONE) == E.ONE


@pytest.mark.parametrize("text, never_one", [
    ("2", True), ("1", False), ("seq", False), ("2*seq", True), ("seq + 2", True), ("seq - 1", False),
    ("4*batch + 2*seq", True),
])
def test_dims_provably_not_one(text, never_one):
    assert parse(text).never_one is never_one


def test_non_negative():
    assert parse("2*batch*seq + 1").nonneg
    assert not parse("seq - 1").nonneg
    assert parse("max(seq - 1, 0)").nonneg
