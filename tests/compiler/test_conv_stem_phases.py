"""Phased band halves (conv_pairs.phases_pay): a strided first layer with few input channels (the 7x7 stride-2
stem) puts its even and odd output rows on the stationary's two column halves, from band copies at row offsets
0..R + sy - 1 (9 for the stem, where the two halves of a band need 14), so the freed partitions take more tap
columns per matmul (fp32: 2 matmuls per row group instead of 3). The output band leaves in one DMA through a
permuted view (partition 2k + h holds rows 2i + h). Checked against an independent NumPy formula (np.pad + one
einsum per tap) on the NKI interpreter, in both NKI dialects, for f32 (the default) and f16 / bf16 (forced)."""
from __future__ import annotations

import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.compiler import conv_pairs
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from test_conv_padded import conv_ref, rounded
from kernel_numbers import numbered

STEM = """\
kernel stem(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 7, 7]) -> Y
  default N = {n}, C = 3, H = {h}, W = {w}, K = {k}
  let Ho = (H - 7) / 2 + 1, Wo = (W - 7) / 2 + 1
  Y: {dt}[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..7, s in 0..7:
      Y[n, k, y, x] += X[n, c, 2*y + r, 2*x + s] * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("n, h, w, k, split", [
    (1, 45, 37, 64, "split Y.y, 4\n"),  # 20 output rows: 4 bands of 4 rows in the slots, one more after them
    (2, 37, 22, 32, "split Y.y, 2\n"),  # batch 2, 32 channels, an even width, 8 bands of one row pair
    (1, 21, 29, 64, None),  # the default band (one band)
])
def test_stem_phases_f32(nki, n, h, w, k, split):
    prog, c, inputs, out = compile_and_run(STEM.format(dt="f32", n=n, h=h, w=w, k=k), nki, split)
    code = numbered(c.source)
    # 9 row offsets x 4 tap columns x 3 channels = 108 partitions, 2 matmuls per group (tap columns 0-3, 4-6: the
    # second over 3 column copies, 81 partitions); each band's two phases leave in one store. Band slots (several
    # bands) spread the copies over every DMA engine (conv_fold.spread): 123 partitions, the second matmul 92
    parts, second = (123, 92) if split else (108, 81)
    assert f"Wt_T = nl.ndarray(({parts}, 2, " in code and f"[0:{second}" in code
    stores = code.count("src=Y_band)")
    assert stores == code.count("Y_band = nl.ndarray") and stores >= 1
    assert ("nl.mgrid[0:" in code) if nki == "0.1" else (".ap(pattern=[[" in code)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=2, pad=(0, 0)))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_stem_phases_forced_in_16_bits(dt, nki, monkeypatch):
    # 16-bit stems keep the band halves by default (DMA-bound: the phases' row-by-row store costs more than the
    # TensorE time they save); forced here so the layout is checked in every dtype
    monkeypatch.setattr(conv_pairs, "PHASES_MIN_BYTES", 2)
    prog, c, inputs, out = compile_and_run(STEM.format(dt=dt, n=2, h=41, w=25, k=64), nki, "split Y.y, 6\n")
    assert "Y_pairs" in c.source and "Y_halves" not in c.source  # the phases' store (its M follows the dtype)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=2, pad=(0, 0)))


def test_stem_16_bit_default_keeps_band_halves():
    c = compile_loaded(lang.load(STEM.format(dt="bf16", n=1, h=41, w=37, k=64)), None)
    assert "Y_halves" in numbered(c.source) and "Y_pairs" not in numbered(c.source)


C3 = """\
kernel c3(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3], b: {dt}[K]) -> Y
  default N = 2, C = 3, H = 26, W = 19, K = {k}
  Y: {dt}[N, K, H - 2, W - 2]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("k", [64, 32])
def test_c3_first_layer_phases_in_fp32(nki, k):
    # a 3x3 first layer: 4 row offsets x 3 tap columns = 12 copies (the halves' 18), 10 partitions apart, one matmul
    # per group; the bias on the interleaved partitions 2k + h; 6 bands of 4 rows (4 slots, then 2)
    prog, c, inputs, out = compile_and_run(C3.format(dt="f32", k=k), nki, "split Y.y, 4\n")
    code = numbered(c.source)
    assert f"Wt_T = nl.ndarray((113, {2 * k})" in code and "Y_pairs" in code and "Y_halves" not in code
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], pad=(0, 0), bias=x["b"]))


def test_c3_first_layer_16_bit_keeps_band_halves():
    c = compile_loaded(lang.load(C3.format(dt="bf16", k=64)), None)
    assert "Y_halves" in numbered(c.source) and "Y_pairs" not in numbered(c.source)


@pytest.mark.parametrize("bands, most, images, slots", [
    (14, 14, 8, 5),  # conv_c3 f32 at batch 8: 4 slots would leave 2 bands between uses across images
    (7, 7, 8, 7),  # 7 bands: 4, 5 or 6 slots leave 3, 2 or 1; all 7 none over
    (16, 16, 8, 4),  # a multiple of 4
    (14, 14, 1, 4),  # one image: no next image
    (14, 3, 8, 3),  # the SBUF allows 3
    (13, 13, 2, 7),  # 13 = 3 x 4 + 1, 2 x 5 + 3, 2 x 6 + 1, 7 + 6: 7 slots are the first that leave 4 or more
    (11, 11, 2, 6),  # 11 = 2 x 4 + 3, 2 x 5 + 1, 6 + 5: 6 slots
])
def test_slot_count_keeps_slots_apart_across_images(bands, most, images, slots):
    from tilec.compiler.build_conv import slot_count
    assert slot_count(bands, most, images) == slots
