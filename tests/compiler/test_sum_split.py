"""A contraction of a sum of products (sum_split.py), `Y += A B + C D` and a complex product's real part with a
subtracted, scaled term, as the chain of contractions each started from the last; against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_in_own_dtypes
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

TWO = """\
kernel two(A: f32[M, K], B: f32[K, N], C: f32[M, K], D: f32[K, N]) -> Y
  default M = 130, K = 200, N = 96
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = 0
    for k in 0..K:
      Y[i, j] += A[i, k] * B[k, j] + C[i, k] * D[k, j]
"""

REAL_PART = """\
kernel re(Ar: bf16[M, K], Ai: bf16[M, K], Br: bf16[K, N], Bi: bf16[K, N], b: f32[N]) -> Y
  default M = 200, K = 150, N = 130
  Y: bf16[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = b[j]
    for k in 0..K:
      Y[i, j] += Ar[i, k] * Br[k, j] - Ai[i, k] * Bi[k, j] * 0.5
"""


def _run(text: str, seed: int):
    return run_in_own_dtypes(text, seed, 2.0)


def test_two_products_summed() -> None:
    prog, out, a = _run(TWO, seed=1)
    assert_matches(prog, "Y", out["Y"], a["A"] @ a["B"] + a["C"] @ a["D"])
    assert "Y_1" in compile_loaded(prog).stages["select"]  # the first product's f32 partial sum


def test_real_part_of_a_complex_product() -> None:
    prog, out, a = _run(REAL_PART, seed=2)
    want = a["b"][None, :] + a["Ar"] @ a["Br"] - 0.5 * (a["Ai"] @ a["Bi"])
    assert_matches(prog, "Y", np.asarray(out["Y"], np.float32), want)


def test_a_term_constant_along_the_sum_is_left_to_the_rules() -> None:
    """`Y += A B + c[j]` adds c K times: not split, the rules refuse it at its line."""
    text = TWO.replace("C: f32[M, K], D: f32[K, N]", "c: f32[N]").replace("C[i, k] * D[k, j]", "c[j]")
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(text))
    assert err.value.span is not None and err.value.span.line == 7
