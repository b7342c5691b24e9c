"""Sums over leading or middle dimensions (column sums, a mean over a middle axis): the reduced rows go on the
partitions and a ones-matmul on TensorE adds them up in PSUM. Checked against NumPy and the reference evaluator."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import check_against_reference, inputs_for
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

COLSUM = """kernel colsum(A: f32[M, N]{extra}) -> s
  default M = {m}, N = {n}
  s: f32[N]
  for j in 0..N:
    s[j] = {init}
  for i in 0..M, j in 0..N:
    s[j] += {term}
"""
MIDMEAN = """kernel midmean(A: f32[B, M, N]) -> s
  default B = 3, M = 200, N = 96
  s: f32[B, N]
  for b in 0..B, n in 0..N:
    s[b, n] = 0
    for m in 0..M:
      s[b, n] += A[b, m, n] / M
"""


def compile_text(text: str, schedule: str | None = None):
    directives = lang.parse_schedule(schedule, "<test>") if schedule is not None else None
    return compile_loaded(lang.load(text), directives)


def colsum(m=256, n=384, init="0", term="A[i, j]", extra=""):
    return COLSUM.format(m=m, n=n, init=init, term=term, extra=extra)


@pytest.mark.parametrize("text,schedule", [
    (colsum(), None), (colsum(), "tile s.i, 64\ntile s.j, 128"), (colsum(300, 1000), None),
    (colsum(init="b[j]", extra=", b: f32[N]"), None), (colsum(term="A[i, j] * A[i, j] / M"), None),
    (MIDMEAN, None),
])
def test_sums_over_leading_dimensions(text, schedule):
    c = compile_text(text, schedule)
    assert "nisa.nc_matmul(ones_f32" in c.source
    check_against_reference(c)


def test_column_sum_against_numpy():
    c = compile_text(colsum())
    a = inputs_for(c.program)["A"]
    got = np.asarray(c.run(A=a)["s"], np.float32)
    np.testing.assert_allclose(got, a.astype(np.float64).sum(axis=0), rtol=1e-5)


def test_column_sum_directives_are_checked():
    with pytest.raises(TilecError, match="exceeds the 512 one matmul sums"):
        compile_text(colsum(n=1024), "tile s.j, 1024")
