"""Statements a user writes with operands of two dtypes (lang/widen.py) and extrema of scaled values
(select_reduce: `m[i] max= X[i, j] / T`), compiled, run on the interpreter and checked against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_in_own_dtypes
from tilec.lang import api as lang
from tilec.lang import syntax as sx
from tilec.lang.widen import widen_mixed

SOFTMAX_BF16 = """\
kernel softmax(X: bf16[M, N]) -> Y
  default M = 160, N = 300
  mx: f32[M]
  s: f32[M]
  Y: bf16[M, N]
  for i in 0..M:
    mx[i] = -inf
    for j in 0..N:
      mx[i] max= X[i, j]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += exp(X[i, j] - mx[i])
  for i in 0..M, j in 0..N:
    Y[i, j] = exp(X[i, j] - mx[i]) / s[i]
"""

BIAS_F16 = """\
kernel bias(X: f16[M, N], b: f32[N]) -> Y
  default M = 200, N = 96
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] * 2 + b[j]
"""

SCALED_MAX = """\
kernel scaled(X: f32[M, N], b: f32[M]) -> m
  default M = 200, N = 300
  m: f32[M]
  for i in 0..M:
    m[i] = b[i]
    for j in 0..N:
      m[i] {op} X[i, j] {scale}
"""


def _run(text: str, seed: int):
    return run_in_own_dtypes(text, seed, 4.0)


def test_bf16_softmax_with_f32_statistics() -> None:
    prog, out, a = _run(SOFTMAX_BF16, seed=1)
    e = np.exp(a["X"] - a["X"].max(axis=1, keepdims=True))
    assert_matches(prog, "Y", np.asarray(out["Y"], np.float32), e / e.sum(axis=1, keepdims=True))


def test_f16_operand_with_an_f32_bias() -> None:
    prog, out, a = _run(BIAS_F16, seed=2)
    assert_matches(prog, "Y", out["Y"], a["X"] * 2 + a["b"][None, :])


def test_only_the_16_bit_operands_of_a_mixed_statement_are_widened() -> None:
    kernel = widen_mixed(lang.parse(SOFTMAX_BF16))
    sums = kernel.body[1].body[1].body[0]  # s[i] += exp(X[i, j] - mx[i])
    assert isinstance(sums, sx.Assign)
    diff = sums.value.args[0]
    assert isinstance(diff.lhs, sx.Call) and diff.lhs.fn == "f32" and diff.lhs.args[0].tensor == "X"
    assert isinstance(diff.rhs, sx.Access) and diff.rhs.tensor == "mx"
    single = kernel.body[0].body[1].body[0]  # mx[i] max= X[i, j]: one dtype, left as written
    assert isinstance(single.value, sx.Access)


@pytest.mark.parametrize("op, scale, factor, reduce", [("max=", "/ 0.7", 1 / 0.7, np.max), ("max=", "* -2", -2, np.max),
                                                       ("min=", "* 0.5", 0.5, np.min), ("min=", "* -3", -3, np.min)])
def test_extrema_of_scaled_values(op: str, scale: str, factor: float, reduce) -> None:
    """Refused before ("a constant factor applies to a `+=` reduction only"), though `X[i, j] * b[i]` compiled."""
    prog, out, a = _run(SCALED_MAX.format(op=op, scale=scale), seed=3)
    values = np.concatenate([a["X"] * factor, a["b"][:, None]], axis=1)
    assert_matches(prog, "m", out["m"], reduce(values, axis=1))


MIXED_MATMUL = """\
kernel mm(A: bf16[M, K], B: f32[K, N]) -> C
  default M = 130, K = 200, N = 96
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
"""


def test_bf16_weights_times_f32_activations() -> None:
    """The bf16 operand is copied to f32 (exact; operand_split): rounding B to bf16 instead would not match."""
    prog, out, a = _run(MIXED_MATMUL, seed=4)
    assert_matches(prog, "C", out["C"], a["A"] @ a["B"])
