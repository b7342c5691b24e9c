"""max= and min= over leading or middle dimensions (`s[j] max= A[i, j]`, `s[b, n] min= A[b, m, n]`): the row tiles
are folded element-wise on VectorE and GpSimdE, then the running tile is transposed on TensorE chunk by chunk and
folded along its free axis. Checked against NumPy on the interpreter (signed inputs rounded to the source dtype
first: a max is exact, so the results must agree exactly once rounded to the output dtype)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded, explain
from tilec.lang import api as lang
from tilec.compiler.wrap import unwrap

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}

COLUMN = """kernel colext(A: {src}[M, N]{extra}) -> s
  default M = {m}, N = {n}
  s: {out}[N]
  for j in 0..N:
    s[j] = {init}
  for i in 0..M, j in 0..N:
    s[j] {op} {term}
"""
MIDDLE = """kernel midext(A: {src}[B, M, N]{extra}) -> s
  default B = {b}, M = {m}, N = {n}
  s: {out}[B, N]
  for o in 0..B, n in 0..N:
    s[o, n] = {init}
    for m in 0..M:
      s[o, n] {op} A[o, m, n]
"""


def signed_inputs(program, seed: int = 7) -> dict[str, np.ndarray]:
    """Normal inputs (signed, so an initial value of 0 or 0.5 is sometimes the result), rounded to each dtype."""
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(NP[t.dtype]).astype(np.float32) for t in program.inputs}


def check(text: str, reduce_axis: int, op: str, init: str, out: str, term=None):
    c = compile_loaded(lang.load(text))
    ins = signed_inputs(c.program)
    rows = ins["A"].shape[reduce_axis]  # one row needs no transpose: the row is the result
    assert ("nisa.nc_transpose" in c.source) == (rows > 1) and "nisa.nc_matmul" not in c.source
    got = np.asarray(c.run(**ins)["s"], np.float64)
    fold = np.maximum if op == "max=" else np.minimum
    src = term(ins) if term is not None else ins["A"].astype(np.float64)
    want = (np.max if op == "max=" else np.min)(src, axis=reduce_axis)
    if init.startswith("b["):
        want = fold(want, ins["b"].astype(np.float64))
    elif init not in ("-inf", "inf"):
        want = fold(want, float(init))
    want = want.astype(NP[out]).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    return c


@pytest.mark.parametrize("m,n,src,out,op,init", [
    (256, 384, "f32", "f32", "max=", "-inf"),      # two row tiles, no loop
    (1000, 1000, "f32", "f32", "max=", "0.5"),     # ragged: 125-row tiles, 125-column chunks, a constant start
    (300, 200, "bf16", "bf16", "min=", "b[j]"),    # 100-row tiles, a tensor start, 16-bit in and out
    (1, 256, "f16", "f32", "min=", "inf"),         # a unit leading axis: one row, stored as it is
    (384, 640, "f32", "bf16", "max=", "0"),        # three row tiles (a loop of one), a narrower output
    (1024, 1536, "bf16", "f32", "min=", "inf"),    # groups of four row tiles, wide loads, both engines
    (100, 97, "f32", "f32", "max=", "-inf"),       # one row tile; a prime column count (one chunk of 97)
    (2, 302, "bf16", "f16", "max=", "-inf"),       # fuzz seed 10000452: 151 chunks of 2 columns > 128 partitions
    (400, 257, "f32", "f32", "max=", "-inf"),      # fuzz seed 10001316: 257 chunks of one column
])
def test_column_max_and_min_match_numpy(m, n, src, out, op, init):
    extra = f", b: {out}[N]" if init.startswith("b[") else ""
    check(COLUMN.format(src=src, out=out, m=m, n=n, op=op, init=init, term="A[i, j]", extra=extra), 0, op, init, out)


@pytest.mark.parametrize("b,m,n,src,op,init", [
    (3, 200, 96, "f32", "max=", "-inf"), (2, 512, 256, "bf16", "min=", "b[o, n]"), (4, 1, 130, "f32", "max=", "0"),
    (2, 130, 4000, "f32", "min=", "b[o, n]"),  # 65-row tiles; two free tiles of 2000 per step (interleaved)
])
def test_middle_axis_of_a_3d_tensor(b, m, n, src, op, init):
    extra = f", b: {src}[B, N]" if init.startswith("b[") else ""
    c = check(MIDDLE.format(src=src, out=src, b=b, m=m, n=n, op=op, init=init, extra=extra), 1, op, init, src)
    assert ("s_run1 = " in c.source) == (n == 4000)  # the pair's second running tile, named apart


def test_an_expression_of_same_indexed_tensors():
    text = COLUMN.format(src="f32", out="f32", m=512, n=256, op="max=", init="-inf", term="A[i, j] - C[i, j]",
                         extra=", C: f32[M, N]")
    check(text, 0, "max=", "-inf", "f32", term=lambda ins: ins["A"].astype(np.float64) - ins["C"])


def test_folds_are_shared_by_vector_and_gpsimd_and_explained():
    c = compile_loaded(lang.load(COLUMN.format(src="bf16", out="bf16", m=1024, n=1024, op="max=", init="-inf",
                                               term="A[i, j]", extra="")))
    lines = unwrap(c.source).splitlines()
    assert any("tensor_tensor(" in ln and "maximum" in ln and "gpsimd" in ln for ln in lines)
    assert any("tensor_tensor(" in ln and "maximum" in ln and "gpsimd" not in ln for ln in lines)
    assert any("tensor_reduce(" in ln and "maximum" in ln and "s_T" in ln for ln in lines)
    assert sum("dma_copy(dst=s" in ln for ln in lines) == 1  # one store of each free tile's row of maxima
    text = explain(c)
    assert "build_column_extreme" in text and "transposed into PSUM (several per bank), tensor_reduce max" in text


def test_same_program_same_bytes():
    text = COLUMN.format(src="f32", out="f32", m=768, n=512, op="min=", init="b[j]", term="A[i, j]",
                         extra=", b: f32[N]")
    assert compile_loaded(lang.load(text)).source == compile_loaded(lang.load(text)).source


@pytest.mark.parametrize("m,n,schedule", [(257, 300, None), (256, 1024, "tile s.i, 64\ntile s.j, 128")])
def test_prime_row_count_and_directives(m, n, schedule):
    """257 rows: tiles of one row (the running row is the result, no transposes); directives set the tiles."""
    text = COLUMN.format(src="f32", out="f32", m=m, n=n, op="max=", init="-inf", term="A[i, j]", extra="")
    c = compile_loaded(lang.load(text), lang.parse_schedule(schedule, "<test>") if schedule else None)
    ins = signed_inputs(c.program)
    np.testing.assert_array_equal(np.asarray(c.run(**ins)["s"]), ins["A"].max(axis=0))
    assert ("nl.ndarray((64, " in c.source) == (schedule is not None)  # tile s.i, 64: 64-row tiles
