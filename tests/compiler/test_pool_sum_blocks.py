"""Sum pools (count_include_pad=True averages) with few channel rows in row blocks (pool22): the band rows of a block
that lie outside X are zeroed by ScalarE copies of a small zeroed tile (made once, before the first loop) instead
of a memset of the whole band, which every load of the band waited for; and a sum with more than one seam row per
block takes the row blocks, not the Interleave, unless it is 16-bit with a row stride over 1 (the Interleave's
TensorE taps). Each kernel runs on the NKI interpreter against NumPy (np.pad + sliding windows,
`test_pool_window.reference`) at small sizes."""
from __future__ import annotations

import numpy as np
import pytest

from test_pool_engines import check_pool

INTERLEAVED = "partition b * "  # the Interleave's note in the kernel


def run_avg(r: int, s: int, pad: int, dtype: str, h: int, w: int, c: int) -> str:
    return check_pool("avg", r, s, pad, dtype, h=h, w=w, n=1, c=c)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("r,s,pad,h,c", [
    (3, 1, 1, 24, 64),  # two blocks of 12 rows on partitions 0 and 64
    (5, 1, 2, 20, 48),  # block 1 starts at partition 48: its zero copy spans every partition, before the loads
    (3, 1, 1, 23, 24),  # Ho = 23: five blocks of 24 partitions, not evenly spaced (one DMA each)
    (5, 2, 2, 30, 32),  # stride 2, three blocks of 32 partitions (too few rows per block to interleave)
    (7, 2, 3, 26, 64),  # 7 taps, three rows of padding per side
])
def test_sum_in_row_blocks_zeroes_only_the_rows_outside_x(dtype, r, s, pad, h, c):
    source = run_avg(r, s, pad, dtype, h=h, w=13, c=c)
    assert INTERLEAVED not in source and "blocks of" in source
    assert "X_zero" in source and "nisa.memset(dst=X_band" not in source


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_strided_16_bit_sum_keeps_the_interleave(dtype):
    """5x5 s2 pad 2, 64 channel rows of 56 x 13 (two blocks of 14 output rows, three seam rows): f32 takes the row
    blocks, a 16-bit sum keeps the Interleave, where TensorE sums the taps of the pass along x."""
    source = run_avg(5, 2, 2, dtype, h=56, w=13, c=64)
    assert (INTERLEAVED in source) == (dtype == "bf16")
    assert ("nc_matmul" in source) == (dtype == "bf16")


def test_misaligned_block_copy_covers_every_partition():
    """48 channel rows: block 1 on partitions 48..95, where an engine may not start an access of 48 partitions
    (nki-spec §1.6): the copy of its bottom zero rows spans all 96 partitions and comes before the band's loads
    (the rows go to a band's buffer, or to the block image when the bands are its views: pool_image.py)."""
    source = run_avg(5, 1, 2, "f32", h=20, w=13, c=48)
    lines = source.splitlines()
    copies = [i for i, ln in enumerate(lines) if "data=X_zero" in ln]
    loads = [i for i, ln in enumerate(lines) if "nisa.dma_copy(dst=X_band" in ln or "nisa.dma_copy(dst=X_image" in ln]
    assert copies and any(f"X_{b}[{p}" in lines[i] for i in copies for b in ("band", "image") for p in (":, ", "0:96"))
    assert all(any(c < ld for ld in loads) for c in copies)
    zeroes = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("X_zero = ")]  # (nl.zeros in NKI 0.1)
    assert len(zeroes) == 1 and all(zeroes[0] < c for c in copies)  # (made once)


def test_interleave_builds_the_identity_before_the_seams():
    """The Interleave of a strided 16-bit sum: TensorE's identity matrix is made first, so the bands' taps start
    while the vector engines compute the seams (they waited for the seams before: avgpool 5x5 s2 bf16, 64 x 112 x
    112, 18.74 -> 14.85 us on the model)."""
    source = run_avg(5, 2, 2, "bf16", h=56, w=13, c=64)
    lines = source.splitlines()
    ident = next(i for i, ln in enumerate(lines) if "# ---- identity matrix" in ln)
    seams = next(i for i, ln in enumerate(lines) if "(the seams between blocks)" in ln or "a seam between" in ln)
    assert INTERLEAVED in source and ident < seams
