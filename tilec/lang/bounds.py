"""Sizes, divisibility and bounds.

Symbolically (no sizes known): every access is checked against its tensor's shape over the ranges of its loops,
with sizes as positive symbols. An access proven in bounds needs no further check; one proven out of bounds for all
sizes is an error at once; the rest wait for concrete sizes. `/` in sizes is floor division, so the polynomial
reasoning is used only where every `/` involved is proven exact (from the coefficients or from an
`assume X % d == 0`) and no `%` is involved; quasi-affine indices (`i / 2`) and padded reads (`X[i - 1] ?? 0`)
are checked with concrete sizes, exactly.

Concretely (`resolve`): size symbols come from -D, input arrays and `default`; lets are evaluated, assumptions,
positive dimensions and the accesses not proven in bounds are checked. A padded read may leave its tensor, but in
every dimension it must touch the tensor and may reach at most the tensor's extent beyond either end.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping

from tilec.errors import TilecError
from tilec.lang import syntax as s
from tilec.lang.checker import Facts, Site, children
from tilec.lang.symbolic import Affine, NotAffine, Poly, concrete_range, index_range, size_poly, to_affine


@dataclass(frozen=True)
class Pending:
    """Symbolic facts: which accesses (site, dim) and which divisions still need concrete sizes."""

    sites: tuple[tuple[Site, int], ...]
    divisions: tuple[s.BinOp, ...]  # floor divisions not proven exact (so polynomial reasoning avoids them)


_MEMO: list = [None, {}, {}]  # the Facts last asked about, its lets as Polys, its size expressions' Polys


def _poly(facts: Facts, expr: s.Expr) -> Poly:
    if _MEMO[0] is not facts:  # every site asks for its loop bounds and shapes: the lets are solved once per program
        lets: dict[str, Poly] = {}
        for name, let in facts.lets.items():  # lets in order; each may use earlier ones
            lets[name] = size_poly(let.value, lambda n: lets.get(n.id) or Poly.sym(n.id))
        _MEMO[:] = [facts, lets, {}]
    lets, seen = _MEMO[1], _MEMO[2]
    hit = seen.get(id(expr))
    if hit is None or hit[0] is not expr:  # keyed by identity; the entry keeps its expression alive (unique ids)
        hit = seen[id(expr)] = (expr, size_poly(expr, lambda n: lets.get(n.id) or Poly.sym(n.id)))
    return hit[1]


# ---- symbolic -------------------------------------------------------------------------------------------------------


def prove(facts: Facts) -> Pending:
    """Prove what can be proven for all sizes; raise for accesses out of bounds whatever the sizes."""
    known = _assumed_nonneg(facts)
    open_sites = []
    for site in facts.sites:
        for dim in range(len(site.affines)):
            if not _prove_site(facts, site, dim, known):
                open_sites.append((site, dim))
    open_divs = tuple(d for d in _divisions(facts) if not _divides(facts, d))
    return Pending(tuple(open_sites), open_divs)


def _polynomial(facts: Facts, expr: s.Expr, loop_vars: frozenset[str] = frozenset()) -> bool:
    """The size expression (through its lets) is the polynomial `_poly` gives: no `%`, every `/` proven exact.
    In an index, a `/` or `%` of loop variables is a quasi-affine term of the Affine, not a size: its operands are
    looked into."""
    if isinstance(expr, s.BinOp) and expr.op in "/%" and _uses(expr.lhs, loop_vars):
        return _polynomial(facts, expr.lhs, loop_vars) and _polynomial(facts, expr.rhs, loop_vars)
    if isinstance(expr, s.BinOp) and expr.op == "%":
        return False
    if isinstance(expr, s.BinOp) and expr.op == "/" and not _divides(facts, expr):
        return False
    if isinstance(expr, s.Name) and expr.id in facts.lets:
        return _polynomial(facts, facts.lets[expr.id].value)
    return all(_polynomial(facts, c, loop_vars) for c in children(expr))


def _uses(expr: s.Expr, names: frozenset[str]) -> bool:
    if isinstance(expr, s.Name):
        return expr.id in names
    return any(_uses(c, names) for c in children(expr))


def _assumed_nonneg(facts: Facts) -> list[Poly]:
    """Each `assume a >= b` (or >, <=, <, ==) as polynomials g with g >= 0; `%` conditions are not used here."""
    out = []
    for a in facts.kernel.assumes:
        if not (_polynomial(facts, a.cond.lhs) and _polynomial(facts, a.cond.rhs)):
            continue
        try:
            lhs, rhs = _poly(facts, a.cond.lhs), _poly(facts, a.cond.rhs)
        except NotAffine:
            continue
        one = Poly.const(1)
        out += {">=": [lhs - rhs], ">": [lhs - rhs - one], "<=": [rhs - lhs], "<": [rhs - lhs - one],
                "==": [lhs - rhs, rhs - lhs]}.get(a.cond.op, [])
    return out


class Atoms:
    """Size expressions as polynomials in which each floor division not proven exact and each modulo is an atom
    (a symbol named `⌊...⌋`) with the facts that bound it: floor(E / d) lies in [(E - d + 1) / d, E / d] and
    E % d in [0, d - 1]. Two uses of one expression (`Ho / 2` as a shape and as a loop bound) are one atom."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self.known: list[Poly] = []  # the atoms' facts, as polynomials g >= 0
        self.names: set[str] = set()

    def poly(self, expr: s.Expr) -> Poly:
        if isinstance(expr, s.Num):
            return Poly.const(int(expr.value))
        if isinstance(expr, s.Name):
            let = self.facts.lets.get(expr.id)
            return self.poly(let.value) if let is not None else Poly.sym(expr.id)
        if isinstance(expr, s.Neg):
            return -self.poly(expr.x)
        if not isinstance(expr, s.BinOp):
            raise NotAffine("not a size", expr.span, "")
        a, b = self.poly(expr.lhs), self.poly(expr.rhs)
        if expr.op == "+":
            return a + b
        if expr.op == "-":
            return a - b
        if expr.op == "*":
            return a * b
        d = int(b.const_value())
        if expr.op == "/" and _divides(self.facts, expr):
            return a.scale(Fraction(1, d))
        return self._atom(expr.op, a, d)

    def _atom(self, op: str, a: Poly, d: int) -> Poly:
        name = f"⌊{a}/{d}⌋" if op == "/" else f"⌊{a} mod {d}⌋"
        atom = Poly.sym(name)
        if name not in self.names:
            self.names.add(name)
            if op == "/":
                self.known += [a.scale(Fraction(1, d)) - atom, atom - (a - Poly.const(d - 1)).scale(Fraction(1, d))]
            else:
                self.known += [atom, Poly.const(d - 1) - atom]
        return atom

    def nonneg(self, p: Poly, known: list[Poly]) -> bool:
        """p >= 0 for all positive sizes: directly, or minus a multiple of one fact g >= 0 (the multiple that
        cancels an atom, or 1), with no atom left."""
        for g in [Poly()] + known + self.known:
            for c in self._multiples(p, g):
                rest = p - g.scale(c)
                if not any(n.startswith("⌊") for n in rest.symbols()) and rest.proven_nonneg():
                    return True
        return False

    @staticmethod
    def _multiples(p: Poly, g: Poly) -> list[Fraction]:
        ours, theirs = dict(p.terms), dict(g.terms)
        out = [Fraction(1)]
        for m, c in ours.items():
            if any(n.startswith("⌊") for n in m) and m in theirs and c / theirs[m] > 0:
                out.append(c / theirs[m])
        return out


