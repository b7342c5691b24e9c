"""The element-wise rule's default tile width (schedule.eltwise_plan): 4 KiB per partition of the result (1024 fp32
elements, 2048 16-bit ones), twice that when no operand is loaded tile by tile (only broadcast columns or rows:
each tile's one transfer is its store). Each kernel's output matches NumPy on the interpreter; on the trn2 model the
defaults beat the narrower tiles they replaced."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.perf.api import estimate

SCALE = """kernel scale(X: {t}[M, N], s: f32[M]) -> Y
  default M = 256, N = 4096
  Y: {t}[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] * s[i]
"""
OUTER = """kernel outer(a: f32[M], b: f32[N]) -> Y
  default M = 256, N = 4096
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = a[i] * b[j]
"""


def tile_f(source: str) -> int:
    found = re.search(r"^\w*TILE_F = (\d+)", source, re.M)
    assert found, source
    return int(found.group(1))


@pytest.mark.parametrize("t,width", [("f32", 1024), ("bf16", 2048)])
def test_a_loaded_tile_is_4_kib_per_partition_and_matches_numpy(t: str, width: int) -> None:
    c = compile_loaded(lang.load(SCALE.format(t=t)), target="trn2")
    assert tile_f(c.source) == width
    inputs = lang.random_inputs(c.program, seed=3)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    x = np.asarray(inputs["X"], np.float64)
    if t == "bf16":
        import ml_dtypes
        x = np.asarray(inputs["X"], ml_dtypes.bfloat16).astype(np.float64)
    want = x * np.asarray(inputs["s"], np.float64)[:, None]
    unit = 2.0**-8 if t == "bf16" else 2.0**-24
    assert np.abs(got - want).max() <= 2 * unit * np.abs(want).max()


def test_a_stored_only_nest_takes_tiles_twice_as_wide_and_matches_numpy() -> None:
    c = compile_loaded(lang.load(OUTER), target="trn2")
    assert tile_f(c.source) == 2048
    inputs = lang.random_inputs(c.program, seed=4)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = np.outer(np.asarray(inputs["a"], np.float64), np.asarray(inputs["b"], np.float64))
    assert np.abs(got - want).max() <= 2.0**-23 * np.abs(want).max()


def test_the_wider_outer_product_tiles_are_faster_on_the_model() -> None:
    def us(schedule: str | None) -> float:
        prog = lang.load(OUTER, {"M": 2048, "N": 2048})
        c = compile_loaded(prog, lang.parse_schedule(schedule, "<test>") if schedule else None, target="trn2")
        _, trace = c.run_traced(**lang.random_inputs(c.program, seed=1), numerics=False)
        return estimate(trace).total_us

    assert us(None) < 0.9 * us("tile Y.j, 1024\n")
