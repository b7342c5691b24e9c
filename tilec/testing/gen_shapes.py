"""The fuzzer's programs of the shapes users write after the examples (fuzz23), each with its NumPy formula:

    Y[n, c, i, j] max= X[n, c, 2*i + p - 1, 2*j + q - 1] ?? -inf       # "window": a pool with a stride, padding,
                                                                       #   dilation, any window, sizes with a remainder
    Y[n, 2*c + m, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * W[2*c + m, r, s]   # "dwconv": depthwise with a
                                                                       #   channel multiplier, or a dense conv, strided,
                                                                       #   dilated, padded, sizes with a remainder
    Y[i3, i0, i4, i1, i2] = X[i0, i1, i2, i3, i4]                       # "permute5": permutes of rank 5
    s[i, j] = X[i, j] * 0.5 + mk[j]; softmax of s                       # "masked": row chains reading a mask
    C[b, i, j] = bias[j]; C[b, i, j] += A[b, i, k] * W[j, k]            # "bmm_bias": batched matmuls with a bias

The formulas are written from what the program means (windows over a padded copy, einsum, np.transpose) in float64
from the rounded inputs, not from the program text.
"""
from __future__ import annotations

import random

import numpy as np

from tilec.testing.gen import DTYPES, Builder, Case, Names, _num, size

FILL = {"max": ("max=", "-inf", -np.inf), "min": ("min=", "inf", np.inf), "sum": ("+=", "0", 0.0),
        "avg": ("+=", "0", 0.0)}


