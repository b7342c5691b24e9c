"""Grouped convolutions whose groups have one output channel (Kg = 1: `Y[n, g, ..] += X[n, g*Cg + c, ..] * W[g, c,
..]`) or one input channel (Cg = 1, a depthwise multiplier: `Y[n, g*Kg + k, ..] += X[n, g, ..] * W[g*Kg + k, ..]`):
selection maps both onto the grouped convolution's single contraction (select_conv.ungroup_single, ungroup), the
builder's block-diagonal stationary does the rest. Checked against NumPy (test_conv_grouped.grouped_ref: np.pad, a
reshape to groups, one einsum per tap) on the NKI interpreter for f32, f16 and bf16, at sizes of several channel
tiles (more than 128 groups or output channels), with padding, bias, relu and two images."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import assert_matches
from test_conv_grouped import grouped_ref
from test_conv_padded import rounded, run

ONE_OUTPUT = """\
kernel kg1(X: {dt}[N, G * Cg, H, W], Wg: {dt}[G, Cg, 3, 3], b: {dt}[G]) -> Y
  default N = 2, G = 150, Cg = 4, H = 12, W = 10
  Y: {dt}[N, G, H, W]
  for n in 0..N, g in 0..G, y in 0..H, x in 0..W:
    Y[n, g, y, x] = b[g]
    for c in 0..Cg, r in 0..3, s in 0..3:
      Y[n, g, y, x] += (X[n, g*Cg + c, y + r - 1, x + s - 1] ?? 0) * Wg[g, c, r, s]
"""

MULTIPLIER = """\
kernel dwm(X: {dt}[N, G, H, W], Wm: {dt}[G * Kg, 3, 3], b: {dt}[G * Kg]) -> Y
  default N = 2, G = {G}, Kg = {Kg}, H = 12, W = 10
  Y: {dt}[N, G * Kg, H, W]
  for n in 0..N, g in 0..G, k in 0..Kg, y in 0..H, x in 0..W:
    Y[n, g*Kg + k, y, x] = b[g*Kg + k]
    for r in 0..3, s in 0..3:
      Y[n, g*Kg + k, y, x] += (X[n, g, y + r - 1, x + s - 1] ?? 0) * Wm[g*Kg + k, r, s]
"""

RELU = """\
kernel kg1r(X: {dt}[N, G * Cg, H, W], Wg: {dt}[G, Cg, 3, 3]) -> Y
  default N = 1, G = 40, Cg = 8, H = 14, W = 9
  T: {dt}[N, G, H - 2, W - 2]
  Y: {dt}[N, G, H - 2, W - 2]
  for n in 0..N, g in 0..G, y in 0..H - 2, x in 0..W - 2:
    T[n, g, y, x] = 0
    for c in 0..Cg, r in 0..3, s in 0..3:
      T[n, g, y, x] += X[n, g*Cg + c, y + r, x + s] * Wg[g, c, r, s]
  for n in 0..N, g in 0..G, y in 0..H - 2, x in 0..W - 2:
    Y[n, g, y, x] = relu(T[n, g, y, x])
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_one_output_channel_per_group(dt):
    """150 groups of 4 input channels: 600 input channels (5 tiles), 150 outputs (2 tiles). The depthwise kernel
    sums each group's 4 input channels in its output channel's partition (36 taps, padded rows and columns)."""
    prog, c, inputs, out = run(ONE_OUTPUT.format(dt=dt))
    assert "36 taps" in c.source and "groups of the tile" not in c.source
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], x["Wg"], 150, pad=1, bias=x["b"]))


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("G,Kg", [(70, 2), (40, 3), (30, 6)])
def test_depthwise_multiplier(monkeypatch, dt, G, Kg):
    """Each input channel feeds Kg output channels: 140 (two tiles of 70) or 180 (tiles of whole groups). Up to
    build_depthwise.MULTIPLIER_MAX outputs per input channel, the depthwise kernel computes them from one band of the
    input (output m of each channel after another; here forced: the block-diagonal conv's estimate, which wins at
    some of these sizes, is taken out, see test_grouped_fold); more take the block-diagonal matmul."""
    from tilec.compiler import build_depthwise
    from tilec.compiler.build_depthwise import MULTIPLIER_MAX
    monkeypatch.setattr(build_depthwise, "dense_ns", lambda *args: float("inf"))
    prog, c, inputs, out = run(MULTIPLIER.format(dt=dt, G=G, Kg=Kg))
    if Kg <= MULTIPLIER_MAX:
        assert re.search(rf"\(output {Kg - 1} of each \w+\)", c.source) and "groups of the tile" not in c.source
    else:
        assert "groups of the tile" in c.source
    x = rounded(inputs, dt)
    w = x["Wm"].reshape(G * Kg, 1, 3, 3)
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], w, G, pad=1, bias=x["b"]))


@pytest.mark.parametrize("cg", [2, 9])
def test_one_output_channel_per_group_fan_in(cg):
    """Up to build_depthwise.FAN_IN_MAX input channels per group the depthwise kernel sums them (2: 18 taps), more
    take the block-diagonal matmul (9)."""
    from tilec.compiler.build_depthwise import FAN_IN_MAX
    text = ONE_OUTPUT.format(dt="f32").replace("G = 150, Cg = 4, H = 12, W = 10", f"G = 70, Cg = {cg}, H = 7, W = 6")
    prog, c, inputs, out = run(text)
    assert ("groups of the tile" in c.source) == (cg > FAN_IN_MAX)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], x["Wg"], 70, pad=1, bias=x["b"]))


def test_one_output_channel_per_group_with_relu_and_a_schedule():
    prog, c, inputs, out = run(RELU.format(dt="f32"), "split Y.y, 4\n")
    x = rounded(inputs, "f32")
    want = grouped_ref(x["X"], x["Wg"], 40)
    assert_matches(prog, "Y", out["Y"], want * (want > 0))


def test_explain_shows_the_depthwise_kernels_plan_for_grouped_convs():
    from tilec.compiler.api import explain
    _, c, _, _ = run(ONE_OUTPUT.format(dt="f32"))
    assert "fan-in 4: each partition sums its group's 4 input channels" in explain(c)
    _, c, _, _ = run(MULTIPLIER.format(dt="f32", G=70, Kg=2))
    assert "channel multiplier 2: each partition computes" in explain(c)
