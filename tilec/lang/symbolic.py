"""Symbolic sizes and affine indices.

A size expression (`H - R + 1`, `Ho / 2`) becomes a `Poly`: a polynomial with rational coefficients over size
symbols. Exact division by a constant is just a rational coefficient; whether it really divides is checked
separately (symbolically from `assume`s when possible, otherwise once sizes are concrete).

An index expression becomes an `Affine`: sum of coefficient * loop variable + offset, where coefficients and
offset are Polys over sizes. Anything else (`i * j`, `i / 2`, `A[i]`) is a `NotAffine` error with its span.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Mapping

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
    """sum(coeffs[v] * v) + offset; coeffs never hold a zero polynomial."""

    coeffs: tuple[tuple[str, Poly], ...]
    offset: Poly

    def coeff(self, var: str) -> Poly:
        return dict(self.coeffs).get(var, Poly())

    def vars(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.coeffs)


class NotAffine(Exception):
    """An index or size expression outside the affine fragment; carries the span and the reason."""

    def __init__(self, reason: str, span: Span, hint: str) -> None:
        super().__init__(reason)
        self.reason, self.span, self.hint = reason, span, hint


def _affine_add(a: Affine, b: Affine, sign: int) -> Affine:
    coeffs = dict(a.coeffs)
    for v, c in b.coeffs:
        coeffs[v] = coeffs.get(v, Poly()) + (c if sign > 0 else -c)
    return Affine(tuple(sorted((v, c) for v, c in coeffs.items() if c.terms)),
                  a.offset + (b.offset if sign > 0 else -b.offset))


def _affine_scale(a: Affine, p: Poly) -> Affine:
    coeffs = tuple((v, c * p) for v, c in a.coeffs)
    return Affine(tuple((v, c) for v, c in coeffs if c.terms), a.offset * p)


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
        if lhs.coeffs and rhs.coeffs:
            raise NotAffine("product of two loop variables in an index", expr.span,
                            "indices must be affine: multiply a loop variable only by sizes or constants")
        return _affine_scale(rhs, lhs.offset) if not lhs.coeffs else _affine_scale(lhs, rhs.offset)
    if lhs.coeffs or rhs.coeffs:
        word = "division" if expr.op == "/" else "remainder"
        raise NotAffine(f"{word} of a loop variable in an index", expr.span,
                        f"indices must be affine: `{expr.op}` may only combine sizes; "
                        "use a separate loop for the quotient (e.g. `2*i + p` instead of `x / 2`)")
    return Affine((), size_binop(expr.op, lhs.offset, rhs.offset, expr))


def size_binop(op: str, a: Poly, b: Poly, expr: s.BinOp) -> Poly:
    """Poly arithmetic for size expressions: + - *, and / by a positive integer constant."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/" and b.is_const() and b.const_value() > 0 and b.const_value().denominator == 1:
        return a.scale(Fraction(1) / b.const_value())
    if op == "/":
        raise NotAffine("sizes may only be divided by a positive integer constant", expr.rhs.span,
                        "write e.g. `Ho / 2`; a size divided by another size is not supported")
    raise NotAffine("`%` is only allowed in `assume` conditions", expr.span,
                    "state divisibility with `assume X % 2 == 0` and divide with `X / 2`")


def size_poly(expr: s.Expr, size_of: Callable[[s.Name], Poly]) -> Poly:
    """A size expression (no loop variables) -> Poly."""
    return to_affine(expr, set(), size_of).offset


def index_range(aff: Affine, ranges: Mapping[str, tuple[Poly, Poly]]) -> tuple[Poly, Poly] | None:
    """Smallest and largest value of aff over loop ranges [start, stop), when each coefficient's sign is known;
    None otherwise. Valid whenever every loop range is non-empty (an empty loop makes no access at all)."""
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
