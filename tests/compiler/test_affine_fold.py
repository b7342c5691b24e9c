"""affine_fold.folded: an element-wise expression affine in its one tile with per-partition (column) coefficients
becomes `x * A + B`, A and B column expressions. Each form is evaluated in NumPy (float64) before and after on random
data: the same values."""
from __future__ import annotations

import numpy as np
import pytest

from tilec.compiler.affine_fold import folded
from tilec.compiler.exprs import accesses, fmt_expr
from tilec.lang import syntax as sx

COLUMNS = {"m", "v", "g", "b", "s"}


def read(name: str) -> sx.Access:
    return sx.Access(name, ())


def op(o: str, a: sx.Expr, b: sx.Expr) -> sx.BinOp:
    return sx.BinOp(o, a, b)


def num(v: float) -> sx.Num:
    return sx.Num(v)


X, M, V, G, B, S = (read(n) for n in ("X", "m", "v", "g", "b", "s"))
RSTD = sx.Call("rsqrt", (op("+", V, num(1e-5)),))


def is_column(e: sx.Expr) -> bool:
    reads = [a.tensor for a in accesses(e)]
    return bool(reads) and all(r in COLUMNS for r in reads)


def evaluate(e: sx.Expr, env: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(e, sx.Num):
        return np.float64(e.value)
    if isinstance(e, sx.Access):
        return env[e.tensor]
    if isinstance(e, sx.Neg):
        return -evaluate(e.x, env)
    if isinstance(e, sx.Call):
        args = [evaluate(a, env) for a in e.args]
        return {"rsqrt": lambda x: 1 / np.sqrt(x), "f32": lambda x: x, "exp": np.exp}[e.fn](*args)
    assert isinstance(e, sx.BinOp)
    a, b = evaluate(e.lhs, env), evaluate(e.rhs, env)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[e.op]


def env() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    out = {n: rng.standard_normal((6, 1)) for n in COLUMNS}
    out["v"] = np.abs(out["v"]) + 0.5
    out["s"] = np.abs(out["s"]) + 0.5
    out["X"] = rng.standard_normal((6, 9))
    return out


FOLDED = {
    "batch norm": op("+", op("*", op("*", op("-", X, M), RSTD), G), B),
    "widened tile": op("+", op("*", op("*", op("-", sx.Call("f32", (X,)), M), RSTD), G), B),
    "divided": op("-", op("/", op("+", X, B), S), op("*", num(2.0), M)),
    "negated": op("*", sx.Neg(op("-", M, X)), op("+", G, num(1.0))),
    "column first": op("+", B, op("*", G, op("*", S, op("-", X, M)))),
}


@pytest.mark.parametrize("name", sorted(FOLDED))
def test_a_folded_form_is_one_multiply_add_with_the_same_values(name: str) -> None:
    e = FOLDED[name]
    f = folded(e, is_column)
    assert f is not None
    assert isinstance(f, sx.BinOp) and f.op == "+" and isinstance(f.lhs, sx.BinOp) and f.lhs.op == "*"
    assert f.lhs.lhs == X and is_column(f.lhs.rhs) and is_column(f.rhs), fmt_expr(f)
    data = env()
    np.testing.assert_allclose(evaluate(f, data), evaluate(e, data), rtol=1e-12, atol=1e-12)


KEPT = {
    "two operators (one tensor_scalar already)": op("*", op("-", X, M), S),
    "the tile squared": op("+", op("*", op("-", X, M), op("-", X, M)), B),
    "a function of the tile": op("+", op("*", sx.Call("exp", (op("-", X, M),)), G), B),
    "divided by the tile": op("+", op("/", G, op("-", X, M)), op("*", B, S)),
    "two tiles": op("+", op("*", op("-", X, M), G), op("*", read("Z"), S)),
}


@pytest.mark.parametrize("name", sorted(KEPT))
def test_what_is_not_one_affine_pass_more_is_left_as_written(name: str) -> None:
    assert folded(KEPT[name], is_column) is None
