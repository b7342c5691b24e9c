"""Filter taps folded into the contraction partitions (im2col-style in SBUF) for convolutions with few input
channels: copy j of the input band, on partitions [j*C, (j+1)*C), holds X shifted by tap delta j, and one matmul
covers a group of taps (C = 3: a 3x3 conv in one matmul over 27 partitions, a 7x7 in two). Checked against an
independent NumPy formula on the NKI interpreter, with stride, padding, dilation, several bands, both weight
layouts, and f32/f16/bf16."""
from __future__ import annotations

import pytest

from compiler_helpers import assert_matches
from test_conv_padded import STRIDED, conv_ref, rounded, run
from tilec.compiler.build_conv import fold_groups

C3 = """\
kernel c3(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3], b: {dt}[K]) -> Y
  default N = 2, C = 3, H = 30, W = 21, K = 136
  Y: {dt}[N, K, H - 2, W - 2]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
"""


def test_fold_groups_cover_every_tap_once_with_prefixes_of_the_deltas():
    assert fold_groups(3, 3, 9) == [[(r, s) for r in range(3) for s in range(3)]]
    assert fold_groups(3, 3, 2) == [[(0, 0), (0, 1)], [(0, 2)], [(1, 0), (1, 1)], [(1, 2)], [(2, 0), (2, 1)],
                                    [(2, 2)]]
    for r, s, fold in ((7, 7, 42), (3, 3, 4), (5, 3, 7), (2, 2, 3)):
        groups = fold_groups(r, s, fold)
        taps = [t for g in groups for t in g]
        assert sorted(taps) == [(i, j) for i in range(r) for j in range(s)]
        deltas = [(i, j) for i in range(r) for j in range(s)][:fold]
        for g in groups:
            assert [(t[0] - g[0][0], t[1] - g[0][1]) for t in g] == deltas[:len(g)]


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_c3_conv_folds_all_taps_into_one_matmul(dt):
    prog, c, inputs, out = run(C3.format(dt=dt), "split Y.y, 7\n")
    assert c.source.count("nisa.nc_matmul(") == 1 and "for r in " not in c.source
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], pad=(0, 0), bias=x["b"]))


C_OUT_MAJOR = """\
kernel ck(X: f32[N, C, H, W], Wt: f32[C, K, 3, 3]) -> Y
  default N = 1, C = 40, H = 12, W = 9, K = 24
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + 2*r - 2, x + 2*s - 2] ?? 0) * Wt[c, k, r, s]
"""


@pytest.mark.parametrize("schedule", [None, "split Y.y, 3\n"])
def test_folded_contraction_major_weights_padded_dilated(schedule):
    prog, c, inputs, out = run(C_OUT_MAJOR, schedule)
    x = rounded(inputs, "f32")
    w = x["Wt"].transpose(1, 0, 2, 3)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], w, dilation=2, pad=(2, 2)))


STEM = STRIDED.replace("H = 24, W = 22, K = 16", "H = 40, W = 26, K = 64")  # the padded 7x7 s2 stem, larger


def test_folded_padded_stride_2_stem_in_two_matmuls_per_group():
    prog, c, inputs, out = run(STEM, "split Y.y, 4\n")
    # K = 64: the output rows' phases share each matmul (test_conv_phases.py, test_conv_stem_halo.py), two matmuls
    # (tap columns 0-3 over 9 row offsets x 4 column copies, then 4-6 over 81 partitions) per band; the 5 bands
    # are in 5 slots (build_conv.slot_count), each written out; at batch 2 the copies are spread over every DMA
    # engine (conv_fold.spread): the second matmul's 27 copies reach partition 92
    assert c.source.count("nisa.nc_matmul(") == 10 and "for r in " not in c.source
    assert c.source.count("nisa.nc_matmul(Wt_T[0:92, 1], X_band") == 5
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=2, pad=(3, 3)))


def test_more_channels_than_half_the_partitions_do_not_fold():
    prog, c, inputs, out = run(C3.format(dt="f32").replace("C = 3,", "C = 72,"))
    assert c.source.count("nisa.nc_matmul(") == 1 and "for r in " in c.source
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], pad=(0, 0), bias=x["b"]))