def _axis(rng: random.Random, taps: int) -> tuple[int, int, int, int, int]:
    """One spatial axis of a window: (input extent, stride, dilation, padding, output extent). The padding reaches at
    most half the window's span; the extent leaves a remainder the stride drops now and then (floor division)."""
    stride, dil = rng.choice([1, 2, 2, 3]), rng.choice([1, 1, 1, 2])
    span = dil * (taps - 1) + 1
    pad = rng.randint(0, (span - 1) // 2)
    extent = max(span - 2 * pad, pad, 1) + rng.randint(0, 3 * stride + 9)  # a padded read reaches at most X's extent
    return extent, stride, dil, pad, (extent + 2 * pad - span) // stride + 1


def _out_size(sym: str, taps: int, stride: int, dil: int, pad: int) -> str:
    shift = 2 * pad - dil * (taps - 1) - 1
    span = sym if shift == 0 else f"{sym} + {shift}" if shift > 0 else f"{sym} - {-shift}"
    return f"({span}) / {stride} + 1" if stride > 1 else (f"{span} + 1" if shift else f"{sym} + 1")


def _tap(out_var: str, tap_var: str | None, stride: int, dil: int, pad: int) -> str:
    """The input index of an output index and a tap (None: the axis is one tap wide)."""
    text = f"{stride}*{out_var}" if stride > 1 else out_var
    if tap_var:
        text += f" + {dil}*{tap_var}" if dil > 1 else f" + {tap_var}"
    return text + (f" - {pad}" if pad else "")


def _windows(x: np.ndarray, axes: list[tuple[int, int, int, int, int]], taps: list[int], fill: float) -> list:
    """Every tap's strided view of x padded with `fill` (the last len(axes) dims are spatial)."""
    pads = [(0, 0)] * (x.ndim - len(axes)) + [(a[3], a[3]) for a in axes]
    xp = np.pad(x, pads, constant_values=fill)
    views = []
    for offs in np.ndindex(*taps):
        sl = [slice(None)] * (x.ndim - len(axes))
        sl += [slice(a[2] * o, a[2] * o + a[1] * (a[4] - 1) + 1, a[1]) for a, o in zip(axes, offs)]
        views.append(xp[tuple(sl)])
    return views


def window(rng: random.Random, nm: Names) -> Case:
    """A pool of any window (3x3, 2x3, 5), stride, dilation and padding by the reduction's identity (avg counts
    the padding, torch's count_include_pad), over [N, C, H, W] or [N, C, W]; output sizes as torch floors them."""
    two_d = rng.random() < 0.75
    taps = [rng.choice([2, 3, 3, 5]) for _ in range(2 if two_d else 1)]
    axes = [_axis(rng, t) for t in taps]
    n, c = rng.choice([1, 2]), size(rng, 200)
    while n * c * np.prod([a[0] for a in axes]) > 400_000:
        c = max(1, c // 2)
    kind = rng.choice(["max", "min", "sum", "avg"])
    op, init, fill = FILL[kind]
    sp = [nm("H"), nm("W")] if two_d else [nm("W")]
    syms = [nm("N"), nm("C")] + sp
    b = Builder(nm("pool"))
    b.defaults = list(zip(syms, [n, c] + [a[0] for a in axes]))
    outs = [nm("Ho"), nm("Wo")][-len(axes):]
    b.lets = [(o, _out_size(s, t, a[1], a[2], a[3])) for o, s, t, a in zip(outs, sp, taps, axes)]
    x, y, dt = nm("X"), nm("Y"), rng.choice(DTYPES)
    b.param(x, dt, syms)
    b.decl(y, rng.choice(DTYPES), syms[:2] + outs, out=True)
    iv, tv = [nm("n"), nm("c")] + [nm("i") for _ in axes], [nm("p") for _ in axes]
    src = iv[:2] + [_tap(o, t, a[1], a[2], a[3]) for o, t, a in zip(iv[2:], tv, axes)]
    term = f"{x}[{', '.join(src)}]"
    padded = any(a[3] for a in axes)
    if padded:
        term = f"{term} ?? {init}"
    count = int(np.prod(taps))
    times = rng.random() < 0.5  # avg as a product by 1/count (rounded to f32) or a division by count
    if kind == "avg":
        term = f"{_num(1.0 / count)} * ({term})" if times else f"({term}) / {count}"
    dst = f"{y}[{', '.join(iv)}]"
    b.loops(list(zip(iv, syms[:2] + outs)), [f"{dst} = {init}", f"for {', '.join(f'{v} in 0..{t}' for v, t in zip(tv, taps))}:",
                                              f"  {dst} {op} {term}"])
    scale = float(np.float32(1.0 / count)) if times else 1.0 / count

    def formula(env: dict) -> dict:
        wins = np.stack(_windows(env[x], axes, taps, fill))
        red = {"max": wins.max, "min": wins.min, "sum": wins.sum, "avg": lambda a: (wins * scale).sum(a)}[kind](0)
        return {y: red}
    forms = tuple(f for f, on in (("padded", padded), ("strided", any(a[1] > 1 for a in axes)),
                                  ("dilated", any(a[2] > 1 for a in axes))) if on)
    return Case("window", b.text(), formula, forms=forms)


def dwconv(rng: random.Random, nm: Names) -> Case:
    """A 2-D conv with a stride, dilation and zero padding, sizes leaving a remainder: depthwise with a channel
    multiplier (`Y[n, M*c + m, ..]`, weights [C*M, R, S] as torch stores them or [C, M, R, S]) or dense."""
    depthwise = rng.random() < 0.6
    mult = rng.choice([1, 2, 2, 3, 4]) if depthwise else 1
    taps = [rng.choice([1, 3, 3, 5]), rng.choice([1, 3, 3, 5])]
    axes = [_axis(rng, t) for t in taps]
    n, c, k = rng.choice([1, 1, 2]), size(rng, 96), size(rng, 96)
    while n * c * (mult if depthwise else k) * axes[0][4] * axes[1][4] * taps[0] * taps[1] > 1_500_000:
        c, k = max(1, c // 2), max(1, k // 2)
    dt = rng.choice(DTYPES)
    syms = [nm("N"), nm("C")] + ([] if depthwise else [nm("K")]) + [nm("H"), nm("W")]
    b = Builder(nm("conv"))
    b.defaults = list(zip(syms, [n, c] + ([] if depthwise else [k]) + [axes[0][0], axes[1][0]]))
    sn, sc, sh, sw = syms[0], syms[1], syms[-2], syms[-1]
    outs = [nm("Ho"), nm("Wo")]
    b.lets = [(o, _out_size(s, t, a[1], a[2], a[3])) for o, s, t, a in zip(outs, (sh, sw), taps, axes)]
    x, wt, y = nm("X"), nm("Wt"), nm("Y")
    b.param(x, dt, [sn, sc, sh, sw])
    v = {key: nm(key) for key in ("n", "c", "m", "k", "y", "x", "r", "s")}
    torch_layout = rng.random() < 0.6
    if depthwise:
        kdim = f"{sc} * {mult}" if mult > 1 else sc
        kk = f"{mult}*{v['c']} + {v['m']}" if mult > 1 else v["c"]
        b.param(wt, dt, [kdim] + [str(t) for t in taps] if torch_layout or mult == 1 else [sc, str(mult)] +
                [str(t) for t in taps])
        widx = [kk] if torch_layout or mult == 1 else [v["c"], v["m"]]
        outer = [(v["n"], sn), (v["c"], sc)] + ([(v["m"], str(mult))] if mult > 1 else [])
        chan = v["c"]
    else:
        kdim, kk = syms[2], v["k"]
        b.param(wt, dt, [kdim, sc] + [str(t) for t in taps])
        widx, outer, chan = [v["k"], v["c"]], [(v["n"], sn), (v["k"], kdim)], v["c"]
    bias = rng.random() < 0.5
    bname = nm("b")
    if bias:
        b.param(bname, rng.choice(["f32", dt]), [kdim])
    b.decl(y, rng.choice(DTYPES), [sn, kdim] + outs, out=True)
    padded = any(a[3] for a in axes)
    tap_vars = [tv if t > 1 else None for tv, t in zip((v["r"], v["s"]), taps)]  # a 1-wide axis has no loop
    src = [v["n"], chan] + [_tap(o, tv, a[1], a[2], a[3]) for o, tv, a in zip((v["y"], v["x"]), tap_vars, axes)]
    tap_loops = [(tv, str(t)) for tv, t in zip(tap_vars, taps) if tv]
    read = f"{x}[{', '.join(src)}]"
    read = f"({read} ?? 0)" if padded else read
    widx += [tv or "0" for tv in tap_vars]
    if not depthwise:
        tap_loops = [(v["c"], sc)] + tap_loops
    dst = f"{y}[{v['n']}, {kk}, {v['y']}, {v['x']}]"
    body = [f"{dst} = {f'{bname}[{kk}]' if bias else '0'}"]
    term = f"{read} * {wt}[{', '.join(widx)}]"
    if tap_loops:
        body += [f"for {', '.join(f'{a} in 0..{e}' for a, e in tap_loops)}:", f"  {dst} += {term}"]
    else:
        body.append(f"{dst} += {term}")
    b.loops(outer + [(v["y"], outs[0]), (v["x"], outs[1])], body)

    def formula(env: dict) -> dict:
        w = env[wt].reshape(c * mult if depthwise else k, -1, *taps)
        views = _windows(env[x], axes, taps, 0.0)
        out = 0.0
        for view, (dy, dx) in zip(views, np.ndindex(*taps)):
            if depthwise:
                out = out + np.repeat(view, mult, axis=1) * w[None, :, 0, dy, dx, None, None]
            else:
                out = out + np.einsum("nchw,kc->nkhw", view, w[:, :, dy, dx])
        if bias:
            out = out + env[bname][None, :, None, None]
        return {y: out}
    forms = tuple(f for f, on in (("depthwise", depthwise), ("multiplier", mult > 1), ("padded", padded),
                                  ("strided", any(a[1] > 1 for a in axes)),
                                  ("dilated", any(a[2] > 1 for a in axes))) if on)
    return Case("dwconv", b.text(), formula, forms=forms)


def permute5(rng: random.Random, nm: Names) -> Case:
    """Y = X with its five dimensions in another order (a 3-D conv layout change, a head split's permute)."""
    dims = [rng.choice([1, 2, 3]), rng.randint(1, 6), rng.randint(1, 12), size(rng, 40), rng.randint(1, 70)]
    rng.shuffle(dims)
    order = tuple(rng.sample(range(5), 5))
    while order == tuple(range(5)):
        order = tuple(rng.sample(range(5), 5))
    syms = [nm(s) for s in ("A", "B", "D", "E", "F")]
    b = Builder(nm("perm"))
    b.defaults = list(zip(syms, dims))
    x, y = nm("X"), nm("Y")
    b.param(x, rng.choice(DTYPES), syms)
    b.decl(y, rng.choice(DTYPES), [syms[d] for d in order], out=True)
    iv = [nm(s) for s in ("a", "b", "d", "e", "f")]
    b.loops([(iv[d], syms[d]) for d in order], [f"{y}[{', '.join(iv[d] for d in order)}] = {x}[{', '.join(iv)}]"])
    return Case("permute5", b.text(), lambda env: {y: np.transpose(env[x], order)})


def masked(rng: random.Random, nm: Names) -> Case:
    """A softmax of scores plus a mask (a full [M, N] one, a key-padding [N] one, a per-batch [B, N] one over
    [B, M, N] scores), scaled now and then, written through a score tensor or inline; or a layernorm / rmsnorm of
    X times a mask (the statistics and the output read both)."""
    kind = rng.choice(["softmax", "softmax", "layernorm", "rmsnorm"])
    batched = kind == "softmax" and rng.random() < 0.35
    m, n = size(rng, 200), size(rng, 400)
    nb = rng.choice([1, 2, 3]) if batched else 1
    sb, sm, sn = nm("B"), nm("M"), nm("N")
    b = Builder(nm(f"masked_{kind}"))
    b.defaults = ([(sb, nb)] if batched else []) + [(sm, m), (sn, n)]
    lead = [sb] if batched else []
    dt = rng.choice(["f32", "f32", "bf16", "f16"])
    x, mk = nm("X"), nm("mk")
    b.param(x, dt, lead + [sm, sn])
    mshape = rng.choice(["full", "keys"]) if not batched else "batch"
    b.param(mk, rng.choice(["f32", dt]), {"full": [sm, sn], "keys": [sn], "batch": [sb, sn]}[mshape])
    bv, i, j = nm("b"), nm("i"), nm("j")
    ix = ([bv] if batched else []) + [i]
    rows = [(bv, sb)] if batched else []
    xr = f"{x}[{', '.join(ix + [j])}]"
    mr = f"{mk}[{ {'full': f'{i}, {j}', 'keys': j, 'batch': f'{bv}, {j}'}[mshape]}]"
    scale = rng.choice([1.0, 1.0, 0.125, 0.5])
    y = nm("Y")
    b.decl(y, rng.choice(DTYPES), lead + [sm, sn], out=True)
    vec = lambda name: b.decl(name, "f32", lead + [sm])  # noqa: E731
    r = f"[{', '.join(ix)}]"
    if kind == "softmax":
        val = (f"{xr} * {_num(scale)}" if scale != 1.0 else xr) + f" + {mr}"
        through = rng.random() < 0.5
        if through:  # the scores stored first, as attention writes them
            sc = nm("sc")
            b.decl(sc, "f32", lead + [sm, sn])
            b.loops(rows + [(i, sm), (j, sn)], [f"{sc}[{', '.join(ix + [j])}] = {val}"])
            val = f"{sc}[{', '.join(ix + [j])}]"
        mx, sv = nm("mx"), nm("s")
        vec(mx)
        vec(sv)
        b.loops(rows + [(i, sm)], [f"{mx}{r} = -inf", f"for {j} in 0..{sn}:", f"  {mx}{r} max= {val}"])
        b.loops(rows + [(i, sm)], [f"{sv}{r} = 0", f"for {j} in 0..{sn}:", f"  {sv}{r} += exp({val} - {mx}{r})"])
        b.loops(rows + [(i, sm), (j, sn)], [f"{y}[{', '.join(ix + [j])}] = exp({val} - {mx}{r}) / {sv}{r}"])
    else:
        val = f"{xr} * {mr}"
        mu, var, rs = nm("mu"), nm("v"), nm("r")
        g = nm("g")
        b.param(g, dt, [sn])
        if kind == "layernorm":
            vec(mu)
            b.loops([(i, sm)], [f"{mu}[{i}] = 0", f"for {j} in 0..{sn}:", f"  {mu}[{i}] += {val} / {sn}"])
        cent = f"({val} - {mu}[{i}])" if kind == "layernorm" else f"({val})"
        vec(var)
        vec(rs)
        b.loops([(i, sm)], [f"{var}[{i}] = 0", f"for {j} in 0..{sn}:", f"  {var}[{i}] += {cent} * {cent} / {sn}"])
        b.loops([(i, sm)], [f"{rs}[{i}] = rsqrt({var}[{i}] + 1e-05)"])
        b.loops([(i, sm), (j, sn)], [f"{y}[{i}, {j}] = {cent} * {rs}[{i}] * {g}[{j}]"])

    def formula(env: dict) -> dict:
        mv = env[mk]
        mv = mv[:, None, :] if mshape == "batch" else mv
        if kind == "softmax":
            v = env[x] * float(np.float32(scale)) + mv
            e = np.exp(v - v.max(axis=-1, keepdims=True))
            return {y: e / e.sum(axis=-1, keepdims=True)}
        v = env[x] * mv
        d = v - v.mean(axis=1, keepdims=True) if kind == "layernorm" else v
        return {y: d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-5) * env[g][None, :]}
    return Case("masked", b.text(), formula, forms=(kind, mshape))


def bmm_bias(rng: random.Random, nm: Names) -> Case:
    """C[b, i, j] = bias + sum_k A[b, i, k] * W[..]: a batched linear layer (W [N, K] shared by the batch, as torch
    stores it, or [K, N]) or a batched matmul (W [B, K, N]); the bias per column, per batch and column or per row;
    A stored [B, M, K] or [B, K, M]; a relu in the nest now and then."""
    nb, m, k, n = rng.choice([1, 2, 3, 4]), size(rng, 200), size(rng, 200), size(rng, 200)
    syms = [nm(s) for s in ("Bt", "M", "K", "N")]
    sb, sm, sk, sn = syms
    bld = Builder(nm("bmm"))
    bld.defaults = list(zip(syms, [nb, m, k, n]))
    a, w, bias, c, dt = nm("A"), nm("W"), nm("bias"), nm("C"), rng.choice(DTYPES)
    bv, iv, jv, kv = nm("b"), nm("i"), nm("j"), nm("k")
    a_t = rng.random() < 0.25
    bld.param(a, dt, [sb, sk, sm] if a_t else [sb, sm, sk])
    wl = rng.choice(["nk", "kn", "bkn"])
    bld.param(w, dt, {"nk": [sn, sk], "kn": [sk, sn], "bkn": [sb, sk, sn]}[wl])
    bl = rng.choice(["n", "n", "bn", "m"])
    bld.param(bias, rng.choice(["f32", dt]), {"n": [sn], "bn": [sb, sn], "m": [sm]}[bl])
    bld.decl(c, rng.choice(DTYPES), [sb, sm, sn], out=True)
    relu = rng.random() < 0.3
    dst = f"{c}[{bv}, {iv}, {jv}]"
    ar = f"{a}[{bv}, {kv}, {iv}]" if a_t else f"{a}[{bv}, {iv}, {kv}]"
    wr = {"nk": f"{w}[{jv}, {kv}]", "kn": f"{w}[{kv}, {jv}]", "bkn": f"{w}[{bv}, {kv}, {jv}]"}[wl]
    br = {"n": f"{bias}[{jv}]", "bn": f"{bias}[{bv}, {jv}]", "m": f"{bias}[{iv}]"}[bl]
    lines = [f"{dst} = {br}", f"for {kv} in 0..{sk}:", f"  {dst} += {ar} * {wr}"]
    lines += [f"{dst} = relu({dst})"] if relu else []
    bld.loops([(bv, sb), (iv, sm), (jv, sn)], lines)

    def formula(env: dict) -> dict:
        av = np.swapaxes(env[a], 1, 2) if a_t else env[a]
        wv = {"nk": lambda: env[w].T[None], "kn": lambda: env[w][None], "bkn": lambda: env[w]}[wl]()
        bv_ = {"n": lambda: env[bias][None, None, :], "bn": lambda: env[bias][:, None, :],
               "m": lambda: env[bias][None, :, None]}[bl]()
        out = np.einsum("bik,bkj->bij", av, np.broadcast_to(wv, (nb, k, n))) + bv_
        return {c: np.maximum(out, 0) if relu else out}
    return Case("bmm_bias", bld.text(), formula, forms=(wl, bl) + (("relu",) if relu else ()))
