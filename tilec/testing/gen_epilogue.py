"""The fuzzer's epilogues: a contraction (a matmul, a matrix-vector product or a conv) into a declared
intermediate, then an element-wise statement of its own that reads it, as users write a bias, a scale, a clamp or
a residual add after a layer (`Y = min(max(conv + b[k], 0), 6)`). Issue 13 asks these to run on the PSUM eviction;
whether they do or go through HBM, the answer must match the formula here (float64, the intermediate rounded to its
dtype as the reference evaluator rounds it).
"""
from __future__ import annotations

import random

import numpy as np

from tilec.testing.gen import (DTYPES, RANGES, Builder, Case, Leaf, Names, Node, evaluate, gen_expr, render,
                               rounded, size)


def _leaves(rng: random.Random, nm: Names, b: Builder, t: str, syms: list[str], channel: int, dt: str) -> list:
    """The intermediate itself, and now and then a per-channel vector, a same-shape input (all of the intermediate's
    dtype) and a constant."""
    rank = len(syms)
    out = [Leaf(t, tuple(range(rank)))]
    if rng.random() < 0.7:
        v = nm("b")
        b.param(v, dt, [syms[channel]])
        out.append(Leaf(v, (channel,)))
    if rng.random() < 0.35:
        s = nm("S")
        b.param(s, dt, syms)
        out.append(Leaf(s, tuple(range(rank))))
    return out + [Leaf(None, const=rng.choice([0.5, 2, -1, 6, 0.25, 3]))]


def _consumer(rng: random.Random, leaves: list) -> object:
    """A bias/scale/clamp shape most of the time, an arbitrary expression over the leaves otherwise; the
    intermediate is always read."""
    t = leaves[0]
    vec = next((lf for lf in leaves[1:] if lf.tensor and len(lf.dims) == 1), None)
    pick = rng.choice(["bias_relu", "scale_shift", "clamp", "any", "any"])
    if pick == "bias_relu" and vec:
        return Node("relu", (Node("+", (t, vec)),))
    if pick == "scale_shift" and vec:
        return Node("+", (Node("*", (t, vec)), Leaf(None, const=0.5)))
    if pick == "clamp":
        return Node("min", (Node("max", (t, Leaf(None, const=0))), Leaf(None, const=6)))
    e = gen_expr(rng, leaves, rng.randint(1, 3))
    return e if t in _leaf_set(e) else Node("+", (t, e))


def _leaf_set(e) -> set:
    return {e} if isinstance(e, Leaf) else set().union(*(_leaf_set(a) for a in e.args))


def epilogue(rng: random.Random, nm: Names) -> Case:
    kind = rng.choice(["matmul", "matmul", "matvec", "conv", "conv"])
    b = Builder(nm("epi"))
    dt = rng.choice(DTYPES)
    t, t_dt, y = nm("T"), dt, nm("Y")  # one dtype per statement, as the checker asks
    if kind == "conv":
        syms, ext, produce, channel = _conv(rng, nm, b, t, dt)
    else:
        syms, ext, produce, channel = _matmul(rng, nm, b, t, dt, kind == "matvec")
    b.decl(t, t_dt, syms)
    b.decl(y, rng.choice(DTYPES), syms, out=True)
    leaves = _leaves(rng, nm, b, t, syms, channel, dt)
    expr = _consumer(rng, leaves)
    idx = [nm(c) for c in "pqrs"[:len(syms)]]
    RANGES.update(zip(idx, syms))
    b.loops(list(zip(idx, syms)), [f"{y}[{', '.join(idx)}] = {render(expr, idx)}"])

    def formula(env: dict) -> dict:
        inter = rounded(produce(env), t_dt)
        val = evaluate(expr, {**env, t: inter}, len(syms))
        return {y: np.broadcast_to(np.asarray(val, np.float64), tuple(ext))}
    return Case("epilogue", b.text(), formula, forms=(kind,))


