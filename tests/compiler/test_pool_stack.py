"""Several channel rows per partition, stacked as rows (pool_stack.py): a max or min pool of many channel rows runs
a partition tile of k images as one pool over k * H rows whose pass along y keeps to each image's rows. Checked on
the NKI interpreter against NumPy (test_pool_window.reference): stride 1 and 2, paddings 0 to 3, f32 and bf16,
k = 2 and 3 (forced: the costs choose it only at batch-8 sizes), and the plan the costs choose at families.py's
maxpool5x5s1 batch 8."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from kernel_numbers import numbered
from test_pool_window import NP, pool_program, reference
from tilec.compiler import pool_knobs
from tilec.compiler.api import compile_loaded
from tilec.compiler.ops import PoolOp, PoolSpec, Window
from tilec.compiler.pool_segments import Segment
from tilec.compiler.pool_stack import stacked, y_segments
from tilec.compiler.schedule import PoolPlan, window_pool_plan
from tilec.lang import api as lang


def run(kind: str, r: int, s: int, pad: int, dtype: str, n: int, c: int, h: int, w: int) -> str:
    """A pool of n x c channel rows over h x w, compared with NumPy; the kernel's text, numbered."""
    text = pool_program("max" if kind == "min" else kind, r, s, pad, dtype, h=h, w=w, n=n, c=c)
    if kind == "min":
        text = text.replace("-inf", "inf").replace("max=", "min=")
    prog = lang.load(text)
    compiled = compile_loaded(prog)
    x = np.random.default_rng(r * 10 + pad + c).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    if kind == "min":
        want = -reference(-x.astype(np.float32), "max", r, s, pad)
    else:
        want = reference(x.astype(np.float32), kind, r, s, pad)
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], want)
    return numbered(compiled.source)


def pool_op(c: int, h: int, op: str = "maximum") -> PoolOp:
    spec = PoolSpec(5, 5, op, 1.0 if op != "add" else 1 / 25)
    window = Window((1, 1), (-2, -2), (h, h), "window")
    return PoolOp("Y", "Y", "X", (("B", c), ("H", h), ("W", h)), spec, (("b", "c"), ("i", "i"), ("j", "j")),
                  window=window)


def test_segments_repeat_per_image():
    """5 rows padded by 2 over images of 6 rows, three stacked: each image's borders (3 and 4 taps) and interior,
    shifted by 6 outputs an image; no window crosses into the next image."""
    one = [Segment(0, 1, (2, 3, 4)), Segment(1, 1, (1, 2, 3, 4)), Segment(2, 2, (0, 1, 2, 3, 4)),
           Segment(4, 1, (0, 1, 2, 3)), Segment(5, 1, (0, 1, 2))]
    assert y_segments(6, -2, 1, 5, 6, 1, -2) == one
    assert y_segments(18, -2, 1, 5, 6, 3, -2) == [Segment(g.start + 6 * b, g.size, g.taps)
                                                  for b in range(3) for g in one]


def test_the_plan_at_batch_8():
    """families.py's maxpool5x5s1 at batch 8 (1536 rows of 28 x 28): three images per partition in bf16, two in
    f32 (the model's costs: 46.06 -> 44.51 and 62.56 -> 61.60 us); a sum, and 192 rows (batch 1), keep one."""
    assert window_pool_plan(pool_op(1536, 28), ("bf16", "bf16")) == PoolPlan(128, 28, images=3)
    assert window_pool_plan(pool_op(1536, 28), ("f32", "f32")) == PoolPlan(128, 28, images=2)
    assert window_pool_plan(pool_op(1536, 28, "add"), ("f32", "f32")).images == 1
    assert window_pool_plan(pool_op(192, 28), ("f32", "f32")).images == 1


