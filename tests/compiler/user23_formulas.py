"""NumPy float64 formulas of tests/programs/user23/ (user23's survey of a new user's next programs), written from
the operations' definitions (torch's documentation), independent of tilec's reference evaluator."""
from __future__ import annotations

import math

import numpy as np


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _lse(x):
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sqdist(a):
    return {"Dm": ((a["A"][:, None, :] - a["B"][None, :, :]) ** 2).sum(axis=2)}


def cosine_matrix(a):
    na = np.sqrt((a["A"] ** 2).sum(1) + 1e-8)
    nb = np.sqrt((a["B"] ** 2).sum(1) + 1e-8)
    return {"S": a["A"] @ a["B"].T / na[:, None] / nb[None, :]}


def normalize_rows(a):
    x = a["X"]
    return {"Y": x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)}


def logsumexp(a):
    return {"L": _lse(a["X"])}


def ce_label_smoothing(a):
    # -sum_j (0.9 t_j + 0.1 / N) log p_j for a target t summing to 1 (one-hot); written for any t as the program
    # states it (the test's T is random)
    x, t = a["X"], a["T"]
    return {"L": _lse(x) - 0.9 * (t * x).sum(axis=1) - 0.1 * x.mean(axis=1)}


def geglu_ffn(a):
    x = a["X"]
    return {"Y": (_gelu(x @ a["W1"]) * (x @ a["W2"])) @ a["W3"]}


def geglu(a):
    x = a["X"]
    n = x.shape[1] // 2
    return {"Y": _gelu(x[:, :n]) * x[:, n:]}


def instance_norm1d(a):
    x = a["X"]
    mu, var = x.mean(axis=2, keepdims=True), x.var(axis=2, keepdims=True)
    return {"Y": (x - mu) / np.sqrt(var + 1e-5)}


def rmsnorm_residual(a):
    h = a["X"] + a["R"]
    return {"H": h, "Y": h / np.sqrt((h ** 2).mean(axis=1, keepdims=True) + 1e-6) * a["g"]}


def alibi_scores(a):
    s = a["Q"].shape[1]
    dist = np.arange(s)[None, :] - np.arange(s)[:, None]
    sc = np.einsum("hid,hjd->hij", a["Q"], a["K"]) / math.sqrt(a["Q"].shape[2]) + a["slope"][:, None, None] * dist
    return {"P": _softmax(sc)}


def alibi_pos(a):
    pos = a["pos"]
    sc = np.einsum("hid,hjd->hij", a["Q"], a["K"]) / math.sqrt(a["Q"].shape[2])
    return {"P": _softmax(sc + a["slope"][:, None, None] * (pos[None, None, :] - pos[None, :, None]))}


def relpos_bias(a):
    s = a["Q"].shape[1]
    rel = np.arange(s)[:, None] - np.arange(s)[None, :] + s - 1
    return {"Sc": np.einsum("hid,hjd->hij", a["Q"], a["K"]) + a["Bt"][:, rel]}


def gram_style(a):
    f = a["F"]
    n, c, h, w = f.shape
    x = f.reshape(n, c, h * w)
    return {"G": np.einsum("ncl,ndl->ncd", x, x) / (c * h * w)}


def conv1d_dilated(a):
    x, w = a["X"], a["Wt"]
    lo = x.shape[2] - 4
    y = sum(np.einsum("ncl,kc->nkl", x[:, :, 2 * r:2 * r + lo], w[:, :, r]) for r in range(3))
    return {"Y": y + a["b"][None, :, None]}


def ws_conv(a):
    w = a["Wt"]
    mu = w.mean(axis=(1, 2, 3), keepdims=True)
    ws = (w - mu) / np.sqrt(w.var(axis=(1, 2, 3), keepdims=True) + 1e-5)
    x = a["X"]
    h, wd = x.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = sum(np.einsum("nchw,kc->nkhw", xp[:, :, r:r + h, s:s + wd], ws[:, :, r, s]) for r in range(3) for s in range(3))
    return {"Y": y}


def bilinear_up2(a):
    return {"Y": np.einsum("ih,chw,jw->cij", a["Uh"], a["X"], a["Uw"])}


def bilinear_up2_taps(a):
    x = a["X"]
    left = np.pad(x, ((0, 0), (1, 0)))[:, :-1]
    right = np.pad(x, ((0, 0), (0, 1)))[:, 1:]
    y = np.empty((x.shape[0], 2 * x.shape[1]))
    y[:, 0::2], y[:, 1::2] = 0.75 * x + 0.25 * left, 0.75 * x + 0.25 * right
    return {"Y": y}


def minmax_norm(a):
    x = a["X"]
    mn, mx = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    return {"Y": (x - mn) / (mx - mn + 1e-6)}


def fake_quant(a):
    x = a["X"]
    am = np.abs(x).max(axis=1, keepdims=True)
    return {"Y": np.clip(x * 127 / (am + 1e-6), -128, 127)}


def softmax_entropy(a):
    p = _softmax(a["X"])
    return {"E": -(p * np.log(p)).sum(axis=1)}


def huber_loss(a):
    d = np.abs(a["P"] - a["T"])
    return {"L": np.where(d < 1, 0.5 * d * d, d - 0.5).mean(axis=1)}


def batch_cosine(a):
    x, y = a["A"], a["C"]
    num = (x * y).sum(axis=2)
    return {"S": num / np.maximum(np.sqrt((x * x).sum(axis=2) * (y * y).sum(axis=2)), 1e-8)}


def sqdist_matmul(a):
    return sqdist(a)


def late_norms(a):
    return {"S": 2 * a["A"] @ a["B"].T + (a["B"] ** 2).sum(axis=1)[None, :]}


def group_norm_silu(a):
    x = a["X"]
    n, c, h, w = x.shape
    g = 4
    xg = x.reshape(n, g, c // g * h * w)
    y = ((xg - xg.mean(axis=2, keepdims=True)) / np.sqrt(xg.var(axis=2, keepdims=True) + 1e-5)).reshape(x.shape)
    y = y * a["g"][None, :, None, None] + a["b"][None, :, None, None]
    return {"Y": y / (1 + np.exp(-y))}


FORMULAS = {name: f for name, f in globals().items() if callable(f) and not name.startswith("_")
            and f.__module__ == __name__}
