"""A contraction operand read at the constant 0 of a dimension of one element, as torch stores depthwise weights
([C*M, 1, R, S]: `Y[n, g*M + m, y, x] += X[n, g, y + r, x + s] * W[g*M + m, 0, r, s]`; the fuzzer's survey, 8 of
38 refusals): selected without those indices, the operand read through a view of its own dimensions (the same
elements). Checked on the interpreter against NumPy formulas in float64."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, only_conv, run_signed
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang


def _run(src: str, dtype: str):
    return run_signed(src, dtype, seed=13)


def _depthwise_np(x: np.ndarray, w: np.ndarray, mult: int, pad: int) -> np.ndarray:
    """x [N, C, H, W], w [C*mult, R, S]: output channel g*mult + m reads input channel g."""
    R, S = w.shape[1:]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    Ho, Wo = xp.shape[2] - R + 1, xp.shape[3] - S + 1
    xs = np.repeat(xp, mult, axis=1)
    return sum(xs[:, :, r:r + Ho, s:s + Wo] * w[None, :, r, s, None, None] for r in range(R) for s in range(S))


DEPTHWISE = """\
kernel dw(X: f32[N, C, H, W], Wt: f32[C * M, 1, R, S], b: f32[C * M]) -> Y
  default N = 2, C = {C}, M = {M}, H = 10, W = 9, R = 3, S = 3
  Y: f32[N, C * M, H, W]
  for n in 0..N, g in 0..C, m in 0..M, y in 0..H, x in 0..W:
    Y[n, g*M + m, y, x] = b[g*M + m]
    for r in 0..R, s in 0..S:
      Y[n, g*M + m, y, x] += (X[n, g, y + r - 1, x + s - 1] ?? 0) * Wt[g*M + m, 0, r, s]
"""


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("C, M", [(20, 2), (150, 3), (6, 5)])
def test_depthwise_multiplier_with_torch_weights(dtype, C, M):
    prog, c, out, x = _run(DEPTHWISE.format(C=C, M=M), dtype)
    want = _depthwise_np(x["X"], x["Wt"][:, 0], M, 1) + x["b"][None, :, None, None]
    assert_matches(prog, "Y", out["Y"], want)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_depthwise_with_torch_weights(dtype):
    """M = 1: `Y[n, c, y, x] += X[n, c, ..] * W[c, 0, r, s]` is a plain depthwise convolution."""
    src = """\
kernel dw(X: f32[N, C, H, W], Wt: f32[C, 1, R, S]) -> Y
  default N = 1, C = 140, H = 7, W = 11, R = 3, S = 3
  Y: f32[N, C, H - 2, W - 2]
  for n in 0..N, c in 0..C, y in 0..H - 2, x in 0..W - 2:
    Y[n, c, y, x] = 0
    for r in 0..R, s in 0..S:
      Y[n, c, y, x] += X[n, c, y + r, x + s] * Wt[c, 0, r, s]
"""
    prog, c, out, x = _run(src, dtype)
    assert only_conv(prog).w_layout == "dw"
    assert_matches(prog, "Y", out["Y"], _depthwise_np(x["X"], x["Wt"][:, 0], 1, 0))


def test_relu6_of_the_input_then_torch_depthwise_block():
    """A MobileNet-like pair: a 3x3 conv, then relu6 of it (zero-padded) through depthwise weights [C*M, 1, 3, 3]."""
    src = """\
kernel blk(X: f32[N, C, H, W], W1: f32[K, C, 3, 3], W2: f32[K * 2, 1, 3, 3]) -> Y
  default N = 1, C = 5, H = 6, W = 9, K = 3
  A: f32[N, K, H - 2, W - 2]
  Y: f32[N, K * 2, H - 2, W - 2]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    A[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      A[n, k, y, x] += X[n, c, y + r, x + s] * W1[k, c, r, s]
  for n in 0..N, g in 0..K, m in 0..2, y in 0..H - 2, x in 0..W - 2:
    Y[n, g*2 + m, y, x] = 0
    for r in 0..3, s in 0..3:
      Y[n, g*2 + m, y, x] += min(relu((A[n, g, y + r - 1, x + s - 1] ?? 0)), 0.2) * W2[g*2 + m, 0, r, s]
"""
    prog, c, out, x = _run(src, "f32")
    a = sum(np.einsum("nchw,kc->nkhw", x["X"][:, :, r:r + 4, s:s + 7], x["W1"][:, :, r, s])
            for r in range(3) for s in range(3))
    want = _depthwise_np(np.minimum(np.maximum(a, 0), 0.2), x["W2"][:, 0], 2, 1)
    assert_matches(prog, "Y", out["Y"], want)


def test_a_constant_index_of_a_wider_dimension_is_still_refused():
    """W[k, 0, r, s] where dimension 1 has 2 elements reads part of W: not a contraction the compiler maps."""
    src = """\
kernel dw(X: f32[N, C, H, W], Wt: f32[C, 2, R, S]) -> Y
  default N = 1, C = 16, H = 7, W = 7, R = 3, S = 3
  Y: f32[N, C, H - 2, W - 2]
  for n in 0..N, c in 0..C, y in 0..H - 2, x in 0..W - 2:
    Y[n, c, y, x] = 0
    for r in 0..R, s in 0..S:
      Y[n, c, y, x] += X[n, c, y + r, x + s] * Wt[c, 0, r, s]
"""
    with pytest.raises(TilecError, match="stationary side") as err:
        compile_loaded(lang.load(src))
    assert err.value.span.line == 7
