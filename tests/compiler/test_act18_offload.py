"""ScalarE's abs and relu moved to VectorE when ScalarE is the tile's busiest engine (expr_instrs.offloaded):
abs(x) = max(x * -1, x) as one scalar_tensor_tensor, relu(x) = max(x, 0) as one tensor_scalar. Each kernel's output
on the interpreter equals the formula computed here with NumPy (float64 from the same rounded inputs), f32 and bf16;
tiles where ScalarE is not the busiest engine or the loads and stores bound the tile, and activations with a bias,
keep their activation."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

SRC = """kernel k(A: f32[M, N], B: f32[M, N]) -> Y
  default M = 128, N = 1024
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = {expr}
"""
FUNCS_MIX = ("((sqrt(abs(A[i, j]) + 1) + log(abs(B[i, j]) + 0.5) * gelu(A[i, j]) - tanh(B[i, j]))"
             " / (sigmoid(A[i, j]) + rsqrt(abs(B[i, j]) + 1)) + reciprocal(2 + A[i, j]))")
RELU_MIX = "relu(A[i, j]) * sqrt(sigmoid(tanh(exp(B[i, j])))) + gelu(A[i, j])"  # ScalarE-bound, little VectorE work


erf = np.vectorize(math.erf)  # float64, exact to its last bit or so: the independent reference


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def funcs_mix(a, b):
    num = np.sqrt(np.abs(a) + 1) + np.log(np.abs(b) + 0.5) * gelu(a) - np.tanh(b)
    return num / (sigmoid(a) + 1.0 / np.sqrt(np.abs(b) + 1)) + 1.0 / (2 + a)


def relu_mix(a, b):
    return np.maximum(a, 0) * np.sqrt(sigmoid(np.tanh(np.exp(b)))) + gelu(a)


def run(expr: str, dtype: str, seed: int = 0, nki: str | None = None):
    """Compile for trn2 and run on inputs in [-1.5, 1.5) (2 + A stays >= 0.5), exact in `dtype`."""
    c = compile_loaded(lang.load(SRC.format(expr=expr).replace("f32", dtype)), nki=nki)
    rng = np.random.default_rng(seed)
    inputs = {n: (rng.random((128, 1024), dtype=np.float32) - 0.5) * np.float32(3) for n in "AB"}
    if dtype == "bf16":  # exact bf16 values (the interpreter rounds bf16 inputs)
        inputs = {n: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for n, v in inputs.items()}
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    return c.source, got, {n: np.asarray(v, np.float64) for n, v in inputs.items()}


@pytest.mark.parametrize("dtype,nki", [("f32", None), ("bf16", None), ("f32", "0.6")])
@pytest.mark.parametrize("expr,meaning,moved", [(FUNCS_MIX, funcs_mix, r"nisa\.scalar_tensor_tensor\("),
                                                (RELU_MIX, relu_mix, r"nl\.maximum, (operand0=)?0\.0")])
def test_a_function_moved_off_scalar_engine_matches_numpy(expr, meaning, moved, dtype, nki) -> None:
    source, got, x = run(expr, dtype, nki=nki)
    assert re.search(moved, source) and "op=nl.relu" not in source
    want = meaning(x["A"], x["B"])
    rel = 2.0**-18 if dtype == "f32" else 2.0**-7  # f32: the written steps' roundings; bf16: the output's own
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * np.abs(want).max())


def test_funcs_mix_moves_one_abs_and_orders_scalar_engine_by_handovers() -> None:
    """One of the two abs moves (the second would make VectorE + GpSimdE the busier side); ScalarE's functions that
    read only loaded tiles come before the sqrt reading VectorE's abs, so the next tile's ScalarE work does not
    wait for VectorE's."""
    source, _, _ = run(FUNCS_MIX, "f32")
    body = source[source.index("nisa.scalar_tensor_tensor("):]
    body = body[:body.index("nisa.dma_copy(")]
    assert body.count("op=nl.abs,") == 1 and body.count("nisa.scalar_tensor_tensor(") == 1
    funcs = [f for f in ("abs", "log", "gelu", "tanh", "sigmoid", "rsqrt", "reciprocal", "sqrt")
             if f"op=nl.{f}," in body]
    assert len(funcs) == 8
    assert all(body.index(f"op=nl.{f},") < body.index("op=nl.sqrt,") for f in funcs[:-1])


@pytest.mark.parametrize("expr", ["sqrt(abs(A[i, j]))", "abs(A[i, j]) * B[i, j]", "relu(A[i, j]) + B[i, j]",
                                  "tanh(abs(A[i, j] + 1)) * gelu(exp(B[i, j])) * sigmoid(sqrt(A[i, j] + 2))",
                                  "sqrt(abs(A[i, j])) * tanh(B[i, j]) + sigmoid(A[i, j])"])
def test_activations_stay_where_scalar_engine_is_not_the_bound(expr) -> None:
    """ScalarE not the busiest engine after a move, the tile's DMA slower than ScalarE (the last: four functions,
    DMA-bound), or a bias on the abs: the activation stays."""
    c = compile_loaded(lang.load(SRC.format(expr=expr)))
    assert "scalar_tensor_tensor" not in c.source and not re.search(r"nl\.maximum, (operand0=)?0\.0", c.source)
