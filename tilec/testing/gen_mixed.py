"""The fuzzer's programs that mix dtypes in one statement and reduce scaled values (lead22), as users write them:

    s[i] += exp(X[i, j] - mx[i])             # "mixed": a bf16 X beside f32 statistics (lang/widen.py), no f32(..)
    Y[i, j] = A[i, j] * 0.5 + b[j]           #   an f16 A, an f32 b
    C[i, j] += A[i, k] * B[k, j]             #   bf16 weights, f32 activations (operand_split's exact copy)
    m[i] max= X[i, j] / 0.7                  # "scaled": an extremum of scaled values (select_reduce)
    y[b, d] += X[b, s, d] * m[b, s] / q[b]   # "vecmat": masked mean pooling (matvec_split's vector expression)
    Y[i, j] += A[i, k] * B[k, j] - C[i, k] * D[k, j]   # "summed": a contraction of a sum of products (sum_split)

The formulas compute in float64 from the rounded inputs (widening is exact, so the program means exactly this).
"""
from __future__ import annotations

import random

import numpy as np

from tilec.testing.gen import DTYPES, Builder, Case, Names, size

NARROW = ("f16", "bf16")


def mixed(rng: random.Random, nm: Names) -> Case:
    return rng.choice([_softmax, _bias, _matmul])(rng, nm)


def _softmax(rng: random.Random, nm: Names) -> Case:
    """A softmax of a 16-bit X with f32 statistics, the exponent scaled by a temperature now and then."""
    m, n = size(rng, 300), size(rng, 400)
    sm, sn = nm("M"), nm("N")
    b = Builder(nm("sm"))
    b.defaults = [(sm, m), (sn, n)]
    x, mx, s, y = nm("X"), nm("mx"), nm("s"), nm("Y")
    b.param(x, rng.choice(NARROW), [sm, sn])
    b.decl(mx, "f32", [sm])
    b.decl(s, "f32", [sm])
    b.decl(y, rng.choice(DTYPES), [sm, sn], out=True)
    t = rng.choice([1.0, 1.0, 0.5, 2.0])
    i, j = nm("i"), nm("j")
    xs = f"{x}[{i}, {j}]" + ("" if t == 1.0 else f" / {t}")
    b.loops([(i, sm)], [f"{mx}[{i}] = -inf", f"for {j} in 0..{sn}:", f"  {mx}[{i}] max= {xs}"])
    b.loops([(i, sm)], [f"{s}[{i}] = 0", f"for {j} in 0..{sn}:", f"  {s}[{i}] += exp({xs} - {mx}[{i}])"])
    b.loops([(i, sm), (j, sn)], [f"{y}[{i}, {j}] = exp({xs} - {mx}[{i}]) / {s}[{i}]"])

    def formula(env: dict) -> dict:
        v = env[x] / t
        e = np.exp(v - v.max(axis=1, keepdims=True))
        return {y: e / e.sum(axis=1, keepdims=True)}
    return Case("mixed", b.text(), formula, forms=("softmax",))


def _bias(rng: random.Random, nm: Names) -> Case:
    """`Y[i, j] = A[i, j] * c + b[j]` (or b[i]) with A and b of two dtypes."""
    m, n = size(rng, 300), size(rng, 600)
    sm, sn = nm("M"), nm("N")
    bld = Builder(nm("bias"))
    bld.defaults = [(sm, m), (sn, n)]
    a, bias, y = nm("A"), nm("b"), nm("Y")
    da, db = rng.sample(DTYPES, 2)
    per_col = rng.random() < 0.5
    bld.param(a, da, [sm, sn])
    bld.param(bias, db, [sn] if per_col else [sm])
    bld.decl(y, rng.choice(DTYPES), [sm, sn], out=True)
    c = rng.choice([0.5, -2.0, 3.0])
    i, j = nm("i"), nm("j")
    bld.loops([(i, sm), (j, sn)], [f"{y}[{i}, {j}] = {a}[{i}, {j}] * {c} + {bias}[{j if per_col else i}]"])

    def formula(env: dict) -> dict:
        return {y: env[a] * c + (env[bias][None, :] if per_col else env[bias][:, None])}
    return Case("mixed", bld.text(), formula, forms=("bias",))


def _matmul(rng: random.Random, nm: Names) -> Case:
    """`C[i, j] += A[i, k] * B[k, j]` with A and B of two dtypes, from 0 or a bias."""
    m, kk, n = size(rng, 260), size(rng, 260), size(rng, 300)
    sm, sk, sn = nm("M"), nm("K"), nm("N")
    b = Builder(nm("mm"))
    b.defaults = [(sm, m), (sk, kk), (sn, n)]
    a, bb, c = nm("A"), nm("B"), nm("C")
    da, db = rng.sample(DTYPES, 2)
    b.param(a, da, [sm, sk])
    b.param(bb, db, [sk, sn])
    b.decl(c, "f32", [sm, sn], out=True)
    i, j, k = nm("i"), nm("j"), nm("k")
    b.loops([(i, sm), (j, sn)], [f"{c}[{i}, {j}] = 0", f"for {k} in 0..{sk}:",
                                 f"  {c}[{i}, {j}] += {a}[{i}, {k}] * {bb}[{k}, {j}]"])
    return Case("mixed", b.text(), lambda env: {c: env[a] @ env[bb]}, forms=("matmul",))