def _prove_site(facts: Facts, site: Site, dim: int, known: list[Poly]) -> bool:
    if not _polynomial(facts, site.access.indices[dim], frozenset(c.var for c in site.loops)):
        return False  # an index with a floor division of sizes: checked with concrete sizes
    atoms = Atoms(facts)
    size = atoms.poly(facts.tensors[site.access.tensor].shape[dim])
    ranges = {c.var: (atoms.poly(c.start), atoms.poly(c.stop)) for c in site.loops}
    if site.affines[dim].quasi:
        return _quasi_in_bounds(site.affines[dim], ranges, size, atoms, known)
    found = index_range(site.affines[dim], ranges)
    if found is None:
        return False
    low, high = found
    in_bounds = atoms.nonneg(low, known) and atoms.nonneg(size - Poly.const(1) - high, known)
    if site.access.fill is not None or atoms.names:  # padding, or floors: proven in bounds, else checked concretely
        return in_bounds
    if (high - size).proven_nonneg() and all(_nonempty(facts, c) for c in site.loops):
        raise _oob(site, dim, f"reaches {high}, beyond the last index {size - Poly.const(1)}",
                   f"for every size, {_index_text(site, dim)} runs from {low} to {high}")
    if (Poly.const(-1) - low).proven_nonneg() and all(_nonempty(facts, c) for c in site.loops):
        raise _oob(site, dim, f"goes down to {low}, below 0",
                   f"for every size, {_index_text(site, dim)} runs from {low} to {high}")
    return in_bounds


