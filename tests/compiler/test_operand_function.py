"""A function of a contraction operand, `Y[i, j] += exp(A[k, i]) * B[k, j]`: compiled as an f32 temporary
`Y_lhs[k, i] = exp(A[k, i])` (the element-wise rule) and the contraction of it (operand_split.py since lead21;
pad_split.operand_functions, fp32 only, before), the rewrite the refusal's hint asked users to write; exact, since
the temporary holds exp(A) in fp32 as the reference computes it. A 16-bit operand beside it is copied to f32 (exact).
Checked on the interpreter against NumPy formulas in float64, both dialects."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches, conv_valid
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang


def _run(src: str, nki: str, seed: int = 3):
    prog = lang.load(src)
    c = compile_loaded(prog, nki=nki)
    rng = np.random.default_rng(seed)
    x = {t.name: rng.random(t.shape, dtype=np.float32) - 0.5 for t in prog.inputs}
    return prog, c, c.run(**x), {k: np.asarray(v, np.float64) for k, v in x.items()}


MATMUL = """\
kernel e(A: f32[K, M], B: f32[K, N]) -> Y
  default K = {K}, M = {M}, N = {N}
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = 0
    for k in 0..K:
      Y[i, j] += {f} * B[k, j]
"""

FUNCS = {"exp(A[k, i])": np.exp, "tanh(A[k, i])": np.tanh, "(A[k, i] + 1)": lambda a: a + 1,
         "sigmoid(A[k, i])": lambda a: 1 / (1 + np.exp(-a))}


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("f", sorted(FUNCS))
@pytest.mark.parametrize("K, M, N", [(200, 70, 90), (130, 129, 600), (1, 1, 3)])
def test_a_function_of_the_stationary_operand(K, M, N, f, nki):
    prog, c, out, x = _run(MATMUL.format(K=K, M=M, N=N, f=f), nki)
    assert "A_" in c.source  # the temporary
    assert_matches(prog, "Y", out["Y"], FUNCS[f](x["A"]).T @ x["B"])


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_a_function_of_the_moving_operand_with_a_factor_and_bias(nki):
    src = """\
kernel e(A: f32[M, K], B: f32[K, N], b: f32[M]) -> Y
  default K = 150, M = 100, N = 70
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = b[i]
    for k in 0..K:
      Y[i, j] += 0.5 * A[i, k] * exp(B[k, j])
"""
    prog, c, out, x = _run(src, nki)
    assert_matches(prog, "Y", out["Y"], 0.5 * x["A"] @ np.exp(x["B"]) + x["b"][:, None])


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_a_function_of_conv_weights(nki):
    src = """\
kernel c(X: f32[N, C, H, W], Wt: f32[K, C, R, S]) -> Y
  default N = 2, C = 5, H = 9, W = 8, K = 7, R = 3, S = 3
  Y: f32[N, K, H - 2, W - 2]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..R, s in 0..S:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * abs(Wt[k, c, r, s])
"""
    prog, c, out, x = _run(src, nki)
    assert_matches(prog, "Y", out["Y"], conv_valid(x["X"], np.abs(x["Wt"])))


def test_a_row_reduction_of_a_function_is_not_rewritten():
    """`s[i] += exp(A[i, k]) * B[i, k]` is not a contraction: it compiles as it did, with no temporary."""
    src = """\
kernel e(A: f32[M, K], B: f32[M, K]) -> Y
  default K = 200, M = 70
  Y: f32[M]
  for i in 0..M:
    Y[i] = 0
    for k in 0..K:
      Y[i] += exp(A[i, k]) * B[i, k]
"""
    prog, c, out, x = _run(src, "0.6")
    assert "A_exp" not in c.source
    assert_matches(prog, "Y", out["Y"], (np.exp(x["A"]) * x["B"]).sum(axis=1))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_16_bit_operands_compute_the_function_in_f32(dtype):
    """A located refusal until lead21: exp(A) into an f32 temporary, B copied to f32 beside it (operand_split.py;
    exact, as the reference computes them)."""
    src = MATMUL.format(K=20, M=7, N=9, f="exp(A[k, i])").replace("f32", dtype)
    prog = lang.load(src)
    c = compile_loaded(prog)
    rng = np.random.default_rng(4)
    np_dtype = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]
    x = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(np_dtype) for t in prog.inputs}
    want = np.exp(x["A"].astype(np.float64)).T @ x["B"].astype(np.float64)
    assert_matches(prog, "Y", c.run(**x)["Y"], want)


def test_a_factor_with_no_read_is_not_rewritten():
    """`exp(i) * (A[i, k] + B[k, j])`: a factor without a read (and one with two) is no function of an operand; the
    located refusal, not an internal error (the first version of the rewrite unpacked the factor's one read)."""
    src = MATMUL.format(K=20, M=7, N=9, f="exp(i)").replace("* B[k, j]", "* (A[i, k] + B[k, j])").replace(
        "A: f32[K, M]", "A: f32[M, K]")
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(src))
    assert ":7:18:" in str(err.value) and "`exp(i)` is not a tensor read" in str(err.value)
