"""Broadcast operands over different runs of the output's indices in one element-wise statement (audit15: group
norm's `(X[n, k, l] - mu[n, k]) * g[k]` was refused "all broadcast columns must be indexed by the same output
indices", and `a[i] + b[j] + c[k]` in a 3-D statement): each read is widened first into a temporary indexed by its
kind's union of indices (lang_split.split_mixed_broadcasts), for columns, for rows and for a column inside a row's run; reads over runs that do not nest (`b[j]`, `c[i]`) keep
compiling as they did, with no temporary.
Checked on the interpreter against NumPy formulas, both NKI dialects."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
CASES = {
    "group_scale": ("""\
kernel gn(X: {dt}[N, G, L], mu: {dt}[N, G], g: {dt}[G]) -> Y
  default N = 3, G = 50, L = 700
  Y: {dt}[N, G, L]
  for n in 0..N, k in 0..G, l in 0..L:
    Y[n, k, l] = (X[n, k, l] - mu[n, k]) * g[k]
""", lambda a: (a["X"] - a["mu"][:, :, None]) * a["g"][None, :, None]),
    "rows": ("""\
kernel rows(X: {dt}[B, M, N], a: {dt}[M, N], b: {dt}[N]) -> Y
  default B = 2, M = 130, N = 300
  Y: {dt}[B, M, N]
  for i in 0..B, j in 0..M, k in 0..N:
    Y[i, j, k] = X[i, j, k] * a[j, k] + 2 * b[k]
""", lambda a: a["X"] * a["a"][None] + 2 * a["b"][None, None, :]),
    "nchw_affine": ("""\
kernel aff(X: {dt}[N, C, H, W], s: {dt}[N, C], t: {dt}[C]) -> Y
  default N = 2, C = 96, H = 5, W = 40
  Y: {dt}[N, C, H, W]
  for n in 0..N, c in 0..C, h in 0..H, w in 0..W:
    Y[n, c, h, w] = relu(X[n, c, h, w] * s[n, c] + t[c])
""", lambda a: np.maximum(a["X"] * a["s"][:, :, None, None] + a["t"][None, :, None, None], 0)),
    "three_axes": ("""\
kernel ax3(X: {dt}[A, B, C], a: {dt}[A], b: {dt}[B], c: {dt}[C]) -> Y
  default A = 3, B = 150, C = 260
  Y: {dt}[A, B, C]
  for i in 0..A, j in 0..B, k in 0..C:
    Y[i, j, k] = 0.5 * X[i, j, k] - 2 * a[i] + 3 * b[j] - 0.25 * c[k]
""", lambda a: 0.5 * a["X"] - 2 * a["a"][:, None, None] + 3 * a["b"][None, :, None] - 0.25 * a["c"][None, None, :]),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_nested_broadcasts_match_numpy(case, dt, nki):
    text, formula = CASES[case]
    prog, c, x, out = compile_and_run(text.format(dt=dt), nki)
    f64 = {k: np.asarray(v).astype(NP[dt]).astype(np.float64) for k, v in x.items()}
    assert "_at" in c.stages["select"]  # the narrower read went through its widened temporary
    assert_matches(prog, "Y", out["Y"], formula(f64))


def test_a_column_inside_a_rows_run_is_widened_into_a_row():
    text = """\
kernel rc(X: f32[N, G, L], a: f32[G, L], g: f32[G]) -> Y
  default N = 2, G = 40, L = 300
  Y: f32[N, G, L]
  for n in 0..N, k in 0..G, l in 0..L:
    Y[n, k, l] = X[n, k, l] * a[k, l] * g[k]
"""
    prog, c, x, out = compile_and_run(text, "0.6")
    assert "g_at" in c.stages["select"]
    assert_matches(prog, "Y", out["Y"], x["X"].astype(np.float64) * x["a"][None] * x["g"][None, :, None])


def test_runs_that_do_not_nest_need_no_temporary():
    text = """\
kernel rc(X: f32[M, N], b: f32[N], c: f32[M]) -> Y
  default M = 300, N = 500
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] * b[j] - c[i]
"""
    prog, c, x, out = compile_and_run(text, "0.6")
    assert "_at" not in c.stages["select"]
    assert_matches(prog, "Y", out["Y"], x["X"].astype(np.float64) * x["b"][None, :] - x["c"][:, None])


def test_two_column_operators_are_one_tensor_scalar():
    """(X - mu[n, k]) * g_at[n, k]: subtract a column, then multiply by another, as one tensor_scalar's op0 and
    op1 (one VectorE pass instead of two)."""
    from tilec.compiler import wrap

    _, c, _, _ = compile_and_run(CASES["group_scale"][0].format(dt="f32"), "0.6")
    calls = [ln for ln in wrap.unwrap(c.source).splitlines() if "nisa.tensor_scalar(dst=Y_tile" in ln]
    assert len(calls) == 1 and "op0=nl.subtract, operand0=mu_col" in calls[0] \
        and "op1=nl.multiply, operand1=g_at_col" in calls[0], calls