def _quasi_in_bounds(aff: Affine, ranges: dict[str, tuple[Poly, Poly]], size: Poly, atoms: Atoms,
                     known: list[Poly]) -> bool:
    """`c + floor(E / d)` lies in [0, size - 1] exactly when E lies in [-d*c, d*(size - c) - 1] (`X[i / 2]` of an
    upsample, for all sizes); `c + E % d` when c >= 0 and c + d - 1 <= size - 1. Other quasi-affine indices are
    checked with concrete sizes."""
    if aff.coeffs or len(aff.quasi) != 1 or aff.quasi[0].coef != Poly.const(1):
        return False
    q, c, d = aff.quasi[0], aff.offset, Poly.const(aff.quasi[0].divisor)
    if q.op == "%":
        return atoms.nonneg(c, known) and atoms.nonneg(size - c - d, known)
    found = index_range(q.inner, ranges)
    if found is None:
        return False
    return atoms.nonneg(found[0] + d * c, known) and atoms.nonneg(d * (size - c) - Poly.const(1) - found[1], known)


def _nonempty(facts: Facts, loop) -> bool:
    return (_poly(facts, loop.stop) - _poly(facts, loop.start) - Poly.const(1)).proven_nonneg()


def _oob(site: Site, dim: int, what: str, detail: str) -> TilecError:
    index = site.access.indices[dim]
    return TilecError(f"index out of bounds: dimension {dim + 1} of `{site.access.tensor}` {what}", index.span,
                      f"{detail}; shrink the loop range, make the tensor larger, or read it padded "
                      f"(`{site.access.tensor}[...] ?? 0` reads 0 outside it)")


def _index_text(site: Site, dim: int) -> str:
    sp = site.access.indices[dim].span
    text = sp.line_text()[sp.col - 1:sp.end_col - 1] if sp.line == sp.end_line else ""
    return f"`{text}`" if text else "the index"


def _divisions(facts: Facts) -> list[s.BinOp]:
    exprs: list[s.Expr] = [d for t in facts.tensors.values() for d in t.shape]
    exprs += [let.value for let in facts.lets.values()]
    for site in facts.sites:
        exprs += list(site.access.indices) + [e for c in site.loops for e in (c.start, c.stop)]
    out: list[s.BinOp] = []
    for e in exprs:
        _collect_divs(e, out)
    unique = {id(d): d for d in out}
    return list(unique.values())


def _collect_divs(expr: s.Expr, out: list[s.BinOp]) -> None:
    if isinstance(expr, s.BinOp) and expr.op == "/":
        out.append(expr)
    for child in children(expr):
        _collect_divs(child, out)


