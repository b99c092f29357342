"""Symbolic dims in one canonical form: integer polynomials over atoms.

An atom is a symbol (a named input dim such as ``batch``, or a fresh unknown such as
``x.dim2``), a floor quotient that does not divide exactly, or ``max``/``min``/``broadcast`` of
several expressions. Every expression is a sum of terms ``coefficient * atom**power * ...``,
kept sorted, so two expressions that are equal as polynomials are the same object value (``==``
and ``hash`` agree) and render to the same text. Symbols stand for dims, so they are >= 0; that
is all the arithmetic assumes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


class Atom:
    """A factor that is not a number: compared and sorted by its rendering."""

    __slots__ = ("key", "_hash")

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.key == self.key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return self.key

    def symbols(self) -> set[str]:
        raise NotImplementedError

    @property
    def nonneg(self) -> bool:
        raise NotImplementedError


class Sym(Atom):
    """A named dim or a fresh unknown; its name is its identity."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name
        self.key = name if _PLAIN_NAME.fullmatch(name) else "'" + name.replace("'", "\\'") + "'"
        self._hash = hash(("sym", name))

    def symbols(self) -> set[str]:
        return {self.name}

    @property
    def nonneg(self) -> bool:
        return True


class FloorDiv(Atom):
    """``num // den`` that is not an exact quotient (both >= 0)."""

    __slots__ = ("num", "den")

    def __init__(self, num: Expr, den: Expr):
        self.num, self.den = num, den
        self.key = f"{num.factor_text()}//{den.factor_text()}"
        self._hash = hash(("div", self.key))

    def symbols(self) -> set[str]:
        return self.num.symbols() | self.den.symbols()

    @property
    def nonneg(self) -> bool:
        return True


