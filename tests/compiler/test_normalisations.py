"""Programs written as several statements, the way a user writes them after the course: softmax, layernorm and
rmsnorm over rows, a sum of squared differences in one statement, and broadcast operands carrying constants. Each
compiles with the default schedule and matches the reference evaluator on the interpreter."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import compile_example, inputs_for
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from kernel_numbers import numbered


def check(c, seed: int = 42) -> None:
    """Outputs of unit scale: the tolerance is relative to the largest output (a centred value near 0 carries the
    rounding of the mean, so an element-wise relative tolerance would judge summation order)."""
    inputs = inputs_for(c.program, seed)
    want = lang.evaluate(c.program, inputs)
    got = c.run(**inputs)
    for name, w in want.items():
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(np.asarray(got[name], np.float32), w, rtol=1e-5, atol=2e-6 * scale)


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("sizes", [None, {"M": 200, "N": 1000}])
def test_normalisations_over_rows(name: str, sizes) -> None:
    check(compile_example(name, sizes))


SSD = """kernel ssd(A: f32[M, N], B: f32[M, N]) -> s
  default M = 256, N = 384
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += (A[i, j] - B[i, j]) * (A[i, j] - B[i, j])
"""

BROADCAST_CONSTANTS = """kernel bcast(X: f32[M, N], b: f32[N], c: f32[M]) -> Y
  default M = 256, N = 512
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = 2*X[i, j] + b[j] - 0.5*c[i]
"""


def test_sum_of_squared_differences_in_one_statement() -> None:
    c = compile_loaded(lang.load(SSD))
    assert "of (A[i, j] - B[i, j]) * (A[i, j] - B[i, j])" in c.stages["select"]
    check(c)


def test_broadcast_operands_carry_constants() -> None:
    c = compile_loaded(lang.load(BROADCAST_CONSTANTS))
    # the constant is applied to the (P, 1) column, not the tile (on ScalarE: the column is then the bias of X's
    # scaling, as rows broadcast whole are regrouped: expr_instrs.regrouped)
    assert "data=c_col, scale=-0.5" in numbered(c.source)
    check(c)


def test_a_row_chain_is_one_pass_over_row_tiles() -> None:
    """With the default schedule the four softmax statements share one loop over row tiles: no intermediate goes
    to HBM, the shift rides on the exp (activation bias) and the division on a ScalarE scale."""
    c = compile_example("softmax")
    assert "fused row chain" in numbered(c.source) and "buffer=nl.hbm" not in numbered(c.source)
    assert "nisa.activation(op=nl.exp, data=X_tile, bias=" in numbered(c.source)
    assert numbered(c.source).count("nisa.dma_copy(") == 2  # one load, one store per row tile


def test_a_directive_on_a_chain_op_keeps_that_op_separate() -> None:
    """`tile s.j, 256` schedules s on its own: m and e still fuse, e goes through HBM to s and Y."""
    c = compile_example("softmax", schedule="tile s.j, 256")
    assert "# ---- m, e: one pass over row tiles (fused row chain)" in numbered(c.source)
    assert "S_TILE_F = 256" in c.source
    assert "e = nl.ndarray((256, 512), dtype=nl.float32, buffer=nl.hbm)" in numbered(c.source)
    check(c)


SOFTMAX_WITH_SUMS = """kernel sm(X: f32[M, N]) -> Y, s
  default M = 200, N = 300
  m: f32[M]
  e: f32[M, N]
  s: f32[M]
  Y: f32[M, N]
  for i in 0..M:
    m[i] = -inf
    for j in 0..N:
      m[i] max= X[i, j]
  for i in 0..M, j in 0..N:
    e[i, j] = exp(X[i, j] - m[i])
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += e[i, j]
  for i in 0..M, j in 0..N:
    Y[i, j] = e[i, j] / s[i]
"""


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_a_chain_stores_every_output_it_makes(dtype: str) -> None:
    c = compile_loaded(lang.load(SOFTMAX_WITH_SUMS.replace("f32", dtype)))
    assert "fused row chain" in numbered(c.source)
    if dtype == "f32":
        check(c)
        return
    inputs = inputs_for(c.program)
    want, got = lang.evaluate(c.program, inputs), c.run(**inputs)
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name], np.float32), want[name], rtol=4e-3, atol=1e-3)