def test_a_directive_that_breaks_the_stack_falls_back():
    """A band shorter than an image, or a tile the stacked rows do not fill, leaves one image per partition."""
    op = pool_op(1536, 28)
    assert stacked(op, PoolPlan(128, 14, images=2)) == (op, PoolPlan(128, 14))
    assert stacked(op, PoolPlan(128, 28, images=5)) == (op, PoolPlan(128, 28))
    sop, splan = stacked(op, PoolPlan(128, 28, images=2))
    assert (sop.dim("B"), sop.dim("H"), sop.window.out, splan.band) == (768, 56, (56, 28), 56)


def test_the_knob_turns_it_off(monkeypatch):
    monkeypatch.setattr(pool_knobs, "IMAGES", "off")
    assert window_pool_plan(pool_op(1536, 28), ("bf16", "bf16")).images == 1


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kind, r, s, pad, h, w", [("max", 5, 1, 2, 7, 9), ("max", 3, 2, 1, 8, 10),
                                                   ("min", 3, 1, 1, 6, 5), ("max", 2, 2, 0, 6, 8),
                                                   ("max", 7, 1, 3, 7, 8)])
@pytest.mark.parametrize("k", [2, 3])
def test_stacked_images_match_numpy(kind, r, s, pad, h, w, dtype, k, monkeypatch):
    """k images per partition (forced), one tile of 128 partitions: every output row's window within its image."""
    monkeypatch.setattr(pool_knobs, "IMAGES", k)
    source = run(kind, r, s, pad, dtype, k, 128, h, w)
    assert f"X.reshape((128, {k * h}, {w}))" in source


def test_two_tiles_of_stacked_images_match_numpy(monkeypatch):
    """512 channel rows, two per partition: two tiles (the tile loop's views of the stacked rows)."""
    monkeypatch.setattr(pool_knobs, "IMAGES", 2)
    source = run("max", 5, 1, 2, "bf16", 4, 128, 6, 7)
    assert "X.reshape((256, 12, 7))" in source and "range(2):" in source


def test_even_bands_of_a_large_max_pool(monkeypatch):
    """pool_bands.even_band: maxpool 5x5 s2 over 512 rows of 112 x 112 (families.py batch 8) had bands of 18, 18,
    18 and 2 output rows; the model's costs take two bands of 28 (bf16 87.77 -> 81.46 us, f32 125.91 -> 120.81); a
    sum keeps the default band, and so does the knob."""
    op = PoolOp("Y", "Y", "X", (("B", 512), ("H", 112), ("W", 112)), PoolSpec(5, 5, "maximum", 1.0),
                (("b", "c"), ("i", "i"), ("j", "j")), window=Window((2, 2), (-2, -2), (56, 56), "window"))
    assert window_pool_plan(op, ("bf16", "bf16")) == PoolPlan(128, 28)
    assert window_pool_plan(op, ("f32", "f32")) == PoolPlan(128, 28)
    avg = PoolOp(op.name, op.out, op.src, op.dims, PoolSpec(5, 5, "add", 1 / 25), op.vars, window=op.window)
    assert window_pool_plan(avg, ("f32", "f32")) == PoolPlan(128, 18)
    monkeypatch.setattr(pool_knobs, "EVEN_BANDS", False)
    assert window_pool_plan(op, ("bf16", "bf16")) == PoolPlan(128, 18)


def test_even_bands_only_where_the_kernel_fits_sbuf():
    """256 rows of 64 x 1024 f32, max 5x5 s1: bands of 8 rows would need 455 KiB of SBUF per partition (the kernel
    with the default bands of 4 needs 263 and is refused too, as on main): the default band stays."""
    op = PoolOp("Y", "Y", "X", (("B", 256), ("H", 64), ("W", 1024)), PoolSpec(5, 5, "maximum", 1.0),
                (("b", "c"), ("i", "i"), ("j", "j")), window=Window((1, 1), (-2, -2), (64, 1024), "window"))
    assert window_pool_plan(op, ("f32", "f32")) == PoolPlan(128, 4)
