"""A negated contraction, `C[i, j] += A[i, k] * (-B[k, j])` or `-(A * B)` (issue 10, found by the fuzzer): the
product of the reads accumulates in PSUM and its sign is a scale of -1 on the eviction, before the bias, the relu,
the clamp or the residual add (`relu(b - A.B)`). Checked on the interpreter against NumPy formulas in float64."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, conv_valid, matmul_update, only_conv, run_signed
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": np.float32}


def _run(src: str, dtype: str):
    return run_signed(src, dtype, seed=3)


def _scale(prog, name: str) -> float:
    conv = only_conv(prog)
    assert conv.out == name
    return conv.scale


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("update, sign", [("A[i, k] * (-B[k, j])", -1), ("-(A[i, k] * B[k, j])", -1),
                                          ("(-A[i, k]) * B[k, j]", -1), ("(-A[i, k]) * (-B[k, j])", 1)])
def test_negated_matmul(dtype, update, sign):
    prog, c, out, x = _run(matmul_update(update), dtype)
    assert _scale(prog, "C") == sign
    assert_matches(prog, "C", out["C"], sign * (x["A"] @ x["B"]))


BIAS_RELU = """\
kernel neg(A: f32[M, K], B: f32[K, N], b: f32[{bias_dim}]) -> Y
  default M = 200, K = 300, N = 260
  C: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = b[{bias_idx}]
    for k in 0..K:
      C[i, j] += A[i, k] * (-B[k, j])
  for i in 0..M, j in 0..N:
    Y[i, j] = relu(C[i, j])
"""


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("bias_dim, bias_idx", [("M", "i"), ("N", "j")])
def test_relu_of_bias_minus_product(dtype, bias_dim, bias_idx):
    """relu(b - A.B): the sign applies to the product only, before the bias (a column b[i] on the activation, a
    row b[j] subtracted on VectorE)."""
    prog, c, out, x = _run(BIAS_RELU.format(bias_dim=bias_dim, bias_idx=bias_idx), dtype)
    b = x["b"][:, None] if bias_idx == "i" else x["b"][None, :]
    want = np.maximum(b - x["A"] @ x["B"], 0.0)
    assert (want == 0).mean() > 0.2 and (want > 0).mean() > 0.2  # both the sign and the relu matter
    assert_matches(prog, "Y", out["Y"], want)


RESIDUAL = """\
kernel neg(A: f32[M, K], B: f32[K, N], S: f32[M, N]) -> Y
  default M = 130, K = 200, N = 96
  C: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += -(A[i, k] * B[k, j])
  for i in 0..M, j in 0..N:
    Y[i, j] = C[i, j] + S[i, j]
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_residual_after_negated_product(dtype):
    prog, c, out, x = _run(RESIDUAL, dtype)
    assert_matches(prog, "Y", out["Y"], x["S"] - x["A"] @ x["B"])


CONV = """\
kernel neg(X: f32[N, C, H, W], Wt: f32[K, C, R, S], b: f32[K]) -> Y
  default N = 2, C = 20, H = 11, W = 13, K = 36, R = 3, S = 3
  T: f32[N, K, H - R + 1, W - S + 1]
  Y: f32[N, K, H - R + 1, W - S + 1]
  for n in 0..N, k in 0..K, y in 0..H - R + 1, x in 0..W - S + 1:
    T[n, k, y, x] = b[k]
    for c in 0..C, r in 0..R, s in 0..S:
      T[n, k, y, x] += -(X[n, c, y + r, x + s] * Wt[k, c, r, s])
  for n in 0..N, k in 0..K, y in 0..H - R + 1, x in 0..W - S + 1:
    Y[n, k, y, x] = min(relu(T[n, k, y, x]), 0.25)
"""


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_negated_conv_bias_relu6(dtype):
    prog, c, out, x = _run(CONV, dtype)
    want = np.minimum(np.maximum(x["b"][None, :, None, None] - conv_valid(x["X"], x["Wt"]), 0.0), 0.25)
    assert (want == 0).mean() > 0.1 and (want == 0.25).mean() > 0.05
    assert_matches(prog, "Y", out["Y"], want)


