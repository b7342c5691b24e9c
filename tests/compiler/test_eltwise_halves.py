"""An element-wise tile whose instructions pass values from VectorE/GpSimdE to ScalarE and back (or the reverse) is two
column halves with their instructions alternating (expr_instrs.ExprCompiler.interleaved): ScalarE's function of one
half runs while the other engines work on the other half. The output equals the NumPy formula (f32, bf16); tiles
without ScalarE functions, narrower than two shares, or busiest on ScalarE stay whole."""
from __future__ import annotations

import re

import numpy as np
import pytest

from kernel_numbers import numbered
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

SRC = """kernel k(X: f32[M, N], Z: f32[M, N], beta: f32[N]) -> Y
  default M = {M}, N = {N}
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = {expr}
"""


def run(expr: str, dtype: str, M: int = 256, N: int = 2048):
    c = compile_loaded(lang.load(SRC.format(expr=expr, M=M, N=N).replace("f32", dtype)), nki="0.6")
    rng = np.random.default_rng(3)
    inputs = {"X": (rng.random((M, N), dtype=np.float32) - 0.5) * 8,
              "Z": (rng.random((M, N), dtype=np.float32) - 0.5) * 8,
              "beta": rng.random(N, dtype=np.float32) + np.float32(0.5)}
    if dtype == "bf16":
        inputs = {n: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for n, v in inputs.items()}
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    return c, got, {n: np.asarray(v, np.float64) for n, v in inputs.items()}


def activations(source: str, fn: str) -> list[str]:
    """The destination tiles of the kernel's `fn` activations."""
    return re.findall(rf"activation\(dst=(\w+), op=nl\.{fn},", source)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_swish_with_a_column_slope_alternates_halves(dtype: str) -> None:
    c, got, x = run("X[i, j] * sigmoid(beta[j] * X[i, j])", dtype)
    tiles = activations(c.source, "sigmoid")
    assert len(tiles) == 2 and tiles[0] != tiles[1]  # one sigmoid per half, each into its own temporary
    tile_f = re.search(r"TILE_F = (\d+)", c.source)  # (a bf16 tile is a whole row of 2048: no TILE_F)
    half = (int(tile_f.group(1)) if tile_f else 2048) // 2
    assert re.search(rf"{tiles[0]} = nl.ndarray\(\(128, {half}\)", numbered(c.source))
    want = x["X"] / (1 + np.exp(-x["beta"] * x["X"]))
    rel = 2.0**-20 if dtype == "f32" else 2.0**-8
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * np.abs(want).max())


def test_a_chain_of_functions_and_products() -> None:
    """Several ScalarE functions and tensor_tensors, subexpressions used twice (each half computes its own)."""
    expr = "tanh(X[i, j] * Z[i, j]) * exp(Z[i, j] / 4) + X[i, j] * Z[i, j] - sigmoid(X[i, j] * Z[i, j])"
    c, got, x = run(expr, "f32")
    assert len(activations(c.source, "tanh")) == 2 and len(activations(c.source, "exp")) == 2
    p = x["X"] * x["Z"]
    want = np.tanh(p) * np.exp(x["Z"] / 4) + p - 1 / (1 + np.exp(-p))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("expr,M,N,meaning", [
    # no ScalarE function: VectorE and GpSimdE only
    ("X[i, j] * Z[i, j] + X[i, j] * beta[j]", 256, 2048, lambda X, Z, b: X * Z + X * b),
    # tiles narrower than two shares
    ("X[i, j] * sigmoid(beta[j] * X[i, j])", 256, 300, lambda X, Z, b: X / (1 + np.exp(-b * X))),
    # ScalarE the busiest engine (four functions an element): halves would only add instructions there
    ("sqrt(abs(X[i, j])) * tanh(Z[i, j]) + sigmoid(X[i, j])", 256, 2048,
     lambda X, Z, b: np.sqrt(abs(X)) * np.tanh(Z) + 1 / (1 + np.exp(-X))),
])
def test_tiles_that_stay_whole(expr: str, M: int, N: int, meaning) -> None:
    c, got, x = run(expr, "f32", M, N)
    tile = int(re.search(r"TILE_F = (\d+)", c.source).group(1)) if "TILE_F =" in c.source else N
    assert set(re.findall(r"tmp\d+ = nl.ndarray\(\(\d+, (\d+)\)", numbered(c.source))) == {str(tile)}
    want = meaning(x["X"], x["Z"], x["beta"])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())