def _divides(facts: Facts, div: s.BinOp) -> bool:
    num, d = _poly(facts, div.lhs), _poly(facts, div.rhs).const_value()
    if all((c / d).denominator == 1 for _, c in num.terms):
        return True
    return any(_assumed_multiple(facts, a.cond, num, d) for a in facts.kernel.assumes)


def _assumed_multiple(facts: Facts, cond: s.Compare, num: Poly, d: Fraction) -> bool:
    """`assume E % m == 0` proves num / d exact when d divides m and num - E is a multiple of d."""
    lhs, rhs = cond.lhs, cond.rhs
    if cond.op != "==" or not (isinstance(rhs, s.Num) and rhs.value == 0):
        return False
    if not (isinstance(lhs, s.BinOp) and lhs.op == "%" and isinstance(lhs.rhs, s.Num)):
        return False
    m = lhs.rhs.value
    if not isinstance(m, int) or m % d != 0:
        return False
    rest = num - _poly(facts, lhs.lhs)
    return all((c / d).denominator == 1 for _, c in rest.terms)


# ---- concrete -------------------------------------------------------------------------------------------------------


def evaluate_size(expr: s.Expr, values: Mapping[str, int]) -> int:
    """Integer value of a size expression: `/` is floor division and `%` floor modulo (Python's // and %)."""
    if isinstance(expr, s.Num):
        return int(expr.value)
    if isinstance(expr, s.Name):
        return values[expr.id]
    if isinstance(expr, s.Neg):
        return -evaluate_size(expr.x, values)
    a, b = evaluate_size(expr.lhs, values), evaluate_size(expr.rhs, values)
    if expr.op in "/%":
        if b <= 0:
            raise TilecError(f"`{_text(expr)}` divides by {b}", expr.rhs.span,
                             f"in sizes `{expr.op}` is floor {'division' if expr.op == '/' else 'modulo'} by a "
                             "positive integer constant")
        return a // b if expr.op == "/" else a % b
    return {"+": a + b, "-": a - b, "*": a * b}[expr.op]


def _text(expr: s.Expr) -> str:
    sp = expr.span
    return sp.line_text()[sp.col - 1:sp.end_col - 1] if sp.line == sp.end_line and sp.line else "expression"


def resolve(facts: Facts, pending: Pending, given: Mapping[str, int]) -> dict[str, int]:
    """Sizes for every symbol and let (only those computable when some symbols are unknown); when all are known,
    also check assumptions, dimensions, exact divisions and the accesses left open by `prove`."""
    values = {name: given[name] for name in facts.symbols if name in given}
    for name in values:
        if values[name] < 1:
            raise TilecError(f"size {name} = {values[name]} is not positive", None,
                             f"give {name} a value of at least 1")
    for name, let in facts.lets.items():
        if _known(let.value, values):
            values[name] = evaluate_size(let.value, values)
    if len(values) < len(facts.symbols) + len(facts.lets):
        return values
    _check_assumes(facts, values)
    _check_dims(facts, values)
    for site, dim in pending.sites:
        _check_site(facts, site, dim, values)
    return values


def _known(expr: s.Expr, values: Mapping[str, int]) -> bool:
    if isinstance(expr, s.Name):
        return expr.id in values
    return all(_known(c, values) for c in children(expr))


