"""A depthwise fan-in's band (grouped conv with one output channel per group: each partition sums its group's input
channels) loads in pieces of rows, one DMA per (piece, input channel), so that the first chunk's taps wait for its
own rows only (before: one DMA of the whole band, every tap behind it). Checked against NumPy
(test_conv_grouped.grouped_ref: np.pad, a reshape to groups, one einsum per tap) on the NKI interpreter, both NKI
dialects, at sizes of several PSUM chunks (several pieces), padded and not, with a bias, batch 1 and 2."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import assert_matches
from test_conv_grouped import grouped_ref
from test_conv_padded import rounded, run
from tilec.compiler import build_depthwise, codegen, wrap

FAN_IN = """\
kernel kg1(X: {dt}[N, G * Cg, H, W], Wg: {dt}[G, Cg, 3, 3], b: {dt}[G]) -> Y
  default N = {n}, G = {g}, Cg = {cg}, H = {h}, W = {w}
  Y: {dt}[N, G, H - 2 + 2 * {pad}, W - 2 + 2 * {pad}]
  for n in 0..N, g in 0..G, y in 0..H - 2 + 2 * {pad}, x in 0..W - 2 + 2 * {pad}:
    Y[n, g, y, x] = b[g]
    for c in 0..Cg, r in 0..3, s in 0..3:
      Y[n, g, y, x] += (X[n, g*Cg + c, y + r - {pad}, x + s - {pad}] ?? 0) * Wg[g, c, r, s]
"""


def band_loads(source: str) -> list[str]:
    return [line for line in wrap.unwrap(source).splitlines() if re.search(r"dma_copy\(dst=X_band.*src=X_v", line)]


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("n, g, cg, h, w, pad", [(1, 24, 4, 30, 30, 0), (2, 20, 3, 26, 33, 1)])
def test_fan_in_band_in_pieces_matches_numpy(monkeypatch, nki, dt, n, g, cg, h, w, pad):
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    # at these small sizes the block-diagonal conv may win at 16 bits (decide): the depthwise kernel's path is tested
    monkeypatch.setattr(build_depthwise, "dense_ns", lambda *args: float("inf"))
    prog, comp, inputs, out = run(FAN_IN.format(dt=dt, n=n, g=g, cg=cg, h=h, w=w, pad=pad))
    assert f"{9 * cg} taps" in comp.source  # the depthwise kernel's fan-in
    loads = band_loads(comp.source)
    # several pieces of rows, each one DMA per input channel (band[p, c, rows, cols]: a range of each partition)
    assert len(loads) > cg and len(loads) % cg == 0, loads
    assert all(re.search(r"X_band\w*\[[^,\]]+, \d+, ", line) for line in loads), loads
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], x["Wg"], g, pad=pad, bias=x["b"]))
