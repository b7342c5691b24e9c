"""Directives the printed schedules use (core24): what `tilec explain` prints must compile when pasted back
(test_explain_roundtrip.py covers every program); these are the cases that were refused or changed the kernel,
checked against NumPy formulas at small shapes."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import compile_example
from test_core20_directives import compiled, matches
from tilec.errors import TilecError

ROW = """kernel r(X: f32[M, N], b: f32[N]) -> Y
  default M = {M}, N = {N}
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] + b[j]
"""

PRODUCED = """kernel mm(A: f32[M, K], B: f32[K, N]) -> Y
  default M = {M}, K = {K}, N = {N}
  T: f32[M, K]
  Y: f32[M, N]
  for i in 0..M, k in 0..K:
    T[i, k] = exp(A[i, k])
  for i in 0..M, j in 0..N:
    Y[i, j] = 0
    for k in 0..K:
      Y[i, j] += T[i, k] * B[k, j]
"""


def test_whole_rows_take_tiles_wider_than_a_psum_bank():
    """b copied to the partitions once, whole (schedule.rows_whole): a tile of 1024 columns needs no PSUM bank of
    1024 (the default plan's own tiles are that wide, and explain prints them)."""
    c = compiled(ROW, "tile Y.j, 1024", M=64, N=2048)
    assert "free=1024" in c.stages["schedule"]
    matches(c, lambda x: x["X"] + x["b"])


def test_rows_broadcast_per_tile_keep_the_bank_limit():
    """200 rows in tiles of 128: a ragged last partition tile, so b goes to the partitions tile by tile through one
    PSUM bank each."""
    with pytest.raises(TilecError) as err:
        compiled(ROW, "tile Y.i, 128\ntile Y.j, 1024", M=200, N=2048)
    assert "512 columns one matmul broadcasts b" in err.value.message and err.value.span is not None


def test_hoist_of_an_operand_an_earlier_statement_writes():
    """`hoist T, Y.i`: T is the matmul's stationary operand and the output of the exp before it; the directive is
    about the matmul (it was refused as "only conv inputs can be hoisted", naming T's element-wise op)."""
    default = compiled(PRODUCED, "", M=256, K=128, N=256)
    c = compiled(PRODUCED, "hoist T, Y.i", M=256, K=128, N=256)
    assert "hoist_w='k'" in c.stages["schedule"] and c.source != default.source
    matches(c, lambda x: np.exp(x["A"]) @ x["B"])


@pytest.mark.parametrize("n", [1, 3])
def test_buffers_of_an_operand_a_chain_reads_names_the_chain(n):
    """X is read by m and e, both in softmax's row chain: the refusal names the chain whose tiles they are."""
    with pytest.raises(TilecError) as err:
        compile_example("softmax", {"M": 256, "N": 64}, schedule=f"buffers X, {n}")
    assert "X is read by m and e, which the row chain of m, e, s, Y computes together" in err.value.message
    assert err.value.span is not None and err.value.span.line == 1
