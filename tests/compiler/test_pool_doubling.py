"""Windows of 4 taps or more by doubling (pool_doubling.py: pairs, pairs of pairs, then each output's pieces by
its run's binary digits): compiled, run on the NKI interpreter and compared with NumPy (test_pool_window.reference:
np.pad + sliding windows), max / average with the padding counted / excluded, windows 4 to 9 (up to three levels),
strides 1 to 3, paddings up to half the window, f32/f16/bf16; the same programs with doubling off give the same
answers. Also the row blocks of few channel rows loaded and stored as one DMA per band (pool_window.one_store)."""
from __future__ import annotations

import numpy as np
import pytest

from test_pool_window import pool_program, reference, NP
from compiler_helpers import assert_matches
from tilec.compiler import pool_doubling, pool_knobs
from tilec.compiler.api import compile_loaded
from tilec.compiler.pool_segments import segments
from tilec.lang import api as lang

CASES = [(kind, r, s, pad) for kind in ("max", "avg", "avgx") for r, s, pad in
         ((4, 1, 0), (4, 2, 2), (5, 1, 2), (5, 2, 2), (5, 3, 1), (6, 1, 3), (7, 2, 3), (7, 1, 0), (9, 1, 4),
          (8, 2, 0))]


def run(kind: str, r: int, s: int, pad: int, dtype: str, **shape: int) -> str:
    text = pool_program(kind, r, s, pad, dtype, **shape)
    prog = lang.load(text)
    compiled = compile_loaded(prog)
    x = np.random.default_rng(r * 10 + s).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    got = compiled.run(X=x)["Y"]
    want = reference(x.astype(np.float32), kind, r, s, pad)
    assert np.shape(got) == want.shape
    assert_matches(prog, "Y", got, want)
    return compiled.source


@pytest.mark.parametrize("kind, r, s, pad", CASES)
def test_doubled_windows_match_numpy(kind, r, s, pad):
    """Two partition tiles (N*C = 192), odd sizes (the last window of a stride reads the padding or not)."""
    run(kind, r, s, pad, "f32", h=17, w=19, n=2, c=96)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("kind", ["max", "avg", "avgx"])
def test_doubled_windows_in_16_bit(kind, dtype):
    """Sums keep fp32 levels and round once into Y (the last piece writes Y's band)."""
    run(kind, 5, 1, 2, dtype, h=14, w=15, n=1, c=160)
    run(kind, 6, 2, 3, dtype, h=15, w=13, n=1, c=160)


def test_few_channel_rows_in_row_blocks():
    """N*C = 40: blocks of output rows on the other partitions (every block reads its whole window rows)."""
    for kind in ("max", "avg"):
        run(kind, 5, 1, 2, "f32", h=30, w=21, n=1, c=40)


def test_the_doubling_form_is_used_and_off_gives_the_same_answer(monkeypatch):
    source = run("max", 5, 1, 2, "f32", h=16, w=18, n=1, c=128)
    assert "Y_d4x" in source and "Y_d4y" in source  # both passes by doubling
    monkeypatch.setattr(pool_knobs, "DOUBLING", False)
    source = run("max", 5, 1, 2, "f32", h=16, w=18, n=1, c=128)
    assert "_d4" not in source and "_d2" not in source


def test_three_taps_keep_the_tap_by_tap_form():
    """A 3-wide window costs 2 combines per output either way: the kernel is the tap-by-tap one."""
    assert "_d2" not in run("max", 3, 1, 1, "f32", h=12, w=12, n=1, c=128)


@pytest.mark.parametrize("window", range(1, 10))
def test_pieces_cover_the_run_once(window):
    """Each run is cut into disjoint powers of two, largest first (exact for sums)."""
    parts = pool_doubling.pieces(window)
    covered = [off + t for k, off in parts for t in range(k)]
    assert covered == list(range(window))
    assert [k for k, _ in parts] == sorted((k for k, _ in parts), reverse=True)


@pytest.mark.parametrize("stride", [1, 2])
def test_levels_write_fewer_elements_than_the_taps(stride):
    """A 5-wide pass, padding 2, over 28 inputs: about 3 combines per output instead of 4."""
    n = (28 + 4 - 5) // stride + 1
    segs = segments(n, -2, stride, 5, 28)
    levels = pool_doubling.plan_levels(segs, stride, -2)
    assert levels is not None and all(step == stride for _, _, step in levels.values())
    assert pool_doubling.elements(levels, segs) < 0.8 * pool_doubling.tap_elements(segs)


@pytest.mark.parametrize("kind, r, s, pad, h", [("max", 2, 1, 0, 24), ("max", 2, 1, 0, 25),
                                                ("avg", 3, 2, 1, 23), ("max", 5, 1, 2, 21)])
def test_row_blocks_load_and_store_as_one_dma(kind, r, s, pad, h, monkeypatch):
    """N*C = 64: two blocks of output rows on partitions 0-63 and 64-127. Each band's rows of both blocks are one
    DMA in and one out (the blocks an access-pattern axis, dma_merge.py), also when Ho is odd and the second block
    redoes the first block's last row (written twice, the same values); the answer is NumPy's either way. (The
    per-band buffers in both compilations: with ONE_BLOCK_DMA off the costs may pick the other form, pool_image.py,
    whose one-DMA bands test_pool_image checks.)"""
    monkeypatch.setattr(pool_knobs, "IMAGE", False)
    text = pool_program(kind, r, s, pad, h=h, w=21, n=1, c=64)
    source = run(kind, r, s, pad, "f32", h=h, w=21, n=1, c=64)
    assert "blocks of" in source
    stores = [line for line in source.splitlines() if "dma_copy(dst=Y" in line]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pool_knobs, "ONE_BLOCK_DMA", False)
        apart = compile_loaded(lang.load(text)).source
    # (one DMA per block apart: twice the stores)
    assert len([line for line in apart.splitlines() if "dma_copy(dst=Y" in line]) == 2 * len(stores)
