"""The fuzzer's loop nests of several statements (lead20): statistics of one row computed together, in one loop, as
the NumPy loop a user ports reads,

    for i in 0..M:
      s1[i] = 0                       # each statistic's start
      s2[i] = -inf
      for j in 0..N:
        s1[i] += A[i, j] * A[i, j]    # a sum, a sum of squares or of products, a mean, a max or a min
        s2[i] max= A[i, j]
        Z[i, j] = A[i, j] - s1[i]     # now and then: a read of a running statistic (its value after element j)
      for j in 0..N:                  # now and then: a use of the finished statistics in the same row loop
        Y[i, j] = A[i, j] * c - s1[i] + s2[i]

The formula computes what the statements mean in order: a statement in the accumulating loop sees the running value
(np.cumsum / np.maximum.accumulate), one after it the finished one. The compiler may refuse the running read (with a
location): before lead20 it compiled the finished value instead, a wrong answer nothing generated.
"""
from __future__ import annotations

import random

import numpy as np

from tilec.testing.gen import DTYPES, Builder, Case, Names, rounded, size

# kind -> (update operator, start, term as text of A, B, i, j, n; its NumPy value per element; the running form)
STATS = {
    "sum": ("+=", "0", lambda a, b, i, j, n: f"{a}[{i}, {j}]", lambda x, y, n: x, np.cumsum),
    "squares": ("+=", "0", lambda a, b, i, j, n: f"{a}[{i}, {j}] * {a}[{i}, {j}]", lambda x, y, n: x * x, np.cumsum),
    "products": ("+=", "0", lambda a, b, i, j, n: f"{a}[{i}, {j}] * {b}[{i}, {j}]", lambda x, y, n: x * y,
                 np.cumsum),
    "mean": ("+=", "0", lambda a, b, i, j, n: f"{a}[{i}, {j}] / {n}", lambda x, y, n: x / n, np.cumsum),
    "max": ("max=", "-inf", lambda a, b, i, j, n: f"{a}[{i}, {j}]", lambda x, y, n: x, np.maximum.accumulate),
    "min": ("min=", "inf", lambda a, b, i, j, n: f"{b}[{i}, {j}]", lambda x, y, n: y, np.minimum.accumulate),
}


def nest(rng: random.Random, nm: Names) -> Case:
    m, n = size(rng, 300), size(rng, 400)
    sm, sn = nm("M"), nm("N")
    b = Builder(nm("k"))
    running = rng.random() < 0.2  # a statement reading a running statistic (f32 only: the running value's dtype)
    if running:  # the reference evaluator runs such a loop element by element in Python (130 x 246: 112 s)
        m, n = min(m, 32), min(n, 32)
    b.defaults = [(sm, m), (sn, n)]
    dt = "f32" if running else rng.choice(DTYPES)
    a, bb = nm("A"), nm("B")
    b.param(a, dt, [sm, sn])
    b.param(bb, dt, [sm, sn])
    kinds = rng.sample(sorted(STATS), rng.choice([2, 2, 3]))
    names = [nm("s") for _ in kinds]
    after = rng.random() < 0.6 or not running
    outs = [rng.random() < 0.5 for _ in kinds]
    if not after and not running:
        outs[0] = True
    i, j = nm("i"), nm("j")
    for s, out in zip(names, outs):
        b.decl(s, dt, [sm], out=out)
    z = y = ""
    if running:
        z = nm("Z")
        b.decl(z, dt, [sm, sn], out=True)
    c = rng.choice([0.5, 2.0, -1.0, 3.0])
    if after:
        y = nm("Y")
        b.decl(y, dt, [sm, sn], out=True)
    b.body.append(f"  for {i} in 0..{sm}:")
    b.body += [f"    {s}[{i}] = {STATS[k][1]}" for s, k in zip(names, kinds)]
    b.body.append(f"    for {j} in 0..{sn}:")
    b.body += [f"      {s}[{i}] {STATS[k][0]} {STATS[k][2](a, bb, i, j, n)}" for s, k in zip(names, kinds)]
    if running:
        b.body.append(f"      {z}[{i}, {j}] = {a}[{i}, {j}] - {names[0]}[{i}]")
    if after:
        b.body.append(f"    for {j} in 0..{sn}:")
        b.body.append(f"      {y}[{i}, {j}] = {a}[{i}, {j}] * {c} - {names[0]}[{i}] + {names[1]}[{i}]")

    def formula(env: dict) -> dict:
        x, w = env[a], env[bb]
        out: dict = {}
        final = {}
        for s, k in zip(names, kinds):
            terms = STATS[k][3](x, w, n)
            acc = STATS[k][4](terms, axis=1)
            final[s] = acc[:, -1]
            if running and s == names[0]:
                out[z] = x - acc
        for s, o in zip(names, outs):
            if o:
                out[s] = final[s]
        if after:
            out[y] = x * c - rounded(final[names[0]], dt)[:, None] + rounded(final[names[1]], dt)[:, None]
        return out
    return Case("nest", b.text(), formula, forms=("running",) if running else ())
