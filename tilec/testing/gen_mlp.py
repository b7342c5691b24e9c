"""The fuzzer's two-layer MLPs (a transformer's feed-forward block, build_mlp.py keeps the hidden layer on chip):

    h[i, j] = b1[j] (or 0); h[i, j] += X[i, k] * W1[k, j]; h[i, j] = f(h[i, j]) (f: gelu, relu, tanh or none)
    Y[i, e] = b2[e] (or 0); Y[i, e] += h[i, j] * W2[j, e]; Y[i, e] = g(Y[i, e]) (g: relu, tanh or none)

with random sizes (M from 1, D and H multiples of 128 or not, E past a PSUM bank now and then) and dtypes (h's may
differ from X's: then the MLP is built op by op), and an independent NumPy formula that rounds h where the program
stores it.
"""
from __future__ import annotations

import math
import random

import numpy as np

from tilec.testing.gen import DTYPES, Builder, Case, Names, rounded, size

FUNCS = {"gelu": np.vectorize(lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))), otypes=[np.float64]),
         "relu": lambda x: np.maximum(x, 0.0), "tanh": np.tanh}


def mlp(rng: random.Random, nm: Names) -> Case:
    m = size(rng, 300)
    d = rng.choice([128, 256, 128, 96, 200])  # a multiple of 128 mostly (the on-chip builder's condition)
    hid = rng.choice([128, 256, 640, 128, 130])
    e = rng.choice([size(rng, 200), 600])
    syms = {v: nm(v) for v in ("M", "D", "H", "E")}
    b = Builder(nm("mlp"))
    b.defaults = [(syms["M"], m), (syms["D"], d), (syms["H"], hid), (syms["E"], e)]
    dt, h_dt = rng.choice(DTYPES), rng.choice(DTYPES)
    h_dt = dt if rng.random() < 0.7 else h_dt
    x, w1, w2, h, y = nm("X"), nm("W1"), nm("W2"), nm("h"), nm("Y")
    b.param(x, dt, [syms["M"], syms["D"]])
    b.param(w1, dt, [syms["D"], syms["H"]])
    bias = rng.random() < 0.6
    b1, b2 = (nm("b1"), nm("b2")) if bias else ("", "")
    if bias:
        b.param(b1, dt, [syms["H"]])
    b.param(w2, h_dt, [syms["H"], syms["E"]])
    if bias:
        b.param(b2, h_dt, [syms["E"]])
    func = rng.choice(["gelu", "relu", "tanh", ""])
    b.decl(h, h_dt, [syms["M"], syms["H"]])
    y_dt, y_func = rng.choice(DTYPES), rng.choice(["", "", "relu", "tanh"])  # Y's own function: on its eviction
    b.decl(y, y_dt, [syms["M"], syms["E"]], out=True)
    i, j, k, n = nm("i"), nm("j"), nm("k"), nm("n")
    b.loops([(i, syms["M"]), (j, syms["H"])], [f"{h}[{i}, {j}] = {f'{b1}[{j}]' if bias else '0'}",
                                               f"for {k} in 0..{syms['D']}:",
                                               f"  {h}[{i}, {j}] += {x}[{i}, {k}] * {w1}[{k}, {j}]"])
    if func:
        b.loops([(i, syms["M"]), (j, syms["H"])], [f"{h}[{i}, {j}] = {func}({h}[{i}, {j}])"])
    b.loops([(i, syms["M"]), (n, syms["E"])], [f"{y}[{i}, {n}] = {f'{b2}[{n}]' if bias else '0'}",
                                               f"for {j} in 0..{syms['H']}:",
                                               f"  {y}[{i}, {n}] += {h}[{i}, {j}] * {w2}[{j}, {n}]"])
    if y_func:
        b.loops([(i, syms["M"]), (n, syms["E"])], [f"{y}[{i}, {n}] = {y_func}({y}[{i}, {n}])"])

    def formula(env: dict) -> dict:
        hv = rounded(env[x] @ env[w1] + (env[b1][None, :] if bias else 0.0), h_dt)
        if func:
            hv = rounded(FUNCS[func](hv), h_dt)
        yv = hv @ env[w2] + (env[b2][None, :] if bias else 0.0)
        return {y: FUNCS[y_func](rounded(yv, y_dt)) if y_func else yv}
    return Case("mlp", b.text(), formula)
