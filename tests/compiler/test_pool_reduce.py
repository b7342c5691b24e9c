"""A window pool's pass along x as window reductions (pool18: pool_passes.reduce_pass / reduce_split): VectorE's
input rows as one tensor_reduce per segment of outputs over an overlapping window access pattern (ir.Reduce.window:
NKI 0.1 an advanced index over nl.mgrid, 0.6 `.ap()`), GpSimdE's rows as tensor_tensor combines, chosen by the
model's costs (pool_costs.reduce_costs). Every kernel runs on the NKI interpreter against NumPy (np.pad and
sliding windows, count_include_pad both ways; test_pool_window.reference), f32/f16/bf16, both dialects."""
from __future__ import annotations

import pytest

from test_pool_psum import run
from tilec.compiler import ir, pool_knobs, wrap
from tilec.compiler.ir import Alloc, Buf, Kernel, Reduce, whole
from tilec.compiler.ops import PoolOp, PoolSpec, Window
from tilec.compiler.pool_costs import reduce_costs
from tilec.compiler.pool_segments import border_pairs, segments
from tilec.compiler.verify import verify
from tilec.errors import InternalError


@pytest.fixture
def forced(monkeypatch):
    monkeypatch.setattr(pool_knobs, "REDUCE", "on")
    monkeypatch.setattr(pool_knobs, "PSUM", "off")  # (16-bit sums would take TensorE's taps)


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind,r,s,pad", [("max", 2, 1, 0), ("max", 3, 1, 1), ("max", 3, 2, 1), ("avg", 3, 1, 1),
                                          ("avgx", 3, 1, 1), ("avgx", 3, 2, 0), ("avg", 2, 2, 1), ("max", 5, 1, 2)])
def test_window_reductions_match_numpy(forced, nki, dtype, kind, r, s, pad):
    """Forced on: 2 x 96 channel rows, 17 x 23 (bands of several rows, border segments of fewer taps)."""
    source = wrap.unwrap(run(kind, r, s, pad, dtype, nki=nki, h=17, w=23))
    assert "tensor_reduce(" in source
    assert ("nl.mgrid[" in source) == (nki == "0.1") and (".ap(pattern=" in source) == (nki == "0.6")


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_the_two_border_windows_are_one_reduction(forced, nki):
    """count_include_pad=False 3x3 s1 pad 1, W = 28: outputs 0 and 27 read columns 0-1 and 26-27, one window of 2
    taps with a step of 26 into Y_cols[..., 0:28:27]."""
    source = wrap.unwrap(run("avgx", 3, 1, 1, "f32", nki=nki, h=12, w=28))
    assert ", 0:28:27]" in source
    assert ("[26, 2], [1, 2]]" in source) == (nki == "0.6") and ("26 * i" in source) == (nki == "0.1")
    assert border_pairs(segments(28, -1, 1, 3, 28)) and not border_pairs(segments(28, -1, 2, 3, 28))


def _costs(dtype: str, r: int, s: int, op: str = "maximum", w: int = 112):
    wo = (w + 2 - r) // s + 1
    window = Window((s, s), (-1, -1), (wo, wo))
    op_ = PoolOp("Y", "Y", "X", (("B", 128), ("H", w), ("W", w)), PoolSpec(r, r, op), (), window=window)
    return reduce_costs(op_, dtype, "f32" if op == "add" else dtype, dtype, 15, 7, wo, segments(wo, -1, s, r, w), True)


def test_the_costs_choose_reductions_where_they_stream_fewer_cycles():
    """bf16 max: a 3-wide window reduces at 1.5 VectorE cycles per output (N_in / 2) against 2 for two 16-bit
    combines; f16 reduces at 3 (no half rate), so never; a 2-wide window costs the same both ways (1 cycle per
    output) and keeps the combines (a tie changes nothing); f32 max: 3 cycles against 4."""
    for dtype, r, s, better in (("bf16", 3, 2, True), ("f32", 3, 2, True), ("f16", 3, 2, False),
                                ("bf16", 2, 1, False)):
        tt, red, cut, share = _costs(dtype, r, s)
        assert (red < tt) == better, (dtype, r, s, tt, red)
        assert 1 <= cut <= 15 and 0 <= share <= 1


def test_the_verifier_refuses_a_window_that_does_not_tile_the_axis():
    x, y = Buf("X_t", "sbuf", "f32", (128, 10)), Buf("Y_t", "sbuf", "f32", (128, 4))
    good = Reduce(whole(y), whole(x), "maximum", 0, (2, 4))  # windows at 0, 2, 4, 6 of 4 taps: 10 columns
    assert ir.window_shape(whole(x), good.window) == (128, 4, 4)
    for window, op in (((2, 3), "maximum"), ((2, 4), "multiply")):  # 10 - 3 not a whole number of steps; an op
        bad = Kernel("k", (), (), (Alloc(x), Alloc(y), Reduce(whole(y), whole(x), op, 0, window)))
        with pytest.raises(InternalError, match="window reduce"):
            verify(bad, "test")
