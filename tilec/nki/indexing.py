"""Affine index expressions: `nl.arange`, `nl.mgrid`, `nl.ds`, and the predicates built from them.

An `IndexExpr` is `const + sum(coef * i_axis)` where each `i_axis` ranges over `range(size)` along one axis of a
broadcast index space, e.g. `nl.arange(128)[:, None]` is i_0 over 128 on axis 0 of a 2-D space. Indexing a tensor
with such expressions stays an affine access pattern (offset + strides), exactly what the hardware supports;
non-affine forms (modulo, products of indices) are refused like NKI does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Term = tuple[int, int, int]  # (axis, size, coefficient)


@dataclass(frozen=True)
class IndexExpr:
    terms: tuple[Term, ...]
    const: int
    ndim: int

    @property
    def shape(self) -> tuple[int, ...]:
        shape = [1] * self.ndim
        for axis, size, _ in self.terms:
            shape[axis] = size
        return tuple(shape)

    def bounds(self) -> tuple[int, int]:
        lo = hi = self.const
        for _, size, coef in self.terms:
            ext = (size - 1) * coef
            lo, hi = lo + min(0, ext), hi + max(0, ext)
        return lo, hi

    def values(self) -> np.ndarray:
        out = np.full(self.shape, self.const, dtype=np.int64)
        for axis, size, coef in self.terms:
            shape = [1] * self.ndim
            shape[axis] = size
            out = out + coef * np.arange(size, dtype=np.int64).reshape(shape)
        return out

    # ---- affine arithmetic ----
    def _combine(self, other: object, sign: int) -> "IndexExpr":
        if isinstance(other, IndexExpr):
            ndim = max(self.ndim, other.ndim)
            terms = _shift(self.terms, ndim - self.ndim) + tuple(
                (a, s, sign * c) for a, s, c in _shift(other.terms, ndim - other.ndim))
            return IndexExpr(_merge(terms), self.const + sign * other.const, ndim)
        if isinstance(other, (int, np.integer)):
            return IndexExpr(self.terms, self.const + sign * int(other), self.ndim)
        return NotImplemented

    def __add__(self, other: object) -> "IndexExpr":
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other: object) -> "IndexExpr":
        return self._combine(other, -1)

    def __rsub__(self, other: object) -> "IndexExpr":
        return (-self)._combine(other, 1)

    def __neg__(self) -> "IndexExpr":
        return IndexExpr(tuple((a, s, -c) for a, s, c in self.terms), -self.const, self.ndim)

    def __mul__(self, other: object) -> "IndexExpr":
        if isinstance(other, (int, np.integer)):
            k = int(other)
            return IndexExpr(tuple((a, s, c * k) for a, s, c in self.terms), self.const * k, self.ndim)
        raise _non_affine("*")

    __rmul__ = __mul__

    def __floordiv__(self, other: object) -> "IndexExpr":
        raise _non_affine("//")

    def __mod__(self, other: object) -> "IndexExpr":
        raise _non_affine("%")

    def __getitem__(self, key: object) -> "IndexExpr":
        """`arange(n)[:, None]`: place the 1-D expression's axis among new broadcast axes."""
        key = key if isinstance(key, tuple) else (key,)
        if self.ndim != 1 or sum(k is not None for k in key) != 1:
            raise TypeError("index expressions support only [:, None]-style axis placement")
        axis = next(i for i, k in enumerate(key) if k is not None)
        return IndexExpr(tuple((axis, s, c) for _, s, c in self.terms), self.const, len(key))

    # ---- predicates (for masks and affine_select) ----
    def __lt__(self, other: object) -> "Predicate":
        return Predicate(self, "<", other)

    def __le__(self, other: object) -> "Predicate":
        return Predicate(self, "<=", other)

    def __gt__(self, other: object) -> "Predicate":
        return Predicate(self, ">", other)

    def __ge__(self, other: object) -> "Predicate":
        return Predicate(self, ">=", other)

    def __eq__(self, other: object) -> "Predicate":  # type: ignore[override]
        return Predicate(self, "==", other)

    def __ne__(self, other: object) -> "Predicate":  # type: ignore[override]
        return Predicate(self, "!=", other)

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise TypeError("control flow cannot depend on nl.arange/mgrid values "
                        "[err_control_flow_condition_depending_on_arange]")


def _shift(terms: tuple[Term, ...], by: int) -> tuple[Term, ...]:
    return tuple((a + by, s, c) for a, s, c in terms)


def _merge(terms: tuple[Term, ...]) -> tuple[Term, ...]:
    merged: dict[tuple[int, int], int] = {}
    for a, s, c in terms:
        merged[(a, s)] = merged.get((a, s), 0) + c
    return tuple((a, s, c) for (a, s), c in sorted(merged.items()) if c != 0 or s == 1)


def _non_affine(op: str) -> TypeError:
    return TypeError(f"index expression with '{op}' is not affine; NKI accepts only affine expressions of "
                     "nl.arange/mgrid [err_unsupported_expression_in_mask]")


_CMP = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
        "==": np.equal, "!=": np.not_equal}


@dataclass(frozen=True, eq=False)
class Predicate:
    """An affine comparison, evaluated per element (nisa.affine_select, mask=)."""

    lhs: object
    op: str
    rhs: object
    also: tuple["Predicate", ...] = ()

    def __and__(self, other: "Predicate") -> "Predicate":
        # a term on loop indices alone, `(2 * i + g) * 128 < seqlen`, is a Python bool in an unrolled loop: a
        # constant conjunct (AWS's fused RMSNorm-QKV sample masks its stores this way)
        return Predicate(self.lhs, self.op, self.rhs, self.also + (other,))

    __rand__ = __and__

    def __bool__(self) -> bool:
        raise TypeError("use '&' to combine NKI predicates, not 'and' [err_ambiguous_tensor_truth_value]")

    def evaluate(self) -> np.ndarray:
        vals = [v.values() if isinstance(v, IndexExpr) else np.asarray(v) for v in (self.lhs, self.rhs)]
        out = _CMP[self.op](vals[0], vals[1])
        for p in self.also:
            out = out & (p.evaluate() if isinstance(p, Predicate) else np.asarray(p, dtype=bool))
        return out


def arange(*args: int) -> IndexExpr:
    r = range(*args)
    return IndexExpr(((0, len(r), r.step),), r.start, 1)


class _MGrid:
    """`nl.mgrid[0:128, 0:512]` -> one IndexExpr per axis; unpack it or use `.p`, `.x`, `.y`, `.z`."""

    def __getitem__(self, key: object) -> "Grid":
        key = key if isinstance(key, tuple) else (key,)
        exprs = []
        for axis, sl in enumerate(key):
            r = range(sl.start or 0, sl.stop, sl.step or 1)
            exprs.append(IndexExpr(((axis, len(r), r.step),), r.start, len(key)))
        return Grid(tuple(exprs))


@dataclass(frozen=True)
class Grid:
    exprs: tuple[IndexExpr, ...]

    def __iter__(self):
        return iter(self.exprs)

    def __len__(self) -> int:
        return len(self.exprs)

    def __getitem__(self, i: int) -> IndexExpr:
        return self.exprs[i]

    p = property(lambda self: self.exprs[0])
    x = property(lambda self: self.exprs[1])
    y = property(lambda self: self.exprs[2])
    z = property(lambda self: self.exprs[3])


mgrid = _MGrid()


def ds(start: int, size: int) -> slice:
    """`nl.ds(start, size)` == `start:start+size`."""
    return slice(start, start + size)
