"""The fuzzer's programs of the layer shapes sessions 22-23 taught the compiler (fuzz24), each with its NumPy formula:

    Y[n, k, y, x] += X[n, c, y / 2, x / 2] * Wt[c, k, y % 2, x % 2]   # "tconv": a transposed conv, kernel = stride,
                                                                       #   in its three spellings (tconv_split)
    Y[n, y, x, c] max= X[n, 2*y + p - 1, 2*x + q - 1, c] ?? -inf     # "axpool": a pool over any two axes with
                                                                       #   dimensions after them (pool_axes)
    Y[n, c, y, x] = (X[n, c, y, x] - mu[c]) * rsqrt(v[c] + eps) * g[c] + b[c]   # "bnorm": batch norm at inference,
                                                                       #   C below a partition tile (channel_pack)
    G[n, c, d] += F[n, c, h, w] * F[n, d, h, w] / (C H W)             # "gram": a Gram matrix of a map (merge_split)

The formulas are written from what the program means (einsum over the taps, windows over an identity-padded copy)
in float64 from the rounded inputs, not from the program text.
"""
from __future__ import annotations

import random

import numpy as np

from tilec.testing.gen import DTYPES, Builder, Case, Names, _num, rounded, size
from tilec.testing.gen_shapes import FILL, _out_size, _windows


