"""A sum pool's pass along x shared three ways (pool22): TensorE sums a band's first input rows by identity-tap
matmuls into PSUM (exact in fp32), ScalarE evicts them, VectorE reduces the next rows and GpSimdE combines the
last (pool_window.choose_share, pool_tensor.tensor_rows). Each kernel runs on the NKI interpreter against NumPy
(np.pad + sliding windows, `test_pool_window.reference`) at small sizes; the knob forces the share where the costs
would not take it, so the small shapes reach every form."""
from __future__ import annotations

import numpy as np
import pytest

from test_pool_engines import check_pool
from tilec.compiler import pool_knobs


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind,r,s,pad,rows", [("avg", 3, 1, 1, 1), ("avg", 5, 1, 2, 3), ("avg", 5, 2, 2, 4),
                                               ("avgx", 3, 1, 1, 2), ("avg", 4, 1, 0, 2), ("avg", 7, 3, 3, 5)])
def test_forced_tensor_rows_match_numpy(monkeypatch, dtype, kind, r, s, pad, rows):
    """TENSOR_ROWS forced (REDUCE on: the share sits beside VectorE's reductions): padding (border outputs with fewer
    taps), strides 1-3, count_include_pad=False (the counts after the passes), two partition tiles of 80, ragged
    13 x 11 maps."""
    monkeypatch.setattr(pool_knobs, "TENSOR_ROWS", rows)
    monkeypatch.setattr(pool_knobs, "REDUCE", "on")
    source = check_pool(kind, r, s, pad, dtype, h=13, w=11, n=2, c=80)
    assert "X_share" in source and "nisa.nc_matmul(" in source


@pytest.mark.parametrize("r,s,pad", [(5, 1, 2), (5, 2, 2)])
def test_costs_take_tensor_rows_with_three_tiles(r, s, pad):
    """The model's costs choose the share for a 5x5 average over three partition tiles (TensorE's set-up and
    warm-up amortised); the answer matches NumPy."""
    source = check_pool("avg", r, s, pad, "f32", h=12 * s + 2, w=12 * s + 2, n=3, c=128)
    assert "X_share" in source


def test_two_tiles_or_the_knob_off_keep_the_vector_engines():
    """Two partition tiles (batch 1 of the families' 5x5 row): the identity and TensorE's warm-up would sit on the
    first tile's path, so no share; TENSOR_ROWS = 0 or PSUM = off turn it off everywhere."""
    assert "X_share" not in check_pool("avg", 5, 1, 2, "f32", h=12, w=12, n=2, c=96)
    for knob, value in (("TENSOR_ROWS", 0), ("PSUM", "off")):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(pool_knobs, knob, value)
            assert "X_share" not in check_pool("avg", 5, 1, 2, "f32", h=12, w=12, n=3, c=128)


def test_no_share_without_a_tap_every_output_has():
    """6 taps, stride 2, padding 3 on 14 columns: no column tap reaches every output (the border outputs' taps
    differ), so no matmul can start the accumulation over all of them: the vector engines keep the pass (an
    IndexError before, found by a random sweep)."""
    assert "X_share" not in check_pool("avg", 6, 2, 3, "f32", h=18, w=14, n=3, c=128)

