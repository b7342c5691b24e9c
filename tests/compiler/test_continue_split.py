"""Reductions continuing one another into one output (continue_split.py): `Y = init; for k: Y += A B; for k: Y +=
C D` as the chain of contractions sum_split makes of `Y += A B + C D`; against NumPy."""
from __future__ import annotations

import numpy as np

from compiler_helpers import assert_matches, run_in_own_dtypes
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

TWO = """\
kernel two(A: f32[M, K], B: f32[K, N], C: f32[M, K], D: f32[K, N]) -> Y
  default M = 130, K = 200, N = 96
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = 0
    for k in 0..K:
      Y[i, j] += A[i, k] * B[k, j]
    for k in 0..K:
      Y[i, j] += C[i, k] * D[k, j]
"""

# three reductions of different lengths from a bias, into bf16 (the partial sums stay f32)
THREE = """\
kernel three(A: bf16[M, K], B: bf16[K, N], C: bf16[M, L], D: bf16[L, N], E: bf16[M, L], b: f32[N]) -> Y
  default M = 140, K = 150, L = 70, N = 100
  Y: bf16[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = b[j]
    for k in 0..K:
      Y[i, j] += A[i, k] * B[k, j]
    for l in 0..L:
      Y[i, j] += C[i, l] * D[l, j]
    for l in 0..L:
      Y[i, j] += E[i, l] * D[l, j]
"""


def test_two_accumulations_are_the_summed_kernel() -> None:
    prog, out, a = run_in_own_dtypes(TWO, 1)
    assert_matches(prog, "Y", out["Y"], a["A"] @ a["B"] + a["C"] @ a["D"])
    summed = TWO.replace("A[i, k] * B[k, j]\n    for k in 0..K:\n      Y[i, j] +=", "A[i, k] * B[k, j] +")
    kernels = [compile_loaded(lang.load(t)).source.splitlines() for t in (TWO, summed)]
    # the same instructions (only the `# tl:` line references of the source differ)
    assert [s.split("# tl:")[0] for s in kernels[0]] == [s.split("# tl:")[0] for s in kernels[1]]


def test_three_accumulations_of_different_lengths_bf16() -> None:
    prog, out, a = run_in_own_dtypes(THREE, 2)
    want = a["b"][None, :] + a["A"] @ a["B"] + a["C"] @ a["D"] + a["E"] @ a["D"]
    assert_matches(prog, "Y", np.asarray(out["Y"], np.float32), want)


MAXES = """\
kernel mx(A: f32[M, N], B: f32[M, L]) -> Y
  default M = 130, N = 70, L = 50
  Y: f32[M]
  for i in 0..M:
    Y[i] = -inf
    for j in 0..N:
      Y[i] max= A[i, j]
    for l in 0..L:
      Y[i] max= B[i, l] * 2
"""


def test_a_maximum_continued_over_another_tensor() -> None:
    prog, out, a = run_in_own_dtypes(MAXES, 3)
    assert_matches(prog, "Y", out["Y"], np.maximum(a["A"].max(1), 2 * a["B"].max(1)))


def test_a_reduction_in_its_own_nest_right_after_joins_the_chain() -> None:
    text = TWO.replace("    for k in 0..K:\n      Y[i, j] += C[i, k] * D[k, j]\n",
                       "  for p in 0..M, q in 0..N:\n    for k in 0..K:\n      Y[p, q] += C[p, k] * D[k, q]\n")
    prog, out, a = run_in_own_dtypes(text, 4)
    assert_matches(prog, "Y", out["Y"], a["A"] @ a["B"] + a["C"] @ a["D"])