def tconv(rng: random.Random, nm: Names) -> Case:
    """torch's ConvTranspose2d(C, K, f, stride=f) over [N, C, H, W] (or [C, H, W]), Wt [C, K, f, f], a bias of K
    now and then: written with floor division and remainder, as a stride-f store of the taps, or into a 6-D view."""
    f = rng.choice([2, 2, 2, 3])
    spelling = rng.choice(["floor", "strided", "view"])
    batch = rng.random() < 0.7
    n, c, k = rng.choice([1, 2, 3]), size(rng, 200), size(rng, 160)
    h, w = rng.randint(1, 12), rng.randint(1, 12)
    if rng.random() < 0.15:  # equal sizes: a check comparing extents by position cannot tell the dimensions apart
        c = k = h = w = rng.choice([2, 3, 4])
    while n * c * k * h * w * f * f > 300_000:  # (the reference evaluator's time: ~20 us a multiply-add)
        h, w = max(1, h // 2), max(1, w // 2)
        c, k = max(1, c * 3 // 4), max(1, k * 3 // 4)
    dt = rng.choice(DTYPES)
    sn, sc, sk, sh, sw = nm("N"), nm("C"), nm("K"), nm("H"), nm("W")
    lead = [sn] if batch else []
    b = Builder(nm("tconv"))
    b.defaults = ([(sn, n)] if batch else []) + [(sc, c), (sh, h), (sw, w), (sk, k)]
    x, wt, bias, y = nm("X"), nm("Wt"), nm("bias"), nm("Y")
    b.param(x, dt, lead + [sc, sh, sw])
    b.param(wt, dt, [sc, sk, str(f), str(f)])
    has_bias = rng.random() < 0.5
    if has_bias:
        b.param(bias, rng.choice(["f32", dt]), [sk])
    v = {key: nm(key) for key in ("n", "c", "k", "y", "x", "a", "b")}
    nv = [v["n"]] if batch else []
    outer = [(v["n"], sn)] if batch else []
    skip = spelling != "view" and rng.random() < 0.3  # then a U-Net's skip: Z = relu(Y + S), Y a temporary
    ydt = rng.choice(DTYPES)
    big = lead + [sk, f"{f} * {sh}", f"{f} * {sw}"]
    if spelling == "floor":
        b.decl(y, ydt, big, out=not skip)
        loops = outer + [(v["k"], sk), (v["y"], f"{f} * {sh}"), (v["x"], f"{f} * {sw}")]
        dst = f"{y}[{', '.join(nv + [v['k'], v['y'], v['x']])}]"
        src = f"{x}[{', '.join(nv + [v['c'], v['y'] + f' / {f}', v['x'] + f' / {f}'])}]"
        wr = f"{wt}[{v['c']}, {v['k']}, {v['y']} % {f}, {v['x']} % {f}]"
    else:
        ix = nv + [v["c"], v["y"], v["x"]]
        if spelling == "strided":
            b.decl(y, ydt, big, out=not skip)
            oix = [v["k"], f"{f} * {v['y']} + {v['a']}", f"{f} * {v['x']} + {v['b']}"]
        else:
            b.decl(y, ydt, lead + [sk, sh, str(f), sw, str(f)], out=True)
            oix = [v["k"], v["y"], v["a"], v["x"], v["b"]]
        loops = outer + [(v["k"], sk), (v["y"], sh), (v["a"], str(f)), (v["x"], sw), (v["b"], str(f))]
        dst = f"{y}[{', '.join(nv + oix)}]"
        src = f"{x}[{', '.join(ix)}]"
        wr = f"{wt}[{v['c']}, {v['k']}, {v['a']}, {v['b']}]"
    init = f"{bias}[{v['k']}]" if has_bias else "0"
    b.loops(loops, [f"{dst} = {init}", f"for {v['c']} in 0..{sc}:", f"  {dst} += {src} * {wr}"])
    z, sk_ = nm("Z"), nm("S")
    if skip:
        b.param(sk_, dt, big)
        b.decl(z, rng.choice(DTYPES), big, out=True)
        zi = nv + [v["k"], v["y"], v["x"]]
        b.loops(outer + [(v["k"], sk), (v["y"], f"{f} * {sh}"), (v["x"], f"{f} * {sw}")],
                [f"{z}[{', '.join(zi)}] = relu({y}[{', '.join(zi)}] + {sk_}[{', '.join(zi)}])"])

    def formula(env: dict) -> dict:
        xv = env[x] if batch else env[x][None]
        t = np.einsum("ncyx,ckab->nkyaxb", xv, env[wt])
        if has_bias:
            t = t + env[bias][None, :, None, None, None, None]
        t = t if spelling == "view" else t.reshape(t.shape[0], k, f * h, f * w)
        t = t if batch else t[0]
        return {z: np.maximum(rounded(t, ydt) + env[sk_], 0)} if skip else {y: t}
    forms = (spelling, f"f{f}") + (("bias",) if has_bias else ()) + (("skip",) if skip else ())
    return Case("tconv", b.text(), formula, forms=forms)


def axpool(rng: random.Random, nm: Names) -> Case:
    """A pool over two axes of X with at least one dimension after them (NHWC, HWC, NHWGC, or the two window axes
    apart: [H, N, W, C]), any window (1-5 taps an axis), stride, padding by the reduction's identity; an average
    counts the padding or (the count written with min/max of the loop variables) only the taps inside X."""
    rank = rng.choice([3, 4, 4, 4, 5])
    at = sorted(rng.sample(range(rank - 1), 2)) if rng.random() < 0.2 else [rng.randrange(rank - 2)] * 2
    at[1] = at[0] + 1 if at[0] == at[1] else at[1]
    taps = [rng.choice([1, 2, 3, 3, 5]), rng.choice([2, 3, 3, 5])]
    wins = []
    for t in taps:
        stride = rng.choice([1, 2, 2, 3])
        pad = rng.randint(0, (t - 1) // 2)
        ext = max(t - 2 * pad, pad, 1) + rng.randint(0, 3 * stride + 12)
        wins.append((ext, stride, pad, (ext + 2 * pad - t) // stride + 1))
    other = [rng.choice([1, 2, 3]) if d == 0 else size(rng, 96) for d in range(rank - 2)]
    while np.prod(other) * wins[0][0] * wins[1][0] > 300_000:
        other = [max(1, e // 2) for e in other]
    kind = rng.choice(["max", "min", "sum", "avg", "avg", "avgx"])
    op, init, fill = FILL["avg" if kind == "avgx" else kind]
    syms, exts = [], []
    it = iter(other)
    for d in range(rank):
        if d in at:
            ext = wins[at.index(d)][0]
            syms.append(nm("HW"[at.index(d)]))
            exts.append(ext)
        else:
            syms.append(nm("N" if d == 0 else "C"))
            exts.append(next(it))
    b = Builder(nm("pool"))
    b.defaults = list(zip(syms, exts))
    outs = [nm("Ho"), nm("Wo")]
    b.lets = [(o, _out_size(syms[a], t, st, 1, p)) for o, a, t, (_, st, p, _) in zip(outs, at, taps, wins)]
    x, y, dt = nm("X"), nm("Y"), rng.choice(DTYPES)
    b.param(x, dt, syms)
    oshape = [outs[at.index(d)] if d in at else syms[d] for d in range(rank)]
    b.decl(y, rng.choice([dt, dt, "f32"]), oshape, out=True)
    ivs = [nm("i") for _ in range(rank)]
    tv = [nm("p"), nm("q")]
    src = list(ivs)
    for a, t, (_, st, p, _), tvar in zip(at, taps, wins, tv):
        src[a] = (f"{st} * {ivs[a]}" if st > 1 else ivs[a]) + (f" + {tvar}" if t > 1 else "") + (f" - {p}" if p else "")
    term = f"{x}[{', '.join(src)}]"
    padded = any(p for _, _, p, _ in wins)
    term = f"({term} ?? {init})" if padded else term
    if kind == "avg":
        term = f"{term} / {taps[0] * taps[1]}"
    dst = f"{y}[{', '.join(ivs)}]"
    tap_loops = [f"{tvar} in 0..{t}" for tvar, t in zip(tv, taps) if t > 1]
    body = [f"{dst} = {init}", f"for {', '.join(tap_loops)}:", f"  {dst} {op} {term}"]
    if kind == "avgx":  # torch's count_include_pad=False: the count of taps inside X, from the loop variables
        s = nm("S")
        b.decl(s, "f32", oshape)
        cnt = " * ".join(f"(min({st} * {ivs[a]} + {t - p}, {syms[a]}) - max({st} * {ivs[a]} - {p}, 0))"
                         for a, t, (_, st, p, _) in zip(at, taps, wins))
        body = [line.replace(dst, f"{s}[{', '.join(ivs)}]") for line in body] + [f"{dst} = {s}[{', '.join(ivs)}] / ({cnt})"]
    b.loops([(iv, o) for iv, o in zip(ivs, oshape)], body)

    def formula(env: dict) -> dict:
        xv = np.moveaxis(env[x], at, [-2, -1])
        axes = [(e, st, 1, p, o) for e, st, p, o in wins]
        views = np.stack(_windows(xv, axes, taps, fill))
        if kind in ("max", "min"):
            red = views.max(0) if kind == "max" else views.min(0)
        elif kind == "avgx":
            ones = np.stack(_windows(np.ones(xv.shape[-2:]), axes, taps, 0.0))
            red = views.sum(0) / ones.sum(0)
        else:
            red = views.sum(0) / (taps[0] * taps[1] if kind == "avg" else 1)
        return {y: np.moveaxis(red, [-2, -1], at)}
    forms = (kind, f"rank{rank}") + (("apart",) if at[1] - at[0] > 1 else ()) + (("padded",) if padded else ())
    return Case("axpool", b.text(), formula, forms=forms)


def bnorm(rng: random.Random, nm: Names) -> Case:
    """A per-channel affine map of [N, C, H, W] (or [N, C, L], [C, H, W]), C mostly below a partition tile: batch
    norm at inference from its four statistics (|var|: the inputs are uniform in [-1, 1)), its folded scale and shift, or a layer scale; relu now and then."""
    shape = rng.choice(["nchw", "nchw", "ncl", "chw", "nhwc"])
    c = rng.choice([1, 3, 8, 16, 24, 32, 48, 64, 64, 96, 100, 127, 128, 200])
    sp = [rng.randint(1, 20) for _ in range(1 if shape == "ncl" else 2)]
    n = rng.choice([1, 2, 3]) if shape != "chw" else 1
    while n * c * np.prod(sp) > 120_000:
        sp = [max(1, e // 2) for e in sp]
    syms = ([nm("N")] if shape != "chw" else []) + [nm("C")] + [nm(s) for s in ("HW" if len(sp) == 2 else "L")]
    exts = ([n] if shape != "chw" else []) + [c] + sp
    ci = 0 if shape == "chw" else 1
    if shape == "nhwc":  # channels last: the statistics index the innermost dimension
        syms, exts, ci = syms[:1] + syms[2:] + syms[1:2], exts[:1] + exts[2:] + exts[1:2], 3
    b = Builder(nm("bn"))
    b.defaults = list(zip(syms, exts))
    dt, sdt = rng.choice(DTYPES), rng.choice(["f32", "f32", "same"])
    sdt = dt if sdt == "same" else sdt
    kind = rng.choice(["affine", "affine", "folded", "scale"])
    x, y = nm("X"), nm("Y")
    b.param(x, dt, syms)
    stats = {"affine": ["mean", "var", "g", "b"], "folded": ["s", "t"], "scale": ["g"]}[kind]
    names = {s: nm(s) for s in stats}
    for s in stats:
        b.param(names[s], sdt, [syms[ci]])
    b.decl(y, rng.choice([dt, dt, "f32", "bf16"]), syms, out=True)
    ivs = [nm("i") for _ in syms]
    xr, cv = f"{x}[{', '.join(ivs)}]", ivs[ci]
    eps = rng.choice([1e-5, 0.001])
    st = {s: f"{names[s]}[{cv}]" for s in stats}
    val = {"affine": lambda: f"({xr} - {st['mean']}) * rsqrt(abs({st['var']}) + {_num(eps)}) * {st['g']} + {st['b']}",
           "folded": lambda: f"{xr} * {st['s']} + {st['t']}", "scale": lambda: f"{st['g']} * {xr}"}[kind]()
    relu = rng.random() < 0.3
    b.loops(list(zip(ivs, syms)), [f"{y}[{', '.join(ivs)}] = {f'relu({val})' if relu else val}"])

    def formula(env: dict) -> dict:
        shp = [1] * len(syms)
        shp[ci] = c
        s = {k: env[names[k]].reshape(shp) for k in stats}
        xv = env[x]
        out = {"affine": lambda: (xv - s["mean"]) / np.sqrt(np.abs(s["var"]) + float(np.float32(eps))) * s["g"] + s["b"],
               "folded": lambda: xv * s["s"] + s["t"], "scale": lambda: xv * s["g"]}[kind]()
        return {y: np.maximum(out, 0) if relu else out}
    return Case("bnorm", b.text(), formula, forms=(kind, shape) + (("relu",) if relu else ()))


def gram(rng: random.Random, nm: Names) -> Case:
    """G[n, c, d] = sum over the pixels of F[n, c, ..] F2[n, d, ..] (F2 = F: a style Gram matrix), over [N, C, H, W],
    [N, C, L] or [C, H, W], scaled by 1 / (C H W), by a constant, or not."""
    shape = rng.choice(["nchw", "nchw", "ncl", "chw"])
    c = size(rng, 160)
    sp = [rng.randint(1, 24) for _ in range(1 if shape == "ncl" else 2)]
    n = rng.choice([1, 2, 3]) if shape != "chw" else 1
    while n * c * np.prod(sp) > 60_000:
        sp = [max(1, e // 2) for e in sp]
        c = max(1, c * 3 // 4)
    cross = rng.random() < 0.25
    c2 = size(rng, 160) if cross and rng.random() < 0.5 else c
    sn, sc, sd = nm("N"), nm("C"), nm("D") if c2 != c else None
    spn = [nm(s) for s in ("HW" if len(sp) == 2 else "L")]
    lead = [sn] if shape != "chw" else []
    b = Builder(nm("gram"))
    b.defaults = ([(sn, n)] if lead else []) + [(sc, c)] + ([(sd, c2)] if sd else []) + list(zip(spn, sp))
    f, f2, g, dt = nm("F"), nm("F2") if cross else None, nm("G"), rng.choice(DTYPES)
    b.param(f, dt, lead + [sc] + spn)
    if f2:
        b.param(f2, rng.choice([dt, dt, "f32"]), lead + [sd or sc] + spn)
    b.decl(g, rng.choice([dt, "f32"]), lead + [sc, sd or sc], out=True)
    nv, cv, dv = nm("n"), nm("c"), nm("d")
    pv = [nm(s) for s in ("h", "w")][:len(sp)]
    nix = [nv] if lead else []
    dst = f"{g}[{', '.join(nix + [cv, dv])}]"
    term = f"{f}[{', '.join(nix + [cv] + pv)}] * {f2 or f}[{', '.join(nix + [dv] + pv)}]"
    scale = rng.choice(["none", "chw", "const"])
    term += {"none": "", "chw": f" / ({' * '.join([sc] + spn)})", "const": " * 0.25"}[scale]
    b.loops(([(nv, sn)] if lead else []) + [(cv, sc), (dv, sd or sc)],
            [f"{dst} = 0", f"for {', '.join(f'{p} in 0..{s}' for p, s in zip(pv, spn))}:", f"  {dst} += {term}"])

    def formula(env: dict) -> dict:
        a = env[f] if lead else env[f][None]
        a2 = (env[f2] if lead else env[f2][None]) if f2 else a
        a, a2 = a.reshape(a.shape[0], a.shape[1], -1), a2.reshape(a2.shape[0], a2.shape[1], -1)
        out = np.einsum("ncp,ndp->ncd", a, a2)
        out = out / {"none": 1.0, "chw": float(c * np.prod(sp)), "const": 4.0}[scale]
        return {g: out if lead else out[0]}
    return Case("gram", b.text(), formula, forms=(shape, scale) + (("cross",) if cross else ()))
