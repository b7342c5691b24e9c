"""A conversion of a broadcast operand inside an element-wise statement (`A[i, j] - bf16(s[i])`): the (P, 1) column
is rounded into a tile of that dtype, then read back as fp32 by the per-partition instruction. It was refused
("converting the broadcast operand ... is not supported", 66 of 160 refusals among 1500 fuzz programs). Checked
against NumPy, with the column rounded by ml_dtypes, on the NKI interpreter."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_padded import NARROW, rounded, run

CENTRED = """\
kernel centred(A: {dt}[M, N]) -> Y
  default M = 200, N = 486
  s: f32[M]
  Y: f32[M, N]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += A[i, j] / 486
  for i in 0..M, j in 0..N:
    Y[i, j] = A[i, j] - {cast}(s[i])
"""

SCALED = """\
kernel scaled(A: {cast}[M, N], c: f32[M]) -> Y
  default M = 300, N = 96
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = 2 * A[i, j] * {cast}(c[i]) + 1
"""


@pytest.mark.parametrize("dt, cast", [("bf16", "bf16"), ("f16", "f16")])
def test_mean_rounded_before_the_subtraction(dt, cast):
    """A row chain (the mean and the subtraction in one kernel) with the mean rounded to `cast`."""
    prog, _, inputs, out = run(CENTRED.format(dt=dt, cast=cast))
    a = rounded(inputs, dt)["A"]
    mean = (a / 486).sum(axis=1).astype(np.float32).astype(NARROW[cast]).astype(np.float64)
    assert_matches(prog, "Y", out["Y"], a - mean[:, None])


@pytest.mark.parametrize("cast", ["f16", "bf16"])
def test_input_column_rounded(cast):
    """An element-wise statement alone: a per-row factor read from an f32 input and rounded to A's dtype."""
    prog, _, inputs, out = run(SCALED.format(cast=cast))
    a = rounded(inputs, cast)["A"]
    c = inputs["c"].astype(np.float32).astype(NARROW[cast]).astype(np.float64)
    assert_matches(prog, "Y", out["Y"], 2 * a * c[:, None] + 1)
