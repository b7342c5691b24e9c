"""NumPy float64 formulas of tests/programs/user20/ (a new user's next programs), written from the layers'
definitions (torch's documentation), independent of tilec's reference evaluator."""
from __future__ import annotations

import numpy as np


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def se_block(a):
    g = a["X"].mean(axis=(2, 3))
    s = np.maximum(g @ a["W1"].T, 0) @ a["W2"].T
    return {"Y": a["X"] * _sigmoid(s)[:, :, None, None]}


def channel_shuffle(a, groups=4):
    n, c, h, w = a["X"].shape
    return {"Y": a["X"].reshape(n, groups, c // groups, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)}


def pixel_shuffle(a, r=2):
    n, c4, h, w = a["X"].shape
    x = a["X"].reshape(n, c4 // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
    return {"Y": x.reshape(n, c4 // (r * r), h * r, w * r)}


def pixel_unshuffle(a, r=2):
    n, c, h2, w2 = a["X"].shape
    x = a["X"].reshape(n, c, h2 // r, r, w2 // r, r).transpose(0, 1, 3, 5, 2, 4)
    return {"Y": x.reshape(n, c * r * r, h2 // r, w2 // r)}


def conv1d_causal(a):
    x, wt = a["X"], a["Wt"]
    r = wt.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (r - 1, 0)))
    length = x.shape[2]
    y = sum(np.einsum("ncl,kc->nkl", xp[:, :, t:t + length], wt[:, :, t]) for t in range(r))
    return {"Y": y + a["b"][None, :, None]}


def conv_transpose2x2(a):
    y = np.einsum("nchw,ckij->nkhiwj", a["X"], a["Wt"])
    n, k, h, _, w, _ = y.shape
    return {"Y": y.reshape(n, k, 2 * h, 2 * w) + a["b"][None, :, None, None]}


def _conv3x3_same(x, wt):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, w = x.shape[2:]
    return sum(np.einsum("nchw,kc->nkhw", xp[:, :, r:r + h, s:s + w], wt[:, :, r, s])
               for r in range(3) for s in range(3))


def upsample_conv(a):
    u = a["X"].repeat(2, axis=2).repeat(2, axis=3)
    return {"Y": _conv3x3_same(u, a["Wt"])}


def concat_conv1x1(a):
    t = np.concatenate([a["A"], a["B"]], axis=1)
    return {"Y": np.einsum("nchw,kc->nkhw", t, a["Wt"])}


def avgpool_flatten_fc(a):
    x = a["X"]
    n, c, h2, w2 = x.shape
    p = x.reshape(n, c, h2 // 2, 2, w2 // 2, 2).mean(axis=(3, 5)).reshape(n, -1)
    return {"Y": p @ a["Wt"] + a["b"]}


def channel_max_mean(a):
    return {"Mx": a["X"].max(axis=1), "Mn": a["X"].mean(axis=1)}


def glu(a):
    x = a["X"]
    half = x.shape[1] // 2
    return {"Y": x[:, :half] * _sigmoid(x[:, half:])}


def batched_matvec(a):
    return {"y": np.einsum("bmk,bk->bm", a["A"], a["x"])}


def causal_scores(a):
    return {"P": np.einsum("hid,hjd->hij", a["Q"], a["K"]) * 0.125 + a["Mk"][None]}


def strided_shortcut(a):
    return {"Y": np.einsum("nchw,kc->nkhw", a["X"][:, :, ::2, ::2], a["Wt"])}


def mean_hw_bias(a):
    return {"Y": a["X"].mean(axis=(2, 3)) + a["b"]}


def _affine(x, g, b, axis):
    shape = [1] * x.ndim
    shape[axis] = -1
    return x * g.reshape(shape) + b.reshape(shape)


def instance_norm(a):
    x = a["X"]
    mu, var = x.mean(axis=(2, 3), keepdims=True), x.var(axis=(2, 3), keepdims=True)
    return {"Y": _affine((x - mu) / np.sqrt(var + 1e-5), a["g"], a["b"], 1)}


def channel_layernorm(a):
    x = a["X"]
    mu, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    return {"Y": _affine((x - mu) / np.sqrt(var + 1e-6), a["g"], a["b"], 1)}


def group_norm(a, groups=4):
    x = a["X"]
    n, c, h, w = x.shape
    xg = x.reshape(n, groups, -1)
    mu, var = xg.mean(axis=2, keepdims=True), xg.var(axis=2, keepdims=True)
    return {"Y": _affine(((xg - mu) / np.sqrt(var + 1e-5)).reshape(n, c, h, w), a["g"], a["b"], 1)}


def rope(a):
    x, cs, sn = a["X"], a["Cs"], a["Sn"]
    half = cs.shape[1]
    x1, x2 = x[:, :half], x[:, half:]
    return {"Y": np.concatenate([x1 * cs - x2 * sn, x2 * cs + x1 * sn], axis=1)}


def heads_scores(a, heads=2):
    s, e = a["Q"].shape
    q, k = a["Q"].reshape(s, heads, e // heads), a["K"].reshape(s, heads, e // heads)
    return {"P": np.einsum("ihd,jhd->hij", q, k)}


def attn_values(a):
    return {"O": a["P"] @ a["V"]}


def reverse_seq(a):
    return {"Y": 2 * a["X"][:, ::-1]}


def pad_const(a):
    return {"Y": np.pad(a["X"], ((0, 0), (0, 0), (1, 1), (1, 1)))}


def center_crop(a):
    h, w = a["D"].shape[2:]
    return {"Y": a["E"][:, :, 4:4 + h, 4:4 + w] + a["D"]}


def bn_nhwc(a):
    return {"Y": np.clip(a["X"] * a["g"] + a["b"], 0, 6)}


def cosine_sim(a):
    x, y = a["A"], a["B"]
    ab, aa, bb = (x * y).sum(1), (x * x).sum(1), (y * y).sum(1)
    return {"Y": ab / np.sqrt(aa * bb + 1e-8)}


def dwsep(a):
    x = a["X"]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, w = x.shape[2:]
    d = sum(xp[:, :, r:r + h, s:s + w] * a["Wd"][None, :, r, s, None, None] for r in range(3) for s in range(3))
    return {"Y": np.einsum("nchw,kc->nkhw", np.maximum(d, 0), a["Wp"])}


FORMULAS = {name: fn for name, fn in dict(globals()).items() if callable(fn) and not name.startswith("_")
            and fn.__module__ == __name__}
