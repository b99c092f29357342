"""Equalities between dims learned from a graph, and the canonical form they imply.

A learned ``a == b`` is solved for one atom when it occurs linearly with a one-term coefficient
(``u * 64 == batch * seq * 64`` binds ``u := batch * seq``; ``16 * (4*b*s)//(b*t) * t == 64 * t``
binds the quotient to 4), preferring to eliminate fresh unknowns, then quotients and max/min,
then the latest named dims. Dividing by a symbolic coefficient takes it as non-zero. What cannot be
solved (``a * b == c * d``) joins an equality class of whole expressions (union-find),
represented by its simplest member.
``canonical`` substitutes the bindings, re-simplifies (a quotient may become exact) and maps a
class member to its representative, so two dims are proven equal exactly when their canonical
forms are the same expression.
"""

from __future__ import annotations

from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.dims.expr import Expr, FloorDiv, Func, Sym

_MAX_DEPTH = 64


class Facts:
    def __init__(self):
        self.symbols: dict[str, Expr] = {}  # symbol name -> what it equals
        self.atoms: dict = {}  # quotient / max / min atom (canonical when bound) -> what it equals
        self.classes: dict[Expr, Expr] = {}  # compound expression -> its class's representative
        self.rank: dict[str, tuple[int, int]] = {}  # symbol -> (kind, order); smaller is kept
        self.conflicts: list[tuple[Expr, Expr]] = []  # two different numbers claimed equal
        self._cache: dict[Expr, Expr] = {}
        # Bound atoms and class members are keyed by their canonical form at the time; binding a
        # symbol makes the ones that contain it stale (``_uses``), to be learned again.
        self._uses: dict[str, set] = {}  # symbol -> keys (atoms, class members) that contain it
        self._stale: set = set()
        self._rekeying = False
        self._depth = 0

    # -- symbols -------------------------------------------------------------------------------
    def register(self, name: str, fresh: bool) -> None:
        """Named dims (kind 0) are preferred over fresh unknowns (kind 1) as representatives."""
        if name not in self.rank:
            self.rank[name] = (1 if fresh else 0, len(self.rank))

    def is_fresh(self, name: str) -> bool:
        return self.rank.get(name, (0, 0))[0] == 1

    def _preference(self, name: str) -> tuple[int, int]:
        return self.rank.get(name, (0, len(self.rank)))

    # -- canonical form ------------------------------------------------------------------------
    def canonical(self, e: Expr) -> Expr:
        if e.is_const or (not self.symbols and not self.atoms and not self.classes):
            return e
        if self._stale and not self._rekeying:
            self._rekey()
        cached = self._cache.get(e)
        if cached is not None:
            return cached
        if self._depth > _MAX_DEPTH:  # a chain of bindings this long is a cycle: stop there
            return e
        self._depth += 1
        try:
            result = self._substituted(e)
            seen = set()
            while result in self.classes and result not in seen:
                seen.add(result)
                result = self._substituted(self.classes[result])
        finally:
            self._depth -= 1
        self._cache[e] = result
        return result

    def _substituted(self, e: Expr) -> Expr:
        changed = False
        total = E.ZERO
        for mono, c in e.terms:
            term = E.const(c)
            for atom, power in mono:
                replaced = self._atom(atom)
                if replaced is None:
                    replaced = E.of_atom(atom)
                else:
                    changed = True
                for _ in range(power):
                    term = E.mul(term, replaced)
            total = E.add(total, term)
        return total if changed else e

    def _atom(self, atom) -> Expr | None:
        """The canonical expression for ``atom``, or None when it stays as it is."""
        if isinstance(atom, Sym):
            target = self.symbols.get(atom.name)
            if target is None:
                return None
            resolved = self.canonical(target)
            self.symbols[atom.name] = resolved  # path compression
            return resolved
        rebuilt = None
        if isinstance(atom, FloorDiv):
            num, den = self.canonical(atom.num), self.canonical(atom.den)
            if num != atom.num or den != atom.den:
                rebuilt = E.floordiv(num, den)
        elif isinstance(atom, Func):
            args = [self.canonical(a) for a in atom.args]
            if args != list(atom.args):
                rebuilt = {"max": E.maximum, "min": E.minimum, "broadcast": E.broadcast}[atom.fn](*args)
        single = atom if rebuilt is None else E._single_atom(rebuilt)
        if single is not None and single in self.atoms:
            return self.canonical(self.atoms[single])
        return rebuilt

    def equal(self, a: Expr, b: Expr) -> bool:
        return self.canonical(a) == self.canonical(b)

    # -- learning ------------------------------------------------------------------------------
    def learn(self, a: Expr, b: Expr) -> bool:
        """Record ``a == b``; False when it contradicts what is known (two different numbers)."""
        a, b = self.canonical(a), self.canonical(b)
        if a == b:
            return True
        if a.is_const and b.is_const:
            self.conflicts.append((a, b))
            return False
        difference = E.sub(a, b)
        top = list(dict.fromkeys(atom for atom in difference.atoms()))
        symbols = sorted((x for x in top if isinstance(x, Sym)), key=lambda x: self._preference(x.name),
                         reverse=True)
        fresh = [x for x in symbols if self.is_fresh(x.name)]
        named = [x for x in symbols if not self.is_fresh(x.name)]
        for atom in fresh + [x for x in top if not isinstance(x, Sym)] + named:
            solution = _solve(difference, atom)
            if solution is None:
                continue
            if isinstance(atom, Sym):
                self.symbols[atom.name] = solution
                self._stale |= self._uses.pop(atom.name, set())
            else:
                self._keep(atom, solution)
            self._cache.clear()
            return True
        settled = _broadcasts_settled(a, b) or _broadcasts_settled(b, a)
        if settled:
            for atom, value in settled:
                self._keep(atom, value)
            self._cache.clear()
            return True
        keep, other = sorted((a, b), key=self._score)
        self._keep(other, keep)
        self._cache.clear()
        return True

    def _keep(self, key, value: Expr) -> None:
        """Bind an atom (quotient, max/min) or join a compound expression's class."""
        (self.classes if isinstance(key, Expr) else self.atoms)[key] = value
        for name in key.symbols():
            self._uses.setdefault(name, set()).add(key)

    def _score(self, e: Expr) -> tuple:
        fresh = sum(1 for name in e.symbols() if self.is_fresh(name))
        return fresh, len(e.terms) + sum(1 for _ in e.atoms()), len(e.text), e.text

    def _rekey(self) -> None:
        """Learn the stale atoms and class members again, in their canonical form now."""
        self._rekeying = True
        try:
            while self._stale:
                stale, self._stale = self._stale, set()
                pairs = []
                for key in stale:
                    table = self.classes if isinstance(key, Expr) else self.atoms
                    if key in table:
                        pairs.append((key if isinstance(key, Expr) else E.of_atom(key), table.pop(key)))
                self._cache.clear()
                for member, representative in pairs:
                    self.learn(member, representative)
        finally:
            self._rekeying = False


