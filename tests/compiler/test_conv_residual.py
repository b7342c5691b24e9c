"""Element-wise consumers of a convolution or matmul fused on the PSUM eviction: a residual add of another input
(`Y = conv + S`), with a relu after it (`Y = relu(conv + S)`, the ResNet block's last statement) and with the conv's
own bias and relu before it; the residual band is loaded beside the output band and conv never reaches HBM.
Checked against NumPy (einsum per tap) on the NKI interpreter for f32, f16 and bf16."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_padded import NARROW, conv_ref, rounded, run

RESIDUAL = """\
kernel res(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3], b: {dt}[K], S: {dt}[N, K, H - 2, W - 2]) -> Y
  default N = 2, C = 136, H = 14, W = 11, K = 144
  conv: {dt}[N, K, H - 2, W - 2]
  Y: {dt}[N, K, H - 2, W - 2]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    conv[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    Y[n, k, y, x] = {expr}
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("expr", ["conv[n, k, y, x] + S[n, k, y, x]", "relu(S[n, k, y, x] + conv[n, k, y, x])"])
def test_residual_add_on_the_eviction(dt, expr):
    prog, c, inputs, out = run(RESIDUAL.format(dt=dt, expr=expr), "split conv.y, 4\n")
    assert "+ S" in c.stages["select"] and "fused Y" in c.stages["select"]
    assert c.source.count("nl.shared_hbm") == 1  # Y only: conv stays on chip
    x = rounded(inputs, dt)
    conv = conv_ref(x["X"], x["Wt"], pad=(0, 0), bias=x["b"]).astype(NARROW[dt]).astype(np.float64)
    want = conv + x["S"]
    assert_matches(prog, "Y", out["Y"], np.maximum(want, 0) if "relu" in expr else want)


def test_relu_then_residual_then_relu():
    text = RESIDUAL.format(dt="f32", expr="conv[n, k, y, x] + S[n, k, y, x]").replace(
        "  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:\n    Y",
        "  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:\n    conv[n, k, y, x] = relu(conv[n, k, y, x])\n"
        "  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:\n    Y", 1)
    text += "  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:\n    Y[n, k, y, x] = relu(Y[n, k, y, x])\n"
    prog, c, inputs, out = run(text)
    x = rounded(inputs, "f32")
    want = np.maximum(np.maximum(conv_ref(x["X"], x["Wt"], pad=(0, 0), bias=x["b"]), 0) + x["S"], 0)
    assert_matches(prog, "Y", out["Y"], want)


MATMUL_RESIDUAL = """\
kernel mres(A: f32[M, K], B: f32[K, P], D: f32[M, P]) -> C
  default M = 200, K = 300, P = 96
  T: f32[M, P]
  C: f32[M, P]
  for i in 0..M, j in 0..P:
    T[i, j] = 0
    for k in 0..K:
      T[i, j] += A[i, k] * B[k, j]
  for i in 0..M, j in 0..P:
    C[i, j] = D[i, j] + T[i, j]
"""


def test_matmul_plus_a_matrix():
    prog, c, inputs, out = run(MATMUL_RESIDUAL)
    assert "+ D" in c.stages["select"]
    x = rounded(inputs, "f32")
    assert_matches(prog, "C", out["C"], x["A"] @ x["B"] + x["D"])


BATCH = RESIDUAL.replace("default N = 2, C = 136, H = 14, W = 11, K = 144", "default N = 3, C = 16, H = 9, W = 10, K = 32")


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("expr", ["conv[n, k, y, x] + S[n, k, y, x]", "relu(S[n, k, y, x] + conv[n, k, y, x])"])
def test_batch_residual_in_one_buffer(dt, expr):
    """Images of one band and one out-channel tile: the batch's residual in one buffer allocated before the image
    loop, image n's band loaded into its slice (conv_epilogue.batch_residual), so no load waits for an earlier
    image's adds."""
    prog, c, inputs, out = run(BATCH.format(dt=dt, expr=expr))
    src = c.source
    assert "S_skip[:, n]" in src and "S_skip = nl.ndarray((TILE_K, SIZE_N, " in src
    assert src.index("S_skip = nl.ndarray") < src.index("for n in ")
    x = rounded(inputs, dt)
    conv = conv_ref(x["X"], x["Wt"], pad=(0, 0), bias=x["b"]).astype(NARROW[dt]).astype(np.float64)
    want = conv + x["S"]
    assert_matches(prog, "Y", out["Y"], np.maximum(want, 0) if "relu" in expr else want)
