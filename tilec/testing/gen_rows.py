"""The fuzzer's row-and-contraction programs of sessions 22-23's shapes (fuzz24), each with its NumPy formula:

    D[i, j] += (A[i, k] - B[j, k]) * (A[i, k] - B[j, k])          # "pairwise": squared distances, their expanded
                                                                   #   form, a cosine matrix (distance/scale_split)
    o[b, h, d] += e[b, h, s] * V[b, h, s, d] / z[b, h]             # "decode": one query's attention, the softmax as
                                                                   #   statements (a row statistic broadcast back)
    Y[i, j] = bias[j]; for k: Y += A B; for l: Y += C D            # "accum": statements continuing one sum (LoRA)
    y[b, d] += X[b, s, d] * mask[b, s] / count[b]                  # "maskmean": masked mean pooling (matvec_split)

The formulas are written from what the program means (einsum, a softmax over the last axis) in float64 from the
rounded inputs, not from the program text.
"""
from __future__ import annotations

import random

import numpy as np

from tilec.testing.gen import DTYPES, Builder, Case, Names, rounded, size


def pairwise(rng: random.Random, nm: Names) -> Case:
    """Squared distances between the rows of A [M, D] and of B [N, D] (the difference squared in the sum, or the
    hand-kernel expansion |a|^2 - 2 a.b + |b|^2 through three statements), or their cosine similarity matrix."""
    kind = rng.choice(["sqdist", "sqdist", "expanded", "cosine"])
    m, n, d = size(rng, 300), size(rng, 300), rng.choice([1, 3, 16, 32, 64, 96, 127, 128, 129, 200, size(rng, 260)])
    if rng.random() < 0.15:  # every size equal: a check comparing extents by position cannot tell them apart
        m = n = d
    dt = rng.choice(["f32", "f32", "bf16", "f16"])
    sm, sn, sd = nm("M"), nm("N"), nm("D")
    b = Builder(nm(kind))
    b.defaults = [(sm, m), (sn, n), (sd, d)]
    a, bb, out = nm("A"), nm("B"), nm("Dm")
    b.param(a, dt, [sm, sd])
    b.param(bb, dt, [sn, sd])
    b.decl(out, rng.choice(["f32", "f32", dt]), [sm, sn], out=True)
    i, j, k = nm("i"), nm("j"), nm("k")
    ar, br = f"{a}[{i}, {k}]", f"{bb}[{j}, {k}]"
    dst = f"{out}[{i}, {j}]"
    if kind == "sqdist":
        b.loops([(i, sm), (j, sn)], [f"{dst} = 0", f"for {k} in 0..{sd}:", f"  {dst} += ({ar} - {br}) * ({ar} - {br})"])
    else:
        na, nb, dot = nm("aa"), nm("bb"), nm("ab")
        for vec, t, ln, iv, r in ((na, a, sm, i, ar), (nb, bb, sn, j, br)):
            b.decl(vec, "f32", [ln])
            b.loops([(iv, ln)], [f"{vec}[{iv}] = 0", f"for {k} in 0..{sd}:", f"  {vec}[{iv}] += {r} * {r}"])
        b.decl(dot, "f32", [sm, sn])
        b.loops([(i, sm), (j, sn)], [f"{dot}[{i}, {j}] = 0", f"for {k} in 0..{sd}:", f"  {dot}[{i}, {j}] += {ar} * {br}"])
        val = (f"{na}[{i}] - 2 * {dot}[{i}, {j}] + {nb}[{j}]" if kind == "expanded" else
               f"{dot}[{i}, {j}] * rsqrt({na}[{i}] + 0.00000001) * rsqrt({nb}[{j}] + 0.00000001)")
        b.loops([(i, sm), (j, sn)], [f"{dst} = {val}"])

    def formula(env: dict) -> dict:
        av, bv = env[a], env[bb]
        if kind == "cosine":
            na_, nb_ = (av * av).sum(1) + 1e-8, (bv * bv).sum(1) + 1e-8
            return {out: (av @ bv.T) / np.sqrt(na_)[:, None] / np.sqrt(nb_)[None, :]}
        return {out: ((av[:, None, :] - bv[None, :, :]) ** 2).sum(-1)}
    return Case("pairwise", b.text(), formula, forms=(kind, dt))