def scaled(rng: random.Random, nm: Names) -> Case:
    """`m[i] max= X[i, j] * c` (or min=, or over columns), from ±inf or a tensor."""
    rows, cols = size(rng, 300), size(rng, 500)
    sm, sn = nm("M"), nm("N")
    b = Builder(nm("ext"))
    b.defaults = [(sm, rows), (sn, cols)]
    dt = rng.choice(DTYPES)
    x, out, init = nm("X"), nm("m"), nm("b")
    columns = rng.random() < 0.3
    op, start, npf = rng.choice([("max=", "-inf", np.max), ("min=", "inf", np.min)])
    seeded = rng.random() < 0.4
    b.param(x, dt, [sm, sn])
    kept_size, kept_axis = (sn, 0) if columns else (sm, 1)
    if seeded:
        b.param(init, dt, [kept_size])
    b.decl(out, dt, [kept_size], out=True)
    c = rng.choice([0.5, 2.0, -1.5, -0.25])
    scaled_read = rng.choice([f"{{x}} * {c}", f"{c} * {{x}}", f"{{x}} / {1 / c:g}"])
    i, j = nm("i"), nm("j")
    kept, red, red_size = (j, i, sm) if columns else (i, j, sn)
    read = scaled_read.format(x=f"{x}[{i}, {j}]")
    b.loops([(kept, kept_size)], [f"{out}[{kept}] = {init + f'[{kept}]' if seeded else start}",
                                  f"for {red} in 0..{red_size}:", f"  {out}[{kept}] {op} {read}"])
    factor = 1 / float(f"{1 / c:g}") if "/" in scaled_read else c

    def formula(env: dict) -> dict:
        v = npf(env[x] * factor, axis=kept_axis)
        return {out: (np.maximum if op == "max=" else np.minimum)(v, env[init]) if seeded else v}
    return Case("scaled", b.text(), formula, forms=(op.rstrip("="), "columns" if columns else "rows"))


def vecmat(rng: random.Random, nm: Names) -> Case:
    """A batched vector times a matrix, `y[b, d] += X[b, s, d] * m[b, s]`, divided by a per-batch count or not, or
    the matrix times a vector, `y[b, r] += A[b, r, s] * x[b, s]`."""
    bs, s_, d_ = size(rng, 6), size(rng, 200), size(rng, 200)
    sb, ss, sd = nm("B"), nm("S"), nm("D")
    bld = Builder(nm("vm"))
    bld.defaults = [(sb, bs), (ss, s_), (sd, d_)]
    dt = rng.choice(("f32",) + DTYPES)
    x, v, q, y = nm("X"), nm("m"), nm("q"), nm("y")
    bi, si, di = nm("b"), nm("s"), nm("d")
    transposed = rng.random() < 0.4  # the matrix indexed [b, d, s]: a matrix times a vector
    counted = dt == "f32" and rng.random() < 0.8  # (a computed vector is f32: beside an f32 matrix only)
    bld.param(x, dt, [sb, sd, ss] if transposed else [sb, ss, sd])
    bld.param(v, dt, [sb, ss])
    if counted:
        bld.param(q, dt, [sb])
    bld.decl(y, dt, [sb, sd], out=True)
    mat = f"{x}[{bi}, {di}, {si}]" if transposed else f"{x}[{bi}, {si}, {di}]"
    term = f"{mat} * {v}[{bi}, {si}]" + (f" / ({q}[{bi}] * {q}[{bi}] + 1)" if counted else "")
    bld.loops([(bi, sb), (di, sd)], [f"{y}[{bi}, {di}] = 0", f"for {si} in 0..{ss}:",
                                     f"  {y}[{bi}, {di}] += {term}"])

    def formula(env: dict) -> dict:
        out = np.einsum("bds,bs->bd" if transposed else "bsd,bs->bd", env[x], env[v])
        return {y: out / (env[q] * env[q] + 1)[:, None] if counted else out}
    return Case("vecmat", bld.text(), formula, forms=(("matvec" if transposed else "vecmat")
                                                      + ("/counted" if counted else ""),))


def summed(rng: random.Random, nm: Names) -> Case:
    """`Y[i, j] += A[i, k] * B[k, j] ± C[i, k] * D[k, j] * c` (sum_split.py), from 0 or a bias, in one dtype."""
    m, kk, n = size(rng, 260), size(rng, 260), size(rng, 300)
    sm, sk, sn = nm("M"), nm("K"), nm("N")
    b = Builder(nm("sp"))
    b.defaults = [(sm, m), (sk, kk), (sn, n)]
    dt = rng.choice(DTYPES)
    a, bb, cc, dd, bias, y = nm("A"), nm("B"), nm("C"), nm("D"), nm("b"), nm("Y")
    for name, dims in ((a, [sm, sk]), (bb, [sk, sn]), (cc, [sm, sk]), (dd, [sk, sn])):
        b.param(name, dt, dims)
    biased = rng.random() < 0.4
    if biased:
        b.param(bias, dt, [sn])
    b.decl(y, dt, [sm, sn], out=True)
    sign, c = rng.choice(["+", "-"]), rng.choice([1.0, 0.5, -2.0])
    i, j, k = nm("i"), nm("j"), nm("k")
    second = f"{cc}[{i}, {k}] * {dd}[{k}, {j}]" + ("" if c == 1.0 else f" * {c}")
    b.loops([(i, sm), (j, sn)], [f"{y}[{i}, {j}] = {bias + f'[{j}]' if biased else '0'}", f"for {k} in 0..{sk}:",
                                 f"  {y}[{i}, {j}] += {a}[{i}, {k}] * {bb}[{k}, {j}] {sign} {second}"])

    def formula(env: dict) -> dict:
        out = env[a] @ env[bb] + (1 if sign == "+" else -1) * c * (env[cc] @ env[dd])
        return {y: out + env[bias][None, :] if biased else out}
    return Case("summed", b.text(), formula, forms=(sign,))
