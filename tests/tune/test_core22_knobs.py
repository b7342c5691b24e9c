"""The tuner's knobs for the settings core21/core22 made work: a broadcast layout's tile order (`reorder`),
flattened data's free tiles per DMA (`split`), ragged tiles of a row reduction. Each value the space offers
compiles, and its kernel equals a NumPy formula on the interpreter (small shapes)."""
from __future__ import annotations

import numpy as np
import pytest

from tilec.compiler.api import compile_loaded, read_schedule
from tilec.lang import api as lang
from tilec.tune.knobs import space_of
from tilec.tune.space import DIRECTIVES

SWISH = """kernel s(X: f32[M, N], beta: f32[N]) -> Y
  default M = 256, N = 2048
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] * sigmoid(beta[j] * X[i, j])
"""

TANH = """kernel t(X: f32[M, N]) -> Y
  default M = 256, N = 2048
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = tanh(X[i, j])
"""

ROWSUM = """kernel r(A: f32[M, N]) -> s
  default M = 521, N = 1031
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += A[i, j]
"""

FORMULAS = {"Y": lambda x: x["X"] / (1 + np.exp(-x["beta"][None, :] * x["X"])) if "beta" in x else np.tanh(x["X"]),
            "s": lambda x: x["A"].sum(axis=1)}


def knobs(text: str) -> dict:
    c = compile_loaded(lang.load(text), read_schedule(""), "0.6")
    return {k.name: k for k in space_of(c, "trn2").knobs}


def check(text: str, line: str) -> None:
    c = compile_loaded(lang.load(text), read_schedule(line), "0.6")
    rng = np.random.default_rng(22)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5) * 4 for t in c.program.inputs}
    out = c.program.kernel.outputs[0]
    got = np.asarray(c.run(**given)[out], np.float64)
    want = FORMULAS[out]({k: v.astype(np.float64) for k, v in given.items()})
    np.testing.assert_allclose(got, want, rtol=2.0**-18, atol=2.0**-18 * np.abs(want).max())


@pytest.mark.parametrize("text, name, values", [
    (SWISH, "reorder Y", [None, ("j", "i"), ("i", "j")]),
    (TANH, "split Y.i", [None, 2, 4]),
])
def test_the_tile_order_and_dma_knobs_offer_what_compiles(text, name, values):
    knob = knobs(text)[name]
    assert list(knob.values) == values
    for v in values[1:]:
        check(text, DIRECTIVES[knob.kind](knob, v))


def test_a_row_reduction_without_a_good_divisor_gets_ragged_tiles():
    """521 rows and 1031 elements, both prime: round sizes, the last tile smaller."""
    found = knobs(ROWSUM)
    assert {64, 128} <= set(found["tile s.i"].values) and {512, 1024} <= set(found["tile s.j"].values)
    check(ROWSUM, "tile s.i, 64\ntile s.j, 512")
