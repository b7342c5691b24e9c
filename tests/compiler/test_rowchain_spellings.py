"""rows19: the spellings of a row chain a user writes reach the folded chain (build_rowchain.py): a variance summed
from X and the mean in one statement (`v += (X - mu) * (X - mu) / N`, whose terms read a column and so lower to an
op of their own) is one square activation summing its rows, and a division by a row's column is a product by its
reciprocal. Each program matches a NumPy formula in float64 on the interpreter, in f32 and bf16, in both dialects."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run

MEAN_VAR = """kernel mean_var(X: {t}[M, N]) -> mu, v
  default M = {M}, N = 512
  mu: {t}[M]
  v: {t}[M]
  for i in 0..M:
    mu[i] = 0
    for j in 0..N:
      mu[i] += X[i, j] / N
  for i in 0..M:
    v[i] = 0
    for j in 0..N:
      v[i] += {terms}
"""

STANDARDIZE = """kernel standardize(X: {t}[M, N]) -> Y
  default M = 260, N = 700
  mu: {t}[M]
  v: {t}[M]
  sd: {t}[M]
  Y: {t}[M, N]
  for i in 0..M:
    mu[i] = 0
    for j in 0..N:
      mu[i] += X[i, j] / N
  for i in 0..M:
    v[i] = 0
    for j in 0..N:
      v[i] += (X[i, j] - mu[i]) * (X[i, j] - mu[i]) / N
  for i in 0..M:
    sd[i] = sqrt(v[i] + 1e-05)
  for i in 0..M, j in 0..N:
    Y[i, j] = (X[i, j] - mu[i]) / sd[i]
"""

# the terms of the variance as a user may write them, and the factor each puts on the sum of squares
TERMS = {
    "(X[i, j] - mu[i]) * (X[i, j] - mu[i]) / N": lambda n: 1.0 / n,
    "0.5 * ((X[i, j] - mu[i]) * (X[i, j] - mu[i]))": lambda n: 0.5,
    "(mu[i] - X[i, j]) * (mu[i] - X[i, j]) * 0.25": lambda n: 0.25,
}


def _wide(a: dict) -> dict:
    return {k: np.asarray(v, np.float64) for k, v in a.items()}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("terms", sorted(TERMS))
@pytest.mark.parametrize("rows", [300, 512])  # 3 row tiles; 4 (software-pipelined)
def test_variance_in_one_statement_matches_numpy(terms, dtype, nki, rows):
    prog, c, inputs, out = compile_and_run(MEAN_VAR.format(t=dtype, terms=terms, M=rows), nki)
    r = _bf16 if dtype == "bf16" else (lambda a: a)  # inputs are of the dtype; the program rounds mu where stored
    x = r(_wide(inputs)["X"])
    mu = r(x.mean(1))
    want_v = ((x - mu[:, None]) ** 2).sum(1) * TERMS[terms](x.shape[1])
    assert_matches(prog, "mu", out["mu"], x.mean(1))
    assert_matches(prog, "v", out["v"], want_v)


def _bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (to nearest even), as float64."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("terms", sorted(TERMS))
def test_variance_in_one_statement_is_one_square_pass(terms):
    """No tile of terms: the sum of squares is one ScalarE square of X with the mean as its bias, summing rows."""
    _, c, _, _ = compile_and_run(MEAN_VAR.format(t="f32", terms=terms, M=300), "0.6")
    assert "v_terms_tmp" not in c.source and "nl.multiply" not in c.source
    assert c.source.count("op=nl.square") == 1


def test_statistics_alone_are_pipelined_by_their_loads():
    """A chain that only stores its statistics (no steps) is software-pipelined at its loads: in the loop, the next
    row tile's load comes before this tile's passes and stores (the stores wait for the passes, and a DMA trigger
    for the one before it on its stream)."""
    _, c, _, _ = compile_and_run(MEAN_VAR.format(t="f32", terms=next(iter(TERMS)), M=1024), "0.6")
    body = c.source[c.source.index("pairs of row tiles"):]
    lines = [ln.strip() for ln in body.splitlines()]
    first_load = next(i for i, ln in enumerate(lines) if ln.startswith("nisa.dma_copy(dst=X_tile"))
    first_store = next(i for i, ln in enumerate(lines) if ln.startswith("nisa.dma_copy(dst=mu["))
    first_pass = next(i for i, ln in enumerate(lines) if ln.startswith("nisa.activation("))
    assert first_load < first_pass < first_store


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_division_by_a_row_deviation_matches_numpy(dtype, nki):
    prog, c, inputs, out = compile_and_run(STANDARDIZE.format(t=dtype), nki)
    r = _bf16 if dtype == "bf16" else (lambda a: a)  # inputs are of the dtype; the program rounds mu, v and sd
    x = r(_wide(inputs)["X"])
    mu = r(x.mean(1, keepdims=True))
    sd = r(np.sqrt(r(((x - mu) ** 2).mean(1, keepdims=True)) + 1e-05))
    assert_matches(prog, "Y", out["Y"], (x - mu) / sd)


def test_division_by_a_row_deviation_is_one_reciprocal_per_row():
    """sd's reciprocal is a column op (once per row), the division a scale of the output's activation."""
    _, c, _, _ = compile_and_run(STANDARDIZE.format(t="f32"), "0.6")
    assert "nl.divide" not in c.source and "v_terms_tmp" not in c.source
    assert c.source.count("op=nl.reciprocal") >= 1


RESIDUAL = """kernel residual_ln(X: {t}[M, N], R: {t}[M, N], g: {t}[N], b: {t}[N]) -> Y
  default M = 300, N = 640
  h: {t}[M, N]
  mu: {t}[M]
  v: {t}[M]
  Y: {t}[M, N]
  for i in 0..M, j in 0..N:
    h[i, j] = X[i, j] + R[i, j]
  for i in 0..M:
    mu[i] = 0
    for j in 0..N:
      mu[i] += h[i, j] / N
  for i in 0..M:
    v[i] = 0
    for j in 0..N:
      v[i] += (h[i, j] - mu[i]) * (h[i, j] - mu[i]) / N
  for i in 0..M, j in 0..N:
    Y[i, j] = (h[i, j] - mu[i]) * rsqrt(v[i] + 1e-05) * g[j] + b[j]
