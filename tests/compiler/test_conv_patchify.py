"""Strided convolutions whose stride equals their filter size (a ViT patch embedding, `X[n, c, 8*y + r, ..]` with
r in 0..8): the read `stride*y + r` has the form of a grouped convolution's merged channel index `g*Cg + c`, and
selection once took it for one (the fuzzer's seed 122: a (y, r) pair read as a channel, then refused). Checked
against NumPy (reshape into patches and one einsum) on the NKI interpreter."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_padded import rounded, run

PATCHIFY = """\
kernel patchify(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 8, 8], b: {dt}[K]) -> Y
  default N = 2, C = 3, K = 192, H = 64, W = 48
  Y: {dt}[N, K, H / 8, W / 8]
  for n in 0..N, k in 0..K, y in 0..H / 8, x in 0..W / 8:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..8, s in 0..8:
      Y[n, k, y, x] += X[n, c, 8*y + r, 8*x + s] * Wt[k, c, r, s]
"""

ROWS_ONLY = """\
kernel rows2(X: f16[N, C, H, W], Wt: f16[C, K, 2, 3]) -> Y
  default N = 1, C = 18, K = 56, H = 16, W = 38
  let Ho = (H - 2) / 2 + 1
  Y: f32[N, K, Ho, W - 2]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..W - 2:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..2, s in 0..3:
      Y[n, k, y, x] += X[n, c, 2*y + r, x + s] * Wt[c, k, r, s]
"""


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_patch_embedding(dt):
    prog, _, inputs, out = run(PATCHIFY.format(dt=dt))
    x = rounded(inputs, dt)
    n, c, h, w = x["X"].shape
    patches = x["X"].reshape(n, c, h // 8, 8, w // 8, 8)
    want = np.einsum("ncyrxs,kcrs->nkyx", patches, x["Wt"]) + x["b"][None, :, None, None]
    assert_matches(prog, "Y", out["Y"], want)


def test_stride_equal_to_taps_on_rows_only():
    """Stride 2 with two taps on the rows, stride 1 with three on the columns; weights laid out [C, K, ..]."""
    prog, _, inputs, out = run(ROWS_ONLY)
    x = rounded(inputs, "f16")
    xs, wt = x["X"], x["Wt"]
    ho, wo = (xs.shape[2] - 2) // 2 + 1, xs.shape[3] - 2
    want = sum(np.einsum("ncyx,ck->nkyx", xs[:, :, r:r + 2 * ho - 1:2, s:s + wo], wt[:, :, r, s])
               for r in range(2) for s in range(3))
    assert_matches(prog, "Y", out["Y"], want)