class Func(Atom):
    """``max``, ``min`` or ``broadcast`` (numpy's rule for one axis) of sorted, distinct args."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: str, args: tuple[Expr, ...]):
        self.fn, self.args = fn, args
        self.key = f"{fn}({', '.join(a.text for a in args)})"
        self._hash = hash(("fn", self.key))

    def symbols(self) -> set[str]:
        return set().union(*(a.symbols() for a in self.args))

    @property
    def nonneg(self) -> bool:
        if self.fn == "max":
            return any(a.nonneg for a in self.args)
        return all(a.nonneg for a in self.args)


Mono = tuple  # ((atom, power), ...) sorted by atom key; () for the constant term


def _mono_key(mono: Mono) -> tuple:
    return tuple((atom.key, power) for atom, power in mono)


class Expr:
    """An immutable canonical polynomial: ``terms`` is ((mono, coefficient), ...), sorted."""

    __slots__ = ("terms", "_hash", "_text", "value", "is_const")

    def __init__(self, terms: tuple):
        self.terms = terms
        self._hash = hash(terms)
        self._text: str | None = None
        if not terms:
            self.value: int | None = 0
        elif len(terms) == 1 and not terms[0][0]:
            self.value = terms[0][1]
        else:
            self.value = None
        self.is_const = self.value is not None

    # -- identity ------------------------------------------------------------------------------
    def __eq__(self, other) -> bool:
        return isinstance(other, Expr) and other._hash == self._hash and other.terms == self.terms

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return self.text

    def symbols(self) -> set[str]:
        names: set[str] = set()
        for mono, _ in self.terms:
            for atom, _ in mono:
                names |= atom.symbols()
        return names

    def atoms(self) -> Iterable[Atom]:
        for mono, _ in self.terms:
            for atom, _ in mono:
                yield atom

    @property
    def nonneg(self) -> bool:
        """Provably >= 0: non-negative coefficients over non-negative atoms."""
        return all(c >= 0 for _, c in self.terms) and all(atom.nonneg for atom in self.atoms())

    @property
    def never_one(self) -> bool:
        """Provably != 1: a number other than 1, a multiple of some k >= 2, or >= 2."""
        value = self.value
        if value is not None:
            return value != 1
        if math.gcd(*(c for _, c in self.terms)) >= 2:
            return True
        constant = dict(self.terms).get((), 0)
        return self.nonneg and constant >= 2

    # -- text ----------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        if self._text is None:
            self._text = _render(self)
        return self._text

    def factor_text(self) -> str:
        """The text, parenthesised unless it is one number or one atom."""
        if self.is_const or (len(self.terms) == 1 and self.terms[0][1] == 1 and len(self.terms[0][0]) == 1
                             and self.terms[0][0][0][1] == 1):
            return self.text
        return f"({self.text})"

    # -- arithmetic (operators, for symbolic tensors held in numpy object arrays) ------------------
    def __add__(self, other):
        return add(self, _lift(other))

    __radd__ = __add__

    def __sub__(self, other):
        return add(self, neg(_lift(other)))

    def __rsub__(self, other):
        return add(_lift(other), neg(self))

    def __mul__(self, other):
        return mul(self, _lift(other))

    __rmul__ = __mul__

    def __neg__(self):
        return neg(self)


def _lift(value) -> Expr:
    return value if isinstance(value, Expr) else const(int(value))


_SMALL = {}


def const(n: int) -> Expr:
    n = int(n)
    cached = _SMALL.get(n)
    if cached is not None:
        return cached
    expr = Expr(((( ), n),) if n else ())
    if -64 <= n <= 4096:
        _SMALL[n] = expr
    return expr


def of_atom(atom: Atom) -> Expr:
    return Expr((((((atom, 1),)), 1),))


def sym(name: str) -> Expr:
    return of_atom(Sym(name))


ZERO, ONE = const(0), const(1)


def _sorted_terms(terms: dict) -> tuple:
    return tuple(sorted(((m, c) for m, c in terms.items() if c), key=lambda t: _mono_key(t[0])))


def add(a: Expr, b: Expr) -> Expr:
    if not b.terms:
        return a
    if not a.terms:
        return b
    terms = dict(a.terms)
    for mono, c in b.terms:
        terms[mono] = terms.get(mono, 0) + c
    return Expr(_sorted_terms(terms))


def neg(a: Expr) -> Expr:
    return Expr(tuple((m, -c) for m, c in a.terms))


def sub(a: Expr, b: Expr) -> Expr:
    return add(a, neg(b))


def _mono_mul(a: Mono, b: Mono) -> Mono:
    if not a:
        return b
    if not b:
        return a
    powers = dict(a)
    for atom, p in b:
        powers[atom] = powers.get(atom, 0) + p
    return tuple(sorted(powers.items(), key=lambda t: t[0].key))


def mul(a: Expr, b: Expr) -> Expr:
    if not a.terms or not b.terms:
        return ZERO
    if b.is_const and b.terms[0][1] == 1:
        return a
    if a.is_const and a.terms[0][1] == 1:
        return b
    terms: dict = {}
    for ma, ca in a.terms:
        for mb, cb in b.terms:
            mono = _mono_mul(ma, mb)
            terms[mono] = terms.get(mono, 0) + ca * cb
    return Expr(_sorted_terms(terms))


def product(items: Iterable[Expr]) -> Expr:
    result = ONE
    for item in items:
        result = mul(result, item)
    return result


def _mono_div(a: Mono, b: Mono) -> Mono | None:
    powers = dict(a)
    for atom, p in b:
        have = powers.get(atom, 0)
        if have < p:
            return None
        if have == p:
            del powers[atom]
        else:
            powers[atom] = have - p
    return tuple(sorted(powers.items(), key=lambda t: t[0].key))


def exact_div(a: Expr, b: Expr) -> Expr | None:
    """``a / b`` when ``b`` is one term that divides every term of ``a`` (or ``a == b``)."""
    if a == b and b.terms:
        return ONE
    if len(b.terms) != 1:
        return None
    mono_b, coeff_b = b.terms[0]
    terms = {}
    for mono, c in a.terms:
        if c % coeff_b:
            return None
        quotient = _mono_div(mono, mono_b)
        if quotient is None:
            return None
        terms[quotient] = c // coeff_b
    return Expr(_sorted_terms(terms))


def floordiv(a: Expr, b: Expr) -> Expr | None:
    """``a // b`` for dims (both >= 0, b > 0): exact when it divides, else a FloorDiv atom; None
    when the operands are not provably non-negative or ``b`` is 0."""
    av, bv = a.value, b.value
    if bv == 0:
        return None
    if av is not None and bv is not None:
        return const(av // bv)
    exact = exact_div(a, b)
    if exact is not None:
        return exact
    if not (a.nonneg and b.nonneg):
        return None
    return of_atom(FloorDiv(a, b))


def trunc_div(a: Expr, b: Expr) -> Expr | None:
    """ONNX integer Div (rounds toward zero): exact quotients, numbers, or non-negative operands."""
    av, bv = a.value, b.value
    if bv == 0:
        return None
    if av is not None and bv is not None:
        q = abs(av) // abs(bv)
        return const(q if (av >= 0) == (bv > 0) else -q)
    exact = exact_div(a, b)
    if exact is not None:
        return exact
    return floordiv(a, b) if a.nonneg and b.nonneg else None


def _flatten(fn: str, args: Iterable[Expr]) -> list[Expr]:
    flat: list[Expr] = []
    for arg in args:
        atom = _single_atom(arg)
        if isinstance(atom, Func) and atom.fn == fn:
            flat.extend(atom.args)
        else:
            flat.append(arg)
    return flat


def _single_atom(e: Expr) -> Atom | None:
    if len(e.terms) == 1 and e.terms[0][1] == 1 and len(e.terms[0][0]) == 1 and e.terms[0][0][0][1] == 1:
        return e.terms[0][0][0][0]
    return None


def _dominates(x: Expr, y: Expr) -> bool:
    """Provably x >= y: their difference is a number >= 0 or a non-negative expression."""
    d = sub(x, y)
    return d.nonneg if d.value is None else d.value >= 0


def _extreme(fn: str, args: Iterable[Expr]) -> Expr:
    """max / min without the arguments another one provably bounds (two distinct expressions
    never bound each other both ways)."""
    items = list(dict.fromkeys(_flatten(fn, args)))
    if fn == "max":
        kept = [x for x in items if not any(o != x and _dominates(o, x) for o in items)]
    else:
        kept = [x for x in items if not any(o != x and _dominates(x, o) for o in items)]
    if len(kept) == 1:
        return kept[0]
    return of_atom(Func(fn, tuple(sorted(kept, key=lambda e: e.text))))


def maximum(*args: Expr) -> Expr:
    return _extreme("max", args)


def minimum(*args: Expr) -> Expr:
    return _extreme("min", args)


def broadcast(*args: Expr) -> Expr:
    """One axis of numpy broadcasting: 1s drop out; a dim provably != 1 is the result (the others
    are 1 or equal to it); else ``broadcast(a, b)``, which is a when b is 1, b when a is 1."""
    items = [a for a in dict.fromkeys(_flatten("broadcast", args)) if a != ONE]
    if not items:
        return ONE
    for item in items:
        if item.never_one:
            return item
    if len(items) == 1:
        return items[0]
    return of_atom(Func("broadcast", tuple(sorted(items, key=lambda e: e.text))))


# -- text ------------------------------------------------------------------------------------------
def _render_mono(mono: Mono) -> str:
    parts = []
    for atom, power in mono:
        parts.append(atom.key if power == 1 else f"{atom.key}**{power}")
    return "*".join(parts)


def _render(e: Expr) -> str:
    if not e.terms:
        return "0"
    ordered = sorted(e.terms, key=lambda t: (-sum(p for _, p in t[0]), _mono_key(t[0])))
    out = ""
    for mono, c in ordered:
        sign = "-" if c < 0 else "+"
        size = abs(c)
        if not mono:
            body = str(size)
        elif size == 1:
            body = _render_mono(mono)
        else:
            body = f"{size}*{_render_mono(mono)}"
        if not out:
            out = body if sign == "+" else f"-{body}"
        else:
            out += f" {sign} {body}"
    return out


# -- parsing dim_param text ----------------------------------------------------------------------
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_.]*)|'((?:[^'\\]|\\.)*)'|(\*\*|//|[-+*/(),]))")


class _Parser:
    """Recursive descent over + - * // / ** ( ) max( ) min( ) broadcast( ), integers and names."""

    def __init__(self, text: str):
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise ValueError(text)
            number, name, quoted, punct = m.groups()
            if number is not None:
                self.tokens.append(("num", number))
            elif name is not None:
                self.tokens.append(("name", name))
            elif quoted is not None:
                self.tokens.append(("name", quoted.replace("\\'", "'")))
            else:
                self.tokens.append(("op", punct))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, op: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (op is not None and token != ("op", op)):
            raise ValueError(op)
        self.i += 1
        return token

    def expr(self) -> Expr:
        result = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            right = self.term()
            result = add(result, right) if op == "+" else sub(result, right)
        return result

    def term(self) -> Expr:
        result = self.power()
        while self.peek() in (("op", "*"), ("op", "//"), ("op", "/")):
            op = self.take()[1]
            right = self.power()
            if op == "*":
                result = mul(result, right)
            else:
                quotient = floordiv(result, right)
                if quotient is None:
                    raise ValueError("division")
                result = quotient
        return result

    def power(self) -> Expr:
        base = self.unary()
        if self.peek() == ("op", "**"):
            self.take()
            exponent = self.unary().value
            if exponent is None or not 0 <= exponent <= 8:
                raise ValueError("power")
            return product([base] * exponent)
        return base

    def unary(self) -> Expr:
        if self.peek() == ("op", "-"):
            self.take()
            return neg(self.unary())
        if self.peek() == ("op", "+"):
            self.take()
            return self.unary()
        return self.atom()

    def atom(self) -> Expr:
        kind, text = self.take()
        if kind == "num":
            return const(int(text))
        if kind == "op" and text == "(":
            inner = self.expr()
            self.take(")")
            return inner
        if kind == "name" and text in ("max", "min", "broadcast") and self.peek() == ("op", "("):
            self.take("(")
            args = [self.expr()]
            while self.peek() == ("op", ","):
                self.take()
                args.append(self.expr())
            self.take(")")
            return {"max": maximum, "min": minimum, "broadcast": broadcast}[text](*args)
        if kind == "name":
            return sym(text)
        raise ValueError(text)


_PARSED: dict[str, Expr] = {}


def parse(text: str) -> Expr:
    """A dim_param as an expression: ``'past_seq + seq'``, ``'2*s0'``, ``'batch'``; text that is
    not an expression (``'seq len'``) is one symbol of that name."""
    parsed = _PARSED.get(text)
    if parsed is None:
        parsed = _parse(text)
        if len(_PARSED) < 100_000:
            _PARSED[text] = parsed
    return parsed


def _parse(text: str) -> Expr:
    if _PLAIN_NAME.fullmatch(text):
        return sym(text)
    try:
        parser = _Parser(text)
        result = parser.expr()
        if parser.peek() is not None:
            raise ValueError(text)
        return result
    except (ValueError, IndexError):
        return sym(text)
