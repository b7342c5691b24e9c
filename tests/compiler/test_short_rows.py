"""Reductions of short rows (a global average pool's 7x7 maps, a row sum of a [4096, 49] matrix): the rows go
several per partition (row p * G + g on partition p), one DMA loads a (P, TILE_G, F) tile of contiguous bytes per
partition and one tensor_reduce over its last axis leaves (P, TILE_G) results. Each kernel runs on the interpreter
against an independent NumPy reduction of the dtype-rounded inputs and against the reference evaluator."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches, check_against_reference, inputs_for
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.compiler.wrap import unwrap
from kernel_numbers import numbered

_NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def gpool(dtype: str, n: int, c: int, h: int, w: int) -> str:
    return f"""\
kernel gpool(X: {dtype}[N, C, H, W]) -> Y
  default N = {n}, C = {c}, H = {h}, W = {w}
  S: {dtype}[N, C]
  Y: {dtype}[N, C]
  for n in 0..N, c in 0..C:
    S[n, c] = 0
    for i in 0..H, j in 0..W:
      S[n, c] += X[n, c, i, j]
  for n in 0..N, c in 0..C:
    Y[n, c] = S[n, c] / {h * w}
"""


def rowred(op: str, init: str, dtype: str, m: int, n: int) -> str:
    return f"""\
kernel rowred(A: {dtype}[M, N]) -> s
  default M = {m}, N = {n}
  s: {dtype}[M]
  for i in 0..M:
    s[i] = {init}
    for j in 0..N:
      s[i] {op} A[i, j]
"""


def compile_text(text: str, schedule: str | None = None):
    directives = lang.parse_schedule(schedule, "<test schedule>") if schedule is not None else None
    return compile_loaded(lang.load(text), directives)


def against_numpy(c, out: str, fn) -> None:
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)[out], np.float32)
    dt = _NP[c.program.tensors[out].dtype]
    want = fn({k: v.astype(dt).astype(np.float64) for k, v in inputs.items()})
    assert got.shape == want.shape
    assert_matches(c.program, out, got, want)
    check_against_reference(c)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n,c,h,w", [(1, 2048, 7, 7), (2, 200, 7, 7), (3, 130, 5, 3), (1, 384, 1, 9)])
def test_global_average_pool_matches_numpy(dtype, n, c, h, w):
    k = compile_text(gpool(dtype, n, c, h, w))  # (built by rules_global.global_pool since pool14, rows grouped as here)
    assert ("short rows" in k.source or "global pool" in k.source) and "for pt in" not in k.source
    against_numpy(k, "Y", lambda x: x["X"].mean(axis=(2, 3)))


def test_resnet_pool_groups_rows_and_stores_once():
    src = unwrap(numbered(compile_text(gpool("f32", 1, 2048, 7, 7)).source))
    assert "X_v = X.reshape((128, 16, 49))" in src and "Y_v = Y.reshape((128, 16))" in src
    assert src.count("dma_copy(dst=Y_v") == 1 and "for pt in" not in src


@pytest.mark.parametrize("op,init,fn", [
    ("+=", "0", lambda a: a.sum(axis=1)),
    ("+=", "1.5", lambda a: a.sum(axis=1) + 1.5),
    ("max=", "-inf", lambda a: a.max(axis=1)),
    ("min=", "inf", lambda a: a.min(axis=1)),
])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_row_reduction_of_short_rows(op, init, fn, dtype):
    c = compile_text(rowred(op, init, dtype, 4096, 49))
    assert "axis=2, keepdims=False" in numbered(c.source) and "TILE_G = 16" in numbered(c.source)
    against_numpy(c, "s", lambda x: fn(x["A"]))


@pytest.mark.parametrize("m,n,short", [(300, 17, True), (262, 5, False), (4099, 3, False)])
def test_rows_not_a_multiple_of_128(m, n, short):
    """300 = 100 * 3 rows: short rows on 100 partitions; 262 = 2 * 131 and 4099 (a prime) would put them on 2 and
    1 partitions: ragged row tiles instead (128-row tiles and one of the rest; 4099 x 3 f16: 5981 -> 66 us on the
    model)."""
    c = compile_text(rowred("+=", "0", "f16", m, n))
    assert ("short rows" in numbered(c.source)) == short and (short or "TILE_P = 128" in numbered(c.source))
    against_numpy(c, "s", lambda x: x["A"].sum(axis=1))


@pytest.mark.parametrize("schedule", ["tile s.i, 64", "tile s.j, 7", "tile s.j, 49\ntile s.i, 32"])
def test_directives_keep_one_row_per_partition(schedule):
    """A directive names the row and free tiles of the one-row-per-partition form: it is honoured as written."""
    c = compile_text(rowred("+=", "0", "f32", 512, 49), schedule)
    assert "short rows" not in numbered(c.source)
    against_numpy(c, "s", lambda x: x["A"].sum(axis=1))


def test_directive_on_the_pool_builds_its_ops_alone():
    c = compile_text(gpool("f32", 2, 256, 7, 7), "tile S.c, 64")
    against_numpy(c, "Y", lambda x: x["X"].mean(axis=(2, 3)))


def test_long_rows_keep_one_row_per_partition():
    c = compile_text(rowred("+=", "0", "f32", 512, 129))
    assert "short rows" not in numbered(c.source) and "for pt in" in numbered(c.source)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_nki_06_kernel_matches_numpy(dtype):
    """NKI 0.6 spells the last-axis reduction with dst= and axis=2; its kernel runs on the 0.6 interpreter."""
    k = compile_loaded(lang.load(gpool(dtype, 2, 640, 7, 7)), None, "0.6")
    assert "op=nl.add, data=X_all[:, " in unwrap(k.source) and "axis=2, keepdims=False)" in unwrap(k.source)
    against_numpy(k, "Y", lambda x: x["X"].mean(axis=(2, 3)))


def test_chain_with_a_column_input_and_a_max():
    """Two reductions and element-wise ops of their columns with a column input, grouped together."""
    text = """\