def _monomial(e: Expr) -> tuple[int, list] | None:
    """(coefficient, factors with repetition) of a one-term expression."""
    if len(e.terms) != 1:
        return None
    mono, c = e.terms[0]
    return c, [atom for atom, power in mono for _ in range(power)]


def _broadcasts_settled(a: Expr, b: Expr) -> list | None:
    """``a == b`` with a a product of broadcast(x, y) atoms (and factors b shares), b a product of
    one argument of each: every broadcast is that argument. A broadcast is one of its arguments,
    the others 1 or equal to it, so it is >= each when dims are >= 1; a product of such factors
    equals the product of what they bound only when each does. (A Reshape of the sum of
    ``[b1, s1] + [b2, s2]`` to ``[b2, s1]``: the sum did not broadcast.)"""
    ma, mb = _monomial(a), _monomial(b)
    if ma is None or mb is None or ma[0] != mb[0] or ma[0] <= 0:
        return None
    left, right = list(ma[1]), list(mb[1])
    for atom in list(left):
        if atom in right:
            left.remove(atom)
            right.remove(atom)
    if not left or len(left) != len(right):
        return None
    settled = []
    for atom in left:
        if not (isinstance(atom, Func) and atom.fn == "broadcast"):
            return None
        match = next((x for x in right if E.of_atom(x) in atom.args), None)
        if match is None:
            return None
        right.remove(match)
        settled.append((atom, E.of_atom(match)))
    return settled


def _solve(difference: Expr, x) -> Expr | None:
    """Atom x from ``difference == 0`` when it is ``x * P + R`` with P one term dividing R exactly
    and x nowhere else (not in R, not inside another atom)."""
    inside = x.symbols() if not isinstance(x, Sym) else {x.name}
    coefficient: list = []
    rest: dict = {}
    for mono, c in difference.terms:
        power = 0
        others = []
        for atom, p in mono:
            if atom == x:
                power = p
            elif isinstance(x, Sym) and x.name in atom.symbols():
                return None
            else:
                others.append((atom, p))
        if power > 1:
            return None
        if power == 1:
            coefficient.append((tuple(others), c))
        else:
            rest[mono] = c
    if len(coefficient) != 1 or not inside:
        return None
    p = Expr((coefficient[0],))
    r = Expr(tuple(sorted(rest.items(), key=lambda t: E._mono_key(t[0]))))
    solution = E.exact_div(E.neg(r), p)
    if solution is not None and not isinstance(x, Sym) and any(a == x for a in solution.atoms()):
        return None
    return solution
