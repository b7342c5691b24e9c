"""The fuzzer's network blocks: one to three convolutions in a row, as ResNet, ResNeXt and MobileNet layers write
them (examples/resnet_block.tl, examples/mobilenet_block.tl), each with an independent NumPy formula.

A stage is a dense, depthwise or grouped convolution, 1x1 or 3x3 (zero padded "same" or not), that starts from 0,
a bias or the block's input (a residual: `Y[..] = X[..]` then `+=`), and reads the previous stage through relu or
relu6 (`min(relu(A[..]), 6)`) or as it is. Intermediates are declared tensors of random dtypes: the formula rounds
each stage to its dtype, as the reference evaluator does.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from tilec.testing.gen import DTYPES, Builder, Case, Names, rounded, size

ACTS = {"": lambda x: x, "relu": lambda x: np.maximum(x, 0.0), "relu6": lambda x: np.clip(x, 0.0, 6.0)}


@dataclass(frozen=True)
class Stage:
    kind: str  # dense | depthwise | grouped
    r: int  # 1 or 3
    pad: int  # 0 or (r - 1) // 2
    act: str  # "", relu, relu6: applied to the stage's input as it is read
    init: str  # zero | bias | residual
    cin: int
    cout: int
    groups: int = 1


def _stages(rng: random.Random, c0: int, h: int, w: int) -> list[Stage]:
    out: list[Stage] = []
    c = c0
    for t in range(rng.choice([1, 2, 2, 3])):
        kind = rng.choice(["dense", "dense", "depthwise", "grouped"])
        r = 1 if kind == "dense" and rng.random() < 0.4 else 3
        pad = (r - 1) // 2 if rng.random() < 0.7 else 0
        if r == 3 and not pad and (h < 3 or w < 3):
            pad = 1
        groups = 1
        if kind == "depthwise":
            cout = c
        elif kind == "grouped":
            groups = rng.choice([g for g in (2, 3, 4, 8) if c % g == 0] or [1])
            cout = groups * rng.randint(1, 6)
        else:
            cout = min(size(rng, 160), 160)
        h, w = h + 2 * pad - r + 1, w + 2 * pad - r + 1
        act = "" if t == 0 else rng.choice(["", "relu", "relu6"])
        out.append(Stage(kind, r, pad, act, rng.choice(["zero", "bias"]), c, cout, groups))
        c = cout
    return out


def block(rng: random.Random, nm: Names) -> Case:
    n, c0 = rng.choice([1, 1, 2]), min(size(rng, 96), 96)
    h0, w0 = rng.randint(1, 12), rng.randint(1, 14)
    stages = _stages(rng, c0, h0, w0)
    # the last stage may add the block's input when it keeps its shape (a ResNet / MobileNet residual)
    hs, ws = [h0], [w0]
    for st in stages:
        hs.append(hs[-1] + 2 * st.pad - st.r + 1)
        ws.append(ws[-1] + 2 * st.pad - st.r + 1)
    last = stages[-1]
    if last.cout == c0 and (hs[-1], ws[-1]) == (h0, w0) and rng.random() < 0.6:
        stages[-1] = Stage(last.kind, last.r, last.pad, last.act, "residual", last.cin, last.cout, last.groups)
    syms = {v: nm(v) for v in ("N", "C", "H", "W")}
    b = Builder(nm("block"))
    b.defaults = [(syms["N"], n), (syms["C"], c0), (syms["H"], h0), (syms["W"], w0)]
    x_name, x_dt = nm("X"), rng.choice(DTYPES)
    b.param(x_name, x_dt, [syms["N"], syms["C"], syms["H"], syms["W"]])
    chan, hexp, wexp = syms["C"], syms["H"], syms["W"]
    inp, in_dt, params, names = x_name, x_dt, {}, []
    for t, st in enumerate(stages):
        wname = nm(f"W{t + 1}")
        cname = chan if st.kind == "depthwise" else str(st.cout)
        per = f"{st.cin // st.groups}"
        wdims = [cname] + ([] if st.kind == "depthwise" else [chan if st.kind == "dense" else per])
        wdims += [str(st.r), str(st.r)] if st.r > 1 or st.kind == "depthwise" else []
        wdt = in_dt  # the operands of one product share a dtype
        b.param(wname, wdt, wdims)
        bname = ""
        if st.init == "bias":
            bname = nm(f"b{t + 1}")
            b.param(bname, rng.choice(["f32", wdt]), [cname])
        shrink = st.r - 1 - 2 * st.pad
        hexp2 = f"{hexp} - {shrink}" if shrink else hexp
        wexp2 = f"{wexp} - {shrink}" if shrink else wexp
        out, out_dt = nm("Y" if t == len(stages) - 1 else "A"), rng.choice(DTYPES)
        b.decl(out, out_dt, [syms["N"], cname, hexp2, wexp2], out=t == len(stages) - 1)
        b.loops(*_stage_text(st, nm, inp, out, wname, bname, x_name, syms["N"], cname, hexp2, wexp2))
        params[out] = (st, wname, bname, out_dt)
        names.append(out)
        inp, in_dt, chan, hexp, wexp = out, out_dt, cname, hexp2, wexp2

    def formula(env: dict) -> dict:
        res, cur = {}, env[x_name]
        for out in names:
            st, wname, bname, out_dt = params[out]
            val = _stage_np(st, cur, env[wname], env[bname] if bname else None, env[x_name])
            res[out] = val
            cur = rounded(val, out_dt)
        return res
    forms = tuple(sorted({st.kind for st in stages} | {"residual" for st in stages if st.init == "residual"}
                         | {st.act for st in stages if st.act} | {"padded" for st in stages if st.pad}))
    return Case("block", b.text(), formula, forms=forms)


def _stage_text(st: Stage, nm: Names, inp: str, out: str, wname: str, bname: str, x_name: str, n_sym: str,
                k_sym: str, ho: str, wo: str) -> tuple[list[tuple[str, str]], list[str]]:
    v = {k: nm(k) for k in ("n", "k", "y", "x", "c", "r", "s", "g")}
    per_out = st.cout // st.groups
    if st.kind == "grouped":
        kk = f"{v['g']}*{per_out} + {v['k']}" if per_out > 1 else v["g"]
        outer = [(v["n"], n_sym), (v["g"], str(st.groups))] + ([(v["k"], str(per_out))] if per_out > 1 else [])
    else:
        kk = v["k"]
        outer = [(v["n"], n_sym), (v["k"], k_sym)]
    outer += [(v["y"], ho), (v["x"], wo)]
    dst = f"{out}[{v['n']}, {kk}, {v['y']}, {v['x']}]"
    init = {"zero": "0", "bias": f"{bname}[{kk}]", "residual": f"{x_name}[{v['n']}, {kk}, {v['y']}, {v['x']}]"}
    taps = [(v["r"], str(st.r)), (v["s"], str(st.r))] if st.r > 1 else []
    off = f" - {st.pad}" if st.pad else ""
    yy = f"{v['y']} + {v['r']}{off}" if st.r > 1 else v["y"]
    xx = f"{v['x']} + {v['s']}{off}" if st.r > 1 else v["x"]
    per_in = st.cin // st.groups
    if st.kind == "depthwise":
        ch, widx = kk, [kk]
    elif st.kind == "grouped":
        ch = f"{v['g']}*{per_in} + {v['c']}" if per_in > 1 else v["g"]
        widx = [kk] + ([v["c"]] if per_in > 1 else ["0"])
        taps = ([(v["c"], str(per_in))] if per_in > 1 else []) + taps
    else:
        ch, widx = v["c"], [kk, v["c"]]
        taps = [(v["c"], str(st.cin))] + taps
    widx += [v["r"], v["s"]] if st.r > 1 else []
    read = f"{inp}[{v['n']}, {ch}, {yy}, {xx}]"
    read = f"({read} ?? 0)" if st.pad else read
    read = {"": read, "relu": f"relu({read})", "relu6": f"min(relu({read}), 6)"}[st.act]
    term = f"{read} * {wname}[{', '.join(widx)}]"
    if not taps:  # a 1x1 depthwise or one-channel group: one term, no reduction loop
        return outer, [f"{dst} = {init[st.init]}", f"{dst} += {term}"]
    return outer, [f"{dst} = {init[st.init]}", f"for {', '.join(f'{a} in 0..{e}' for a, e in taps)}:",
                   f"  {dst} += {term}"]


def _stage_np(st: Stage, x: np.ndarray, wt: np.ndarray, bias, block_in: np.ndarray) -> np.ndarray:
    """The stage in float64: act(x) zero padded, the taps summed (torch's conv2d with groups), plus its start."""
    xa = np.pad(ACTS[st.act](x), ((0, 0), (0, 0), (st.pad, st.pad), (st.pad, st.pad)))
    n, _, hp, wp = xa.shape
    ho, wo = hp - st.r + 1, wp - st.r + 1
    if st.kind == "depthwise":
        wt = wt.reshape(st.cout, 1, st.r, st.r)
    elif wt.ndim == 2:
        wt = wt.reshape(wt.shape[0], wt.shape[1], 1, 1)
    out = np.zeros((n, st.cout, ho, wo))
    groups = st.cout if st.kind == "depthwise" else st.groups
    ci, co = st.cin // groups, st.cout // groups
    for g in range(groups):
        for r in range(st.r):
            for s in range(st.r):
                patch = xa[:, g * ci:(g + 1) * ci, r:r + ho, s:s + wo]
                out[:, g * co:(g + 1) * co] += np.einsum("nchw,kc->nkhw", patch, wt[g * co:(g + 1) * co, :, r, s])
    if st.init == "bias":
        out += bias[None, :, None, None]
    elif st.init == "residual":
        out += block_in
    return out
