"""Dilated convolutions `X[n, c, y + 2*r, x + 2*s]`: the taps step through the input band by the dilation (the
band holds (BAND - 1) * stride + (R - 1) * dilation + 1 rows), with or without zero padding, checked against an
independent NumPy formula (np.pad + einsum per tap) on the NKI interpreter."""
from __future__ import annotations

import pytest

from compiler_helpers import assert_matches
from test_conv_padded import conv_ref, rounded, run

DILATED = """\
kernel dil(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3]) -> Y
  default N = 2, C = 144, H = 19, W = 13, K = 130
  Y: {dt}[N, K, H - 4, W - 4]
  for n in 0..N, k in 0..K, y in 0..H - 4, x in 0..W - 4:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += X[n, c, y + 2*r, x + 2*s] * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_dilated_conv_several_bands(dt):
    prog, c, inputs, out = run(DILATED.format(dt=dt), "split Y.y, 5\n")
    assert "r*2" in c.stages["hoist"] or "2*r" in c.stages["hoist"]
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], dilation=2, pad=(0, 0)))


def test_dilated_conv_column_bands():
    prog, c, inputs, out = run(DILATED.format(dt="f32"), "split Y.y, 3\nsplit Y.x, 3\n")
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], dilation=2, pad=(0, 0)))


DILATED_SAME_S2 = """\
kernel ds(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3], b: f32[K]) -> Y
  default N = 1, C = 32, H = 16, W = 14, K = 48
  Y: f32[N, K, H / 2, W / 2]
  for n in 0..N, k in 0..K, y in 0..H / 2, x in 0..W / 2:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, 2*y + 2*r - 2, 2*x + 2*s - 2] ?? 0) * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("schedule", [None, "split Y.y, 2\n"])
def test_dilated_strided_padded_conv(schedule):
    prog, c, inputs, out = run(DILATED_SAME_S2, schedule)
    x = rounded(inputs, "f32")
    want = conv_ref(x["X"], x["Wt"], stride=2, dilation=2, pad=(2, 2), bias=x["b"])
    assert_matches(prog, "Y", out["Y"], want)
