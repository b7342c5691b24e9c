"""NumPy float64 references shared by tests in several folders (sliding windows, convolutions, padding)."""
from __future__ import annotations

import numpy as np


def windows(x: np.ndarray, r: int, stride: int = 1, dilation: int = 1, rs: int | None = None) -> np.ndarray:
    """[R*S, ..., Ho, Wo]: the taps of a 2-D sliding window over the last two axes (valid positions only)."""
    s = r if rs is None else rs
    h, w = x.shape[-2:]
    ho, wo = (h - dilation * (r - 1) - 1) // stride + 1, (w - dilation * (s - 1) - 1) // stride + 1
    return np.stack([x[..., p * dilation:p * dilation + stride * (ho - 1) + 1:stride,
                       q * dilation:q * dilation + stride * (wo - 1) + 1:stride] for p in range(r) for q in range(s)])


def conv(x: np.ndarray, wt: np.ndarray, stride: int = 1, dilation: int = 1, groups: int = 1) -> np.ndarray:
    """torch.nn.functional.conv2d without padding, float64: x [N, C, H, W], wt [K, C / groups, R, S]."""
    k, cg, r, s = wt.shape
    taps = windows(x.astype(np.float64), r, stride, dilation, s)  # [R*S, N, C, Ho, Wo]
    t, n, _, ho, wo = taps.shape
    taps = taps.reshape(t, n, groups, cg, ho, wo)
    w = wt.astype(np.float64).reshape(groups, k // groups, cg, r * s)
    return np.einsum("tngchw,gkct->ngkhw", taps, w).reshape(n, k, ho, wo)
