"""A sum over a leading or middle axis with few reduced rows (`Y[b, c] += X[a, b, c] / A`, A <= KEPT_ROWS) puts the
kept elements on the 128 partitions (build_colreduce.build_column_kept: one DMA per free tile with an access pattern,
the rows added on VectorE and GpSimdE), instead of the ones matmul over A partitions; matches NumPy formulas in
float64, in both NKI dialects."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.compiler import wrap
from tilec.compiler.build_colreduce import KEPT_ROWS, kept_tile
from tilec.lang.evaluator import round_to
from kernel_numbers import numbered

MEAN0 = """\
kernel mean0(X: {dt}[A, B, C]) -> Y
  default A = {A}, B = {B}, C = {C}
  Y: {out}[B, C]
  for b in 0..B, c in 0..C:
    Y[b, c] = {init}
    for a in 0..A:
      Y[b, c] += X[a, b, c]{scale}
"""

MIDDLE = """\
kernel middle(X: f32[O, A, C]) -> Y
  default O = 3, A = 5, C = 16384
  Y: f32[O, C]
  for o in 0..O, c in 0..C:
    Y[o, c] = 0
    for a in 0..A:
      Y[o, c] += X[o, a, c]
"""


def _mean0(A=4, B=16, C=1024, dt="f32", out="f32", init="0", scale=" / A"):
    return MEAN0.format(A=A, B=B, C=C, dt=dt, out=out, init=init, scale=scale)


CASES = {
    "mean_f32": (_mean0(), lambda x: x.mean(0)),
    "sum_plus_constant": (_mean0(A=7, init="0.5", scale=""), lambda x: x.sum(0) + 0.5),
    "bf16_in_f32_out": (_mean0(A=3, dt="bf16", scale=" * 0.25"), lambda x: x.sum(0) * 0.25),
    "f32_in_bf16_out": (_mean0(A=5, out="bf16", scale=""), lambda x: x.sum(0)),
    "bf16_mean_plus_constant": (_mean0(A=6, B=32, dt="bf16", out="bf16", init="1"), lambda x: x.mean(0) + 1),
    "two_free_tiles": (_mean0(A=20, B=64, C=1024), lambda x: x.mean(0)),
    "middle_axis": (MIDDLE, lambda x: x.sum(1)),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_sum_of_few_rows_with_the_kept_elements_on_the_partitions_matches_numpy(case, nki):
    text, formula = CASES[case]
    prog, c, inputs, out = compile_and_run(text, nki)
    assert "the kept elements on the partitions" in numbered(c.source)  # the layout under test, not the ones matmul
    assert "nc_matmul" not in numbered(c.source)
    x = round_to(prog.tensors["X"].dtype, np.asarray(inputs["X"], np.float32))  # what the kernel is given
    assert_matches(prog, "Y", out["Y"], formula(np.asarray(x, np.float64)))


def test_every_dma_moves_128_partitions_and_the_rows_are_added_in_a_loop():
    _, c, _, _ = compile_and_run(_mean0(A=16, B=256, C=1024), "0.6")
    lines = wrap.unwrap(numbered(c.source)).splitlines()
    loads = [ln for ln in lines if "dma_copy" in ln]
    assert len(loads) == 2  # one load and one store per free tile, inside the loop over the tiles
    assert any("nl.ndarray((128, 16, 512)" in ln for ln in lines)
    assert sum("tensor_tensor" in ln for ln in lines) == 4  # the first add and the loop's, each VectorE + GpSimdE
    assert any("for r in range(14)" in ln for ln in lines)


def test_many_reduced_rows_or_short_runs_keep_the_ones_matmul():
    assert kept_tile(1, KEPT_ROWS + 1, 128 * 1024, "f32", True, False) is None  # enough rows for the partitions
    assert kept_tile(1, 8, 128 * 64, "f32", True, False) is None  # runs of 64 elements per partition: too short
    assert kept_tile(1, 8, 128 * 1000 + 64, "f32", True, False) is None  # F not split over 128 partitions
    assert kept_tile(1, 8, 128 * 1024, "f32", False, False) is None  # an expression of several tensors
    assert kept_tile(1, 8, 128 * 1024, "f32", True, True) is None  # an initial value read from a tensor
    assert kept_tile(1, 16, 128 * 2048, "f32", True, False) == 512  # 16 rows x 512 x 4 B = 32 KiB per partition
    _, c, _, _ = compile_and_run(_mean0(A=40, B=16, C=1024), "0.6")
    assert "nc_matmul" in numbered(c.source)


def test_explain_says_the_kept_sum_has_no_schedule_parameters():
    _, c, _, _ = compile_and_run(_mean0(), "0.6")
    stage = c.result.stages["schedule"]
    assert "# Y: a sum of few rows with the kept elements on the partitions" in stage and "tile Y.c" not in stage
