"""Flat band-copy loads (conv_fold.FlatLoads): a folded band of whole rows of X (no padded read) loads each copy
shifted by c0 > 0 columns as one run per partition (the n * W - c0 elements of the flattened image from row r0,
column c0 on) instead of one DMA descriptor per row. Checked against an independent NumPy formula (np.pad + one
einsum per tap) on the NKI interpreter, in both NKI dialects, in f16 and bf16 (fp32 first layers take phases,
whose copies hold every other row: not flat), with band remainders, batch 2 and two channel counts."""
from __future__ import annotations

import dataclasses
import re

import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.compiler import build_depthwise, wrap
from test_conv_grouped import grouped_ref
from test_conv_padded import conv_ref, rounded

C3 = """\
kernel c3(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3]) -> Y
  default N = {n}, C = 3, H = {h}, W = {w}, K = {k}
  Y: {dt}[N, K, H - 2, W - 2]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("n, h, w, k, split", [
    (2, 26, 19, 64, "split Y.y, 4\n"),  # batch 2, 6 bands of 4 rows (slots, then the bands left over)
    (1, 30, 23, 32, "split Y.y, 14\n"),  # 32 channels, 28 rows: 2 bands of 14 (one slot each)
    (1, 12, 17, 64, None),  # the default band
])
def test_c3_flat_copies(dt, nki, n, h, w, k, split):
    prog, c, inputs, out = compile_and_run(C3.format(dt=dt, n=n, h=h, w=w, k=k), nki, split)
    code = wrap.unwrap(c.source)
    flat = [line for line in code.splitlines() if "dma_copy" in line and "_flat[" in line]
    shifted = [line for line in code.splitlines() if "dma_copy" in line and f", 1:{w}])" in line]
    assert flat and not shifted  # every copy shifted by a column loads flat
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=1, pad=(0, 0)))


# a channel multiplier without padding (benchmarks/families/depthwise_mult3x3.tl), as the block-diagonal dense conv
MULT = """\
kernel dwm(X: {dt}[N, C, H, W], Wm: {dt}[C * M, 3, 3]) -> Y
  default N = {n}, C = {c}, M = 2, H = {h}, W = {w}
  Y: {dt}[N, C * M, H - 2, W - 2]
  for n in 0..N, c in 0..C, m in 0..M, y in 0..H - 2, x in 0..W - 2:
    Y[n, c*M + m, y, x] = 0
    for r in 0..3, s in 0..3:
      Y[n, c*M + m, y, x] += X[n, c, y + r, x + s] * Wm[c*M + m, r, s]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("n, c, h, w, loop", [(2, 64, 19, 23, False), (1, 40, 12, 30, False), (2, 64, 44, 20, True),
                                              (2, 32, 40, 12, True)])
def test_multiplier_flat_copies(monkeypatch, dt, nki, n, c, h, w, loop):
    # the dense block-diagonal conv forced (the depthwise kernel's estimate made infinite): copy 1 (and 2 for 32 and
    # 40 channels) shifted by one column; with several bands in a loop the flat start is y_b * (band rows * W) + 1
    monkeypatch.setattr(build_depthwise, "choose", lambda *args: None)
    prog, c_, inputs, out = compile_and_run(MULT.format(dt=dt, n=n, c=c, h=h, w=w), nki)
    code = wrap.unwrap(c_.source)
    flat = [line for line in code.splitlines() if "dma_copy" in line and "_flat[" in line]
    assert flat and all(("y_b * " in line) == loop for line in flat)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], x["Wm"].reshape(c * 2, 1, 3, 3), c))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_flat_copies_stay_within_an_access_pattern_dimension(monkeypatch, nki):
    """A flat copy's one free dimension holds the band's rows x W elements; an access-pattern dimension counts at
    most target.ap_dim_max (65535, a uint16 size). With the limit lowered to 150 (above every other dimension of
    this kernel, below the flat runs of up to 7 rows x 23 columns), the interpreter rejects a flat load, so the
    compiler must load the shifted copies row by row: no flat view, and the same NumPy answer."""
    from tilec import target
    source, split = C3.format(dt="bf16", n=1, h=30, w=23, k=32), "split Y.y, 14\n"
    _, c, _, _ = compile_and_run(source, nki, split)
    runs = [int(n) for n in re.findall(r"_flat\[[^\]]*, 0:(\d+)\]", wrap.unwrap(c.source))]
    assert runs and max(runs) > 150  # without the lowered limit the copies load flat, in runs longer than it
    for name, tgt in list(target.TARGETS.items()):
        monkeypatch.setitem(target.TARGETS, name, dataclasses.replace(tgt, ap_dim_max=150))
    prog, c, inputs, out = compile_and_run(source, nki, split)
    assert "_flat[" not in wrap.unwrap(c.source)
    x = rounded(inputs, "bf16")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=1, pad=(0, 0)))
