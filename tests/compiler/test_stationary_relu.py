"""relu (or `min(relu(x), c)`) of a contraction's stationary operand, `C[i, j] += relu(A[i, k]) * B[k, j]` (issue 10,
found by the fuzzer): applied in place to the stationary tiles after each load (ConvOp.w_relu); the moving operand's
relu still folds into its producer. Checked on the interpreter against NumPy formulas in float64."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, matmul_update, only_conv, run_signed
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang


def _run(src: str, dtype: str):
    return run_signed(src, dtype, seed=5)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("update, upper", [("relu(A[i, k]) * B[k, j]", np.inf),
                                           ("B[k, j] * min(relu(A[i, k]), 0.25)", 0.25),
                                           ("min(0.25, relu(A[i, k])) * B[k, j]", 0.25)])
@pytest.mark.parametrize("M, K", [(200, 300), (130, 100)])
def test_relu_of_stationary(dtype, update, upper, M, K):
    prog, c, out, x = _run(matmul_update(update, M, K), dtype)
    assert only_conv(prog).w_relu == upper
    a = np.minimum(np.maximum(x["A"], 0.0), upper)
    assert (a == 0).mean() > 0.3
    assert_matches(prog, "C", out["C"], a @ x["B"])


def test_relu_of_both_operands():
    """relu(A) * relu(T): the stationary A's after its load, the moving temporary T's on its producer's eviction."""
    src = """\
kernel st(A: f32[M, K], B: f32[K, L], D: f32[L, N]) -> C
  default M = 150, K = 200, L = 140, N = 96
  T: f32[K, N]
  C: f32[M, N]
  for k in 0..K, j in 0..N:
    T[k, j] = 0
    for l in 0..L:
      T[k, j] += B[k, l] * D[l, j]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += relu(A[i, k]) * relu(T[k, j])
"""
    prog, c, out, x = _run(src, "f32")
    want = np.maximum(x["A"], 0) @ np.maximum(x["B"] @ x["D"], 0)
    assert_matches(prog, "C", out["C"], want)


def test_negated_relu_of_stationary_with_bias():
    """The two issue-10 forms together: relu(b - relu(A) . B)."""
    src = """\
kernel st(A: f32[M, K], B: f32[K, N], b: f32[M]) -> Y
  default M = 200, K = 300, N = 130
  C: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = b[i]
    for k in 0..K:
      C[i, j] += -(relu(A[i, k]) * B[k, j])
  for i in 0..M, j in 0..N:
    Y[i, j] = relu(C[i, j])
"""
    for dtype in ("f32", "bf16"):
        prog, c, out, x = _run(src, dtype)
        want = np.maximum(x["b"][:, None] - np.maximum(x["A"], 0) @ x["B"], 0)
        assert (want == 0).mean() > 0.1
        assert_matches(prog, "Y", out["Y"], want)


CONV = """\
kernel st(X: f32[N, C, H, W], Wt: f32[K, C, R, S]) -> Y
  default N = 2, C = 20, H = 10, W = 12, K = 40, R = 3, S = 3
  Y: f32[N, K, H - R + 1, W - S + 1]
  for n in 0..N, k in 0..K, y in 0..H - R + 1, x in 0..W - S + 1:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..R, s in 0..S:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * relu(Wt[k, c, r, s])
"""


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_conv_with_rectified_weights(dtype):
    prog, c, out, x = _run(CONV, dtype)
    w = np.maximum(x["Wt"], 0)
    Ho, Wo = 8, 10
    want = sum(np.einsum("nchw,kc->nkhw", x["X"][:, :, r:r + Ho, s:s + Wo], w[:, :, r, s])
               for r in range(3) for s in range(3))
    assert_matches(prog, "Y", out["Y"], want)


@pytest.mark.parametrize("K", [96, 512])  # 512: the rows transposed two contraction tiles at a time
def test_batched_matmul_rectified_stationary(K):
    src = f"""\
kernel st(A: f32[G, M, K], B: f32[G, K, N]) -> C
  default G = 3, M = 140, K = {K}, N = 64
  C: f32[G, M, N]
  for g in 0..G, i in 0..M, j in 0..N:
    C[g, i, j] = 0
    for k in 0..K:
      C[g, i, j] += relu(A[g, i, k]) * B[g, k, j]
"""
    prog, c, out, x = _run(src, "f32")
    assert_matches(prog, "C", out["C"], np.einsum("gik,gkj->gij", np.maximum(x["A"], 0), x["B"]))


def test_selection_says_where_the_relu_runs():
    prog = lang.load(matmul_update("relu(A[i, k]) * B[k, j]", M=128, K=128))
    assert "stationary relu after load" in compile_loaded(prog).stages["select"]