"""


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_residual_before_layernorm_matches_numpy(dtype, nki):
    prog, c, inputs, out = compile_and_run(RESIDUAL.format(t=dtype), nki)
    r = _bf16 if dtype == "bf16" else (lambda a: a)  # inputs are of the dtype; the program rounds h, mu, v
    a = {k: r(v) for k, v in _wide(inputs).items()}
    h = r(a["X"] + a["R"])
    mu = r(h.mean(1, keepdims=True))
    v = r(((h - mu) ** 2).mean(1, keepdims=True))
    assert_matches(prog, "Y", out["Y"], (h - mu) / np.sqrt(v + 1e-05) * a["g"] + a["b"])


def test_residual_before_layernorm_joins_the_chain():
    """h = X + R is the chain's first op: it never goes to HBM (one load each of X and R per row tile)."""
    _, c, _, _ = compile_and_run(RESIDUAL.format(t="f32"), "0.6")
    assert "h = nl.ndarray" not in c.source
    assert "fused row chain h, mu" in c.source


SOFTMAX_T = """kernel softmax_t(X: {t}[M, N]) -> Y
  default M = 512, N = 256
  m: {t}[M]
  e: {t}[M, N]
  s: {t}[M]
  Y: {t}[M, N]
  for i in 0..M:
    m[i] = -inf
    for j in 0..N:
      m[i] max= X[i, j]
  for i in 0..M, j in 0..N:
    e[i, j] = exp({c} * (X[i, j] - m[i]))
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += e[i, j]
  for i in 0..M, j in 0..N:
    Y[i, j] = e[i, j] * reciprocal(s[i])
"""


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("c", ["0.125", "0.1", "8.0"])
def test_softmax_with_a_temperature_matches_numpy(c, dtype, nki):
    prog, comp, inputs, _ = compile_and_run(SOFTMAX_T.format(t=dtype, c=c), nki)
    r = _bf16 if dtype == "bf16" else (lambda a: a)  # inputs are of the dtype; the program rounds e and s
    x = r(np.random.default_rng(7).uniform(-20.0, 20.0, (512, 256)))  # signed rows, exp(8 (x - m)) >= e^-320
    out = comp.run(X=np.asarray(x, np.float32))
    e = r(np.exp(float(np.float32(c)) * (x - x.max(1, keepdims=True))))
    s = r(e.sum(1, keepdims=True))
    assert_matches(prog, "Y", out["Y"], e / s)


def test_a_power_of_two_temperature_rides_on_the_exp():
    """exp(0.125 * (X - m)): 0.125 X - 0.125 m rounds as (X - m) * 0.125 (a power of two scales exactly), so the
    centring is no ScalarE pass of its own; with 0.1 it is (the sum first, then the scaling)."""
    _, exact, _, _ = compile_and_run(SOFTMAX_T.format(t="f32", c="0.125"), "0.6")
    _, other, _, _ = compile_and_run(SOFTMAX_T.format(t="f32", c="0.1"), "0.6")
    assert "e_centred" not in exact.source and "scale=0.125" in exact.source
    assert "e_centred" in other.source
