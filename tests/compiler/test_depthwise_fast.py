"""The default depthwise kernel (tilec/compiler/build_depthwise.py): (image or row block, channel) pairs on the
partitions, the taps split over ScalarE, VectorE and GpSimdE, PSUM chunks of output rows. Every case compiles the
program with its default schedule, runs the kernel on the NKI interpreter and compares Y with an independent NumPy
formula (np.pad + one product per tap), for f32/f16/bf16, padded or not, stride 1 and 2, dilation, channel counts that
are not a multiple of 128 and sizes that take several groups, slots, chunks and image tiles."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, inputs_for
from test_conv_padded import rounded, run
from tilec.compiler.api import compile_loaded
from tilec.compiler import build_depthwise
from tilec.compiler.ops import ConvOp
from tilec.lang import api as lang


def reference(x, w, stride=1, pad=0, dilation=1, bias=None):
    """Y[n, c, y, x] = sum over taps of w[c, r, s] * X_padded[n, c, stride*y + dilation*r, stride*x + dilation*s]."""
    _, _, h, wd = x.shape
    _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho = (h + 2 * pad - dilation * (r - 1) - 1) // stride + 1
    wo = (wd + 2 * pad - dilation * (s - 1) - 1) // stride + 1
    out = np.zeros((x.shape[0], x.shape[1], ho, wo))
    for i in range(r):
        for j in range(s):
            win = xp[:, :, dilation * i:dilation * i + stride * (ho - 1) + 1:stride,
                     dilation * j:dilation * j + stride * (wo - 1) + 1:stride]
            out += w[None, :, i, j, None, None] * win
    return out + (bias[None, :, None, None] if bias is not None else 0)


PADDED = """\
kernel dw(X: {dt}[N, C, H, W], Wd: {dt}[C, 3, 3], b: {dt}[C]) -> Y
  default N = {n}, C = {c}, H = {h}, W = {w}
  Y: {dt}[N, C, H, W]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    Y[n, c, y, x] = b[c]
    for r in 0..3, s in 0..3:
      Y[n, c, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wd[c, r, s]
"""

VALID = """\
kernel dwv(X: {dt}[N, C, H, W], Wd: {dt}[C, 3, 3]) -> Y
  default N = {n}, C = {c}, H = {h}, W = {w}
  Y: {dt}[N, C, H - 2, W - 2]
  for n in 0..N, c in 0..C, y in 0..H - 2, x in 0..W - 2:
    Y[n, c, y, x] = 0
    for r in 0..3, s in 0..3:
      Y[n, c, y, x] += X[n, c, y + r, x + s] * Wd[c, r, s]
"""

STRIDED = """\
kernel dws(X: {dt}[N, C, H, W], Wd: {dt}[C, 3, 3]) -> Y
  default N = {n}, C = {c}, H = {h}, W = {w}
  Y: {dt}[N, C, H / 2, W / 2]
  for n in 0..N, c in 0..C, y in 0..H / 2, x in 0..W / 2:
    Y[n, c, y, x] = 0
    for r in 0..3, s in 0..3:
      Y[n, c, y, x] += (X[n, c, 2*y + r - 1, 2*x + s - 1] ?? 0) * Wd[c, r, s]
"""

RELU6 = """\
kernel dw6(X: {dt}[N, C, H, W], Wd: {dt}[C, 3, 3]) -> Z
  default N = {n}, C = {c}, H = {h}, W = {w}
  T: {dt}[N, C, H, W]
  Z: {dt}[N, C, H, W]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    T[n, c, y, x] = 0
    for r in 0..3, s in 0..3:
      T[n, c, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wd[c, r, s]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    Z[n, c, y, x] = min(relu(T[n, c, y, x]), 6)
"""

DILATED = """\
kernel dwd(X: {dt}[N, C, H, W], Wd: {dt}[C, 3, 3]) -> Y
  default N = {n}, C = {c}, H = {h}, W = {w}
  Y: {dt}[N, C, H - 4, W - 4]
  for n in 0..N, c in 0..C, y in 0..H - 4, x in 0..W - 4:
    Y[n, c, y, x] = 0
    for r in 0..3, s in 0..3:
      Y[n, c, y, x] += X[n, c, y + 2*r, x + 2*s] * Wd[c, r, s]
"""


def fast(c) -> bool:
    """The kernel is the slot layout's: GpSimdE or PSUM sums, no channel-tile band of the general path."""
    return "nl.psum" in c.source


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n, ch, h, w", [(1, 200, 30, 20), (3, 37, 13, 11), (2, 130, 9, 70)])
def test_padded_with_bias(dt, n, ch, h, w):
    prog, c, inputs, out = run(PADDED.format(dt=dt, n=n, c=ch, h=h, w=w))
    assert fast(c)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"], pad=1, bias=x["b"]))


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_unpadded(dt):
    prog, c, inputs, out = run(VALID.format(dt=dt, n=2, c=150, h=24, w=19))
    assert fast(c)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"]))


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_stride_2_padded(dt):
    prog, c, inputs, out = run(STRIDED.format(dt=dt, n=1, c=144, h=28, w=30))
    assert fast(c)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"], stride=2, pad=1))


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_relu6_fused(dt):
    prog, c, inputs, out = run(RELU6.format(dt=dt, n=2, c=72, h=14, w=15))
    assert fast(c)
    x = rounded(inputs, dt)
    want = reference(x["X"], x["Wd"], pad=1)
    if dt != "f32":  # T is stored (rounded) before the relu6 in the program's meaning
        want = want.astype(np.float16).astype(np.float64)
    assert_matches(prog, "Z", out["Z"], np.minimum(np.maximum(want, 0), 6))


def test_dilated():
    prog, c, inputs, out = run(DILATED.format(dt="f32", n=1, c=40, h=17, w=16))
    assert fast(c)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"], dilation=2))


def test_a_schedule_keeps_the_general_path():
    prog, c, inputs, out = run(PADDED.format(dt="f32", n=1, c=40, h=10, w=9), "split Y.y, 5\n")
    assert not fast(c) and "gpsimd" not in c.source
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"], pad=1, bias=x["b"]))


def _op(n: int, c: int, ho: int, wo: int) -> ConvOp:
    dims = dict(N=n, C=c, K=c, H=ho + 2, W=wo + 2, Ho=ho, Wo=wo, R=3, S=3)
    return ConvOp("Y", "Y", "X", "W", None, tuple(dims.items()), "dw", ())


def test_layout_fills_the_partitions():
    """144 channels: batch 8 puts 8 images of 16 channels on 128 partitions (9 tiles, no row blocks, whose stores
    would overlap in HBM); batch 1 splits rows into a few blocks; a layout never exceeds 128 partitions or a PSUM
    bank per chunk."""
    big = build_depthwise.choose_layout(_op(8, 144, 56, 56), 4)
    assert big is not None and (big.nb, big.k * big.cg) == (1, 128)
    one = build_depthwise.choose_layout(_op(1, 144, 56, 56), 4)
    assert one is not None and one.nb > 1
    for lay in (big, one):
        assert lay.k * lay.nb * lay.cg <= 128 and lay.rc * 56 <= build_depthwise.PSUM_FP32


def test_routes_use_every_engine_and_cover_every_tap():
    rt = build_depthwise.choose_routes(9, 448, False)
    assert 1 + rt.sv + rt.v + rt.g == 9 and rt.g > 0 and rt.sv + rt.v > 0


RELU6_BIAS = """\
kernel dwb6(X: f32[N, C, H, W], Wd: f32[C, 3, 3], b: f32[C]) -> Z
  default N = 1, C = 100, H = 12, W = 13
  T: f32[N, C, H, W]
  Z: f32[N, C, H, W]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    T[n, c, y, x] = b[c]
    for r in 0..3, s in 0..3:
      T[n, c, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wd[c, r, s]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    Z[n, c, y, x] = min(relu(T[n, c, y, x]), 6)
"""


def test_relu6_with_bias_clamps_after_the_eviction():
    prog = lang.load(RELU6_BIAS)
    c = compile_loaded(prog)
    assert fast(c)
    inputs = {name: 4 * v for name, v in inputs_for(prog).items()}  # outputs well above 6: the clamp bites
    out = c.run(**inputs)
    want = np.minimum(np.maximum(reference(inputs["X"], inputs["Wd"], pad=1, bias=inputs["b"]), 0), 6)
    assert (want == 6).mean() > 0.05
    assert_matches(prog, "Z", out["Z"], want)


ANY = """\
kernel dwk(X: f32[N, C, H, W], Wd: f32[C, {r}, {s}]) -> Y
  default N = {n}, C = {c}, H = {h}, W = {w}
  Y: f32[N, C, {ho}, {wo}]
  for n in 0..N, c in 0..C, y in 0..{ho}, x in 0..{wo}:
    Y[n, c, y, x] = 0
    for r in 0..{r}, s in 0..{s}:
      Y[n, c, y, x] += (X[n, c, y + r - {p}, x + s - {p}] ?? 0) * Wd[c, r, s]
"""


@pytest.mark.parametrize("n, c, h, w, r, s, p", [
    (1, 10, 6, 9, 1, 3, 1),  # one tap per row covers every column: the column halo is zeroed by DMA instead
    (2, 70, 7, 8, 3, 1, 1),  # no tap covers every column (a 3x1 window padded on all sides)
    (1, 20, 12, 11, 5, 5, 2),  # 25 taps
    (1, 4, 120, 130, 3, 3, 1),  # several row blocks and chunks of one image
])
def test_window_shapes_and_halos(n, c, h, w, r, s, p):
    ho, wo = h + 2 * p - r + 1, w + 2 * p - s + 1
    prog, comp, inputs, out = run(ANY.format(n=n, c=c, h=h, w=w, r=r, s=s, p=p, ho=ho, wo=wo))
    assert fast(comp)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"], pad=p))


@pytest.mark.parametrize("n, c, h, w, r", [(1, 16, 64, 64, 11), (1, 64, 200, 120, 5)])
def test_big_windows_and_tall_images_fit_sbuf(n, c, h, w, r):
    """121 taps; an image of 200 rows in many PSUM chunks (every chunk's temporaries once counted against SBUF:
    320 KiB, a capacity error)."""
    prog, comp, inputs, out = run(ANY.format(n=n, c=c, h=h, w=w, r=r, s=r, p=r // 2, ho=h, wo=w))
    assert fast(comp)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"], pad=r // 2))


def _hbm_writes(c, inputs, tensor):
    """The element offsets each DMA writing `tensor` in HBM writes, from the interpreter's trace (the access
    patterns: itemsize, offset, shape, strides)."""
    _, trace = c.run_traced(numerics=False, **inputs)
    out = []
    for ins in trace.instrs:
        for acc in ins.writes if ins.engine == "dma" else ():
            if acc.memory == "hbm" and acc.name == tensor:
                _, offset, shape, strides = acc.pattern[:4]
                grid = np.indices(shape).reshape(len(shape), -1)
                out.append(offset + (np.array(strides)[:, None] * grid).sum(axis=0))
    return out


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("cg, nb, rc", [(16, 4, 3), (12, 4, 8), (8, 5, 2), (12, 5, 4)])
def test_row_blocks_store_in_few_dmas(monkeypatch, dt, cg, nb, rc):
    """Row blocks of equal height are stored by one DMA per image (the blocks an axis of its HBM access pattern):
    30 rows in 5 blocks of 6. A shorter last block (4 blocks of 8: 8, 8, 8, 6) keeps one store per (row block,
    channel), each a contiguous range of Y (one DMA of the blocks would span the last block's rows, and the model
    orders overlapping ranges). 16, 12 or 8 channels per group (a remainder group), several chunks per block, two
    images. The stores together write every element of Y exactly once."""
    ho = 30
    rb = -(-ho // nb)
    lay = build_depthwise.Layout(cg, nb, rb, 1, rc)
    monkeypatch.setattr(build_depthwise, "rank_layouts", lambda *args, **kw: [lay])
    prog, c, inputs, out = run(PADDED.format(dt=dt, n=2, c=40, h=ho, w=20))
    assert fast(c) and f"{nb} blocks of {rb} rows" in c.source
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"], pad=1, bias=x["b"]))
    writes = _hbm_writes(c, inputs, "Y")
    tiles = 2 * -(-40 // cg)  # (image, channel group) pairs, one image per tile
    assert len(writes) == (tiles if ho % rb == 0 else 2 * 40 * nb)
    assert np.array_equal(np.sort(np.concatenate(writes)), np.arange(2 * 40 * ho * 20))  # all of Y, once


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("ch, nb, rc", [(40, 1, 8), (20, 3, 5)])
def test_images_of_every_channel_store_in_one_dma(monkeypatch, dt, ch, nb, rc):
    """A tile of two images holding every channel (40 of 40, or 20 of 20 in 3 row blocks) stores both images'
    blocks by one DMA: their ranges of Y join (images and row blocks as two axes of the access pattern)."""
    ho = 30
    lay = build_depthwise.Layout(ch, nb, ho // nb, 2, rc)
    monkeypatch.setattr(build_depthwise, "rank_layouts", lambda *args, **kw: [lay])
    prog, c, inputs, out = run(PADDED.format(dt=dt, n=2, c=ch, h=ho, w=20))
    assert fast(c)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"], pad=1, bias=x["b"]))
    writes = _hbm_writes(c, inputs, "Y")
    assert len(writes) == 1
    assert np.array_equal(np.sort(writes[0]), np.arange(2 * ch * ho * 20))


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_multiplier_row_blocks_store_one_dma_per_output(monkeypatch, dt):
    """A channel multiplier of 2 in 2 row blocks of 6: each image's blocks of each output m are one DMA (Y's
    channels c*2 + m for the group's c: a strided range), 2 images x 2 outputs; every element of Y written once."""
    from test_grouped_single import MULTIPLIER
    from test_conv_grouped import grouped_ref
    lay = build_depthwise.Layout(40, 2, 6, 1, 6)
    monkeypatch.setattr(build_depthwise, "rank_layouts", lambda *args, **kw: [lay])
    monkeypatch.setattr(build_depthwise, "dense_ns", lambda *args: float("inf"))
    prog, c, inputs, out = run(MULTIPLIER.format(dt=dt, G=40, Kg=2))
    x = rounded(inputs, dt)
    w = x["Wm"].reshape(80, 1, 3, 3)
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], w, 40, pad=1, bias=x["b"]))
    writes = _hbm_writes(c, inputs, "Y")
    assert len(writes) == 4
    assert np.array_equal(np.sort(np.concatenate(writes)), np.arange(out["Y"].size))
