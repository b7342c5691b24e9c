"""Transposed operands: A^T B (the stationary operand stored [k, i], loaded as it is) and A B^T (the moving operand
stored [j, k], e.g. a linear layer's weights [out, in]: its rows are loaded onto the partitions and transposed on
TensorE per 128-block), batched or not, with a bias along the output columns; checked against NumPy on the NKI
interpreter for f32, f16 and bf16 at sizes of several tiles (ragged contraction tiles included)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_padded import rounded, run

ABT = """\
kernel abt(A: {dt}[M, K], B: {dt}[P, K]) -> C
  default M = 200, K = 300, P = 260
  C: {dt}[M, P]
  for i in 0..M, j in 0..P:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += A[i, k] * B[j, k]
"""

LINEAR = """\
kernel linear(X: f32[M, K], Wt: f32[P, K], b: f32[P]) -> Y
  default M = 128, K = 257, P = 384
  Y: f32[M, P]
  for i in 0..M, j in 0..P:
    Y[i, j] = b[j]
    for k in 0..K:
      Y[i, j] += X[i, k] * Wt[j, k]
"""

BATCHED_ABT = """\
kernel babt(A: f32[N, M, K], B: f32[N, P, K]) -> C
  default N = 3, M = 72, K = 160, P = 144
  C: f32[N, M, P]
  for n in 0..N, i in 0..M, j in 0..P:
    C[n, i, j] = 0
    for k in 0..K:
      C[n, i, j] += A[n, i, k] * B[n, j, k]
"""

ATB = """\
kernel atb(A: {dt}[K, M], B: {dt}[K, P]) -> C
  default M = 136, K = 390, P = 200
  C: {dt}[M, P]
  for i in 0..M, j in 0..P:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += A[k, i] * B[k, j]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_a_b_transposed(dt):
    prog, c, inputs, out = run(ABT.format(dt=dt))
    assert "nc_transpose" in c.source and "B_rows" in c.source
    x = rounded(inputs, dt)
    assert_matches(prog, "C", out["C"], x["A"] @ x["B"].T)


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_a_transposed_b(dt):
    prog, c, inputs, out = run(ATB.format(dt=dt))
    x = rounded(inputs, dt)
    assert_matches(prog, "C", out["C"], x["A"].T @ x["B"])


def test_linear_layer_with_weights_out_by_in_and_a_bias():
    prog, c, inputs, out = run(LINEAR)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], x["X"] @ x["Wt"].T + x["b"])


def test_batched_a_b_transposed():
    prog, c, inputs, out = run(BATCHED_ABT)
    x = rounded(inputs, "f32")
    assert_matches(prog, "C", out["C"], np.einsum("nik,njk->nij", x["A"], x["B"]))


@pytest.mark.parametrize("schedule", ["tile C.j, 65\nsplit C.j, 130\n", "tile C.i, 100\ntile C.k, 100\n"])
def test_a_b_transposed_under_schedules(schedule):
    prog, c, inputs, out = run(ABT.format(dt="f32"), schedule)
    x = rounded(inputs, "f32")
    assert_matches(prog, "C", out["C"], x["A"] @ x["B"].T)
