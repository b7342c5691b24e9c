"""Directives of core25: column sums whose free tiles do not divide their columns into a narrower output (each
column part evicts into a tile of its own width), checked against NumPy at small shapes."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import run_in_own_dtypes

MEAN = """kernel colmean(A: bf16[{shape}]) -> s
  default {sizes}R = 96, F = 128
  s: bf16[{out}]
  for {outer}j in 0..F:
    s[{idx}j] = 0
    for i in 0..R:
      s[{idx}j] += A[{idx}i, j] / R
  schedule:
{schedule}
"""


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("schedule", ["tile s.j, 21\ntile s.i, 64", "tile s.j, 21", "tile s.j, 100\ntile s.i, 96"])
def test_ragged_column_tiles_of_a_narrow_mean(batched, schedule):
    """128 columns in tiles of 21 (six whole tiles and one of 2): each part's bf16 row is its own tile (the parts
    shared one name, and the verifier refused the last part's 2 columns written into the first part's 21)."""
    text = MEAN.format(sizes="B = 3, " if batched else "", shape="B, R, F" if batched else "R, F", out="B, F" if batched else "F",
                       outer="b in 0..B, " if batched else "", idx="b, " if batched else "",
                       schedule="\n".join("    " + line for line in schedule.splitlines()))
    _, out, x = run_in_own_dtypes(text, seed=25)
    want = x["A"].mean(axis=-2)
    np.testing.assert_allclose(np.asarray(out["s"], np.float64), want, rtol=2.0**-7, atol=2.0**-7)