def _check_assumes(facts: Facts, values: Mapping[str, int]) -> None:
    ops = {"==": int.__eq__, "!=": int.__ne__, "<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__}
    for a in facts.kernel.assumes:
        lhs, rhs = evaluate_size(a.cond.lhs, values), evaluate_size(a.cond.rhs, values)
        if not ops[a.cond.op](lhs, rhs):
            used = sorted({n for n in _names(a.cond.lhs) + _names(a.cond.rhs)})
            shown = ", ".join(f"{n} = {values[n]}" for n in used)
            raise TilecError(f"assumption `{_text(a.cond)}` does not hold for {shown}", a.span,
                             "choose sizes that satisfy it (with -D NAME=VALUE or other input shapes)")


def _names(expr: s.Expr) -> list[str]:
    if isinstance(expr, s.Name):
        return [expr.id]
    return [n for c in children(expr) for n in _names(c)]


def _check_dims(facts: Facts, values: Mapping[str, int]) -> None:
    for t in facts.tensors.values():
        for i, dim in enumerate(t.shape):
            n = evaluate_size(dim, values)
            if n < 1:
                raise TilecError(f"dimension {i + 1} of `{t.name}` is {_text(dim)} = {n}, not positive", dim.span,
                                 "choose sizes that give every tensor a positive shape")


def _reach(facts: Facts, site: Site, dim: int, values: Mapping[str, int]):
    """(loops, affine, lowest and highest index, size) of one dimension of an access; None if it never happens."""
    loops = {c.var: (evaluate_size(c.start, values), evaluate_size(c.stop, values)) for c in site.loops}
    if any(stop <= start for start, stop in loops.values()):
        return None
    aff = to_affine(site.access.indices[dim], set(loops), lambda n: Poly.const(values[n.id]))
    low, high = concrete_range(aff, loops)
    return loops, aff, low, high, evaluate_size(facts.tensors[site.access.tensor].shape[dim], values)


def halo(facts: Facts, site: Site, values: Mapping[str, int]) -> tuple[tuple[int, int], ...]:
    """How far a (padded) read reaches beyond its tensor, per dimension, as np.pad's pad_width: (before, after).
    What a compiler must provide around the tile (zeros, or the padding constant) instead of a padded copy."""
    out = []
    for dim in range(len(site.affines)):
        found = _reach(facts, site, dim, values)
        out.append((0, 0) if found is None else (max(0, -found[2]), max(0, found[3] - found[4] + 1)))
    return tuple(out)


def _check_site(facts: Facts, site: Site, dim: int, values: Mapping[str, int]) -> None:
    found = _reach(facts, site, dim, values)
    if found is None:
        return  # the access never happens
    loops, aff, low, high, size = found
    index = site.access.indices[dim]
    used = ", ".join(f"{v} in {a}..{b}" for v, (a, b) in loops.items() if v in aff.vars())
    over = f"over {used or 'its loops'} it takes values {low}..{high}"
    if site.access.fill is not None:
        _check_padding(site, dim, low, high, size, over)
        return
    if 0 <= low and high < size:
        return
    reach = f"reaches {high}" if high >= size else f"goes down to {low}"
    raise TilecError(
        f"index out of bounds: dimension {dim + 1} of `{site.access.tensor}` has size {size}, "
        f"but {_index_text(site, dim)} {reach}", index.span,
        f"{over}, valid indices are 0..{size - 1}; shrink the loop range, make the tensor larger, or read it "
        f"padded (`{site.access.tensor}[...] ?? 0` reads 0 outside it)")


def _check_padding(site: Site, dim: int, low: int, high: int, size: int, over: str) -> None:
    """A padded read touches its tensor in every dimension and reaches at most its extent beyond either end."""
    name, index = site.access.tensor, site.access.indices[dim]
    if high < 0 or low >= size:
        raise TilecError(f"padded read never touches `{name}`: dimension {dim + 1} has size {size}, but "
                         f"{_index_text(site, dim)} stays outside it", index.span,
                         f"{over}, valid indices are 0..{size - 1}: it would read only the padding constant; "
                         "check the index's offset")
    beyond = max(-low, high - (size - 1))
    if beyond > size:
        raise TilecError(f"padding too wide: dimension {dim + 1} of `{name}` has size {size}, but "
                         f"{_index_text(site, dim)} reaches {beyond} beyond its {'start' if -low == beyond else 'end'}",
                         index.span, f"{over}; a padded read may reach at most the tensor's extent ({size}) "
                                     "beyond either end: check the index's offset and stride")
