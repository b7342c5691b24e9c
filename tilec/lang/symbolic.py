"""Symbolic sizes and affine indices.

A size expression (`H - R + 1`, `Ho / 2`) becomes a `Poly`: a polynomial with rational coefficients over size
symbols. Exact division by a constant is just a rational coefficient; whether it really divides is checked
separately (symbolically from `assume`s when possible, otherwise once sizes are concrete).

An index expression becomes an `Affine`: sum of coefficient * loop variable + offset, where coefficients and
offset are Polys over sizes, plus quasi-affine terms: coefficient * floor(affine / d) and coefficient *
(affine mod d) for positive integer constants d (`i / 2`, `(y + r) % 4`). Anything else (`i * j`, `i / j`, `A[i]`)
is a `NotAffine` error with its span.

Floor semantics: `/` and `%` in sizes and indices are Python's // and %. A Poly keeps `E / d` as E times 1/d, which
is the size only when d divides E; `tilec.lang.bounds` proves that (or does not rely on the Poly). A `%` of sizes
that are not all known is an opaque symbol `(E) % d` in a Poly: an integer, of unknown sign to the provers.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Mapping

import numpy as np

from tilec.errors import Span
from tilec.lang import syntax as s

Monomial = tuple[str, ...]  # sorted symbol names, repeated for powers; () is the constant term


@dataclass(frozen=True)
class Poly:
    terms: tuple[tuple[Monomial, Fraction], ...] = ()  # sorted, no zero coefficients

    @staticmethod
    def make(terms: Mapping[Monomial, Fraction]) -> "Poly":
        return Poly(tuple(sorted((m, Fraction(c)) for m, c in terms.items() if c != 0)))

    @staticmethod
    def const(value: int | Fraction) -> "Poly":
        return Poly.make({(): Fraction(value)})

    @staticmethod
    def sym(name: str) -> "Poly":
        return Poly.make({(name,): Fraction(1)})

    def __add__(self, other: "Poly") -> "Poly":
        out = dict(self.terms)
        for m, c in other.terms:
            out[m] = out.get(m, Fraction(0)) + c
        return Poly.make(out)

    def __neg__(self) -> "Poly":
        return Poly.make({m: -c for m, c in self.terms})

    def __sub__(self, other: "Poly") -> "Poly":
        return self + (-other)

    def __mul__(self, other: "Poly") -> "Poly":
        out: dict[Monomial, Fraction] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = tuple(sorted(m1 + m2))
                out[m] = out.get(m, Fraction(0)) + c1 * c2
        return Poly.make(out)

    def scale(self, factor: Fraction) -> "Poly":
        return Poly.make({m: c * factor for m, c in self.terms})

    def symbols(self) -> set[str]:
        return {name for m, _ in self.terms for name in m}

    def is_const(self) -> bool:
        return all(m == () for m, _ in self.terms)

    def const_value(self) -> Fraction:
        return dict(self.terms).get((), Fraction(0))

    def evaluate(self, values: Mapping[str, int]) -> Fraction:
        total = Fraction(0)
        for m, c in self.terms:
            term = c
            for name in m:
                term *= values[name]
            total += term
        return total

    def substitute(self, values: Mapping[str, "Poly"]) -> "Poly":
        total = Poly()
        for m, c in self.terms:
            term = Poly.const(c)
            for name in m:
                term = term * values.get(name, Poly.sym(name))
            total = total + term
        return total

    def proven_nonneg(self) -> bool:
        """True if self >= 0 whenever every symbol is >= 1 (sizes are positive): substitute x = 1 + t, t >= 0,
        and check that no coefficient is negative. Sound, not complete."""
        shifted = self.substitute({x: Poly.sym(x) + Poly.const(1) for x in self.symbols()})
        return all(c >= 0 for _, c in shifted.terms)

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in sorted(self.terms, key=lambda t: (-len(t[0]), t[0])):
            body = "*".join(m)
            coef = "" if body and c == 1 else ("-" if body and c == -1 else str(c))
            parts.append(f"{coef}{'*' if coef not in ('', '-') and body else ''}{body}")
        return " + ".join(parts).replace("+ -", "- ")


@dataclass(frozen=True)
class Affine:
    """sum(coeffs[v] * v) + offset + sum of quasi terms; coeffs never hold a zero polynomial."""

    coeffs: tuple[tuple[str, Poly], ...]
    offset: Poly
    quasi: tuple["Quasi", ...] = ()

    def coeff(self, var: str) -> Poly:
        return dict(self.coeffs).get(var, Poly())

    def vars(self) -> tuple[str, ...]:
        """The loop variables the value depends on (also through its quasi terms)."""
        out = [v for v, _ in self.coeffs]
        for q in self.quasi:
            out += [v for v in q.inner.vars() if v not in out]
        return tuple(out)

    def varies(self) -> bool:
        return bool(self.coeffs or self.quasi)


@dataclass(frozen=True)
class Quasi:
    """coef * floor(inner / divisor) (op "/") or coef * (inner mod divisor) (op "%"), divisor a positive integer."""

    op: str
    inner: Affine
    divisor: int
    coef: Poly


class NotAffine(Exception):
    """An index or size expression outside the affine fragment; carries the span and the reason."""

    def __init__(self, reason: str, span: Span, hint: str) -> None:
        super().__init__(reason)
        self.reason, self.span, self.hint = reason, span, hint


def _affine_add(a: Affine, b: Affine, sign: int) -> Affine:
    coeffs = dict(a.coeffs)
    for v, c in b.coeffs:
        coeffs[v] = coeffs.get(v, Poly()) + (c if sign > 0 else -c)
    quasi = {(q.op, q.inner, q.divisor): q.coef for q in a.quasi}
    for q in b.quasi:
        key = (q.op, q.inner, q.divisor)
        quasi[key] = quasi.get(key, Poly()) + (q.coef if sign > 0 else -q.coef)
    return Affine(tuple(sorted((v, c) for v, c in coeffs.items() if c.terms)),
                  a.offset + (b.offset if sign > 0 else -b.offset),
                  tuple(Quasi(op, inner, d, c) for (op, inner, d), c in quasi.items() if c.terms))


def _affine_scale(a: Affine, p: Poly) -> Affine:
    coeffs = tuple((v, c * p) for v, c in a.coeffs)
    quasi = tuple(Quasi(q.op, q.inner, q.divisor, q.coef * p) for q in a.quasi)
    return Affine(tuple((v, c) for v, c in coeffs if c.terms), a.offset * p, tuple(q for q in quasi if q.coef.terms))


def to_affine(expr: s.Expr, loop_vars: set[str], size_of: Callable[[s.Name], Poly]) -> Affine:
    """Index expression -> Affine over loop_vars; sizes resolve through size_of (which raises for bad names)."""
    if isinstance(expr, s.Num):
        if not isinstance(expr.value, int):
            raise NotAffine(f"`{expr.value}` is not an integer", expr.span, "indices and sizes are integers")
        return Affine((), Poly.const(expr.value))
    if isinstance(expr, s.Name):
        if expr.id in loop_vars:
            return Affine(((expr.id, Poly.const(1)),), Poly())
        return Affine((), size_of(expr))
    if isinstance(expr, s.Neg):
        return _affine_scale(to_affine(expr.x, loop_vars, size_of), Poly.const(-1))
    if isinstance(expr, s.BinOp):
        return _affine_binop(expr, loop_vars, size_of)
    if isinstance(expr, s.Access):
        raise NotAffine(f"index reads tensor `{expr.tensor}`", expr.span,
                        "indices must be affine in loop variables: tensor values cannot be used as indices")
    raise NotAffine(f"`{expr.fn}(...)` is not allowed in an index", expr.span,
                    "indices must be affine: loop variables times sizes, plus sizes and constants")


def _affine_binop(expr: s.BinOp, loop_vars: set[str], size_of: Callable[[s.Name], Poly]) -> Affine:
    lhs = to_affine(expr.lhs, loop_vars, size_of)
    rhs = to_affine(expr.rhs, loop_vars, size_of)
    if expr.op in "+-":
        return _affine_add(lhs, rhs, 1 if expr.op == "+" else -1)
    if expr.op == "*":
        if lhs.varies() and rhs.varies():
            raise NotAffine("product of two loop variables in an index", expr.span,
                            "indices must be affine: multiply a loop variable only by sizes or constants")
        return _affine_scale(rhs, lhs.offset) if not lhs.varies() else _affine_scale(lhs, rhs.offset)
    if rhs.varies():
        word = "division" if expr.op == "/" else "modulo"
        raise NotAffine(f"{word} by a loop variable in an index", expr.rhs.span,
                        f"in an index `{expr.op}` is floor {word} by a positive integer constant, e.g. `i {expr.op} 2`")
    if lhs.varies():
        return _quasi(expr, lhs, _divisor(rhs.offset, expr))
    return Affine((), size_binop(expr.op, lhs.offset, rhs.offset, expr))


def _divisor(b: Poly, expr: s.BinOp) -> int:
    value = b.const_value()
    if not b.is_const() or value <= 0 or value.denominator != 1:
        word = "divided" if expr.op == "/" else "taken modulo"
        raise NotAffine(f"sizes and indices may only be {word} by a positive integer constant", expr.rhs.span,
                        f"write e.g. `Ho {expr.op} 2` or `i {expr.op} 2`; in sizes and indices `/` is floor division "
                        "and `%` floor modulo, by constants only")
    return int(value)


def _multiple_of(p: Poly, d: int) -> bool:
    return all(c.denominator == 1 and c.numerator % d == 0 for _, c in p.terms)


def _quasi(expr: s.BinOp, inner: Affine, d: int) -> Affine:
    """floor(inner / d) or inner mod d: exact when d divides every coefficient (`(2*i + 4) / 2` is `i + 2`)."""
    exact = all(_multiple_of(c, d) for _, c in inner.coeffs) and _multiple_of(inner.offset, d) and \
        all(_multiple_of(q.coef, d) for q in inner.quasi)
    if exact or d == 1:
        return _affine_scale(inner, Poly.const(Fraction(1, d))) if expr.op == "/" else Affine((), Poly())
    return Affine((), Poly(), (Quasi(expr.op, inner, d, Poly.const(1)),))


def size_binop(op: str, a: Poly, b: Poly, expr: s.BinOp) -> Poly:
    """Poly arithmetic for size expressions: + - *, and floor / and % by a positive integer constant (exact when
    every size is known; see the module docstring otherwise)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    d = _divisor(b, expr)
    if a.is_const():
        whole = a.const_value()
        return Poly.const(whole // d if op == "/" else whole % d)
    if op == "/":
        return a.scale(Fraction(1, d))
    return Poly.sym(f"({a}) % {d}")


def size_poly(expr: s.Expr, size_of: Callable[[s.Name], Poly]) -> Poly:
    """A size expression (no loop variables) -> Poly."""
    return to_affine(expr, set(), size_of).offset


def index_range(aff: Affine, ranges: Mapping[str, tuple[Poly, Poly]]) -> tuple[Poly, Poly] | None:
    """Smallest and largest value of aff over loop ranges [start, stop), when each coefficient's sign is known;
    None otherwise. Valid whenever every loop range is non-empty (an empty loop makes no access at all)."""
    if aff.quasi:
        return None
    low, high = aff.offset, aff.offset
    for var, coef in aff.coeffs:
        start, stop = ranges[var]
        first, last = coef * start, coef * (stop - Poly.const(1))
        if coef.proven_nonneg():
            low, high = low + first, high + last
        elif (-coef).proven_nonneg():
            low, high = low + last, high + first
        else:
            return None
    return low, high


MAX_ENUMERATED = 1 << 22  # concrete_range enumerates a quasi-affine index over at most this many loop points


def concrete_values(aff: Affine, grids: Mapping[str, np.ndarray]) -> np.ndarray:
    """The integer value of an Affine with constant coefficients at every point of the (broadcasting) grids."""
    total: np.ndarray = np.asarray(int(aff.offset.const_value()), dtype=np.int64)
    for var, coef in aff.coeffs:
        total = total + int(coef.const_value()) * grids[var]
    for q in aff.quasi:
        inner = concrete_values(q.inner, grids)
        part = inner // q.divisor if q.op == "/" else inner % q.divisor
        total = total + int(q.coef.const_value()) * part
    return total


def concrete_range(aff: Affine, ranges: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """Smallest and largest value of an Affine with constant coefficients over non-empty loop ranges [start, stop):
    exact (the corners for an affine form, every point for a quasi-affine one, up to MAX_ENUMERATED points; beyond
    that an interval bound, which may be loose)."""
    if not aff.quasi:
        found = index_range(aff, {v: (Poly.const(a), Poly.const(b)) for v, (a, b) in ranges.items()})
        assert found is not None
        return int(found[0].const_value()), int(found[1].const_value())
    used = aff.vars()
    points = 1
    for v in used:
        points *= ranges[v][1] - ranges[v][0]
    if points <= MAX_ENUMERATED:
        grids = {v: np.arange(*ranges[v], dtype=np.int64).reshape([-1 if k == i else 1 for k in range(len(used))])
                 for i, v in enumerate(used)}
        values = concrete_values(aff, grids)
        return int(values.min()), int(values.max())
    return _interval(aff, ranges)


def _interval(aff: Affine, ranges: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    low = high = int(aff.offset.const_value())
    for var, coef in aff.coeffs:
        c, (a, b) = int(coef.const_value()), ranges[var]
        low, high = low + min(c * a, c * (b - 1)), high + max(c * a, c * (b - 1))
    for q in aff.quasi:
        lo, hi = _interval(q.inner, ranges)
        lo, hi = (lo // q.divisor, hi // q.divisor) if q.op == "/" else (0, q.divisor - 1)
        c = int(q.coef.const_value())
        low, high = low + min(c * lo, c * hi), high + max(c * lo, c * hi)
    return low, high
