"""A broadcast column alone as the whole result, `Y[i, j] = c[i]`, `Y[b, m, p] = bf16(c3[b])`, `Y[i, j] = 2 * c[i] + 1`
(issue 10, found by the fuzzer): the value is computed on the (P, 1) column, then one activation writes each tile as
zeros + column (the zeroed tile set once, before the loops: a column times 0 would turn inf into NaN). Checked on
the interpreter against NumPy formulas."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

NP = {"f32": np.float32, "f16": np.float16, "bf16": np.float32}


def _inputs(prog, dtype: str, seed: int = 11) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {t.name: (rng.random(t.shape, dtype=np.float32) * 4 - 2) for t in prog.inputs}
    if dtype == "f16":
        return {k: v.astype(np.float16) for k, v in out.items()}
    if dtype == "bf16":
        return {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in out.items()}
    return out


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even in bf16 (as float64)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


MATRIX = """\
kernel col(c: f32[M], d: f32[N]) -> Y
  default M = 200, N = 300
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = {expr}
"""


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("expr, formula", [("c[i]", lambda c: c), ("2 * c[i] + 1", lambda c: 2 * c + 1),
                                           ("relu(c[i] - 0.5)", lambda c: np.maximum(c - 0.5, 0)),
                                           ("exp(c[i]) / 4", lambda c: np.exp(c) / 4)])
def test_column_expanded_over_rows(dtype, expr, formula):
    prog = lang.load(MATRIX.format(expr=expr).replace("f32", dtype))
    c = compile_loaded(prog)
    inputs = _inputs(prog, dtype)
    got = c.run(**inputs)["Y"]
    want = np.broadcast_to(formula(np.asarray(inputs["c"], np.float64))[:, None], (200, 300))
    if dtype == "bf16":
        want = _bf16(want)
    assert_matches(prog, "Y", got, want)
    zeroing = c.source.index("zeros = nl.zeros(")  # the zeroed tile is set once, before the loops
    assert c.source.count("nl.zeros(") == 1 and zeroing < c.source.index("for pt in")


def test_inf_and_nan_columns_stay_what_they_are():
    prog = lang.load(MATRIX.format(expr="c[i]"))
    c = compile_loaded(prog)
    col = np.linspace(-1, 1, 200).astype(np.float32)
    col[[3, 50, 150]] = [np.inf, -np.inf, np.nan]
    got = np.asarray(c.run(c=col, d=np.zeros(300, np.float32))["Y"])
    want = np.broadcast_to(col[:, None], (200, 300))
    assert np.array_equal(got, want, equal_nan=True)


def test_bf16_of_a_leading_column_over_a_3d_output():
    src = """\
kernel col(c3: f32[B], x: f32[B, M, P]) -> Y
  default B = 6, M = 50, P = 70
  Y: bf16[B, M, P]
  for b in 0..B, m in 0..M, p in 0..P:
    Y[b, m, p] = bf16(c3[b])
"""
    prog = lang.load(src)
    c = compile_loaded(prog)
    inputs = _inputs(prog, "f32")
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = np.broadcast_to(_bf16(inputs["c3"])[:, None, None], (6, 50, 70))
    assert np.array_equal(got, want)


def test_middle_column_of_a_4d_output():
    """`Y[n, k, y, x] = b[k] * 0.5`: the channels on the partitions, n outer, (y, x) the free dimension."""
    src = """\
kernel col(b: f32[K], X: f32[N, K, H, W]) -> Y
  default N = 3, K = 150, H = 7, W = 9
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = b[k] * 0.5
"""
    prog = lang.load(src)
    c = compile_loaded(prog)
    inputs = _inputs(prog, "f32")
    want = np.broadcast_to(inputs["b"].astype(np.float64)[None, :, None, None] * 0.5, (3, 150, 7, 9))
    assert_matches(prog, "Y", c.run(**inputs)["Y"], want)


def test_fused_chain_of_columns():
    """`T[i, j] = c[i] * 3; Y[i, j] = relu(T[i, j])`: the chain fuses into one column-only statement."""
    src = """\
