"""The grouped convolution of Cg == Kg channels per group (2..8) as a TensorE + vector-engine hybrid
(build_depthwise, `hybrid`): TensorE takes some window positions (r, s) of all of a group's input channels as
block-diagonal matmuls, the vector engines the other positions channel by channel, each output channel's partition
holding its group's input channels (rotated, so that band slot 0 is every input channel once). Checked against NumPy
(test_conv_grouped.grouped_ref: np.pad, a reshape to groups, one einsum per tap) on the NKI interpreter for f32, f16
and bf16, with padding, stride 2, bias and relu, several images, group sizes 2, 4 and 8 and more than 128 channels;
the model's choice is checked on the ResNeXt benchmark's shape."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_grouped import grouped_ref
from test_conv_padded import rounded, run
from tilec.compiler import build_depthwise
from tilec.compiler.api import compile_file

PLAIN = """\
kernel grouped(X: {dt}[N, G * Kg, H, W], Wt: {dt}[G * Kg, Kg, 3, 3]) -> Y
  default N = {N}, G = {G}, Kg = {Kg}, H = {H}, W = {W}
  Y: {dt}[N, G * Kg, H - 2, W - 2]
  for n in 0..N, g in 0..G, k in 0..Kg, y in 0..H - 2, x in 0..W - 2:
    Y[n, g*Kg + k, y, x] = 0
    for c in 0..Kg, r in 0..3, s in 0..3:
      Y[n, g*Kg + k, y, x] += X[n, g*Kg + c, y + r, x + s] * Wt[g*Kg + k, c, r, s]
"""

PADDED = """\
kernel grouped(X: {dt}[N, G * Kg, H, W], Wt: {dt}[G * Kg, Kg, 3, 3], b: {dt}[G * Kg]) -> Z
  default N = {N}, G = {G}, Kg = {Kg}, H = {H}, W = {W}
  Y: {dt}[N, G * Kg, (H - 1) / {st} + 1, (W - 1) / {st} + 1]
  for n in 0..N, g in 0..G, k in 0..Kg, y in 0..(H - 1) / {st} + 1, x in 0..(W - 1) / {st} + 1:
    Y[n, g*Kg + k, y, x] = b[g*Kg + k]
    for c in 0..Kg, r in 0..3, s in 0..3:
      Y[n, g*Kg + k, y, x] += (X[n, g*Kg + c, {st}*y + r - 1, {st}*x + s - 1] ?? 0) * Wt[g*Kg + k, c, r, s]
  for n in 0..N, k in 0..G * Kg, y in 0..(H - 1) / {st} + 1, x in 0..(W - 1) / {st} + 1:
    Z[n, k, y, x] = relu(Y[n, k, y, x])
"""


@pytest.fixture
def forced(monkeypatch):
    """The hybrid wherever it applies (the model picks it only where it is faster, see the last test)."""
    monkeypatch.setattr(build_depthwise, "hybrid_faster", lambda *args: True)


def padded_ref(x, w, b, groups, stride):
    full = grouped_ref(x, w, groups, pad=1, bias=b)
    return np.maximum(full[:, :, ::stride, ::stride], 0)


@pytest.mark.parametrize("dt, N, G, Kg, H, W", [
    ("f32", 1, 4, 2, 6, 7),  # groups of 2, 8 channels
    ("f32", 3, 8, 4, 9, 12),  # three images, several images per tile
    ("bf16", 2, 4, 8, 7, 6),  # groups of 8
    ("f16", 1, 32, 4, 10, 10),  # 128 channels: one tile
    ("f32", 1, 64, 4, 13, 6),  # 256 channels: two channel groups of 128
    ("bf16", 1, 48, 4, 30, 8),  # 192 channels (groups of 96), several PSUM chunks
])
def test_hybrid_matches_numpy(forced, dt, N, G, Kg, H, W):
    prog, c, inputs, out = run(PLAIN.format(dt=dt, N=N, G=G, Kg=Kg, H=H, W=W))
    assert "ident_stack" in c.source  # TensorE's block-diagonal matrices: the stacked identity scaled per partition
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], x["Wt"], G))


@pytest.mark.parametrize("dt, N, G, Kg, H, W, st, hy", [
    ("f32", 2, 4, 4, 9, 8, 1, True),  # padding, bias, relu, two images
    ("bf16", 1, 40, 4, 12, 11, 1, True),  # 160 channels: groups of 80 channels
    # stride 2: TensorE's 6 taps all clipped (s = 0 and 2 miss a column each), so none can start the PSUM sum with
    # every column: the grouped kernel (l37)
    ("f32", 1, 8, 2, 11, 9, 2, False),
    ("f16", 2, 2, 8, 10, 13, 2, True),
])
def test_hybrid_padded_strided_with_bias_relu(forced, dt, N, G, Kg, H, W, st, hy):
    text = PADDED.format(dt=dt, N=N, G=G, Kg=Kg, H=H, W=W, st=st).replace(
        "  for n in 0..N, k", f"  Z: {dt}[N, G * Kg, (H - 1) / {st} + 1, (W - 1) / {st} + 1]\n  for n in 0..N, k")
    prog, c, inputs, out = run(text)
    assert ("ident_stack" in c.source) == hy
    x = rounded(inputs, dt)
    assert_matches(prog, "Z", out["Z"], padded_ref(x["X"], x["Wt"], x["b"], G, st))


def test_hybrid_stores_one_dma_per_image(forced):
    """Output channel g*Kg + m sits on partition m*ng + g: one store per image, its HBM side Y's channels as (g, m)
    permuted to (m, g), writing every element of Y once (the access patterns of the trace), two images."""
    prog, c, inputs, out = run(PLAIN.format(dt="f32", N=2, G=16, Kg=4, H=6, W=6))
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], x["Wt"], 16))
    _, trace = c.run_traced(numerics=False, **inputs)
    writes = []
    for ins in trace.instrs:
        for acc in ins.writes if ins.engine == "dma" else ():
            if acc.memory == "hbm" and acc.name == "Y":
                _, offset, shape, strides = acc.pattern[:4]
                grid = np.indices(shape).reshape(len(shape), -1)
                writes.append(offset + (np.array(strides)[:, None] * grid).sum(axis=0))
    assert len(writes) == 2
    assert np.array_equal(np.sort(np.concatenate(writes)), np.arange(out["Y"].size))


def test_model_picks_the_hybrid_where_it_is_faster():
    """ResNeXt's 32 x 4 at 56x56: f32 matmuls cost 4x bf16's, so 6 of 9 positions on TensorE and 12 channel-taps on
    the vector engines beat 9 matmuls per chunk; at bf16 the 9 matmuls are faster than any split."""
    f32 = compile_file("benchmarks/families/grouped3x3.tl")
    assert "ident_stack" in f32.source
    rt = build_depthwise.hybrid_routes(9, 4, 504, False, True)
    assert 0 < rt.pe < 9 and rt.ns < 9 * build_depthwise._matmul_ns(504, True)
    assert not build_depthwise.hybrid_routes(9, 4, 504, False, False).ns < 9 * build_depthwise._matmul_ns(504, False)
