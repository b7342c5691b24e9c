"""Fused ScalarE functions found in expressions written out (tilec/compiler/fused_funcs.py): GELU's tanh form ->
nl.gelu_apprx_tanh, log(1 + exp(y)) -> nl.softplus, x * sigmoid(x) -> nl.silu. Each spelling compiles to the one
activation and its kernel's output on the interpreter equals the formula computed here with NumPy (float64, from the
same rounded inputs), f32 and bf16, over inputs with negatives and large magnitudes; near misses keep the written
instructions."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.compiler.fused_funcs import fused
from tilec.lang import api as lang
from tilec.lang import syntax as sx

SRC = """kernel k(X: f32[M, N], Z: f32[M, N], b: f32[N]) -> Y
  default M = 300, N = 700
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = {expr}
"""
K = math.sqrt(2.0 / math.pi)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(K * (x + 0.044715 * x ** 3)))


def softplus(x):
    return np.logaddexp(0.0, x)


def silu(x):
    return x / (1.0 + np.exp(-x))


# (expression, the NKI function it must compile to, its NumPy meaning of X, Z, b)
SPELLINGS = [
    ("0.5 * X[i, j] * (1 + tanh(0.7978845608 * (X[i, j] + 0.044715 * X[i, j] * X[i, j] * X[i, j])))",
     "gelu_apprx_tanh", lambda x, z, b: gelu_tanh(x)),
    ("X[i, j] * (1 + tanh(0.7978845608 * X[i, j] + 0.0356774081 * X[i, j] * (X[i, j] * X[i, j]))) / 2",
     "gelu_apprx_tanh", lambda x, z, b: gelu_tanh(x)),
    ("(tanh(0.7978845608 * (X[i, j] + 0.044715 * X[i, j] * X[i, j] * X[i, j])) + 1) * (0.5 * X[i, j]) + Z[i, j]",
     "gelu_apprx_tanh", lambda x, z, b: gelu_tanh(x) + z),
    ("(X[i, j] + Z[i, j]) * sigmoid(1.5957691216 * ((X[i, j] + Z[i, j]) + 0.044715 * (X[i, j] + Z[i, j]) * "
     "(X[i, j] + Z[i, j]) * (X[i, j] + Z[i, j])))", "gelu_apprx_tanh", lambda x, z, b: gelu_tanh(x + z)),
    ("log(1 + exp(b[j] * X[i, j])) / b[j]", "softplus", lambda x, z, b: softplus(b * x) / b),
    ("log(exp(X[i, j]) + 1) - Z[i, j]", "softplus", lambda x, z, b: softplus(x) - z),
    ("X[i, j] * sigmoid(X[i, j])", "silu", lambda x, z, b: silu(x)),
    ("2 * sigmoid(X[i, j] - Z[i, j]) * Z[i, j] * (X[i, j] - Z[i, j])", "silu",
     lambda x, z, b: 2 * silu(x - z) * z),
]


def run(expr: str, dtype: str, seed: int = 0, span: float = 12.0):
    """Compile and run on inputs in [-span/2, span/2) (b in [0.5, 2.5): a slope), exact in `dtype`."""
    c = compile_loaded(lang.load(SRC.format(expr=expr).replace("f32", dtype)))
    rng = np.random.default_rng(seed)
    shapes = {"X": (300, 700), "Z": (300, 700), "b": (700,)}
    inputs = {n: (rng.random(s, dtype=np.float32) - 0.5) * np.float32(span) for n, s in shapes.items()}
    inputs["b"] = inputs["b"] / np.float32(span) * 2 + np.float32(1.5)
    if dtype == "bf16":  # exact bf16 values (the interpreter rounds bf16 inputs)
        inputs = {n: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for n, v in inputs.items()}
    out = c.run(**inputs)["Y"]
    return c, np.asarray(out, np.float64), {n: np.asarray(v, np.float64) for n, v in inputs.items()}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("expr,nki,meaning", SPELLINGS)
def test_a_written_out_function_is_one_activation(expr, nki, meaning, dtype) -> None:
    c, got, x = run(expr, dtype)
    assert f"op=nl.{nki}," in c.source
    assert "nl.tanh" not in c.source and "nl.exp" not in c.source and "nl.log," not in c.source
    want = meaning(x["X"], x["Z"], x["b"])
    # f32: a few float32 roundings of the written steps at the largest value; bf16: the output's own rounding
    rel = 2.0**-20 if dtype == "f32" else 2.0**-8
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * np.abs(want).max())


def test_large_arguments() -> None:
    """GELU at |x| up to 60 (x^3 up to 2e5; tanh saturates: x or 0), softplus at up to 30 (exp(30) ~ 1e13: the
    written log(1 + exp(y)) keeps every bit there)."""
    _, got, x = run("0.5 * X[i, j] * (1 + tanh(0.7978845608 * (X[i, j] + 0.044715 * X[i, j] * X[i, j] * "
                    "X[i, j])))", "f32", span=120.0)
    np.testing.assert_allclose(got, gelu_tanh(x["X"]), rtol=2e-6, atol=1e-5)
    _, got, x = run("log(1 + exp(X[i, j]))", "f32", span=60.0)
    np.testing.assert_allclose(got, softplus(x["X"]), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("expr", [
    "0.5 * X[i, j] * (1 + tanh(0.8 * (X[i, j] + 0.044715 * X[i, j] * X[i, j] * X[i, j])))",  # another constant
    "0.5 * X[i, j] * (1 + tanh(0.7978845608 * (Z[i, j] + 0.044715 * X[i, j] * X[i, j] * X[i, j])))",  # not x
    "0.5 * X[i, j] * (1 - tanh(0.7978845608 * (X[i, j] + 0.044715 * X[i, j] * X[i, j] * X[i, j])))",  # a sign
    "0.5 * X[i, j] * (1 + tanh(0.7978845608 * (X[i, j] + 0.044715 * X[i, j] * X[i, j] * X[i, j] + 1)))",
    "log(2 + exp(X[i, j]))", "log(1 + 2 * exp(X[i, j]))", "log(1 + exp(X[i, j]) + Z[i, j])",
    "X[i, j] * sigmoid(Z[i, j])", "X[i, j] + sigmoid(X[i, j])",
])
def test_near_misses_keep_the_written_instructions(expr: str) -> None:
    prog = lang.load(SRC.format(expr=expr))
    stmt = prog.kernel.body[0]
    while isinstance(stmt, sx.Loop):
        stmt = stmt.body[0]
    assert fused(stmt.value) == stmt.value
    c, got, x = run(expr, "f32", span=4.0)
    assert not any(f"nl.{f}," in c.source for f in ("gelu_apprx_tanh", "softplus", "silu"))


@pytest.mark.parametrize("fn", ["softplus", "gelu_tanh"])
def test_the_functions_by_name(fn: str) -> None:
    """softplus(x) and gelu_tanh(x) are functions of the language too (one row each of the table)."""
    c, got, x = run(f"{fn}(X[i, j] - Z[i, j])", "f32")
    want = (softplus if fn == "softplus" else gelu_tanh)(x["X"] - x["Z"])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("target", ["trn2", "trn1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_constants_become_activation_biases(dtype: str, target: str) -> None:
    """`f(k * y + c)` is one activation with a bias column holding c (made once, before the loops); trn1's
    reciprocal (no bias on NeuronCore-v2) keeps its add."""
    expr = ("sqrt(abs(X[i, j]) + 1) + log(2 * abs(Z[i, j]) + 0.5) - tanh(1 - X[i, j]) * exp(X[i, j] / 4 - 1.5) "
            "+ reciprocal(abs(X[i, j]) + 2)")
    c = compile_loaded(lang.load(SRC.format(expr=expr).replace("f32", dtype)), target=target)
    for fn, bias in (("sqrt", "bias_1"), ("log", "bias_0_5"), ("tanh", "bias_1"), ("exp", "bias_m1_5")):
        line = next(t for t in c.source.splitlines() if f"op=nl.{fn}," in t)
        assert f"bias={bias}" in line, line
    assert "scale=-1.0" in c.source and "scale=2.0" in c.source and "scale=0.25" in c.source
    found = re.search(r"^\s+for \w+ in ", c.source, re.M)  # (bf16's 2048-wide tiles take 300 x 700 in one)
    loop = found.start() if found else len(c.source)
    made = [re.search(rf"{b}\w* = nl\.", c.source) for b in ("bias_1", "bias_0_5", "bias_m1_5")]
    assert all(m is not None and m.start() < loop for m in made)  # once, before the loop
    reciprocal = next(t for t in c.source.splitlines() if "op=nl.reciprocal," in t)
    assert ("bias=" in reciprocal) == (target == "trn2")  # trn1's reciprocal takes no bias
    rng = np.random.default_rng(1)
    inputs = {"X": (rng.random((300, 700), dtype=np.float32) - 0.5) * 8,
              "Z": (rng.random((300, 700), dtype=np.float32) - 0.5) * 8, "b": rng.random(700, dtype=np.float32)}
    if dtype == "bf16":
        inputs = {n: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for n, v in inputs.items()}
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    x, z = (np.asarray(inputs[n], np.float64) for n in "XZ")
    want = np.sqrt(abs(x) + 1) + np.log(2 * abs(z) + 0.5) - np.tanh(1 - x) * np.exp(x / 4 - 1.5) + 1 / (abs(x) + 2)
    rel = 2.0**-20 if dtype == "f32" else 2.0**-8
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * np.abs(want).max())