kernel chain(A: f16[M, N], b: f16[M]) -> Y
  default M = 1000, N = 20
  m: f16[M]
  s: f16[M]
  Y: f16[M]
  for i in 0..M:
    m[i] = -inf
    for j in 0..N:
      m[i] max= A[i, j]
  for i in 0..M:
    s[i] = b[i]
    for j in 0..N:
      s[i] += A[i, j]
  for i in 0..M:
    Y[i] = s[i] * 0.5 - m[i] + b[i]
"""
    c = compile_text(text)
    assert "short rows" in numbered(c.source) and numbered(c.source).count("tensor_reduce") == 2
    against_numpy(c, "Y", lambda x: _f16(x["A"].sum(axis=1) + x["b"]) * 0.5 - x["A"].max(axis=1) + x["b"])


def _f16(v):
    return v.astype(np.float16).astype(np.float64)


def test_rows_of_one_element_keep_one_row_per_partition():
    """A reduction over one element is no tensor_reduce over a last axis (the unit axis squeezes away)."""
    c = compile_text(rowred("+=", "0", "f32", 512, 1))
    assert "short rows" not in numbered(c.source)
    against_numpy(c, "s", lambda x: x["A"].sum(axis=1))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_an_element_wise_expression_of_short_rows(dtype):
    """`s += (A - B) * (A - B)` over rows of 49: the expression on (P, TILE_G, F) tiles, then the last-axis reduce."""
    text = f"""\
kernel sq(A: {dtype}[M, N], B: {dtype}[M, N]) -> s
  default M = 1000, N = 49
  s: {dtype}[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += (A[i, j] - B[i, j]) * (A[i, j] - B[i, j]) / 49
"""
    c = compile_text(text)
    assert "short rows" in numbered(c.source) and "axis=2, keepdims=False" in numbered(c.source)
    against_numpy(c, "s", lambda x: ((x["A"] - x["B"]) ** 2).mean(axis=1))
