"""A strided slice of the rows (`Y[b, i, j] = X[b, i, s * j + c]`, s >= 2) loads X's rows whole onto 128 partitions
and picks the elements with on-chip copies (copy_strided.strided_rows), instead of an HBM -> HBM DMA with a step;
matches NumPy slicing in both NKI dialects. Other strided reads keep the HBM -> HBM DMA."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.compiler import wrap
from tilec.lang.evaluator import round_to

SLICE3 = """\
kernel sl3(X: {dt}[B, M, N]) -> Y
  default B = {B}, M = {M}, N = {N}
  Y: {out}[B, M, {W}]
  for b in 0..B, i in 0..M, j in 0..{W}:
    Y[b, i, j] = X[b, i, {s} * j + {c}]
"""

CASES = {  # name: (program, NumPy slice of X)
    "odd_columns_f32": (SLICE3.format(dt="f32", out="f32", B=2, M=128, N=600, W="N / 2", s=2, c=1),
                        lambda x: x[:, :, 1::2]),
    "every_third_bf16": (SLICE3.format(dt="bf16", out="bf16", B=3, M=256, N=900, W="N / 3", s=3, c=0),
                         lambda x: x[:, :, 0::3]),
    "few_rows_cast_to_bf16": (SLICE3.format(dt="f32", out="bf16", B=1, M=40, N=1000, W="99", s=4, c=3),
                              lambda x: x[:, :, 3:399:4]),
    "rows_on_120_partitions": (SLICE3.format(dt="f32", out="f32", B=3, M=200, N=600, W="N / 2", s=2, c=1),
                               lambda x: x[:, :, 1::2]),  # gaps15's default sizes: 600 rows, 120 x 5
    "many_steps": (SLICE3.format(dt="f32", out="f32", B=8, M=256, N=2048, W="N / 2", s=2, c=1),
                   lambda x: x[:, :, 1::2]),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_strided_slice_of_the_rows_matches_numpy(case, nki):
    text, formula = CASES[case]
    prog, c, inputs, out = compile_and_run(text, nki)
    assert "rows loaded whole, the elements picked by on-chip copies" in c.source
    x = round_to(prog.tensors["X"].dtype, np.asarray(inputs["X"], np.float32))
    assert_matches(prog, "Y", out["Y"], formula(np.asarray(x, np.float64)))


def test_every_dma_moves_whole_rows():
    _, c, _, _ = compile_and_run(CASES["many_steps"][0], "0.6")
    dmas = [ln for ln in wrap.unwrap(c.source).splitlines() if "dma_copy" in ln]
    assert len(dmas) == 2 and not any("::" in ln or ":2]" in ln for ln in dmas)  # no step in any DMA
    assert "TILE_G" in c.source


@pytest.mark.parametrize("text", [
    SLICE3.format(dt="f32", out="f32", B=1, M=131, N=600, W="N / 2", s=2, c=1),  # 131 rows (a prime): 1 block
    SLICE3.format(dt="f32", out="f32", B=1, M=4, N=64, W="N / 2", s=2, c=1),  # 4 short rows: the DMA is as good
    """\
kernel rows2(X: f32[M, N]) -> Y
  default M = 512, N = 900
  Y: f32[M / 2, N / 3]
  for i in 0..M / 2, j in 0..N / 3:
    Y[i, j] = X[2 * i, 3 * j]
""",  # a strided outer dimension too
])
def test_other_strided_reads_keep_the_hbm_dma_and_match(text):
    prog, c, inputs, out = compile_and_run(text, "0.6")
    assert "picked by on-chip copies" not in c.source
    x = np.asarray(inputs["X"], np.float64)
    want = x[::2, ::3] if x.ndim == 2 else x[:, :, 1::2]
    assert_matches(prog, "Y", out["Y"], want)