DEPTHWISE = """\
kernel neg(X: f32[N, C, H, W], Wd: f32[C, R, S]) -> Y
  default N = 2, C = 40, H = 12, W = 12, R = 3, S = 3
  T: f32[N, C, H, W]
  Y: f32[N, C, H, W]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    T[n, c, y, x] = 0
    for r in 0..R, s in 0..S:
      T[n, c, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * (-Wd[c, r, s])
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    Y[n, c, y, x] = min(relu(T[n, c, y, x]), 0.5)
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_negated_depthwise_relu6(dtype):
    prog, c, out, x = _run(DEPTHWISE, dtype)
    xp = np.pad(x["X"], ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = sum(xp[:, :, r:r + 12, s:s + 12] * x["Wd"][None, :, r, s, None, None] for r in range(3) for s in range(3))
    want = np.minimum(np.maximum(-conv, 0.0), 0.5)
    assert (want == 0).mean() > 0.1
    assert_matches(prog, "Y", out["Y"], want)


MATVEC = """\
kernel neg(A: f32[M, K], v: f32[K]) -> y
  default M = 300, K = 200
  y: f32[M]
  for i in 0..M:
    y[i] = 0
    for k in 0..K:
      y[i] += -(A[i, k] * v[k])
"""


def test_negated_matvec():
    prog, c, out, x = _run(MATVEC, "f32")
    assert_matches(prog, "y", out["y"], -(x["A"] @ x["v"]))


def test_selection_names_the_sign():
    prog = lang.load(BIAS_RELU.format(bias_dim="M", bias_idx="i"))
    c = compile_loaded(prog)
    assert "epilogue negated, relu" in c.stages["select"]
    assert "scale=-1.0" in c.source  # one activation: -acc + b, relu


def test_negated_conv_then_fused_max_pool():
    """The pool runs after the eviction, on the negated values (max of -conv, not -max of conv)."""
    src = """\
kernel neg(X: f32[N, C, H, W], Wt: f32[K, C, R, S]) -> P
  default N = 1, C = 16, H = 10, W = 10, K = 24, R = 3, S = 3
  T: f32[N, K, 8, 8]
  P: f32[N, K, 4, 4]
  for n in 0..N, k in 0..K, y in 0..8, x in 0..8:
    T[n, k, y, x] = 0
    for c in 0..C, r in 0..R, s in 0..S:
      T[n, k, y, x] += -(X[n, c, y + r, x + s] * Wt[k, c, r, s])
  for n in 0..N, k in 0..K, y in 0..4, x in 0..4:
    P[n, k, y, x] = -inf
    for i in 0..2, j in 0..2:
      P[n, k, y, x] max= T[n, k, 2 * y + i, 2 * x + j]
"""
    prog, c, out, x = _run(src, "f32")
    conv = -conv_valid(x["X"], x["Wt"])
    want = conv.reshape(1, 24, 4, 2, 4, 2).max(axis=(3, 5))
    assert _scale(prog, "P") == -1
    assert_matches(prog, "P", out["P"], want)


def test_negated_grouped_conv():
    src = """\
kernel neg(X: f32[N, G * Cg, H, W], Wt: f32[G * Kg, Cg, R, S]) -> Y
  default N = 1, G = 4, Cg = 8, Kg = 6, H = 9, W = 9, R = 3, S = 3
  Y: f32[N, G * Kg, H - R + 1, W - S + 1]
  for n in 0..N, g in 0..G, k in 0..Kg, y in 0..H - R + 1, x in 0..W - S + 1:
    Y[n, g * Kg + k, y, x] = 0
    for c in 0..Cg, r in 0..R, s in 0..S:
      Y[n, g * Kg + k, y, x] += X[n, g * Cg + c, y + r, x + s] * (-Wt[g * Kg + k, c, r, s])
"""
    prog, c, out, x = _run(src, "f32")
    want = np.concatenate([-conv_valid(x["X"][:, g * 8:(g + 1) * 8], x["Wt"][g * 6:(g + 1) * 6]) for g in range(4)],
                          axis=1)
    assert_matches(prog, "Y", out["Y"], want)
