"""Grouped convolutions `Y[n, g*Kg + k, y, x] += X[n, g*Cg + c, y + r, x + s] * W[g*Kg + k, c, r, s]` (ResNeXt):
selection maps the merged channel indices onto one contraction over all G*Cg input channels into G*Kg output
channels (select_conv.ungroup), and the builder loads each group's rows of W into a zeroed block on the diagonal of its
out-channel tile, so the usual per-tap PE transposes give a block-diagonal stationary: one matmul covers every group
of a tile. Checked against NumPy (np.pad, a reshape to groups and one einsum per tap) on the NKI interpreter for
f32, f16 and bf16, with channels above 128, several row bands and channel tiles, padding, bias and relu."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_padded import rounded, run
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang


def grouped_ref(x, w, groups, pad=0, bias=None):
    """Y[n, g*Kg + k] = sum over c, r, s of X[n, g*Cg + c, y + r - pad, x + s - pad] * W[g*Kg + k, c, r, s]."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).reshape(n, groups, cg, h + 2 * pad, wd + 2 * pad)
    wg = w.reshape(groups, k // groups, cg, r, s)
    ho, wo = h + 2 * pad - r + 1, wd + 2 * pad - s + 1
    out = np.zeros((n, groups, k // groups, ho, wo))
    for i in range(r):
        for j in range(s):
            out += np.einsum("ngchw,gkc->ngkhw", xp[:, :, :, i:i + ho, j:j + wo], wg[:, :, :, i, j])
    out = out.reshape(n, k, ho, wo)
    return out + (bias[None, :, None, None] if bias is not None else 0)


PADDED = """\
kernel grouped(X: {dt}[N, G * Cg, H, W], Wt: {dt}[G * Kg, Cg, 3, 3], b: {dt}[G * Kg]) -> Y
  default N = 2, G = 10, Cg = 16, Kg = 20, H = 20, W = 9
  Y: {dt}[N, G * Kg, H, W]
  for n in 0..N, g in 0..G, k in 0..Kg, y in 0..H, x in 0..W:
    Y[n, g*Kg + k, y, x] = b[g*Kg + k]
    for c in 0..Cg, r in 0..3, s in 0..3:
      Y[n, g*Kg + k, y, x] += (X[n, g*Cg + c, y + r - 1, x + s - 1] ?? 0) * Wt[g*Kg + k, c, r, s]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_padded_grouped_conv_with_bias_over_channel_tiles_and_bands(dt):
    prog, c, inputs, out = run(PADDED.format(dt=dt), "split Y.y, 5\n")
    assert "groups of the tile" in c.source  # each group's rows of W placed on the block diagonal
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], x["Wt"], 10, pad=1, bias=x["b"]))


RESNEXT = """\
kernel resnext(X: {dt}[N, G * Cg, H, W], Wt: {dt}[G * Kg, Cg, 3, 3]) -> Y
  default N = 1, G = {G}, Cg = {Cg}, Kg = {Kg}, H = 12, W = 11
  T: {dt}[N, G * Kg, H - 2, W - 2]
  Y: {dt}[N, G * Kg, H - 2, W - 2]
  for n in 0..N, g in 0..G, k in 0..Kg, y in 0..H - 2, x in 0..W - 2:
    T[n, g*Kg + k, y, x] = 0
    for c in 0..Cg, r in 0..3, s in 0..3:
      T[n, g*Kg + k, y, x] += X[n, g*Cg + c, y + r, x + s] * Wt[g*Kg + k, c, r, s]
  for n in 0..N, k in 0..G * Kg, y in 0..H - 2, x in 0..W - 2:
    Y[n, k, y, x] = relu(T[n, k, y, x])
"""


@pytest.mark.parametrize("G, Cg, Kg", [(40, 4, 4), (2, 100, 100), (3, 50, 70), (5, 40, 8)])
def test_grouped_conv_with_fused_relu(G, Cg, Kg):
    prog, c, inputs, out = run(RESNEXT.format(dt="f32", G=G, Cg=Cg, Kg=Kg))
    assert "fused Y" in c.stages["select"]
    if Cg == Kg > 8:  # out-channel tile i reads in-channel tile i only: no loop over the c-tiles around the matmuls
        assert "X_band[:, k_t, " in c.source
    if Cg == Kg == 4:  # f32 groups of 4: the TensorE + vector hybrid (build_depthwise) is faster on the model
        assert "ident_stack" in c.source
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], np.maximum(grouped_ref(x["X"], x["Wt"], G), 0))


@pytest.mark.parametrize("schedule", ["tile Y.k, 40\n", "hoist Wt, Y.k\n", "reorder Y, k, n, y\nsplit Y.y, 4\n"])
def test_grouped_conv_under_schedules(schedule):
    prog, c, inputs, out = run(PADDED.format(dt="f32"), schedule)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], x["Wt"], 10, pad=1, bias=x["b"]))


def test_out_channel_tile_splitting_a_group_is_a_located_error():
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(PADDED.format(dt="f32")), lang.parse_schedule("tile Y.k, 25\n", "<test>"))
    assert "whole groups" in str(e.value) and e.value.span is not None


SHIFTED = """\
kernel dwm(X: f32[N, G + 1, H, W], Wt: f32[G * Kg, 3, 3]) -> Y
  default N = 1, G = 8, Kg = 2, H = 10, W = 10
  Y: f32[N, G * Kg, H - 2, W - 2]
  for n in 0..N, g in 0..G, k in 0..Kg, y in 0..H - 2, x in 0..W - 2:
    Y[n, g*Kg + k, y, x] = 0
    for r in 0..3, s in 0..3:
      Y[n, g*Kg + k, y, x] += X[n, g + 1, y + r, x + s] * Wt[g*Kg + k, r, s]
"""

WIDE = RESNEXT.format(dt="f32", G=2, Cg=8, Kg=130)

CK = PADDED.format(dt="f32").replace("Wt: f32[G * Kg, Cg, 3, 3]", "Wt: f32[Cg, G * Kg, 3, 3]") \
    .replace("Wt[g*Kg + k, c, r, s]", "Wt[c, g*Kg + k, r, s]")


@pytest.mark.parametrize("text, line, words", [
    (SHIFTED, 7, "group variable `g`"),  # X read at channel g + 1 (a multiplier's X[n, g]: test_grouped_single)
    (WIDE, 6, "more than 128"),
    (CK, 7, "must be indexed Wt[g*Kg + k, c, taps...]"),
])
def test_grouped_forms_not_compiled_are_located_errors(text, line, words):
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text))
    assert words in str(e.value) and e.value.span is not None and e.value.span.line == line


def test_groups_reading_part_of_the_input_channels_are_a_located_error():
    text = PADDED.format(dt="f32").replace("X: f32[N, G * Cg, H, W]", "X: f32[N, G * Cg + 1, H, W]")
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text))
    assert "not all of them" in str(e.value) and e.value.span is not None and e.value.span.line == 7