def decode(rng: random.Random, nm: Names) -> Case:
    """One decoding step of attention: q [B, H, D] against K, V [B, H, S, D] (or one key/value head shared by G
    query heads: K[b, h / G, s, d]), the softmax written as its statements; the output divides by the row sum in
    the weighted sum, or the weights are normalised first (a row statistic broadcast back along the row)."""
    nb, nh, s, d = rng.choice([1, 2, 3]), rng.choice([1, 2, 4, 5]), size(rng, 400), rng.choice([16, 32, 64, 80, 128])
    while nb * nh * s * d > 200_000:
        s = max(1, s // 2)
    group = rng.choice([1, 1, 2]) if nh % 2 == 0 else 1
    dt = rng.choice(["f32", "f32", "bf16"])
    sb, sh, ss, sd = nm("B"), nm("H"), nm("S"), nm("D")
    bl = Builder(nm("decode"))
    bl.defaults = [(sb, nb), (sh, nh), (ss, s), (sd, d)]
    q, kk, vv, o = nm("q"), nm("K"), nm("V"), nm("o")
    kvh = f"{sh} / {group}" if group > 1 else sh
    bl.param(q, dt, [sb, sh, sd])
    bl.param(kk, dt, [sb, kvh, ss, sd])
    bl.param(vv, dt, [sb, kvh, ss, sd])
    bv, hv, sv, dv = nm("b"), nm("h"), nm("s"), nm("d")
    hk = f"{hv} / {group}" if group > 1 else hv
    scale = rng.choice([0.125, 0.25, 1.0])
    sc, mx, e, z = nm("sc"), nm("m"), nm("e"), nm("z")
    raw = sc
    tdt = {}
    for name, dims in ((sc, [sb, sh, ss]), (mx, [sb, sh]), (e, [sb, sh, ss]), (z, [sb, sh])):
        tdt[name] = "f32" if rng.random() < 0.8 else dt
        bl.decl(name, tdt[name], dims)
    bl.decl(o, rng.choice([dt, "f32"]), [sb, sh, sd], out=True)
    row, el = f"[{bv}, {hv}]", f"[{bv}, {hv}, {sv}]"
    rows, full = [(bv, sb), (hv, sh)], [(bv, sb), (hv, sh), (sv, ss)]
    kr = f"{kk}[{bv}, {hk}, {sv}, {dv}] * {q}[{bv}, {hv}, {dv}]" + (f" * {scale}" if scale != 1.0 else "")
    masked = rng.random() < 0.3  # a key-padding mask per batch added to the scores in a statement of its own
    bl.loops(full, [f"{sc}{el} = 0", f"for {dv} in 0..{sd}:", f"  {sc}{el} += {kr}"])
    if masked:
        mk, sm_ = nm("mask"), nm("sm")
        bl.param(mk, rng.choice(["f32", dt]), [sb, ss])
        bl.decl(sm_, "f32", [sb, sh, ss])
        bl.loops(full, [f"{sm_}{el} = {sc}{el} + {mk}[{bv}, {sv}]"])
        tdt[sm_], sc = "f32", sm_
    bl.loops(rows, [f"{mx}{row} = -inf", f"for {sv} in 0..{ss}:", f"  {mx}{row} max= {sc}{el}"])
    bl.loops(full, [f"{e}{el} = exp({sc}{el} - {mx}{row})"])
    bl.loops(rows, [f"{z}{row} = 0", f"for {sv} in 0..{ss}:", f"  {z}{row} += {e}{el}"])
    norm = rng.choice(["inside", "first"])
    vr = f"{vv}[{bv}, {hk}, {sv}, {dv}]"
    dst = f"{o}[{bv}, {hv}, {dv}]"
    if norm == "first":
        p = nm("p")
        bl.decl(p, "f32", [sb, sh, ss])
        bl.loops(full, [f"{p}{el} = {e}{el} / {z}{row}"])
        bl.loops(rows + [(dv, sd)], [f"{dst} = 0", f"for {sv} in 0..{ss}:", f"  {dst} += {p}{el} * {vr}"])
    else:
        bl.loops(rows + [(dv, sd)], [f"{dst} = 0", f"for {sv} in 0..{ss}:", f"  {dst} += {e}{el} * {vr} / {z}{row}"])

    def formula(env: dict) -> dict:
        kv, vv_ = np.repeat(env[kk], group, axis=1), np.repeat(env[vv], group, axis=1)
        # each statistic rounded to the dtype the program stores it in (the softmax's meaning otherwise)
        scores = rounded(np.einsum("bhsd,bhd->bhs", kv, env[q]) * scale, tdt[raw])
        scores = scores + env[mk][:, None, :] if masked else scores
        w = rounded(np.exp(scores - rounded(scores.max(-1, keepdims=True), tdt[mx])), tdt[e])
        w = w / rounded(w.sum(-1, keepdims=True), tdt[z])
        return {o: np.einsum("bhs,bhsd->bhd", w, vv_)}
    return Case("decode", bl.text(), formula,
                forms=(norm, dt) + (("grouped",) if group > 1 else ()) + (("masked",) if masked else ()))


def accum(rng: random.Random, nm: Names) -> Case:
    """Two or three reductions continuing one output: `Y = init; for k: Y += A B; for l: Y += C D` (init 0, a bias
    of columns or a residual), each pair of operands in its own layout; or a LoRA layer (Y = X W + s (X La) Lb with
    X La a statement of its own)."""
    lora = rng.random() < 0.35
    m, n = size(rng, 260), size(rng, 260)
    same = rng.random() < 0.15  # every size equal (fuzz23's K == M finding)
    n = m if same else n
    dt = rng.choice(DTYPES)
    sm, sn = nm("M"), nm("N")
    b = Builder(nm("lora" if lora else "accum"))
    i, j, y = nm("i"), nm("j"), nm("Y")
    terms: list[tuple[str, str, str, str, int]] = []  # (A, B, loop var, size sym, size); B's layout in `lay`
    lay: dict[str, str] = {}
    if lora:
        k, r = m if same else size(rng, 300), rng.choice([1, 4, 8, 16])
        sk, sr = nm("K"), nm("R")
        b.defaults = [(sm, m), (sk, k), (sn, n), (sr, r)]
        x, w, la, lb, t = nm("X"), nm("W"), nm("La"), nm("Lb"), nm("T")
        b.param(x, dt, [sm, sk])
        lay[w] = rng.choice(["kn", "nk"])
        b.param(w, dt, [sk, sn] if lay[w] == "kn" else [sn, sk])
        b.param(la, dt, [sk, sr])
        b.param(lb, dt, [sr, sn])
        tdt = rng.choice(["f32", dt])
        b.decl(t, tdt, [sm, sr])
        kv, rv = nm("k"), nm("r")
        b.loops([(i, sm), (rv, sr)], [f"{t}[{i}, {rv}] = 0", f"for {kv} in 0..{sk}:",
                                      f"  {t}[{i}, {rv}] += {x}[{i}, {kv}] * {la}[{kv}, {rv}]"])
        lay[lb] = "kn"
        terms = [(x, w, kv, sk, k), (t, lb, rv, sr, r)]
    else:
        count = rng.choice([2, 2, 3])
        b.defaults = [(sm, m), (sn, n)]
        for _ in range(count):
            kv, sk, k = nm("k"), nm("K"), m if same else size(rng, 300)
            b.defaults.append((sk, k))
            av, bv = nm("A"), nm("B")
            lay[av] = rng.choice(["mk", "mk", "km"])
            b.param(av, dt, [sm, sk] if lay[av] == "mk" else [sk, sm])
            lay[bv] = rng.choice(["kn", "nk"])
            b.param(bv, dt, [sk, sn] if lay[bv] == "kn" else [sn, sk])
            terms.append((av, bv, kv, sk, k))
    init = rng.choice(["0", "bias", "res"])
    bias = nm("bias")
    if init != "0":
        b.param(bias, rng.choice(["f32", dt]), [sn] if init == "bias" else [sm, sn])
    scale = rng.choice([1.0, 1.0, 0.5]) if lora else 1.0
    b.decl(y, rng.choice(DTYPES), [sm, sn], out=True)
    dst = f"{y}[{i}, {j}]"
    lines = [f"{dst} = {({'0': '0', 'bias': f'{bias}[{j}]', 'res': f'{bias}[{i}, {j}]'})[init]}"]
    for n_, (av, bv, kv, sk, _) in enumerate(terms):
        br = f"{bv}[{kv}, {j}]" if lay[bv] == "kn" else f"{bv}[{j}, {kv}]"
        sc = f" * {scale}" if scale != 1.0 and n_ == 1 else ""
        ar = f"{av}[{kv}, {i}]" if lay.get(av) == "km" else f"{av}[{i}, {kv}]"
        lines += [f"for {kv} in 0..{sk}:", f"  {dst} += {ar} * {br}{sc}"]
    b.loops([(i, sm), (j, sn)], lines)

    def formula(env: dict) -> dict:
        out = {"0": lambda: np.zeros((m, n)), "bias": lambda: np.broadcast_to(env[bias][None, :], (m, n)),
               "res": lambda: env[bias]}[init]()
        for n_, (av, bv, _, _, _) in enumerate(terms):
            left = rounded(env[x] @ env[la], tdt) if lora and n_ == 1 else env[av]
            left = left.T if lay.get(av) == "km" else left
            right = env[bv] if lay[bv] == "kn" else env[bv].T
            out = out + left @ right * (scale if n_ == 1 else 1.0)
        return {y: out}
    forms = (("lora",) if lora else (f"{len(terms)}terms",)) + (init,) + (("a_km",) if "km" in lay.values() else ())
    return Case("accum", b.text(), formula, forms=forms)


def maskmean(rng: random.Random, nm: Names) -> Case:
    """Masked mean pooling over a sequence: y[b, d] = sum_s X[b, s, d] mask[b, s] / count[b], X mostly bf16, the
    count an input (f32 or the mask's dtype) or computed from the mask in a statement of its own."""
    nb, s, d = rng.choice([1, 2, 3, 4, 8]), size(rng, 300), size(rng, 300)
    while nb * s * d > 200_000:
        s = max(1, s // 2)
    dt = rng.choice(["bf16", "bf16", "f16", "f32"])
    sb, ss, sd = nm("B"), nm("S"), nm("D")
    bl = Builder(nm("masked_mean"))
    bl.defaults = [(sb, nb), (ss, s), (sd, d)]
    x, mk, cnt, y = nm("X"), nm("mask"), nm("count"), nm("y")
    bl.param(x, dt, [sb, ss, sd])
    bl.param(mk, rng.choice([dt, "f32"]), [sb, ss])
    computed = rng.random() < 0.3
    bv, sv, dv = nm("b"), nm("s"), nm("d")
    if computed:  # the count of the mask (plus one: an all-zero mask row would divide by zero)
        bl.decl(cnt, "f32", [sb])
        bl.loops([(bv, sb)], [f"{cnt}[{bv}] = 1", f"for {sv} in 0..{ss}:", f"  {cnt}[{bv}] += {mk}[{bv}, {sv}]"])
    else:
        bl.param(cnt, rng.choice(["f32", "f32", dt]), [sb])
    bl.decl(y, rng.choice([dt, dt, "f32"]), [sb, sd], out=True)
    dst = f"{y}[{bv}, {dv}]"
    bl.loops([(bv, sb), (dv, sd)], [f"{dst} = 0", f"for {sv} in 0..{ss}:",
                                    f"  {dst} += {x}[{bv}, {sv}, {dv}] * {mk}[{bv}, {sv}] / {cnt}[{bv}]"])

    def formula(env: dict) -> dict:
        c = 1.0 + env[mk].sum(1) if computed else env[cnt]
        return {y: np.einsum("bsd,bs->bd", env[x], env[mk]) / c[:, None]}
    return Case("maskmean", bl.text(), formula, forms=(dt,) + (("counted",) if computed else ()))
