"""When may the evaluator run a loop "open" (all iterations at once)?

Running a loop open means: each statement under it runs over all of its iterations before the next statement
starts. That equals the sequential nest when
  1. each statement alone may run all its iterations at once: it writes distinct elements for distinct values of
     the loop variables in its target index (checked on the concrete strides), and if it reads its own target
     it does so at exactly the written element, with no reduction loop around it;
  2. for two statements A before B that touch one tensor (one of them writing), every loop enclosing both pins
     the element: some dimension is indexed `c*u + offset` identically by both accesses. Then A and B only
     conflict within one iteration of their common loops, where A runs first in both orders.
Both conditions are sufficient, not necessary; when they fail the evaluator runs the loop in Python instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
from tilec.lang import syntax as s
from tilec.lang.bounds import evaluate_size
from tilec.lang.symbolic import Affine, Poly, to_affine

MAX_TAPS = 4096  # beyond this many tap iterations a materialised contraction is cheaper than a Python loop


@dataclass(frozen=True)
class OpenLoop:
    var: str
    start: int
    stop: int
    node: int  # id() of the syntax Loop, so two statements can tell whether they share a loop


@dataclass(frozen=True)
class Dim:
    """One index of an access with the Python-loop variables substituted: sum(coeffs[v] * v) + offset, plus the
    quasi-affine terms coef * (inner / divisor) or coef * (inner % divisor), floor semantics (`X[i / 2]`)."""

    coeffs: dict[str, int]
    offset: int
    quasi: tuple[tuple[str, "Dim", int, int], ...] = ()  # (op, inner, divisor, coef)

    def vars(self) -> list[str]:
        out = list(self.coeffs)
        for _, inner, _, _ in self.quasi:
            out += [v for v in inner.vars() if v not in out]
        return out

    def values(self, grids: Mapping[str, np.ndarray]) -> np.ndarray:
        """The index at every point of the broadcasting integer grids of the open loop variables."""
        total: np.ndarray = np.asarray(self.offset, dtype=np.int64)
        for v, c in self.coeffs.items():
            total = total + c * grids[v]
        for op, inner, d, c in self.quasi:
            x = inner.values(grids)
            total = total + c * (x // d if op == "/" else x % d)
        return total


def _concrete(form: Affine) -> tuple:
    """An Affine with constant coefficients -> (coeffs, offset, quasi) of plain ints, for `Affines.of`."""
    return ({v: int(c.const_value()) for v, c in form.coeffs}, int(form.offset.const_value()),
            tuple((q.op, _concrete(q.inner), q.divisor, int(q.coef.const_value())) for q in form.quasi))


def _substitute(base: tuple, env: Mapping[str, int]) -> Dim:
    coeffs, offset, quasi = base
    fixed = sum(c * env[v] for v, c in coeffs.items() if v in env)
    return Dim({v: c for v, c in coeffs.items() if v not in env and c}, offset + fixed,
               tuple((op, _substitute(inner, env), d, c) for op, inner, d, c in quasi))


class _NotASize:
    """Every name that is not a size is a loop variable (the checker already vetted the names)."""

    def __init__(self, sizes: Mapping[str, int]) -> None:
        self.sizes = sizes

    def __contains__(self, name: str) -> bool:
        return name not in self.sizes


class Affines:
    """Concrete affine forms of accesses, cached per access node."""

    def __init__(self, sizes: Mapping[str, int]) -> None:
        self.sizes = sizes
        self.cache: dict[int, tuple] = {}

    def _base(self, acc: s.Access) -> tuple:
        key = id(acc)
        if key not in self.cache:
            forms = [to_affine(i, _NotASize(self.sizes), self._size) for i in acc.indices]
            self.cache[key] = (acc, tuple(_concrete(f) for f in forms))
        return self.cache[key][1]

    def _size(self, name: s.Name) -> Poly:
        return Poly.const(self.sizes[name.id])

    def of(self, acc: s.Access, env: Mapping[str, int]) -> tuple[Dim, ...]:
        return tuple(_substitute(base, env) for base in self._base(acc))

    def vars_of(self, acc: s.Access, env: Mapping[str, int]) -> list[str]:
        return [v for d in self.of(acc, env) for v in d.vars()]

    def gathered(self, acc: s.Access) -> bool:
        """Read by gathering (not through a strided view): a padded or quasi-affine read."""
        return acc.fill is not None or any(quasi for _, _, quasi in self._base(acc))

    def bound(self, expr: s.Expr, env: Mapping[str, int]) -> int:
        return evaluate_size(expr, self.sizes)


def statements_under(loop: s.Loop, affines: Affines, env: Mapping[str, int],
                     outer: tuple[OpenLoop, ...] = ()) -> list[tuple[s.Assign, tuple[OpenLoop, ...]]]:
    """The statements under loop in program order, each with its open loops (outermost first)."""
    here = outer + (OpenLoop(loop.var, affines.bound(loop.start, env), affines.bound(loop.stop, env), id(loop)),)
    out = []
    for st in loop.body:
        if isinstance(st, s.Loop):
            out.extend(statements_under(st, affines, env, here))
        else:
            out.append((st, here))
    return out


def reads(e: s.Expr) -> list[s.Access]:
    if isinstance(e, s.Access):
        return [e]
    children = {s.Neg: lambda x: (x.x,), s.BinOp: lambda x: (x.lhs, x.rhs), s.Call: lambda x: x.args}
    get = children.get(type(e))
    return [a for c in (get(e) if get else ()) for a in reads(c)]


class Planner:
    def __init__(self, affines: Affines, strides: Mapping[str, tuple[int, ...]],
                 shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.affines, self.strides, self.shapes = affines, strides, shapes

    def can_open(self, loop: s.Loop, env: Mapping[str, int]) -> bool:
        stmts = statements_under(loop, self.affines, env)
        if not all(self._alone(st, loops, env) for st, loops in stmts):
            return False
        return all(self._pair(a, la, b, lb, env)
                   for i, (a, la) in enumerate(stmts) for b, lb in stmts[i + 1:])

    def _alone(self, st: s.Assign, loops: tuple[OpenLoop, ...], env: Mapping[str, int]) -> bool:
        target = self.affines.of(st.target, env)
        written = {v for d in target for v in d.coeffs}
        reduce_vars = [lp for lp in loops if lp.var not in written and lp.stop > lp.start + 1]
        for acc in reads(st.value):
            if acc.tensor == st.target.tensor and (reduce_vars or self.affines.of(acc, env) != target):
                return False
        return self._injective(st.target.tensor, target, [lp for lp in loops if lp.var in written])

    def _injective(self, tensor: str, dims: tuple[Dim, ...], loops: list[OpenLoop]) -> bool:
        """Distinct iterations write distinct elements: sorted by stride, each stride exceeds the span of all
        smaller ones (the mixed-radix condition)."""
        item = 4
        axes = []
        for lp in loops:
            stride = abs(sum(d.coeffs.get(lp.var, 0) * st // item for d, st in zip(dims, self.strides[tensor])))
            if lp.stop - lp.start > 1:
                axes.append((stride, lp.stop - lp.start))
        return _mixed_radix(axes)

    def _pair(self, a: s.Assign, la: tuple[OpenLoop, ...], b: s.Assign, lb: tuple[OpenLoop, ...],
              env: Mapping[str, int]) -> bool:
        common = [x for x, y in zip(la, lb) if x.node == y.node]
        if not common:
            return True
        for acc_a, write_a in _touches(a):
            for acc_b, write_b in _touches(b):
                if acc_a.tensor == acc_b.tensor and (write_a or write_b):
                    if not self._pinned(acc_a, acc_b, common, env):
                        return False
        return True

    def _pinned(self, acc_a: s.Access, acc_b: s.Access, common: list[OpenLoop], env: Mapping[str, int]) -> bool:
        """Every common loop is pinned by a dimension both accesses index identically with common loops only, no two
        iterations of them giving one index (`2*y + a` with a in 0..2 pins y and a: a transposed conv's store)."""
        da, db = self.affines.of(acc_a, env), self.affines.of(acc_b, env)
        extents = {lp.var: lp.stop - lp.start for lp in common}
        pinned: set[str] = set()
        for x, y in zip(da, db):
            if x == y and not x.quasi and x.coeffs and set(x.coeffs) <= set(extents):
                if _mixed_radix([(abs(c), extents[v]) for v, c in x.coeffs.items()]):
                    pinned.update(x.coeffs)
        return all(lp.var in pinned for lp in common if lp.stop - lp.start > 1)

    def taps(self, st: s.Assign, loops: tuple[OpenLoop, ...], env: Mapping[str, int]) -> tuple[OpenLoop, ...]:
        """Reduction loops to run in Python: those sharing an index with another open variable (r in y + r)."""
        written = set(self.affines.vars_of(st.target, env))
        open_vars = {lp.var for lp in loops}
        shared: set[str] = set()
        for acc in reads(st.value):
            for d in self.affines.of(acc, env):
                vs = [v for v in d.vars() if v in open_vars]
                if len(vs) > 1:
                    shared.update(v for v in vs if v not in written)
        taps = tuple(lp for lp in loops if lp.var in shared)
        count = 1
        for lp in taps:
            count *= max(0, lp.stop - lp.start)
        return taps if count <= MAX_TAPS else ()


def _mixed_radix(axes: list[tuple[int, int]]) -> bool:
    """Distinct points of the (stride, extent) axes have distinct sums: sorted by stride, each stride exceeds the
    span of all smaller ones."""
    reach = 0
    for stride, extent in sorted(axes):
        if extent > 1 and stride <= reach:
            return False
        reach += stride * (extent - 1)
    return True


def _touches(st: s.Assign) -> list[tuple[s.Access, bool]]:
    return [(st.target, True)] + [(acc, False) for acc in reads(st.value)]
