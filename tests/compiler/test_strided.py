"""Stride-2 convolution windows `X[n, c, 2*y + r, 2*x + s]`: the matmul's moving operand is a strided view of the
input band (every second row and column, a free-dimension access pattern the PE array reads directly), checked
end to end against the reference evaluator, under the default and other schedules."""
from __future__ import annotations

import pytest

from compiler_helpers import check_against_reference
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

CONV_S2 = """\
kernel conv_s2(X: f32[N, C, H, W], Wt: f32[K, C, R, R], b: f32[K]) -> Y
  default N = 2, C = 256, H = 17, W = 21, K = 128, R = 3
  let Ho = (H - R) / 2 + 1, Wo = (W - R) / 2 + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..R, s in 0..R:
      Y[n, k, y, x] += X[n, c, 2*y + r, 2*x + s] * Wt[k, c, r, s]
"""

CONV_S2_POOL = """\
kernel conv_s2_pool(X: f32[N, C, H, W], Wt: f32[K, C, R, R]) -> Y
  default N = 1, C = 128, H = 21, W = 21, K = 128, R = 3
  let Ho = (H - R) / 2 + 1, Wo = (W - R) / 2 + 1
  conv: f32[N, K, Ho, Wo]
  Y: f32[N, K, Ho / 2, Wo / 2]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    conv[n, k, y, x] = 0
    for c in 0..C, r in 0..R, s in 0..R:
      conv[n, k, y, x] += X[n, c, 2*y + r, 2*x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, i in 0..Ho / 2, j in 0..Wo / 2:
    Y[n, k, i, j] = -inf
    for p in 0..2, q in 0..2:
      Y[n, k, i, j] max= relu(conv[n, k, 2*i + p, 2*j + q])
"""

ROW_STRIDE_1D = """\
kernel s2(X: f32[C, H], Wt: f32[K, C, R]) -> Y
  default C = 128, H = 64, K = 128, R = 3
  Y: f32[K, 30]
  for k in 0..K, y in 0..30:
    Y[k, y] = 0
    for c in 0..C, r in 0..R:
      Y[k, y] += X[c, 2*y + r] * Wt[k, c, r]
"""

DOWNSAMPLE_1X1 = """\
kernel down(X: f32[N, C, H, W], Wt: f32[K, C]) -> Y
  default N = 2, C = 256, H = 16, W = 12, K = 128
  Y: f32[N, K, H / 2, W / 2]
  for n in 0..N, k in 0..K, y in 0..H / 2, x in 0..W / 2:
    Y[n, k, y, x] = 0
    for c in 0..C:
      Y[n, k, y, x] += X[n, c, 2*y, 2*x] * Wt[k, c]
"""


def test_stride_2_conv_reads_a_strided_moving_view():
    c = compile_loaded(lang.load(CONV_S2))
    assert "stride 2x2" in c.stages["select"]
    assert "X_band[:128, c_t, r:+15:2, s:+19:2]" in c.stages["hoist"]
    check_against_reference(c)


@pytest.mark.parametrize("schedule", ["split conv.y, 2\n", "split conv.y, 2\nsplit conv.x, 2\n",
                                      "reorder conv, k, n, y\nreorder conv, r, s, c\n"])
def test_stride_2_conv_with_pool_under_schedules(schedule):
    c = compile_loaded(lang.load(CONV_S2_POOL), lang.parse_schedule(schedule, "<test>"))
    check_against_reference(c)


def test_stride_2_one_spatial_dimension():
    check_against_reference(compile_loaded(lang.load(ROW_STRIDE_1D)))


def test_stride_2_pointwise_conv_without_taps():
    c = compile_loaded(lang.load(DOWNSAMPLE_1X1))
    assert "X_band[:128, c_t, 0:+15:2, 0:+11:2]" in c.stages["hoist"]
    check_against_reference(c)


@pytest.mark.parametrize("stage", ["select", "hoist"])
def test_stride_2_stage_golden(stage, golden):
    golden.check(f"compiler/stages/conv_stride2.{stage}.txt", compile_loaded(lang.load(CONV_S2)).stages[stage])
