"""Reductions over a middle dimension with many outer rows and few reduced ones (build_colouter: the outer rows on
the partitions, the reduced rows halved along the free axis): several spellings of the kind, f32 and bf16, sums,
means, max and min, an expression of two tensors and a constant initial value, each run on tilec's NKI interpreter
and compared with a float64 NumPy formula written here."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from compiler_helpers import assert_formula_matches, words
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang


HEIGHT_MEAN = """
kernel hmean(X: {t}[N, C, H, W]) -> Y
  Y: {t}[N, C, W]
  for n in 0..N, c in 0..C, w in 0..W:
    Y[n, c, w] = 0
    for h in 0..H:
      Y[n, c, w] += X[n, c, h, w] / H
"""
# a different spelling: 3-D, a constant start, the reduced loop written over two indices (R = 5 * 3, odd)
MIDDLE_SUM = """
kernel msum(A: {t}[B, P, Q, F]) -> s
  s: {t}[B, F]
  for b in 0..B, f in 0..F:
    s[b, f] = 0.5
    for p in 0..P, q in 0..Q:
      s[b, f] += A[b, p, q, f]
"""
MIDDLE_MAX = """
kernel mmax(X: {t}[O, R, F]) -> m
  m: {t}[O, F]
  for o in 0..O, f in 0..F:
    m[o, f] = -3
    for r in 0..R:
      m[o, f] max= X[o, r, f]
"""
MIDDLE_MIN = MIDDLE_MAX.replace("max=", "min=").replace("= -3", "= 3")
MIDDLE_SSD = """
kernel mssd(X: {t}[A, B, C], Z: {t}[A, B, C]) -> s
  s: f32[A, C]
  for a in 0..A, c in 0..C:
    s[a, c] = 0
    for b in 0..B:
      s[a, c] += (X[a, b, c] - Z[a, b, c]) * (X[a, b, c] - Z[a, b, c]) / B
"""

Case = tuple[str, dict[str, int], Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]]
CASES: dict[str, Case] = {
    "height_mean": (HEIGHT_MEAN, dict(N=2, C=192, H=9, W=11), lambda a: {"Y": a["X"].mean(axis=2)}),
    "middle_sum": (MIDDLE_SUM, dict(B=256, P=5, Q=3, F=40), lambda a: {"s": 0.5 + a["A"].sum(axis=(1, 2))}),
    "middle_max": (MIDDLE_MAX, dict(O=384, R=7, F=33), lambda a: {"m": np.maximum(a["X"].max(axis=1), -3)}),
    "middle_min": (MIDDLE_MIN, dict(O=128, R=2, F=300), lambda a: {"m": np.minimum(a["X"].min(axis=1), 3)}),
    "middle_ssd": (MIDDLE_SSD, dict(A=256, B=6, C=50),
                   lambda a: {"s": ((a["X"] - a["Z"]) ** 2).mean(axis=1)}),
}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("target", ["trn2", "trn1"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_outer_rows_reduction_matches_numpy(name: str, target: str, dtype: str) -> None:
    text, sizes, formula = CASES[name]
    program = lang.load(text.format(t=dtype), sizes)
    compiled = compile_loaded(program, None, None, target)
    assert "outer rows on the partitions" in words(compiled.source)  # the layout under test, not the ones-matmul one
    assert_formula_matches(compiled, formula, f"{name} {dtype}")


def test_few_outer_rows_keep_the_ones_matmul() -> None:
    """32 outer rows of 128 reduced ones: the reduced rows fill the partitions, so the layout stays TensorE's."""
    program = lang.load(MIDDLE_SSD.format(t="f32"), dict(A=32, B=128, C=64))
    assert "outer rows on the partitions" not in words(compile_loaded(program).source)
