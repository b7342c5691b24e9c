"""Reductions of a few long rows (build_longrows: each row over the partitions, then one matmul or transpose across
them): spellings of the kind (a loss per sample over two axes, a squared norm per row, a sum of products of one
row, a max of a few rows, a plain sum with a constant start), f32 and bf16, each run on tilec's NKI interpreter and
compared with a float64 NumPy formula written here."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from compiler_helpers import assert_formula_matches, words
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang


MSE = """
kernel mse(A: {t}[B, M, N], P: {t}[B, M, N]) -> s
  s: f32[B]
  for b in 0..B:
    s[b] = 0
    for i in 0..M, j in 0..N:
      s[b] += (A[b, i, j] - P[b, i, j]) * (A[b, i, j] - P[b, i, j]) / (M * N)
"""
NORM2 = """
kernel norm2(X: {t}[R, F]) -> s
  s: f32[R]
  for k in 0..R:
    s[k] = 1
    for f in 0..F:
      s[k] += X[k, f] * X[k, f]
"""
DOT = """
kernel dot(X: {t}[Z, F], Y: {t}[Z, F]) -> s
  s: f32[Z]
  for z in 0..Z:
    s[z] = 0
    for f in 0..F:
      s[z] += X[z, f] * Y[z, f]
"""
ROWMAX = """
kernel rowmax(X: {t}[R, F]) -> m
  m: {t}[R]
  for r in 0..R:
    m[r] = -2
    for f in 0..F:
      m[r] max= X[r, f]
"""
ROWSUM = """
kernel rowsum(X: {t}[R, F]) -> s
  s: f32[R]
  for r in 0..R:
    s[r] = 0.25
    for f in 0..F:
      s[r] += X[r, f]
"""

Case = tuple[str, dict[str, int], Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]]
CASES: dict[str, Case] = {
    "mse": (MSE, dict(B=3, M=128, N=160), lambda a: {"s": ((a["A"] - a["P"]) ** 2).mean(axis=(1, 2))}),
    "norm2": (NORM2, dict(R=5, F=128 * 130), lambda a: {"s": 1 + (a["X"] ** 2).sum(axis=1)}),
    "dot": (DOT, dict(Z=1, F=128 * 200), lambda a: {"s": (a["X"] * a["Y"]).sum(axis=1)}),
    "rowmax": (ROWMAX, dict(R=6, F=128 * 129), lambda a: {"m": np.maximum(a["X"].max(axis=1), -2)}),
    "rowsum": (ROWSUM, dict(R=40, F=128 * 128), lambda a: {"s": 0.25 + a["X"].sum(axis=1)}),
}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("target", ["trn2", "trn1"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_few_long_rows_match_numpy(name: str, target: str, dtype: str) -> None:
    text, sizes, formula = CASES[name]
    program = lang.load(text.format(t=dtype), sizes)
    compiled = compile_loaded(program, None, None, target)
    assert "rows over the partitions" in words(compiled.source)  # the layout under test
    assert_formula_matches(compiled, formula, f"{name} {dtype}")


def test_many_rows_keep_the_row_layout() -> None:
    """128 rows fill the partitions: each row stays on a partition of its own."""
    program = lang.load(NORM2.format(t="f32"), dict(R=128, F=128 * 128))
    assert "rows over the partitions" not in words(compile_loaded(program).source)
