"""A constant factor in a contraction, `C[i, j] += 0.5 * A[i, k] * B[k, j]`, `A * B * 2`, `A * B / 4`, `-(0.25 * A)
* B` (issue 10, the fuzzer's survey): the product of the two reads accumulates in PSUM and the constant (with any
sign) scales the eviction, before the bias, the relu, the clamp, the residual add or the pool (ConvOp.scale). A row
bias `b[j]` is added after the scaled eviction. Checked on the interpreter against NumPy formulas in float64."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches, conv_valid, matmul_update, only_conv, run_signed
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang


def _run(src: str, dtype: str):
    return run_signed(src, dtype, seed=7)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("update, factor", [("0.5 * A[i, k] * B[k, j]", 0.5), ("A[i, k] * B[k, j] * 2", 2.0),
                                            ("A[i, k] * B[k, j] / 4", 0.25), ("-(0.25 * A[i, k]) * B[k, j]", -0.25),
                                            ("A[i, k] * (3 * B[k, j])", 3.0), ("(-A[i, k]) * B[k, j] * -1.5", 1.5),
                                            ("A[i, k] * B[k, j] / 3", 1 / 3)])
def test_scaled_matmul(dtype, update, factor):
    prog, c, out, x = _run(matmul_update(update), dtype)
    assert only_conv(prog).scale == pytest.approx(factor)
    assert_matches(prog, "C", out["C"], factor * (x["A"] @ x["B"]))


BIAS_RELU = """\
kernel cf(A: f32[M, K], B: f32[K, N], b: f32[{bias_dim}]) -> Y
  default M = 200, K = 300, N = 260
  C: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = b[{bias_idx}]
    for k in 0..K:
      C[i, j] += {update}
  for i in 0..M, j in 0..N:
    Y[i, j] = relu(C[i, j])
"""


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("bias_dim, bias_idx", [("M", "i"), ("N", "j")])
@pytest.mark.parametrize("update, factor", [("A[i, k] * B[k, j] * 2", 2.0), ("-0.5 * A[i, k] * B[k, j]", -0.5)])
def test_relu_of_bias_plus_scaled_product(dtype, bias_dim, bias_idx, update, factor):
    """relu(b + s * A.B): the factor applies to the product only, before the bias (a column b[i] on the activation,
    a row b[j] added on VectorE after a scaled ScalarE eviction)."""
    prog, c, out, x = _run(BIAS_RELU.format(bias_dim=bias_dim, bias_idx=bias_idx, update=update), dtype)
    b = x["b"][:, None] if bias_idx == "i" else x["b"][None, :]
    want = np.maximum(b + factor * (x["A"] @ x["B"]), 0.0)
    assert (want == 0).mean() > 0.2 and (want > 0).mean() > 0.2  # the factor, its sign and the relu matter
    assert_matches(prog, "Y", out["Y"], want)


def test_row_bias_without_relu():
    """`C[i, j] = b[j]; C += A.B * 2`: a row bias and a factor, no activation after."""
    src = BIAS_RELU.format(bias_dim="N", bias_idx="j", update="A[i, k] * B[k, j] * 2").split("  for i in 0..M, j in "
                                                                                            "0..N:\n    Y")[0]
    src = src.replace("-> Y", "-> C").replace("  Y: f32[M, N]\n", "")
    for dtype in ("f32", "bf16"):
        prog, c, out, x = _run(src, dtype)
        assert_matches(prog, "C", out["C"], x["b"][None, :] + 2 * (x["A"] @ x["B"]))


def test_residual_after_scaled_product():
    src = """\
kernel cf(A: f32[M, K], B: f32[K, N], S: f32[M, N]) -> Y
  default M = 130, K = 200, N = 96
  C: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += 0.125 * A[i, k] * B[k, j]
  for i in 0..M, j in 0..N:
    Y[i, j] = C[i, j] + S[i, j]
"""
    for dtype in ("f32", "bf16"):
        prog, c, out, x = _run(src, dtype)
        assert_matches(prog, "Y", out["Y"], x["S"] + 0.125 * (x["A"] @ x["B"]))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_scaled_padded_conv_bias_relu6(dtype):
    """A zero-padded conv with a factor on its product: the padded read beside the constant is still the conv's
    moving operand (unsupported._contraction_padding looks through the factor)."""
    src = """\
