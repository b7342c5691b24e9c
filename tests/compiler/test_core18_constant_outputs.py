"""Constant output indices (`Y[0, j] = ...`, `Y[i, 3] = ...`): each part of the output is stored by a copy (a unit
loop shifted by the constant), an expression computed into a temporary first (const_split.py). They were refused
("the compiler needs each index of Y to be a plain loop variable"). Matched against NumPy formulas in both NKI
dialects; parts that overlap are a located error."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

ROWS = """\
kernel rows(X: f32[Q, K]) -> S
  default Q = 130, K = 200
  S: f32[3, Q, K]
  for q in 0..Q, k in 0..K:
    S[0, q, k] = X[q, k] * 2
  for k in 0..K, q in 0..Q:
    S[2, q, k] = X[q, k]
  for q in 0..Q, k in 0..K:
    S[1, q, k] = exp(X[q, k]) + 1
"""

COLUMNS = """\
kernel cols(A: f32[M], B: f32[M, C]) -> Y
  default M = 300, C = 5
  Y: f32[M, C + 2]
  for i in 0..M, j in 0..C:
    Y[i, j] = B[i, j] * 2
  for i in 0..M:
    Y[i, C] = relu(A[i] - 0.5)
  for i in 0..M:
    Y[i, C + 1] = A[i]
"""

CORNER = """\
kernel corner(A: f32[M, N], v: f32[N]) -> Y
  default M = 140, N = 260
  Y: f32[M + 1, N]
  for j in 0..N:
    Y[0, j] = v[j] * v[j]
  for i in 0..M, j in 0..N:
    Y[i + 1, j] = A[i, j]
"""

CASES = {  # name: (program, NumPy formula of the inputs)
    "rows_of_a_3d_output": (ROWS, lambda a: {"S": np.stack([a["X"] * 2, np.exp(a["X"]) + 1, a["X"]])}),
    "columns_after_a_block": (COLUMNS, lambda a: {"Y": np.concatenate(
        [a["B"] * 2, np.maximum(a["A"] - 0.5, 0)[:, None], a["A"][:, None]], axis=1)}),
    "a_first_row_then_shifted_rows": (CORNER, lambda a: {"Y": np.concatenate([(a["v"] ** 2)[None], a["A"]])}),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_constant_output_indices_match_numpy(case, nki):
    text, formula = CASES[case]
    prog, c, inputs, out = compile_and_run(text, nki)
    for name, want in formula({k: v.astype(np.float64) for k, v in inputs.items()}).items():
        assert out[name].shape == want.shape
        assert_matches(prog, name, out[name], want)


def test_overlapping_parts_are_refused_where_the_second_writes():
    text = COLUMNS.replace("for i in 0..M, j in 0..C:", "for i in 0..M, j in 0..C + 1:")
    text = text.replace("f32[M, C]", "f32[M, C + 1]")
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text))
    msg = str(e.value)
    assert ":7:5:" in msg  # `Y[i, C]`, line 7
    assert "writes elements of Y that line 5 writes too (Y[0..300, 5])" in msg
    assert "write each element of the output once" in msg


def test_a_reduction_started_at_a_constant_index_keeps_its_form():
    text = """\
kernel total(X: f32[M, N]) -> s
  default M = 200, N = 300
  s: f32[1]
  s[0] = 1
  for i in 0..M, j in 0..N:
    s[0] += X[i, j]
"""
    prog, c, inputs, out = compile_and_run(text, "0.6")
    assert_matches(prog, "s", out["s"], [1 + inputs["X"].astype(np.float64).sum()])
