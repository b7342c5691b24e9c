"""NumPy float64 formulas of tests/programs/user24/ (user24's survey: LLaMA/EfficientNet/Conformer blocks, losses,
audio convs, data movement in NHWC), written from the layers' definitions (torch's / ONNX's documentation),
independent of tilec's reference evaluator. INPUTS gives the programs whose inputs are not any signed values (a
one-hot target, a probability) their own."""
from __future__ import annotations

import math

import numpy as np


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _silu(x):
    return x * _sigmoid(x)


def _softplus(x):
    return np.logaddexp(0, x)


def _lse(x):
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]


def _pad(x, lo, hi):
    """Zero padding of the last len(lo) axes."""
    width = [(0, 0)] * (x.ndim - len(lo)) + list(zip(lo, hi))
    return np.pad(x, width)


def _dw2d(x, w, stride=1):
    """Depthwise 3x3 'same' (padding 1) conv of NCHW x with w [C, 3, 3], any stride."""
    xp = _pad(x, (1, 1), (1, 1))
    h, wd = -(-x.shape[2] // stride), -(-x.shape[3] // stride)
    out = np.zeros(x.shape[:2] + (h, wd))
    for r in range(3):
        for s in range(3):
            tap = xp[:, :, r:r + stride * h:stride, s:s + stride * wd:stride]
            out += tap * w[None, :, r, s, None, None]
    return out


def swiglu_ffn(a):
    x = a["X"]
    return {"Y": (_silu(x @ a["W1"]) * (x @ a["W3"])) @ a["W2"]}


def rmsnorm_linear(a):
    x = a["X"]
    xn = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * a["g"]
    return {"Y": xn @ a["Wq"]}


def layernorm_qkv(a):
    x = a["X"]
    xn = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * a["g"] + a["b"]
    return {"Y": xn @ a["W"] + a["c"]}


def ce_mean(a):
    x, t = a["X"], a["T"]
    return {"L": np.array([(_lse(x) - (t * x).sum(1)).mean()])}


def top1_accuracy(a):
    x, t = a["X"], a["T"]
    return {"A": np.array([(x.argmax(1) == t.argmax(1)).mean()])}


def embedding_bag(a):
    return {"Y": a["C"] @ a["E"] / (np.abs(a["n"])[:, None] + 1)}


def instance_norm_relu(a):
    x = a["X"]
    mu, var = x.mean(axis=(2, 3), keepdims=True), x.var(axis=(2, 3), keepdims=True)
    y = (x - mu) / np.sqrt(var + 1e-5) * a["g"][None, :, None, None] + a["b"][None, :, None, None]
    return {"Y": np.maximum(y, 0)}


def audio_conv1d_s2(a):
    x, w = a["X"], a["Wt"]
    t = (x.shape[2] - 1) // 2
    taps = np.stack([x[:, :, r:r + 2 * t:2] for r in range(3)], axis=-1)  # [N, C, T, 3]
    return {"Y": _gelu(np.einsum("nctr,kcr->nkt", taps, w))}


def causal_dwconv1d(a):
    x, w = a["X"], a["Wt"]
    xp = _pad(x, (3,), (0,))
    z = sum(xp[:, :, r:r + x.shape[2]] * w[None, :, r, None] for r in range(4)) + a["b"][None, :, None]
    return {"Y": _silu(z)}


def space_to_depth_nhwc(a):
    x = a["X"]
    n, h2, w2, c = x.shape
    y = x.reshape(n, h2 // 2, 2, w2 // 2, 2, c).transpose(0, 1, 3, 2, 4, 5)
    return {"Y": y.reshape(n, h2 // 2, w2 // 2, 4 * c)}


def separable_s2(a):
    d = _dw2d(a["X"], a["Wd"], stride=2) + a["bd"][None, :, None, None]
    return {"Y": np.einsum("kc,nchw->nkhw", a["Wp"], np.clip(d, 0, 6)) + a["bp"][None, :, None, None]}


def channel_shuffle_nhwc(a):
    x = a["X"]
    n, h, w, c = x.shape
    g = 4
    return {"Y": x.reshape(n, h, w, g, c // g).swapaxes(3, 4).reshape(n, h, w, c)}


def avgpool_conv1x1(a):
    x = a["X"]
    p = _dw2d(x, np.full((x.shape[1], 3, 3), 1 / 9))
    return {"Y": np.maximum(np.einsum("kc,nchw->nkhw", a["Wt"], p), 0)}


def upsample_shifts(a):
    x = a["X"]
    left, right = _pad(x, (1,), (0,))[:, :-1], _pad(x, (0,), (1,))[:, 1:]
    return {"Y": np.stack([0.75 * x + 0.25 * left, 0.75 * x + 0.25 * right], axis=-1)}


def focal_loss(a):
    x, t = a["X"], a["T"]
    p = _sigmoid(x)
    loss = 0.25 * t * (1 - p) ** 2 * _softplus(-x) + 0.75 * (1 - t) * p ** 2 * _softplus(x)
    return {"L": loss.mean(axis=1)}


def huber_mean(a):
    d = np.abs(a["P"] - a["T"])
    q = np.minimum(d, 0.5)
    return {"L": np.array([(0.5 * q * q + 0.5 * (d - q)).mean()])}


def smoothed_kl(a):
    x, t = a["X"], a["T"]
    q = 0.9 * t + 0.1 / x.shape[1]
    logp = x - _lse(x)[:, None]
    return {"L": (q * (np.log(q) - logp)).sum(axis=1)}


def weight_norm_linear(a):
    v = a["V"]
    w = v * (a["g"] / np.linalg.norm(v, axis=1))[:, None]
    return {"Y": a["X"] @ w.T}


def gram_batch_mean(a):
    f = a["F"]
    return {"G": np.einsum("ncl,ndl->cd", f, f) / (f.shape[0] * f.shape[2])}


def grn(a):
    x = a["X"]
    gx = np.sqrt((x * x).sum(axis=(1, 2), keepdims=True))
    nx = gx / (gx.mean(axis=3, keepdims=True) + 1e-6)
    return {"Y": a["g"] * x * nx + a["b"] + x}


def eca_block(a):
    x, k = a["X"], a["k"]
    p = x.mean(axis=(2, 3))
    pp = _pad(p, (1,), (1,))
    att = k[0] * pp[:, :-2] + k[1] * pp[:, 1:-1] + k[2] * pp[:, 2:]
    return {"Y": x * _sigmoid(att)[:, :, None, None]}


def mish_hswish(a):
    x = a["X"]
    return {"Y": x * np.tanh(_softplus(x)), "Z": x * np.clip(x + 3, 0, 6) / 6}


def temporal_pool_fc(a):
    return {"Y": a["X"].mean(axis=2) @ a["Wt"].T + a["b"]}


def dice_loss(a):
    p, t = _sigmoid(a["X"]), a["T"]
    return {"L": 1 - (2 * (p * t).sum(1) + 1) / (p.sum(1) + t.sum(1) + 1)}


def scalar_mix(a):
    w = np.exp(a["s"] - a["s"].max())
    w = w / w.sum()
    return {"Y": a["gam"][0] * np.einsum("l,ltd->td", w, a["Hs"])}


def spatial_attention(a):
    x = a["X"]
    maps = _pad(np.stack([x.mean(axis=1), x.max(axis=1)], axis=1), (3, 3), (3, 3))
    h, w = x.shape[2:]
    att = sum(maps[:, q, r:r + h, s:s + w] * a["Wt"][q, r, s] for q in range(2) for r in range(7) for s in range(7))
    return {"Y": x * _sigmoid(att)[:, None]}


def conformer_conv(a):
    x = a["X"]
    c = x.shape[1]
    u = np.einsum("kc,ncl->nkl", a["W1"], x)
    g = u[:, :c] * _sigmoid(u[:, c:])
    gp = _pad(g, (1,), (1,))
    d = sum(gp[:, :, r:r + x.shape[2]] * a["Wd"][None, :, r, None] for r in range(3))
    return {"Y": np.einsum("kc,ncl->nkl", a["W2"], _silu(d * a["s"][None, :, None] + a["t"][None, :, None]))}


def mbconv_se(a):
    x = a["X"]
    e = _silu(np.einsum("ec,nchw->nehw", a["We"], x))
    d = _silu(_dw2d(e, a["Wd"]))
    z = _silu(d.mean(axis=(2, 3)) @ a["W1"].T)
    s = _sigmoid(z @ a["W2"].T)
    return {"Y": x + np.einsum("ce,nehw->nchw", a["Wp"], d * s[:, :, None, None])}


def ws_conv1x1(a):
    w = a["Wt"]
    ws = (w - w.mean(1, keepdims=True)) / np.sqrt(w.var(1, keepdims=True) + 1e-5)
    return {"Y": np.einsum("kc,nchw->nkhw", ws, a["X"])}


def depth_to_space_crd(a):
    return {"Y": a["X"].transpose(0, 1, 4, 2, 5, 3)}


def _one_hot(rng, shape):
    return np.eye(shape[1], dtype=np.float32)[rng.integers(0, shape[1], shape[0])]


INPUTS = {  # program -> the inputs it needs other than signed values: (name -> maker(rng, shape))
    "top1_accuracy": {"T": _one_hot},
    "ce_mean": {"T": _one_hot},
    "smoothed_kl": {"T": _one_hot},
}

FORMULAS = {name: fn for name, fn in globals().items() if callable(fn) and not name.startswith("_")
            and fn.__module__ == __name__}
