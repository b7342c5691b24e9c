"""An element-wise nest of several tiles is software-pipelined at its loads (pair_tiles.skew_row_tiles, called for
element-wise ops by pipeline._scheduled): the next tile's loads are issued before this tile's work and stores. A
DMA trigger waits for the previous trigger of its stream (perf/schedule.py, after the NKI DMA docs: "DMA transfers
within a queue are executed in order"), and a store waits for its tile's work, so loading after storing made tiles
take turns with one engine. The output equals the NumPy formula in every shape, pipelined or not (f32, bf16)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

SRC = """kernel k(X: f32[M, N], Z: f32[M, N]) -> Y
  default M = {M}, N = {N}
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = {expr}
"""
PIPELINED = "software-pipelined: the next tile's loads"


def compiled(expr: str, dtype: str, M: int, N: int):
    return compile_loaded(lang.load(SRC.format(expr=expr, M=M, N=N).replace("f32", dtype)), nki="0.6")


def check(c, expr_np, dtype: str, M: int, N: int) -> None:
    rng = np.random.default_rng(5)
    x = {n: (rng.random((M, N), dtype=np.float32) - 0.5) * 6 for n in ("X", "Z")}
    if dtype == "bf16":
        x = {n: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for n, v in x.items()}
    got = np.asarray(c.run(**x)["Y"], np.float64)
    want = expr_np(*(np.asarray(x[n], np.float64) for n in ("X", "Z")))
    rel = 2.0**-20 if dtype == "f32" else 2.0**-7
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * np.abs(want).max())


def loop_body(source: str) -> str:
    """The pipelined loop's body (its indented lines)."""
    m = re.search(rf"\n( *)for t in range\(\d+\):.*{PIPELINED}.*\n((?:\1    .*\n)+)", source)
    assert m, "no pipelined loop"
    return m.group(2)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("expr, fn", [("tanh(X[i, j])", lambda x, z: np.tanh(x)),
                                      ("X[i, j] + Z[i, j]", lambda x, z: x + z)])
def test_loads_of_the_next_tile_come_before_this_tiles_store(dtype, expr, fn) -> None:
    M, N = 512, 8192
    c = compiled(expr, dtype, M, N)
    body = loop_body(c.source)
    dmas = re.findall(r"dma_copy\(dst=(\w+)", body)
    first_store = next(i for i, d in enumerate(dmas) if d == "Y_v")
    assert first_store > 0 and all(d != "Y_v" for d in dmas[:first_store])  # a load of the next tile leads
    check(c, fn, dtype, M, N)


@pytest.mark.parametrize("M, N", [(128, 8192 * 3), (256, 1000), (384, 4096), (2, 3)])
def test_any_number_of_tiles_matches_numpy(M, N) -> None:
    """Odd tile counts and single tiles stay as they were; the results match either way."""
    check(compiled("tanh(X[i, j]) * 2 - Z[i, j]", "f32", M, N), lambda x, z: np.tanh(x) * 2 - z, "f32", M, N)


def test_the_model_overlaps_the_pipelined_tiles() -> None:
    """One ScalarE function per tile: the model's estimate (start-up excluded) is within 1.15x of the time the
    core's HBM needs for the bytes (the tiles issued in turn, load, work, store, took ~1.7x: 644 us at 4096^2)."""
    from tilec.perf.api import estimate
    from tilec.target import TARGETS

    M, N = 2048, 4096
    c = compiled("tanh(X[i, j])", "f32", M, N)
    assert PIPELINED in c.source
    _, trace = c.run_traced(**lang.random_inputs(c.program, seed=1), numerics=False)
    est = estimate(trace)
    floor_us = 2 * M * N * 4 / TARGETS["trn2"].hbm_bw / 1000
    assert est.total_us - est.params.startup_ns.value / 1000 < 1.15 * floor_us
