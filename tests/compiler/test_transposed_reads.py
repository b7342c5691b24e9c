"""Element-wise statements reading one operand in the output's order and another transposed (permute_split
split_transposed_reads): a transposed read over all the loops beside reads in the output's order is read by one
transpose that computes the statement on its eviction (fn_chain.py); other transposed reads are permuted into a
temporary first, then the statement reads it. Each kernel's output on the interpreter is compared with NumPy on the
same (dtype-rounded) inputs."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

SYMMETRIC = """
kernel sym(X: {t}[N, N]) -> Y
  default N = 200
  Y: {t}[N, N]
  for i in 0..N, j in 0..N:
    Y[i, j] = 0.5 * (X[i, j] + X[j, i])
"""

BATCHED = """
kernel bsym(A: {t}[B, M, M], c: {t}[M, M]) -> Y
  default B = 3, M = 136
  Y: {t}[B, M, M]
  for b in 0..B, i in 0..M, j in 0..M:
    Y[b, i, j] = A[b, i, j] * A[b, j, i] + c[j, i]
"""

DTYPE = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}


def run(text: str, t: str, nki: str | None):
    c = compile_loaded(lang.load(text.format(t=t)), nki=nki, target="trn2")
    inputs = lang.random_inputs(c.program, seed=23)
    got = {k: np.asarray(v, np.float64) for k, v in c.run(**inputs).items()}
    stored = {k: np.asarray(v, DTYPE[t]).astype(np.float64) for k, v in inputs.items()}
    return c, got, stored


def rounded(x: np.ndarray, t: str) -> np.ndarray:
    return x.astype(np.float32).astype(DTYPE[t]).astype(np.float64)


@pytest.mark.parametrize("t,nki", [("f32", None), ("bf16", None), ("f32", "0.1")])
def test_a_symmetric_part_is_one_transpose_computing_it(t: str, nki: str | None) -> None:
    c, got, x = run(SYMMETRIC, t, nki)
    assert "src X computing 0.5 * (X[i, j] + X[j, i])" in c.stages["select"] and "X_t" not in c.stages["select"]
    np.testing.assert_array_equal(got["Y"], rounded(0.5 * (x["X"] + x["X"].T), t))


@pytest.mark.parametrize("t", ["f32", "bf16"])
def test_a_batched_product_with_its_transpose_and_a_transposed_broadcast(t: str) -> None:
    c, got, x = run(BATCHED, t, None)
    a, cc = x["A"], x["c"]
    want = rounded(a * a.transpose(0, 2, 1) + cc.T, t)  # one product and one sum in f32, rounded once
    ulp = 2.0**-8 if t == "bf16" else 2.0**-23
    assert np.abs(got["Y"] - want).max() <= ulp * np.abs(want).max()
    assert "A_t" not in c.stages["select"] and "c_t" in c.stages["select"]  # c permuted first, A read twice


def test_reads_in_one_other_order_stay_with_the_permuted_eltwise_split() -> None:
    """`Y[i, j] = relu(X[j, i])` reads nothing in the output's order: computed in X's order, then one permute."""
    c = compile_loaded(lang.load(SYMMETRIC.format(t="f32").replace("0.5 * (X[i, j] + X[j, i])", "relu(X[j, i])")),
                       target="trn2")
    assert "X_t" not in c.stages["select"]
    x = lang.random_inputs(c.program, seed=3)["X"]
    np.testing.assert_array_equal(np.asarray(c.run(X=x)["Y"]), np.maximum(x.T, 0))
