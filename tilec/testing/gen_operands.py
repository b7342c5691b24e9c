"""The fuzzer's contractions of expressions and reductions with gaps (lead21), as users first write them:

    for i in 0..M, j in 0..N:                        # "operands": a matmul whose factors are expressions
      Y[i, j] = 0                                    # (or a bias b[j])
      for k in 0..K:
        Y[i, j] += exp(A[i, k] - m[i]) / z[i] * (B[k, j] + 1) * 0.5

    for c in 0..C:                                   # "gapped": a reduction whose reduced dimensions are not
      s[c] = 0                                       # one run (batch norm's statistics over N, H, W)
      for n in 0..N, h in 0..H:
        s[c] += X[n, c, h] / (N * H)

The formulas compute in float64 from the rounded inputs; operand_split.py and gap_split.py rewrite these before
lowering (the compiler may also refuse a form with a location).
"""
from __future__ import annotations

import random

import numpy as np

from tilec.testing.gen import DTYPES, Builder, Case, Names, size

# the left factor: text of (A, i, k, row vectors m, z), its NumPy value from (A, m, z)
LEFT = {
    "plain": (lambda a, i, k, m, z: f"{a}[{i}, {k}]", lambda x, m, z: x),
    "relu": (lambda a, i, k, m, z: f"relu({a}[{i}, {k}])", lambda x, m, z: np.maximum(x, 0)),
    "exp": (lambda a, i, k, m, z: f"exp({a}[{i}, {k}] - {m}[{i}])", lambda x, m, z: np.exp(x - m[:, None])),
    "softmax": (lambda a, i, k, m, z: f"exp({a}[{i}, {k}] - {m}[{i}]) / ({z}[{i}] * {z}[{i}] + 1)",
                lambda x, m, z: np.exp(x - m[:, None]) / (z * z + 1)[:, None]),
    "scaled": (lambda a, i, k, m, z: f"{a}[{i}, {k}] * {m}[{i}]", lambda x, m, z: x * m[:, None]),
    "tanh": (lambda a, i, k, m, z: f"tanh({a}[{i}, {k}])", lambda x, m, z: np.tanh(x)),
}
# the right factor: text of (B, k, j, column vector h), its NumPy value from (B, h)
RIGHT = {
    "plain": (lambda b, k, j, h: f"{b}[{k}, {j}]", lambda y, h: y),
    "shifted": (lambda b, k, j, h: f"({b}[{k}, {j}] + 1)", lambda y, h: y + 1),
    "sigmoid": (lambda b, k, j, h: f"sigmoid({b}[{k}, {j}])", lambda y, h: 1 / (1 + np.exp(-y))),
    "scaled": (lambda b, k, j, h: f"{b}[{k}, {j}] * {h}[{j}]", lambda y, h: y * h[None, :]),
}


def operands(rng: random.Random, nm: Names) -> Case:
    m, kk, n = size(rng, 300), size(rng, 300), size(rng, 300)
    sm, sk, sn = nm("M"), nm("K"), nm("N")
    b = Builder(nm("k"))
    b.defaults = [(sm, m), (sk, kk), (sn, n)]
    dt = rng.choice(DTYPES)
    a, bb, mv, zv, hv, y = nm("A"), nm("B"), nm("m"), nm("z"), nm("h"), nm("Y")
    left, right = rng.choice(sorted(LEFT)), rng.choice(sorted(RIGHT))
    if left == right == "plain":
        left = "exp"
    for name, dims in ((a, [sm, sk]), (bb, [sk, sn]), (mv, [sm]), (zv, [sm]), (hv, [sn])):
        b.param(name, dt, dims)
    bias = rng.random() < 0.3
    nm_bias = nm("b")
    if bias:
        b.param(nm_bias, dt, [sn])
    b.decl(y, dt, [sm, sn], out=True)
    c = rng.choice([1.0, 0.5, -2.0])
    i, j, k = nm("i"), nm("j"), nm("k")
    term = f"{LEFT[left][0](a, i, k, mv, zv)} * {RIGHT[right][0](bb, k, j, hv)}" + ("" if c == 1.0 else f" * {c}")
    start = f"{nm_bias}[{j}]" if bias else "0"
    b.body.append(f"  for {i} in 0..{sm}, {j} in 0..{sn}:")
    b.body += [f"    {y}[{i}, {j}] = {start}", f"    for {k} in 0..{sk}:", f"      {y}[{i}, {j}] += {term}"]

    def formula(env: dict) -> dict:
        lhs = LEFT[left][1](env[a], env[mv], env[zv])
        rhs = RIGHT[right][1](env[bb], env[hv])
        out = lhs @ rhs * c
        return {y: out + (env[nm_bias][None, :] if bias else 0)}
    return Case("operands", b.text(), formula, forms=(f"{left}/{right}",))


def gapped(rng: random.Random, nm: Names) -> Case:
    rank = rng.choice([3, 3, 4])
    dims = [size(rng, 24) for _ in range(rank)]
    while np.prod(dims) > 30000:
        dims[rng.randrange(rank)] //= 2
        dims = [max(1, d) for d in dims]
    syms = [nm(s) for s in "NCHW"[:rank]]
    idx = [nm(v) for v in "nchw"[:rank]]
    kept = [1] if rank == 3 else rng.choice([[1], [1, 3], [0, 2]])
    reduced = [d for d in range(rank) if d not in kept]
    b = Builder(nm("g"))
    b.defaults = list(zip(syms, dims))
    dt = rng.choice(DTYPES)
    x, s = nm("X"), nm("s")
    b.param(x, dt, syms)
    b.decl(s, dt, [syms[d] for d in kept], out=True)
    op, start, npf = rng.choice([("+=", "0", np.sum), ("max=", "-inf", np.max), ("min=", "inf", np.min)])
    mean = op == "+=" and rng.random() < 0.5
    count = " * ".join(syms[d] for d in reduced)
    read = f"{x}[{', '.join(idx)}]" + (f" / ({count})" if mean else "")
    kept_idx = ", ".join(idx[d] for d in kept)
    b.body.append(f"  for {', '.join(f'{idx[d]} in 0..{syms[d]}' for d in kept)}:")
    b.body.append(f"    {s}[{kept_idx}] = {start}")
    b.body.append(f"    for {', '.join(f'{idx[d]} in 0..{syms[d]}' for d in reduced)}:")
    b.body.append(f"      {s}[{kept_idx}] {op} {read}")

    def formula(env: dict) -> dict:
        v = npf(env[x], axis=tuple(reduced))
        return {s: v / np.prod([dims[d] for d in reduced]) if mean else v}
    return Case("gapped", b.text(), formula, forms=(op.rstrip("="),))
