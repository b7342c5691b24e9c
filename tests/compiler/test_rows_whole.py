"""One reading of "rows broadcast whole" (schedule.rows_whole, row_free): the default plan of an element-wise op
with a broadcast row and the rule that expands it agree on the free tile, so `tilec explain` shows the tile the
kernel uses. Rows copied to the partitions tile by tile (per outer index, `mask[b, k]`, or per ragged region of
partitions) go through one PSUM bank per tile, at most 512 fp32 columns; the plan said 1024 for them and the rule
capped it (lead16's review). Each kernel matches its NumPy formula in float64."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.compiler.lower import lower
from tilec.compiler.schedule import MOVING_FMAX, default_plan
from tilec.compiler.select import select
from tilec.lang import api as lang

RAGGED = """\
kernel rb(X: f32[M, N], b: f32[N]) -> Y
  default M = 139, N = 2048
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] * b[j]
"""
MASK = """\
kernel mk(S: f32[B, Q, K], mask: f32[B, K]) -> Y
  default B = 2, Q = 128, K = 2048
  Y: f32[B, Q, K]
  for b in 0..B, q in 0..Q, k in 0..K:
    Y[b, q, k] = S[b, q, k] + mask[b, k]
"""
WHOLE = """\
kernel wh(X: f32[M, N], b: f32[N]) -> Y
  default M = 256, N = 2048
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] - b[j]
"""
CASES = {  # name -> (program, formula, whether the row is broadcast whole)
    "ragged_partitions": (RAGGED, lambda a: a["X"] * a["b"], False),
    "row_per_outer_index": (MASK, lambda a: a["S"] + a["mask"][:, None, :], False),
    "whole": (WHOLE, lambda a: a["X"] - a["b"], True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_plan_explain_shows_is_the_kernels_tile(case: str) -> None:
    text, formula, whole = CASES[case]
    prog = lang.load(text)
    plan = default_plan(select(lower(prog.kernel, prog.sizes), prog)[0], {})
    assert (plan.free > MOVING_FMAX) == whole  # wide tiles only for rows broadcast whole
    prog, c, inputs, out = compile_and_run(text, "0.6")
    assert f"TILE_F = {plan.free}" in c.source.replace("  ", " ")
    assert_matches(prog, "Y", out["Y"], formula({b: np.asarray(v, np.float64) for b, v in inputs.items()}))
