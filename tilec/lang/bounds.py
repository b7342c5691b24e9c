"""Sizes, divisibility and bounds.

Symbolically (no sizes known): every access is checked against its tensor's shape over the ranges of its loops,
with sizes as positive symbols. An access proven in bounds needs no further check; one proven out of bounds for all
sizes is an error at once; the rest wait for concrete sizes. Likewise every `/` in a size expression must divide
exactly: proven from the coefficients or from an `assume X % d == 0`, or checked once sizes are known.

Concretely (`resolve`): size symbols come from -D, input arrays and `default`; lets are evaluated, assumptions,
positive dimensions, exact divisions and the accesses not proven in bounds are checked.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping

from tilec.errors import TilecError
from tilec.lang import syntax as s
from tilec.lang.checker import Facts, Site, children
from tilec.lang.symbolic import NotAffine, Poly, index_range, size_poly


@dataclass(frozen=True)
class Pending:
    """Symbolic facts: which accesses (site, dim) and which divisions still need concrete sizes."""

    sites: tuple[tuple[Site, int], ...]
    divisions: tuple[s.BinOp, ...]


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


def _assumed_nonneg(facts: Facts) -> list[Poly]:
    """Each `assume a >= b` (or >, <=, <, ==) as polynomials g with g >= 0; `%` conditions are not used here."""
    out = []
    for a in facts.kernel.assumes:
        try:
            lhs, rhs = _poly(facts, a.cond.lhs), _poly(facts, a.cond.rhs)
        except NotAffine:
            continue
        one = Poly.const(1)
        out += {">=": [lhs - rhs], ">": [lhs - rhs - one], "<=": [rhs - lhs], "<": [rhs - lhs - one],
                "==": [lhs - rhs, rhs - lhs]}.get(a.cond.op, [])
    return out


def _nonneg(p: Poly, known: list[Poly]) -> bool:
    """p >= 0 for all positive sizes, or p minus one assumed-nonnegative g is (so p >= g >= 0)."""
    return p.proven_nonneg() or any((p - g).proven_nonneg() for g in known)


def _prove_site(facts: Facts, site: Site, dim: int, known: list[Poly]) -> bool:
    size = _poly(facts, facts.tensors[site.access.tensor].shape[dim])
    ranges = {c.var: (_poly(facts, c.start), _poly(facts, c.stop)) for c in site.loops}
    found = index_range(site.affines[dim], ranges)
    if found is None:
        return False
    low, high = found
    if (high - size).proven_nonneg() and all(_nonempty(facts, c) for c in site.loops):
        raise _oob(site, dim, f"reaches {high}, beyond the last index {size - Poly.const(1)}",
                   f"for every size, {_index_text(site, dim)} runs from {low} to {high}")
    if (Poly.const(-1) - low).proven_nonneg() and all(_nonempty(facts, c) for c in site.loops):
        raise _oob(site, dim, f"goes down to {low}, below 0",
                   f"for every size, {_index_text(site, dim)} runs from {low} to {high}")
    return _nonneg(low, known) and _nonneg(size - Poly.const(1) - high, known)


def _nonempty(facts: Facts, loop) -> bool:
    return (_poly(facts, loop.stop) - _poly(facts, loop.start) - Poly.const(1)).proven_nonneg()


def _oob(site: Site, dim: int, what: str, detail: str) -> TilecError:
    index = site.access.indices[dim]
    return TilecError(f"index out of bounds: dimension {dim + 1} of `{site.access.tensor}` {what}", index.span,
                      f"{detail}; shrink the loop range, or make the tensor larger (e.g. pad the input)")


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
    """Exact integer value of a size expression; a `/` that does not divide is a TilecError at that `/`."""
    if isinstance(expr, s.Num):
        return int(expr.value)
    if isinstance(expr, s.Name):
        return values[expr.id]
    if isinstance(expr, s.Neg):
        return -evaluate_size(expr.x, values)
    a, b = evaluate_size(expr.lhs, values), evaluate_size(expr.rhs, values)
    if expr.op == "/":
        if b == 0 or a % b:
            raise TilecError(f"`{_text(expr)}` does not divide evenly: {_text(expr.lhs)} = {a}", expr.span,
                             f"choose sizes that make {_text(expr.lhs)} a multiple of {b}")
        return a // b
    if expr.op == "%":
        return a % b if b else a
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
    for div in pending.divisions:
        evaluate_size(div, values)
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


def _check_site(facts: Facts, site: Site, dim: int, values: Mapping[str, int]) -> None:
    loops = {c.var: (evaluate_size(c.start, values), evaluate_size(c.stop, values)) for c in site.loops}
    if any(stop <= start for start, stop in loops.values()):
        return  # the access never happens
    aff = site.affines[dim]
    ranges = {v: (Poly.const(a), Poly.const(b)) for v, (a, b) in loops.items()}
    concrete = type(aff)(tuple((v, Poly.const(c.evaluate(values))) for v, c in aff.coeffs),
                         Poly.const(aff.offset.evaluate(values)))
    low, high = (int(p.const_value()) for p in index_range(concrete, ranges))
    size = evaluate_size(facts.tensors[site.access.tensor].shape[dim], values)
    if 0 <= low and high < size:
        return
    used = ", ".join(f"{v} in {a}..{b}" for v, (a, b) in loops.items() if v in aff.vars())
    reach = f"reaches {high}" if high >= size else f"goes down to {low}"
    raise TilecError(
        f"index out of bounds: dimension {dim + 1} of `{site.access.tensor}` has size {size}, "
        f"but {_index_text(site, dim)} {reach}", site.access.indices[dim].span,
        f"over {used or 'its loops'} it takes values {low}..{high}, valid indices are 0..{size - 1}; "
        "shrink the loop range or make the tensor larger")