def _matmul(rng: random.Random, nm: Names, b: Builder, t: str, dt: str, matvec: bool):
    m, k = size(rng, 300), size(rng, 300)
    n = 1 if matvec else size(rng, 520)
    while m * k * n > 3_000_000:
        m, k = max(1, m // 2), max(1, k // 2)
    sm, sk = nm("M"), nm("K")
    a, x = nm("A"), nm("B")
    b.param(a, dt, [sm, sk])
    i, r = nm("i"), nm("k")
    if matvec:  # a 1-D vector: y[i] = sum_k A[i, k] x[k]
        b.defaults = [(sm, m), (sk, k)]
        b.param(x, dt, [sk])
        b.loops([(i, sm)], [f"{t}[{i}] = 0", f"for {r} in 0..{sk}:", f"  {t}[{i}] += {a}[{i}, {r}] * {x}[{r}]"])
        return [sm], [m], lambda env: env[a] @ env[x], 0
    sn, j = nm("N"), nm("j")
    b.defaults = [(sm, m), (sk, k), (sn, n)]
    b.param(x, dt, [sk, sn])
    b.loops([(i, sm), (j, sn)], [f"{t}[{i}, {j}] = 0", f"for {r} in 0..{sk}:",
                                 f"  {t}[{i}, {j}] += {a}[{i}, {r}] * {x}[{r}, {j}]"])
    return [sm, sn], [m, n], lambda env: env[a] @ env[x], rng.choice([0, 1])


def _conv(rng: random.Random, nm: Names, b: Builder, t: str, dt: str):
    """Y[n, k, y, x] = sum_{c, r, s} X[n, c, y + r - pad, x + s - pad] W[k, c, r, s] (zero padded when pad > 0)."""
    batch, c, kk = rng.choice([1, 1, 2]), min(size(rng, 140), 140), min(size(rng, 140), 140)
    r = rng.choice([1, 3])
    pad = (r - 1) // 2 if rng.random() < 0.7 else 0
    h, w = rng.randint(r, 14), rng.randint(r, 20)
    ho, wo = h + 2 * pad - r + 1, w + 2 * pad - r + 1
    sn, sc, sk = nm("N"), nm("C"), nm("K")
    sh, sw = nm("H"), nm("W")
    b.defaults = [(sn, batch), (sc, c), (sk, kk), (sh, h), (sw, w)]
    x, wt = nm("X"), nm("Wt")
    b.param(x, dt, [sn, sc, sh, sw])
    b.param(wt, dt, [sk, sc, str(r), str(r)])
    oh = sh if pad else f"{sh} - {r - 1}"
    ow = sw if pad else f"{sw} - {r - 1}"
    n_, k_, y_, x_ = nm("n"), nm("k"), nm("y"), nm("x")
    c_, r_, s_ = nm("c"), nm("r"), nm("s")
    off = f" - {pad}" if pad else ""
    read = f"{x}[{n_}, {c_}, {y_} + {r_}{off}, {x_} + {s_}{off}]"
    read = f"({read} ?? 0)" if pad else read
    b.loops([(n_, sn), (k_, sk), (y_, oh), (x_, ow)], [
        f"{t}[{n_}, {k_}, {y_}, {x_}] = 0",
        f"for {c_} in 0..{sc}, {r_} in 0..{r}, {s_} in 0..{r}:",
        f"  {t}[{n_}, {k_}, {y_}, {x_}] += {read} * {wt}[{k_}, {c_}, {r_}, {s_}]"])

    def produce(env: dict) -> np.ndarray:
        xp = np.pad(env[x], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        out = np.zeros((batch, kk, ho, wo))
        for i in range(r):
            for j in range(r):
                out += np.einsum("nchw,kc->nkhw", xp[:, :, i:i + ho, j:j + wo], env[wt][:, :, i, j])
        return out
    return [sn, sk, oh, ow], [batch, kk, ho, wo], produce, 1
