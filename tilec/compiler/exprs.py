"""Small helpers over .tl expressions: a printer and pattern tests used by operation selection."""
from __future__ import annotations

import numpy as np

from typing import Mapping

from tilec.lang import syntax as sx

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "%": 2}


def fmt_expr(e: sx.Expr, prec: int = 0) -> str:
    if isinstance(e, sx.Num):
        v = e.value
        if isinstance(v, float) and v == float("-inf"):
            return "-inf"
        return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
    if isinstance(e, sx.Name):
        return e.id
    if isinstance(e, sx.Neg):
        return f"-{fmt_expr(e.x, 3)}"
    if isinstance(e, sx.BinOp):
        p = _PREC[e.op]
        text = f"{fmt_expr(e.lhs, p)} {e.op} {fmt_expr(e.rhs, p + 1)}"
        return f"({text})" if p < prec else text
    if isinstance(e, sx.Call):
        return f"{e.fn}({', '.join(fmt_expr(a) for a in e.args)})"
    if isinstance(e, sx.Access):
        return f"{e.tensor}[{', '.join(fmt_expr(a) for a in e.indices)}]"
    return repr(e)


def const_value(e: sx.Expr, sizes: Mapping[str, int] | None = None) -> float | None:
    """The value of a constant expression (`-inf`, `0.25`, `-1`; with `sizes`, also `1 / N`), else None."""
    if isinstance(e, sx.Num):
        return float(e.value)
    if isinstance(e, sx.Name) and sizes and e.id in sizes:
        return float(sizes[e.id])
    if isinstance(e, sx.Neg):
        v = const_value(e.x, sizes)
        return None if v is None else -v
    if isinstance(e, sx.BinOp):
        a, b = const_value(e.lhs, sizes), const_value(e.rhs, sizes)
        if a is None or b is None:
            return None
        x, y = np.float32(a), np.float32(b)  # folded as the program computes it: float32 arithmetic
        if e.op == "/":
            return float(x / y) if b else None
        return {"+": float(x + y), "-": float(x - y), "*": float(x * y)}.get(e.op)
    return None


def accesses(e: sx.Expr) -> list[sx.Access]:
    if isinstance(e, sx.Access):
        return [e]
    if isinstance(e, sx.Neg):
        return accesses(e.x)
    if isinstance(e, sx.BinOp):
        return accesses(e.lhs) + accesses(e.rhs)
    if isinstance(e, sx.Call):
        return [a for arg in e.args for a in accesses(arg)]
    return []


def strip_scale(e: sx.Expr, sizes: Mapping[str, int] | None = None) -> tuple[sx.Expr, float]:
    """`X[..] / 4` -> (X[..], 0.25); `0.25 * X[..]` -> (X[..], 0.25); anything else -> (e, 1.0). With `sizes`, a
    size counts as a constant (`X[..] / N`)."""
    if isinstance(e, sx.BinOp) and e.op in "*/":
        rc = const_value(e.rhs, sizes)
        if rc is not None and rc != 0:
            inner, s = strip_scale(e.lhs, sizes)
            return inner, s * (rc if e.op == "*" else 1.0 / rc)
        lc = const_value(e.lhs, sizes)
        if lc is not None and e.op == "*":
            inner, s = strip_scale(e.rhs, sizes)
            return inner, s * lc
    return e, 1.0


def strip_relu(e: sx.Expr) -> tuple[sx.Expr, bool]:
    """`relu(x)` or `max(x, 0)` -> (x, True)."""
    if isinstance(e, sx.Call) and e.fn == "relu" and len(e.args) == 1:
        return e.args[0], True
    if isinstance(e, sx.Call) and e.fn == "max" and len(e.args) == 2:
        for a, b in (e.args, e.args[::-1]):
            if const_value(b) == 0.0:
                return a, True
    return e, False


def product_factors(e: sx.Expr) -> tuple[list[sx.Expr], float]:
    """A product as its factors that are not constants and the product of those that are: `-(0.5 * A[..] * B[..])`
    -> ([A[..], B[..]], -0.5); `A[..] * B[..] / 4` -> ([A[..], B[..]], 0.25); negations anywhere in the product count
    as -1. Anything else is one factor: `A[..] + B[..]` -> ([A[..] + B[..]], 1.0)."""
    c = const_value(e)
    if c is not None:
        return [], c
    if isinstance(e, sx.Neg):
        fs, k = product_factors(e.x)
        return fs, -k
    if isinstance(e, sx.BinOp) and e.op == "*":
        (fa, ka), (fb, kb) = product_factors(e.lhs), product_factors(e.rhs)
        return fa + fb, ka * kb
    divisor = const_value(e.rhs) if isinstance(e, sx.BinOp) and e.op == "/" else None
    if isinstance(e, sx.BinOp) and divisor:
        fs, k = product_factors(e.lhs)
        return fs, k / divisor
    return [e], 1.0
