"""Any loop name the user chooses works: the reduction rules name their own loops (`r`, `f`, `o`, `p`, `g`, `e`,
`e_u`, ..) and reshape the epilogue nests (`s = s / F`, `s = s + c`) after the reduction's, so a kept loop the user
called like one of them was "2 loops are named `r`" without a location (perf16, lead16). Each kernel matches a
NumPy formula in float64."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run

ROW_MEAN_SQUARES = """\
kernel ms(X: f32[R, F]) -> s
  default R = {R}, F = {F}
  s: f32[R]
  for {k} in 0..R:
    s[{k}] = 0
  for {k} in 0..R, j in 0..F:
    s[{k}] += X[{k}, j] * X[{k}, j] / F
"""
ROW_MEAN_PLUS = """\
kernel mp(X: f32[R, F], c: f32[R]) -> s
  default R = {R}, F = {F}
  s: f32[R]
  for {k} in 0..R:
    s[{k}] = 0
  for {k} in 0..R, j in 0..F:
    s[{k}] += X[{k}, j] / F
  for {k} in 0..R:
    s[{k}] = s[{k}] + c[{k}]
"""
MIDDLE_MEAN = """\
kernel mm(X: f32[Q, R, F]) -> s
  default Q = 3, R = {R}, F = {F}
  s: f32[Q, F]
  for {k} in 0..Q, j in 0..F:
    s[{k}, j] = 0
  for {k} in 0..Q, i in 0..R, j in 0..F:
    s[{k}, j] += X[{k}, i, j] / R
"""
CASES = {  # name -> (program, sizes, formula of the inputs)
    "rows": (ROW_MEAN_SQUARES, (128, 2048), lambda x: (x["X"] ** 2).mean(1)),
    "short_rows": (ROW_MEAN_SQUARES, (2048, 16), lambda x: (x["X"] ** 2).mean(1)),
    "two_steps": (ROW_MEAN_PLUS, (256, 1024), lambda x: x["X"].mean(1) + x["c"]),
    "middle": (MIDDLE_MEAN, (64, 96), lambda x: x["X"].mean(1)),
}
NAMES = ("r", "f", "o", "p", "g", "e", "e_u", "e2")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_kept_loop_named_like_a_rules_loop_matches_numpy(case: str, name: str) -> None:
    text, (R, F), formula = CASES[case]
    prog, _, inputs, out = compile_and_run(text.format(R=R, F=F, k=name), "0.6")
    want = formula({b: np.asarray(v, np.float64) for b, v in inputs.items()})
    assert_matches(prog, "s", out["s"], want)