kernel col(c: f32[M], d: f32[N]) -> Y
  default M = 130, N = 40
  T: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    T[i, j] = c[i] * 3
  for i in 0..M, j in 0..N:
    Y[i, j] = relu(T[i, j])
"""
    prog = lang.load(src)
    c = compile_loaded(prog)
    inputs = _inputs(prog, "f32")
    want = np.broadcast_to(np.maximum(inputs["c"].astype(np.float64) * 3, 0)[:, None], (130, 40))
    assert_matches(prog, "Y", c.run(**inputs)["Y"], want)


@pytest.mark.parametrize("M, N", [(521, 7), (521, 1), (7, 3)])
def test_ragged_rows_and_a_single_column(M, N):
    """521 rows: 128-row tiles plus a 9-row remainder, each with its own zeroed tile; N = 1: the tile is the column
    itself (no expansion)."""
    prog = lang.load(MATRIX.format(expr="2 * c[i] - 1"), dict(M=M, N=N))
    c = compile_loaded(prog)
    inputs = _inputs(prog, "f32")
    want = np.broadcast_to(2 * inputs["c"].astype(np.float64)[:, None] - 1, (M, N))
    assert_matches(prog, "Y", c.run(**inputs)["Y"], want)


UNIT = """\
kernel col(A: f32[N, M, P], c: f32[M]) -> Y
  default N = {N}, M = 1, P = {P}
  Y: f32[N, M, P]
  for n in 0..N, m in 0..M, p in 0..P:
    Y[n, m, p] = {expr}
"""


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("expr, formula", [("c[m]", lambda c: c), ("2 * c[m] + 1", lambda c: 2 * c + 1),
                                           ("relu(c[m] - 0.5)", lambda c: np.maximum(c - 0.5, 0))])
@pytest.mark.parametrize("N, P", [(26, 64), (3, 700), (1, 1)])
def test_one_element_column_alone(dtype, expr, formula, N, P):
    """`Y[n, m, p] = c[m]` with M = 1 (l39): a column of one element, so one partition per tile; its value read with
    no loop variable left in the nest is a column (expanded over the tile), not a row to copy to every partition
    (that matmul had the wrong shape)."""
    prog = lang.load(UNIT.format(N=N, P=P, expr=expr).replace("f32", dtype))
    c = compile_loaded(prog)
    inputs = _inputs(prog, dtype)
    want = np.broadcast_to(formula(np.asarray(inputs["c"], np.float64))[None, :, None], (N, 1, P))
    if dtype == "bf16":
        want = _bf16(want)
    assert_matches(prog, "Y", c.run(**inputs)["Y"], want)


def test_one_element_column_keeps_inf_and_nan():
    prog = lang.load(UNIT.format(N=4, P=30, expr="c[m]"))
    c = compile_loaded(prog)
    for v in (np.inf, -np.inf, np.nan):
        got = np.asarray(c.run(A=np.zeros((4, 1, 30), np.float32), c=np.array([v], np.float32))["Y"])
        assert np.array_equal(got, np.full((4, 1, 30), v, np.float32), equal_nan=True)


@pytest.mark.parametrize("expr, formula", [("s[j]", lambda a, s: np.broadcast_to(s, a.shape)),
                                           ("A[i, j] - 3 * s[j]", lambda a, s: a - 3 * s)])
def test_one_element_row_still_copied_to_every_partition(expr, formula):
    """The twin: `Y[i, j] = s[j]` with N = 1 (a row of one element on every partition)."""
    src = f"""\
kernel row(A: f32[M, N], s: f32[N]) -> Y
  default M = 200, N = 1
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = {expr}
"""
    prog = lang.load(src)
    c = compile_loaded(prog)
    inputs = _inputs(prog, "f32")
    want = formula(inputs["A"].astype(np.float64), inputs["s"].astype(np.float64)[None, :])
    assert_matches(prog, "Y", c.run(**inputs)["Y"], want)