@pytest.mark.parametrize("C, upper", [(16, "relu(Wd[c, r, s])"), (150, "min(relu(Wd[c, r, s]), 0.3)")])
def test_depthwise_weights_rectified_after_their_load(C, upper):
    src = f"""\
kernel st(X: f32[N, C, H, W], Wd: f32[C, R, S]) -> Y
  default N = 2, C = {C}, H = 10, W = 10, R = 3, S = 3
  Y: f32[N, C, H - R + 1, W - S + 1]
  for n in 0..N, c in 0..C, y in 0..H - R + 1, x in 0..W - S + 1:
    Y[n, c, y, x] = 0
    for r in 0..R, s in 0..S:
      Y[n, c, y, x] += X[n, c, y + r, x + s] * {upper}
"""
    prog, c, out, x = _run(src, "f32")
    assert only_conv(prog).w_layout == "dw"
    w = np.minimum(np.maximum(x["Wd"], 0), 0.3 if "min" in upper else np.inf)
    want = sum(x["X"][:, :, r:r + 8, s:s + 8] * w[None, :, r, s, None, None] for r in range(3) for s in range(3))
    assert_matches(prog, "Y", out["Y"], want)


CMAJOR = """\
kernel st(A: f32[K, M], B: f32[K, N]) -> C
  default K = {K}, M = {M}, N = 100
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += {update}
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("K, M", [(200, 150), (145, 1), (1, 150), (1, 1), (300, 260)])
@pytest.mark.parametrize("update, upper", [("min(relu(A[k, i]), 0.2) * B[k, j]", 0.2),
                                           ("B[k, j] * relu(A[k, i])", np.inf)])
def test_contraction_major_stationary_rectified_where_loaded(dtype, K, M, update, upper):
    """A^T B with relu(A[k, i]): A is loaded as it is (no transposes to fold the relu into), and each region its
    loads write is rectified right after it: a ragged contraction tile (K = 145) or a one-column stationary (M = 1)
    leaves rows and columns of the buffer unwritten, which a whole-buffer pass read (l38)."""
    prog, c, out, x = _run(CMAJOR.format(K=K, M=M, update=update), dtype)
    assert only_conv(prog).w_layout == "ck" and only_conv(prog).w_relu == upper
    a = np.minimum(np.maximum(x["A"], 0), upper)
    assert (a == 0).mean() > 0.3 or a.size == 1
    assert_matches(prog, "C", out["C"], a.T @ x["B"])


@pytest.mark.parametrize("C", [150, 3])  # 150: a ragged contraction tile; 3: taps folded into the partitions
def test_contraction_major_conv_weights_rectified(C):
    """Y += X * relu(W[c, k, r, s]): contraction-major filters, rectified region by region after their loads."""
    src = f"""\
kernel st(X: f32[N, C, H, W], Wt: f32[C, K, R, S]) -> Y
  default N = 1, C = {C}, H = 9, W = 11, K = 40, R = 3, S = 3
  Y: f32[N, K, H - R + 1, W - S + 1]
  for n in 0..N, k in 0..K, y in 0..H - R + 1, x in 0..W - S + 1:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..R, s in 0..S:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * relu(Wt[c, k, r, s])
"""
    prog, c, out, x = _run(src, "f32")
    assert only_conv(prog).w_layout == "ck"
    w = np.maximum(x["Wt"], 0)
    want = sum(np.einsum("nchw,ck->nkhw", x["X"][:, :, r:r + 7, s:s + 9], w[:, :, r, s])
               for r in range(3) for s in range(3))
    assert_matches(prog, "Y", out["Y"], want)


def test_first_layer_conv_with_rectified_weights():
    """C = 3 input channels: the filter taps folded into the contraction partitions (conv_fold)."""
    src = """\
kernel st(X: f32[N, C, H, W], Wt: f32[K, C, R, S]) -> Y
  default N = 1, C = 3, H = 20, W = 18, K = 24, R = 3, S = 3
  Y: f32[N, K, H - R + 1, W - S + 1]
  for n in 0..N, k in 0..K, y in 0..H - R + 1, x in 0..W - S + 1:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..R, s in 0..S:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * relu(Wt[k, c, r, s])
"""
    prog, c, out, x = _run(src, "f32")
    w = np.maximum(x["Wt"], 0)
    want = sum(np.einsum("nchw,kc->nkhw", x["X"][:, :, r:r + 18, s:s + 16], w[:, :, r, s])
               for r in range(3) for s in range(3))
    assert_matches(prog, "Y", out["Y"], want)
