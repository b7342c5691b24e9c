"""A bf16 row min without a start value (rowrange_bf16): GpSimdE folds the tile in half (min), ScalarE negates the
half (exact), VectorE takes its max at N/2 (the column holds -min); the half tiles get a buffer per parity in the
pipelined chain. The kernels' outputs on the interpreter equal NumPy's max - min (and min, when stored) of the same
bf16 inputs; an f16 min and a min with a start value keep the plain min."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

RANGE = """
kernel rng(X: {t}[M, N]) -> {outs}
  default M = 512, N = 1024
  hi: {o}[M]
  lo: {o}[M]
  r: f32[M]
  for i in 0..M:
    hi[i] = -inf
    for j in 0..N:
      hi[i] max= {x}
  for i in 0..M:
    lo[i] = {start}
    for j in 0..N:
      lo[i] min= {x}
  for i in 0..M:
    r[i] = {d}
"""


def run(t: str = "bf16", o: str = "f32", outs: str = "r", start: str = "inf", nki: str | None = None):
    x, d = ("f32(X[i, j])", "hi[i] - lo[i]") if o == "f32" else ("X[i, j]", "f32(hi[i]) - f32(lo[i])")
    c = compile_loaded(lang.load(RANGE.format(t=t, o=o, x=x, d=d, outs=outs, start=start)), nki=nki, target="trn2")
    rng = np.random.default_rng(18)
    x_in = ((rng.random((512, 1024)) - 0.5) * 40).astype(np.float32)
    x_in = (x_in.view(np.uint32) & 0xFFFF0000).view(np.float32) if t == "bf16" else \
        x_in.astype(np.float16).astype(np.float32)
    got = c.run(X=x_in)
    return c.source, {k: np.asarray(v, np.float64) for k, v in got.items()}, x_in.astype(np.float64)


@pytest.mark.parametrize("o,nki", [("f32", None), ("bf16", None), ("f32", "0.6")])
def test_a_bf16_row_range_negates_the_folded_half(o: str, nki: str | None) -> None:
    source, got, x = run(o=o, nki=nki)
    np.testing.assert_array_equal(got["r"], x.max(axis=1) - x.min(axis=1))  # exact: max, min, one difference
    assert re.search(r"activation\((dst=lo_negated, )?op=nl\.copy, data=lo_half, scale=-1\.0", source)
    assert re.search(r"tensor_reduce\((dst=lo_bf16, )?(op=)?nl\.maximum, (data=)?lo_negated", source)
    assert "lo_half_2" in source and "lo_negated_2" in source  # a buffer per parity: no engine waits on another


def test_the_min_stored_too_is_the_min() -> None:
    _, got, x = run(outs="r, lo")
    np.testing.assert_array_equal(got["lo"], x.min(axis=1))
    np.testing.assert_array_equal(got["r"], x.max(axis=1) - x.min(axis=1))


@pytest.mark.parametrize("t,start", [("f16", "inf"), ("bf16", "0.5")])
def test_plain_min_where_negation_gains_nothing(t: str, start: str) -> None:
    """f16: VectorE's N/2 max is bf16 -> bf16 only (nki-spec 2.4); a start value: the column is min(start, ...)."""
    source, got, x = run(t=t, o=t, start=start)
    lo = np.minimum(x.min(axis=1), float(start))
    np.testing.assert_array_equal(got["r"], x.max(axis=1) - lo)
    assert "lo_negated" not in source
