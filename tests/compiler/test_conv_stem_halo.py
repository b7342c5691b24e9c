"""Phased band halves over a zero-padded read (conv_pairs.phases_pay): the stem of stem_maxpool (7x7 stride 2,
padding 3, C = 3) and a padded 3x3 first layer take the output rows' phases like their pre-padded forms: 9 row
copies per column copy instead of 14, so 4 tap columns fit a matmul (2 matmuls per row group instead of 3). The
copies' rows outside X are zeroed by conv_halo's boxes at the phases' row step (2 sy). Checked against an
independent NumPy formula (np.pad + one einsum per tap) on the NKI interpreter, in both NKI dialects."""
from __future__ import annotations

import pytest

from compiler_helpers import assert_matches, compile_and_run
from test_conv_padded import conv_ref, rounded
from kernel_numbers import numbered

STEM = """\
kernel stem(X: f32[N, C, H, W], Wt: f32[K, C, 7, 7]) -> Y
  default N = {n}, C = 3, H = {h}, W = {w}, K = {k}
  let Ho = (H + 2 * {p} - 7) / 2 + 1, Wo = (W + 2 * {p} - 7) / 2 + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..7, s in 0..7:
      Y[n, k, y, x] += (X[n, c, 2*y + r - {p}, 2*x + s - {p}] ?? 0) * Wt[k, c, r, s]
"""

C3 = """\
kernel c3(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3], b: f32[K]) -> Y
  default N = 2, C = 3, H = 24, W = 19, K = {k}
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("n, h, w, k, p, split", [
    (1, 40, 33, 64, 3, "split Y.y, 4\n"),  # 20 output rows in 5 bands: top and bottom bands clipped by the halo
    (2, 39, 22, 32, 3, "split Y.y, 2\n"),  # batch 2, 32 channels, bands of one row pair
    (1, 34, 30, 64, 2, None),  # padding 2, the default band
])
def test_padded_stem_takes_the_phases(nki, n, h, w, k, p, split):
    prog, c, inputs, out = compile_and_run(STEM.format(n=n, h=h, w=w, k=k, p=p), nki, split)
    code = numbered(c.source)
    # 9 row offsets x 4 tap columns x 3 channels = 108 partitions: 2 matmuls per row group (the halves' 3)
    assert "Y_pairs" in code and "Wt_T = nl.ndarray((108, 2, " in code
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=2, pad=(p, p)))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("k, split", [(64, "split Y.y, 4\n"), (32, None)])
def test_padded_first_layer_takes_the_phases(nki, k, split):
    prog, c, inputs, out = compile_and_run(C3.format(k=k), nki, split)
    assert "Y_pairs" in c.source and "Y_halves" not in c.source
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], pad=(1, 1), bias=x["b"]))
