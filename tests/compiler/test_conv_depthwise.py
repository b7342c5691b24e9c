"""Depthwise convolutions `Y[n, c, y, x] += X[n, c, y + r, x + s] * W[c, r, s]` (no channel contraction): each
output channel tile reads the same input channel tile of the band; per tap, ScalarE multiplies the shifted band by
the tap's per-channel weight (an activation with a per-partition scale column) and VectorE adds it into an fp32
accumulator in SBUF, which the usual epilogue (bias, relu, residual, pool) evicts. Checked against NumPy (np.pad +
a per-tap product) on the NKI interpreter for f32, f16 and bf16, with padding, stride, several bands and channel
tiles."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_padded import rounded, run


def depthwise_ref(x, w, stride=1, pad=1, bias=None):
    n, c, h, wd = x.shape
    _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    out = np.zeros((n, c, ho, wo))
    for i in range(r):
        for j in range(s):
            out += w[None, :, i, j, None, None] * xp[:, :, i:i + stride * (ho - 1) + 1:stride,
                                                     j:j + stride * (wo - 1) + 1:stride]
    return out + (bias[None, :, None, None] if bias is not None else 0)


DW = """\
kernel dw(X: {dt}[N, C, H, W], Wd: {dt}[C, 3, 3], b: {dt}[C]) -> Y
  default N = 2, C = 200, H = 15, W = 12
  Y: {dt}[N, C, H, W]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    Y[n, c, y, x] = b[c]
    for r in 0..3, s in 0..3:
      Y[n, c, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wd[c, r, s]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_padded_depthwise_several_bands_and_channel_tiles(dt):
    prog, c, inputs, out = run(DW.format(dt=dt), "split Y.y, 5\n")
    assert "nc_matmul" not in c.source and "scale=" in c.source
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], depthwise_ref(x["X"], x["Wd"], bias=x["b"]))


DW_S2_RELU = """\
kernel dws(X: f32[N, C, H, W], Wd: f32[C, 3, 3]) -> Y
  default N = 1, C = 96, H = 16, W = 14
  T: f32[N, C, H / 2, W / 2]
  Y: f32[N, C, H / 2, W / 2]
  for n in 0..N, c in 0..C, y in 0..H / 2, x in 0..W / 2:
    T[n, c, y, x] = 0
    for r in 0..3, s in 0..3:
      T[n, c, y, x] += (X[n, c, 2*y + r - 1, 2*x + s - 1] ?? 0) * Wd[c, r, s]
  for n in 0..N, c in 0..C, y in 0..H / 2, x in 0..W / 2:
    Y[n, c, y, x] = relu(T[n, c, y, x])
"""


def test_strided_depthwise_with_fused_relu():
    prog, c, inputs, out = run(DW_S2_RELU)
    assert "fused Y" in c.stages["select"]
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], np.maximum(depthwise_ref(x["X"], x["Wd"], stride=2), 0))


def test_depthwise_weights_stored_taps_first_compile():
    """Once a located error; since lang15 the weights are permuted to [c, r, s] first (lang_split.py)."""
    text = DW.format(dt="f32").replace("Wd: f32[C, 3, 3]", "Wd: f32[3, 3, C]").replace("Wd[c, r, s]", "Wd[r, s, c]")
    prog, c, inputs, out = run(text)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], depthwise_ref(x["X"], x["Wd"].transpose(2, 0, 1), bias=x["b"]))


@pytest.mark.parametrize("schedule", ["hoist Wd, Y.c\n", "tile Y.c, 40\nsplit Y.y, 3\n", "reorder Y, c, n, y\n"])
def test_depthwise_under_schedules(schedule):
    prog, c, inputs, out = run(DW.format(dt="f32"), schedule)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], depthwise_ref(x["X"], x["Wd"], bias=x["b"]))
