"""Phased band halves over a zero-padded read (conv_pairs.phases_pay): the stem of stem_maxpool (7x7 stride 2,
padding 3, C = 3) and a padded 3x3 first layer take the output rows' phases like their pre-padded forms: 9 row
copies per column copy instead of 14, so 4 tap columns fit a matmul (2 matmuls per row group instead of 3). The
copies' rows outside X are zeroed by conv_halo's boxes at the phases' row step (2 sy). Their bands take band slots
(build_conv.slot_count) as the pre-padded ones do, each band copying its halo into its slot before its loads (a
slot holds an earlier band's data). Checked against an independent NumPy formula (np.pad + one einsum per tap) on
the NKI interpreter, in both NKI dialects."""
from __future__ import annotations

import pytest

from compiler_helpers import assert_matches, compile_and_run
from test_conv_padded import conv_ref, rounded
from kernel_numbers import numbered
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

STEM = """\
kernel stem(X: f32[N, C, H, W], Wt: f32[K, C, 7, 7]) -> Y
  default N = {n}, C = 3, H = {h}, W = {w}, K = {k}
  let Ho = (H + 2 * {p} - 7) / 2 + 1, Wo = (W + 2 * {p} - 7) / 2 + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..7, s in 0..7:
      Y[n, k, y, x] += (X[n, c, 2*y + r - {p}, 2*x + s - {p}] ?? 0) * Wt[k, c, r, s]
"""

C3 = """\
kernel c3(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3], b: f32[K]) -> Y
  default N = 2, C = 3, H = 24, W = 19, K = {k}
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("n, h, w, k, p, split, slots", [
    (1, 40, 33, 64, 3, "split Y.y, 4\n", 5),  # 5 bands: the first (clipped at the top) in its own slot, 4 shared
    (2, 39, 22, 64, 3, "split Y.y, 4\n", 5),  # batch 2, 5 bands each: 4 shared slots (slot_count) and the first's
    (2, 39, 22, 32, 3, "split Y.y, 2\n", 0),  # 32 channels, bands of one row pair (no slots: too many bands)
    (1, 34, 30, 64, 2, None, 0),  # padding 2, the default band
])
def test_padded_stem_takes_the_phases(nki, n, h, w, k, p, split, slots):
    prog, c, inputs, out = compile_and_run(STEM.format(n=n, h=h, w=w, k=k, p=p), nki, split)
    code = numbered(c.source)
    # 9 row offsets x 4 tap columns x 3 channels = 108 partitions: 2 matmuls per row group (the halves' 3); in slots
    # from batch 2 spread over every DMA engine (conv_fold.spread: 123 partitions)
    parts = 123 if slots and n > 1 else 108
    assert "Y_pairs" in code and f"Wt_T = nl.ndarray(({parts}, 2, " in code
    assert (f"X_band{slots - 1} = " in code and f"X_band{slots} = " not in code) if slots else "X_band0" not in code
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=2, pad=(p, p)))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("k, split", [(64, "split Y.y, 4\n"), (32, None)])
def test_padded_first_layer_takes_the_phases(nki, k, split):
    prog, c, inputs, out = compile_and_run(C3.format(k=k), nki, split)
    assert "Y_pairs" in c.source and "Y_halves" not in c.source
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], pad=(1, 1), bias=x["b"]))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_padded_16_bit_halves_take_slots_from_batch_two(dt):
    # 16-bit stems keep band halves (2 tap columns per copy: 28 copies, 4 partitions apart in 3 shared slots for
    # the other 3 bands and the first band's own, halos zeroed once); at one image the slots' memsets only delay
    # the first load: one buffer
    text = STEM.format(n=2, h=34, w=30, k=64, p=2).replace("f32[", f"{dt}[")
    prog, c, inputs, out = compile_and_run(text, "0.6", "split Y.y, 4\n")
    code = numbered(c.source)
    assert "Y_halves" in code and "X_band3 = " in code and "X_band4 = " not in code
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=2, pad=(2, 2)))
    one = compile_and_run(text.replace("N = 2", "N = 1"), "0.6", "split Y.y, 4\n")[1]
    assert "X_band0" not in numbered(one.source)


def test_union_halo_is_one_copy_per_side():
    # 36 copies of 3 channels (not 32 or 64: every zero copy covers all the copies' partitions), each with its own
    # rows and columns outside X: conv_halo.hulls zeroes each side's hull once per band (top or bottom rows, left
    # and right columns: at most 4 GpSimdE copies per band, 5 bands) where the first band took 22 copies
    text = STEM.format(n=1, h=40, w=33, k=64, p=3)
    code = numbered(compile_loaded(lang.load(text), lang.parse_schedule("split Y.y, 4\n", "<test>"), "0.6").source)
    assert 5 <= code.count("src=X_zero_") <= 5 * 3


@pytest.mark.parametrize("dt, h, w, p", [("f32", 39, 22, 3), ("bf16", 34, 30, 2)])
def test_first_band_halo_zeroed_once(dt, h, w, p):
    # batch 3: the first band (rows clipped at X's top) in a slot of its own and every slot's halo copied once
    # before the image loop; inside it only the last band's halo rows are copied (conv_halo.fixed_slots)
    text = STEM.format(n=3, h=h, w=w, k=64, p=p).replace("f32[", f"{dt}[")
    prog, c, inputs, out = compile_and_run(text, "0.6", "split Y.y, 4\n")
    loop_at = c.source.index("for n in range(")
    inside = [line for line in c.source[loop_at:].splitlines() if "src=X_zero_" in line]
    assert all("src=X_zero_rows" in line for line in inside)  # (the last band's rows, when clipped)
    assert "src=X_zero_rows" in c.source[:loop_at]  # the first band's rows, once
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=2, pad=(p, p)))
