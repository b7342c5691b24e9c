"""Instruction selection by meaning: an expression tree that computes one of ScalarE's fused functions, written out,
becomes a call of that function (one activation instead of several VectorE and ScalarE passes).

    0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)))   -> gelu_tanh(x)   (nl.gelu_apprx_tanh)
    x * sigmoid(1.5957691216 * (x + 0.044715 * x * x * x))            -> gelu_tanh(x)   (the same function)
    log(1 + exp(y))                                                    -> softplus(y)    (nl.softplus)
    x * sigmoid(x) * z                                                 -> silu(x) * z    (nl.silu)

The functions' NumPy meanings are the table's rows (tilec/lang/functions.py); a match is the same function of the
same argument, so the rewrite changes only the rounding of intermediate steps (the engines' functions are
piecewise-polynomial approximations either way [SHARED "Supported Activation Functions"]). Constants must equal
the function's own to within COEF_REL (a few float32 ulps: `0.7978845608` for sqrt(2/pi) matches, `0.8` does not).
Where the written form leaves its own engine functions' documented ranges, the fused one is the better value:
`log(1 + exp(y))` for y > 44 puts log's argument above 2^64, outside the range where ScalarE's log is valid [nki-spec
§1.10.8], while softplus(y) is y there.
"""
from __future__ import annotations

import math

from tilec.compiler.exprs import const_value, fmt_expr, product_factors
from tilec.lang import syntax as sx
from tilec.lang.functions import GELU_K

COEF_REL = 2.0**-20  # relative difference allowed between a written constant and the function's (~8 f32 ulps)
GELU_C = 0.044715


def fused(e: sx.Expr) -> sx.Expr:
    """e with every subexpression that computes a fused function replaced by its call (outermost match first)."""
    found = _match(e)
    if found is not None:
        return fused(found)  # the match's argument may hold more (a softplus of a GELU)
    if isinstance(e, sx.Neg):
        return sx.Neg(fused(e.x), e.span)
    if isinstance(e, sx.BinOp):
        return sx.BinOp(e.op, fused(e.lhs), fused(e.rhs), e.span)
    if isinstance(e, sx.Call):
        return sx.Call(e.fn, tuple(fused(a) for a in e.args), e.span)
    return e


def _match(e: sx.Expr) -> sx.Expr | None:
    if isinstance(e, sx.Call) and e.fn == "log" and len(e.args) == 1:
        return _softplus(e)
    if isinstance(e, sx.BinOp) and e.op in "*/" or isinstance(e, sx.Neg):
        return _gelu(e) or _silu(e)
    return None


def _close(value: float, want: float) -> bool:
    return abs(value - want) <= COEF_REL * abs(want)


def _call(fn: str, x: sx.Expr, like: sx.Expr) -> sx.Call:
    return sx.Call(fn, (x,), like.span)


def _softplus(e: sx.Call) -> sx.Expr | None:
    """log(1 + exp(y)), log(exp(y) + 1) -> softplus(y)."""
    terms = _terms(e.args[0])
    if terms is None or len(terms) != 2:
        return None
    consts = [k for k, fs in terms if not fs]
    exps = [fs[0] for k, fs in terms if len(fs) == 1 and k == 1.0]
    if consts != [1.0] or len(exps) != 1 or not _is_call(exps[0], "exp"):
        return None
    assert isinstance(exps[0], sx.Call)
    return _call("softplus", exps[0].args[0], e)


