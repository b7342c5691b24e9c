"""A reduction over dimensions that are not one run (gap_split.py): batch norm's statistics over N, H and W of NCHW,
a max over the batch and the image, a variance about a per-channel mean, two gaps; each against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_signed
from tilec.compiler.pipeline import compile_program
from tilec.lang import api as lang

BN_MEAN = """\
kernel bn_mean(X: f32[N, C, H, W]) -> mu
  default N = 3, C = 160, H = 9, W = 11
  mu: f32[C]
  for c in 0..C:
    mu[c] = 0
    for n in 0..N, h in 0..H, w in 0..W:
      mu[c] += X[n, c, h, w] / (N * H * W)
"""

BN_MAX = """\
kernel bn_max(X: f32[N, C, H, W]) -> mx
  default N = 2, C = 130, H = 7, W = 6
  mx: f32[C]
  for c in 0..C:
    mx[c] = -inf
    for n in 0..N, h in 0..H, w in 0..W:
      mx[c] max= X[n, c, h, w]
"""

BN_VAR = """\
kernel bn_var(X: f32[N, C, H, W], mu: f32[C]) -> v
  default N = 2, C = 96, H = 8, W = 8
  v: f32[C]
  for c in 0..C:
    v[c] = 0
    for n in 0..N, h in 0..H, w in 0..W:
      v[c] += (X[n, c, h, w] - mu[c]) * (X[n, c, h, w] - mu[c]) / (N * H * W)
"""

INTERLEAVED = """\
kernel mid(A: f32[M, N, L]) -> s
  default M = 128, N = 16, L = 8
  s: f32[N]
  for j in 0..N:
    s[j] = 0
    for i in 0..M, l in 0..L:
      s[j] += A[i, j, l]
"""

TWO_GAPS = """\
kernel two_gaps(X: f32[A, C, B, D, E]) -> s
  default A = 3, C = 40, B = 5, D = 6, E = 7
  s: f32[C, D]
  for c in 0..C, d in 0..D:
    s[c, d] = 0
    for a in 0..A, b in 0..B, e in 0..E:
      s[c, d] += X[a, c, b, d, e]
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_batch_norm_mean_over_n_h_w(dtype: str) -> None:
    prog, c, out, a = run_signed(BN_MEAN, dtype, seed=2)
    assert_matches(prog, "mu", out["mu"], a["X"].mean(axis=(0, 2, 3)))
    kinds = [type(op).__name__ for op in compile_program(prog).ops]
    assert kinds == ["ReduceOp", "ColumnReduceOp"]  # over h, w into mu_part[n, c], then over n


def test_max_over_n_h_w() -> None:
    prog, c, out, a = run_signed(BN_MAX, "f32", seed=3)
    assert_matches(prog, "mx", out["mx"], a["X"].max(axis=(0, 2, 3)))


def test_variance_about_a_channel_mean() -> None:
    prog, c, out, a = run_signed(BN_VAR, "f32", seed=4)
    want = ((a["X"] - a["mu"][None, :, None, None]) ** 2).mean(axis=(0, 2, 3))
    assert_matches(prog, "v", out["v"], want)


def test_two_gaps_take_two_steps() -> None:
    prog, c, out, a = run_signed(TWO_GAPS, "f32", seed=5)
    assert_matches(prog, "s", out["s"], a["X"].sum(axis=(0, 2, 4)))
    assert len(compile_program(lang.load(TWO_GAPS)).ops) == 3


def test_interleaved_dimensions_refused_before() -> None:
    """test_row_reduce's refusal `interleaved_dims` until gap_split: it compiles now."""
    prog, c, out, a = run_signed(INTERLEAVED, "f32", seed=6)
    assert_matches(prog, "s", out["s"], a["A"].sum(axis=(0, 2)))
