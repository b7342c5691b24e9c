"""An element-wise expression affine in its one tile with per-partition coefficients, as `x * A + B`.

Batch norm at inference, `(X[n, c, y, x] - mean[c]) * rsqrt(var[c] + eps) * g[c] + b[c]`, is three operators on the
tile: two VectorE/ScalarE passes (a tensor_scalar takes two operators). Written as `X * A + B` with
`A = rsqrt(var + eps) * g` and `B = b - mean * A`, columns computed once outside the tile loops, it is one
tensor_scalar a tile, and with a 16-bit tile in and out that pass runs in VectorE's 16-bit performance mode (ARCH3,
perf/costs.py). The reassociation changes fp32 rounding: only used where the result is stored in a 16-bit dtype,
whose own rounding (2^-8 relative) is far above fp32's (2^-24) on each coefficient (torch folds batch norm the same
way for inference)."""
from __future__ import annotations

from typing import Callable

from tilec.compiler.exprs import const_value, fmt_expr
from tilec.lang import syntax as sx

Linear = tuple[sx.Expr | None, sx.Expr | None]  # (A, B) of A * x + B; None is zero
_ONE = sx.Num(1.0)


def folded(e: sx.Expr, is_column: Callable[[sx.Expr], bool]) -> sx.Expr | None:
    """`x * A + B` when e is affine in one tile read x with column-only A and B, and e applies more than two
    operators to x (two join into one tensor_scalar already); else None."""
    tile: list[sx.Access] = []
    form = _linear(e, is_column, tile)
    if form is None or not tile or _depth(e, is_column) <= 2:
        return None
    a, b = form
    scaled = tile[0] if a is None or const_value(a) == 1.0 else sx.BinOp("*", tile[0], a, e.span)
    return scaled if b is None else sx.BinOp("+", scaled, b, e.span)


def _linear(e: sx.Expr, is_column: Callable[[sx.Expr], bool], tile: list[sx.Access]) -> Linear | None:
    if const_value(e) is not None or is_column(e):
        return None, e
    if isinstance(e, sx.Access):
        if tile and fmt_expr(tile[0]) != fmt_expr(e):
            return None  # two tiles: not one tensor_scalar
        tile[:] = [e]
        return _ONE, None
    if _widened(e):
        return _linear(e.args[0], is_column, tile)  # type: ignore[union-attr]
    if isinstance(e, sx.Neg):
        inner = _linear(e.x, is_column, tile)
        return None if inner is None else (_neg(inner[0]), _neg(inner[1]))
    if not isinstance(e, sx.BinOp) or e.op not in "+-*/":
        return None  # a function of the tile
    lhs, rhs = _linear(e.lhs, is_column, tile), _linear(e.rhs, is_column, tile)
    if lhs is None or rhs is None:
        return None
    if e.op in "+-":
        sub = e.op == "-"
        return _add(lhs[0], _neg(rhs[0]) if sub else rhs[0]), _add(lhs[1], _neg(rhs[1]) if sub else rhs[1])
    if e.op == "*" and (lhs[0] is None or rhs[0] is None):
        (_, c), (a, b) = (lhs, rhs) if lhs[0] is None else (rhs, lhs)  # c: the factor without the tile
        return _mul(a, c), _mul(b, c)
    if e.op == "/" and rhs[0] is None and rhs[1] is not None:
        return _div(lhs[0], rhs[1]), _div(lhs[1], rhs[1])
    return None  # the tile times itself, or divided by an expression of it


def _depth(e: sx.Expr, is_column: Callable[[sx.Expr], bool]) -> int:
    """Operators between the root and the tile read."""
    if _widened(e):
        return _depth(e.args[0], is_column)  # type: ignore[union-attr]
    if isinstance(e, sx.Neg):
        return 1 + _depth(e.x, is_column)
    if isinstance(e, sx.BinOp):
        inner = [_depth(x, is_column) for x in (e.lhs, e.rhs) if not is_column(x) and const_value(x) is None]
        return 1 + max(inner, default=-1)
    return 0


def _widened(e: sx.Expr) -> bool:
    """`f32(x)`: x itself to the engines, which compute in fp32."""
    return isinstance(e, sx.Call) and e.fn == "f32" and len(e.args) == 1


def _add(x: sx.Expr | None, y: sx.Expr | None) -> sx.Expr | None:
    if x is None or y is None:
        return y if x is None else x
    if isinstance(y, sx.Neg):
        return sx.BinOp("-", x, y.x)
    return sx.BinOp("+", x, y)


def _neg(x: sx.Expr | None) -> sx.Expr | None:
    if x is None:
        return None
    return x.x if isinstance(x, sx.Neg) else sx.Neg(x)


def _mul(x: sx.Expr | None, c: sx.Expr | None) -> sx.Expr | None:
    if x is None or c is None:
        return None
    if const_value(x) == 1.0:
        return c
    return sx.BinOp("*", x, c)


def _div(x: sx.Expr | None, c: sx.Expr) -> sx.Expr | None:
    return None if x is None else sx.BinOp("/", x, c)