kernel cf(X: f32[N, C, H, W], Wt: f32[K, C, R, S], b: f32[K]) -> Y
  default N = 2, C = 20, H = 11, W = 13, K = 36, R = 3, S = 3
  T: f32[N, K, H, W]
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    T[n, k, y, x] = b[k]
    for c in 0..C, r in 0..R, s in 0..S:
      T[n, k, y, x] += 4 * (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = min(relu(T[n, k, y, x]), 1.5)
"""
    prog, c, out, x = _run(src, dtype)
    xp = np.pad(x["X"], ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.minimum(np.maximum(x["b"][None, :, None, None] + 4 * conv_valid(xp, x["Wt"]), 0.0), 1.5)
    assert (want == 0).mean() > 0.1 and (want == 1.5).mean() > 0.05
    assert_matches(prog, "Y", out["Y"], want)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_scaled_depthwise_relu6(dtype):
    src = """\
kernel cf(X: f32[N, C, H, W], Wd: f32[C, R, S]) -> Y
  default N = 2, C = 40, H = 12, W = 12, R = 3, S = 3
  T: f32[N, C, H, W]
  Y: f32[N, C, H, W]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    T[n, c, y, x] = 0
    for r in 0..R, s in 0..S:
      T[n, c, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wd[c, r, s] * 3
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    Y[n, c, y, x] = min(relu(T[n, c, y, x]), 0.5)
"""
    prog, c, out, x = _run(src, dtype)
    xp = np.pad(x["X"], ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = sum(xp[:, :, r:r + 12, s:s + 12] * x["Wd"][None, :, r, s, None, None] for r in range(3) for s in range(3))
    want = np.minimum(np.maximum(3 * conv, 0.0), 0.5)
    assert (want == 0).mean() > 0.1 and (want == 0.5).mean() > 0.05
    assert_matches(prog, "Y", out["Y"], want)


@pytest.mark.parametrize("update", ["0.5 * A[i, k] * v[k]", "-(A[i, k] * v[k])"])
def test_scaled_matvec(update):
    """The matrix-vector builder (build_matvec) with the factor on its sum's activation."""
    src = f"""\
kernel cf(A: f32[M, K], v: f32[K]) -> y
  default M = 300, K = 200
  y: f32[M]
  for i in 0..M:
    y[i] = 0
    for k in 0..K:
      y[i] += {update}
"""
    factor = 0.5 if update.startswith("0.5") else -1.0
    for dtype in ("f32", "bf16"):
        prog, c, out, x = _run(src, dtype)
        assert f"scale={factor}" in c.source  # build_matvec's sum (or eviction) activation takes the factor
        assert_matches(prog, "y", out["y"], factor * (x["A"] @ x["v"]))


def test_scaled_conv_then_fused_max_pool():
    """A negative factor before a max pool: the pool takes the max of the scaled values (the min of the conv)."""
    src = """\
kernel cf(X: f32[N, C, H, W], Wt: f32[K, C, R, S]) -> P
  default N = 1, C = 16, H = 10, W = 10, K = 24, R = 3, S = 3
  T: f32[N, K, 8, 8]
  P: f32[N, K, 4, 4]
  for n in 0..N, k in 0..K, y in 0..8, x in 0..8:
    T[n, k, y, x] = 0
    for c in 0..C, r in 0..R, s in 0..S:
      T[n, k, y, x] += -0.5 * X[n, c, y + r, x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, y in 0..4, x in 0..4:
    P[n, k, y, x] = -inf
    for i in 0..2, j in 0..2:
      P[n, k, y, x] max= T[n, k, 2 * y + i, 2 * x + j]
"""
    prog, c, out, x = _run(src, "f32")
    want = (-0.5 * conv_valid(x["X"], x["Wt"])).reshape(1, 24, 4, 2, 4, 2).max(axis=(3, 5))
    assert_matches(prog, "P", out["P"], want)


def test_selection_names_the_factor():
    prog = lang.load(BIAS_RELU.format(bias_dim="M", bias_idx="i", update="A[i, k] * B[k, j] * 2"))
    c = compile_loaded(prog)
    assert "epilogue scaled by 2, relu" in c.stages["select"]
    assert "scale=2.0" in c.source  # one activation: relu(2 * acc + b)


def test_row_reduction_of_a_scaled_product_is_not_a_contraction():
    """`s[i] += 0.5 * A[i, j] * B[i, j]` (no summed variable indexes both operands as a contraction's): selected as
    written, a row reduction of the scaled product."""
    src = """\
kernel cf(A: f32[M, N], B: f32[M, N]) -> s
  default M = 150, N = 300
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += 0.5 * A[i, j] * B[i, j]
"""
    prog, c, out, x = _run(src, "f32")
    assert_matches(prog, "s", out["s"], 0.5 * (x["A"] * x["B"]).sum(axis=1))


def test_a_function_of_16_bit_operands_is_computed_in_f32_first():
    """`0.5 * exp(A) * B` of bf16 operands (refused until lead21): exp(A) into an f32 temporary, B copied to f32
    beside it (exact: a bf16 temporary would round every term), the constant on the result (operand_split.py)."""
    prog, c, out, x = _run(matmul_update("0.5 * exp(A[i, k]) * B[k, j]"), "bf16")
    assert_matches(prog, "C", out["C"], 0.5 * (np.exp(x["A"]) @ x["B"]))


@pytest.mark.parametrize("dtype, update", [("bf16", "bf16(A[i, k]) * B[k, j]"), ("f16", "A[i, k] * f16(B[k, j])"),
                                           ("f32", "f32(A[i, k]) * B[k, j] * 0.5")])
def test_conversion_of_an_operand_to_its_own_dtype(dtype, update):
    """`bf16(A[i, k])` of a bf16 A is A (the survey's f16(W)/bf16(A) operands): the read as loaded."""
    prog, c, out, x = _run(matmul_update(update), dtype)  # every tensor in dtype
    factor = 0.5 if "0.5" in update else 1.0
    assert_matches(prog, "C", out["C"], factor * (x["A"] @ x["B"]))


def test_a_narrowing_conversion_of_an_operand_is_computed_first():
    """`bf16(A[i, k])` of an f32 A rounds each element: not the operand as loaded. Since gaps12 each rounded
    operand is computed into an fp32 temporary first (operand_split.py; pad_split.operand_functions until lead21),
    exact: the products of two bf16 values are exact in fp32."""
    prog, c, out, x = _run(matmul_update("bf16(A[i, k]) * bf16(B[k, j])"), "f32")
    assert "A_bf16" in c.source and "B_bf16" in c.source

    def bf16(a):  # NumPy's round to nearest even, through ml_dtypes
        return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    assert_matches(prog, "C", out["C"], bf16(x["A"]) @ bf16(x["B"]))