def _gelu(e: sx.Expr) -> sx.Expr | None:
    """k x (c0 + c1 tanh(a x + b x^3)) with k c0 = k c1 = 1/2, a = sqrt(2/pi), b = 0.044715 a; or
    k x sigmoid(a x + b x^3) with k = 1 and twice those a, b -> gelu_tanh(x)."""
    factors, k = product_factors(e)
    if len(factors) != 2:
        return None
    for x, rest in (factors, factors[::-1]):
        if _is_call(rest, "sigmoid") and _close(k, 1.0) and _gelu_arg(rest, x, 2.0):
            return _call("gelu_tanh", x, e)
        terms = _terms(rest)
        if terms is None or len(terms) != 2:
            continue
        c0 = [c for c, fs in terms if not fs]
        tanh = [(c, fs[0]) for c, fs in terms if len(fs) == 1 and _is_call(fs[0], "tanh")]
        if len(c0) == 1 and len(tanh) == 1 and _close(k * c0[0], 0.5) and _close(k * tanh[0][0], 0.5) and \
                _gelu_arg(tanh[0][1], x, 1.0):
            return _call("gelu_tanh", x, e)
    return None


def _gelu_arg(call: sx.Expr, x: sx.Expr, times: float) -> bool:
    assert isinstance(call, sx.Call)
    p = _poly(call.args[0], fmt_expr(x))
    if p is None or set(p) != {1, 3}:
        return False
    return _close(p[1], times * GELU_K) and _close(p[3], times * GELU_K * GELU_C)


def _silu(e: sx.Expr) -> sx.Expr | None:
    """A product holding x and sigmoid(x) -> silu(x) times the other factors."""
    factors, k = product_factors(e)
    for i, f in enumerate(factors):
        if not _is_call(f, "sigmoid"):
            continue
        assert isinstance(f, sx.Call)
        inner = fmt_expr(f.args[0])
        j = next((j for j, g in enumerate(factors) if j != i and fmt_expr(g) == inner), None)
        if j is None:
            continue
        out: sx.Expr = _call("silu", f.args[0], e)
        for g in (g for n, g in enumerate(factors) if n not in (i, j)):
            out = sx.BinOp("*", out, g, e.span)
        return out if k == 1.0 else sx.BinOp("*", sx.Num(k, e.span), out, e.span)
    return None


def _is_call(e: sx.Expr, fn: str) -> bool:
    return isinstance(e, sx.Call) and e.fn == fn and len(e.args) == 1


def _terms(e: sx.Expr) -> list[tuple[float, list[sx.Expr]]] | None:
    """A sum as its terms, each (constant factor, other factors): `1 - 0.5 * t` -> [(1, []), (-0.5, [t])]."""
    if isinstance(e, sx.BinOp) and e.op in "+-":
        a, b = _terms(e.lhs), _terms(e.rhs)
        if a is None or b is None:
            return None
        return a + [(-c if e.op == "-" else c, fs) for c, fs in b]
    fs, k = product_factors(e)
    return [(k, fs)] if math.isfinite(k) else None


def _poly(e: sx.Expr, x: str) -> dict[int, float] | None:
    """e as a polynomial of degree <= 3 in the expression printed `x` ({power: coefficient}, zero terms dropped);
    None if it is not one."""
    if fmt_expr(e) == x:
        return {1: 1.0}
    c = const_value(e)
    if c is not None:
        return {0: c} if c else {}
    if isinstance(e, sx.Neg):
        p = _poly(e.x, x)
        return None if p is None else {n: -v for n, v in p.items()}
    if not isinstance(e, sx.BinOp):
        return None
    a, b = _poly(e.lhs, x), _poly(e.rhs, x)
    if a is None or b is None:
        return None
    if e.op in "+-":
        s = -1.0 if e.op == "-" else 1.0
        out = {n: a.get(n, 0.0) + s * b.get(n, 0.0) for n in {*a, *b}}
        return {n: v for n, v in out.items() if v}
    if e.op == "*":
        prod: dict[int, float] = {}
        for n, u in a.items():
            for m, v in b.items():
                prod[n + m] = prod.get(n + m, 0.0) + u * v
        return prod if max(prod, default=0) <= 3 else None
    if e.op == "/" and set(b) == {0}:
        return {n: v / b[0] for n, v in a.items()}
    return None
