"""A positional embedding added to every sequence of a batch, `Y[b, s, d] = X[b, s, d] + P[s, d]`: P's tile is loaded
once for every b and the b loop loads X's tile, adds, stores Y's. The add is cut between GpSimdE (first) and VectorE
(dma_streams.cut_apart), so X's loads are triggered on GpSimdE's stream and Y's stores on VectorE's: the next
load does not wait behind this tile's store. The kernel's output on the interpreter matches NumPy."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

EMBED = """kernel embed(X: DT[B, S, D], P: DT[S, D]) -> Y
  default B = 3, S = 256, D = 512
  Y: DT[B, S, D]
  for b in 0..B, s in 0..S, d in 0..D:
    Y[b, s, d] = X[b, s, d] + P[s, d]
"""
NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}


def run(dtype: str, nki: str | None = None):
    c = compile_loaded(lang.load(EMBED.replace("DT", dtype)), nki=nki, target="trn2")
    given = {n: np.asarray(v, NP[dtype]) for n, v in lang.random_inputs(c.program, seed=7).items()}
    got = np.asarray(c.run(**given)["Y"], np.float64)
    x, p = (given[n].astype(np.float64) for n in ("X", "P"))
    return c, got, x + p[None]


@pytest.mark.parametrize("nki", [None, "0.1"])
def test_the_add_is_cut_between_gpsimd_and_vector(nki: str | None) -> None:
    c, got, want = run("f32", nki)
    assert "gpsimd" in c.source
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_sixteen_bit_adds_stay_whole() -> None:
    """All-bf16 operands: VectorE's fast mode borrows GpSimdE's bus (expr_instrs.shared_binary keeps them whole)."""
    c, got, want = run("bf16")
    assert "gpsimd" not in c.source
    ulp = 2.0**-8
    assert np.abs(got - want).max() <= ulp * np.abs(want).max()


def test_a_loop_of_two_loads_is_left_whole() -> None:
    """`a + b` loads two tiles per iteration: their bytes bound it cut or not (vector add 24.0 -> 24.2 us cut)."""
    text = EMBED.replace("DT", "f32").replace("P: f32[S, D]", "P: f32[B, S, D]").replace("P[s, d]", "P[b, s, d]")
    c = compile_loaded(lang.load(text), target="trn2")
    assert "gpsimd" not in c.source
