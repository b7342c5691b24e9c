"""A row of two or more trailing indices broadcast over few leading ones, `Y[b, s, d] = X[b, s, d] + P[s, d]` (a
positional embedding added to a batch): the row's first index goes on the partitions and each tile of P is loaded
once for every b (rules._rows_reused); before, the B leading values were the partitions and P was copied to all of
them, 40x the DMA floor on the model at 8 x 512 x 512 fp32. Outputs on the interpreter against NumPy."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler import rules
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

EMBED = """
kernel embed(X: {t}[B, S, D], P: {t}[S, D]) -> Y
  default B = {b}, S = {s}, D = {d}
  Y: {t}[B, S, D]
  for b in 0..B, s in 0..S, d in 0..D:
    Y[b, s, d] = {expr}
"""
DTYPE = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}


def compiled(t: str = "f32", b: int = 4, s: int = 256, d: int = 192, expr: str = "X[b, s, d] + P[s, d]",
             nki: str | None = None, **sizes: int):
    return compile_loaded(lang.load(EMBED.format(t=t, b=b, s=s, d=d, expr=expr), sizes or None), nki=nki,
                          target="trn2")


@pytest.mark.parametrize("t,b,s,d,nki", [("f32", 4, 256, 192, None), ("bf16", 4, 256, 192, None),
                                         ("f32", 3, 96, 40, "0.6"), ("bf16", 2, 128, 1536, "0.6")])
def test_the_row_is_loaded_once_for_every_batch_index_and_matches_numpy(t: str, b: int, s: int, d: int,
                                                                        nki: str | None) -> None:
    c = compiled(t, b, s, d, "relu(X[b, s, d] * 0.5 + P[s, d])", nki)
    assert "P loaded once for every b" in c.source
    inputs = lang.random_inputs(c.program, seed=29)
    x, p = (np.asarray(inputs[k], DTYPE[t]).astype(np.float32) for k in ("X", "P"))
    want = np.maximum(x * np.float32(0.5) + p[None], 0).astype(DTYPE[t]).astype(np.float64)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    np.testing.assert_array_equal(got, want)  # one multiply, one add in f32, rounded once: exact


def test_rows_of_one_index_or_many_leading_partitions_keep_the_broadcast_layout() -> None:
    """A row of the last index alone (`g[d]`) and 128 or more leading values keep the broadcast rows."""
    row = EMBED.format(t="f32", b=4, s=256, d=192, expr="X[b, s, d] + g[d]").replace("P: f32[S, D]", "g: f32[D]")
    assert "loaded once for every" not in compile_loaded(lang.load(row), target="trn2").source
    assert "loaded once for every" not in compiled(b=128, s=256, d=64).source


def test_the_model_puts_the_batched_embedding_near_its_floor(monkeypatch) -> None:
    from tilec.perf.api import estimate
    from tilec.target import TARGETS

    def run_us() -> float:
        c = compiled(B=8, S=512, D=512)
        _, trace = c.run_traced(**lang.random_inputs(c.program, seed=1), numerics=False)
        est = estimate(trace)
        return est.total_us - est.params.startup_ns.value / 1000

    floor_us = (2 * 8 + 1) * 512 * 512 * 4 / TARGETS["trn2"].hbm_bw / 1000
    reused = run_us()
    monkeypatch.setattr(rules, "_rows_on_partitions", lambda n: False)
    assert reused < 3 * floor_us < 10 * floor_us < run_us()
