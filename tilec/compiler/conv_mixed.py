"""Mixed-tap folding: filter taps folded into the contraction partitions when C x taps does not fit 128 and C does
not divide it (conv_odd's 67 channels: 2 x 67 > 128, so conv_fold's whole copies fold nothing and each of the 9 taps
was a matmul over 67 partitions). The contraction rows (tap j, channel c) are numbered j * C + c and cut into
tiles of 128: tile t, partition p holds row 128 t + p, so a tap's channels may straddle two tiles. Copy j of the
band (X shifted by tap j) is then loaded in one or two segments, each on its tile's partitions, and one matmul per
tile covers all its rows: 603 rows in 5 matmuls instead of 9. A tile's matmul reads every copy at the same rows and
columns (the first tap's), as conv_fold's one-group band does. Functions of the builder `b`, as conv_fold.py.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tilec.compiler import conv_spread, conv_weights, ir
from tilec.compiler.conv_halo import region_boxes
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.ir import Alloc, Buf, Dma, Matmul, Stmt, View, full
from tilec.compiler.schedule import PMAX

# a part's weights read straight into the tiles' layout up to this many elements (one descriptor each)
DIRECT = 1024

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder
    from tilec.compiler.ops import ConvOp


def tiles(channels: int, taps: int) -> int:
    """Contraction tiles of 128 partitions holding every (tap, channel) row."""
    return -(-channels * taps // PMAX)


def pays(op: ConvOp, elem: int, cols: int, k_tiles: int) -> bool:
    """Whether the schedule folds every tap of `op` into mixed tiles: a plain dense conv (no groups, pool, batched
    weights, transposed X) of one contraction tile whose channels leave whole copies nothing to fold (2 C > 128),
    when the matmul time its fewer tiles save beats the DMA time of the band copies it adds, per output row, on
    every target: saved (taps - tiles) x out-channel tiles x Wo moving columns at tensor_ghz (fp32 at a quarter
    rate, nki-spec §2.3), added taps x C x stride x band columns x elem bytes at dma_engines x dma_engine_bw.
    conv_odd (C = 67, 3x3, 28 x 28, K = 129): fp32 373 ns saved against 197 added; bf16 93 against 98, so 16-bit
    keeps a matmul per tap."""
    c, taps = op.dim("C"), op.dim("R") * op.dim("S")
    return op.w_layout == "kc" and op.groups == 1 and not op.pool and not op.w_batch and not op.x_transposed \
        and 2 * c > PMAX and c < PMAX and taps > 1 and tiles(c, taps) < taps and saves(op, elem, cols, k_tiles)


def saves(op: ConvOp, elem: int, cols: int, k_tiles: int) -> bool:
    """pays' estimate: matmul time saved against band copy time added, per output row, on every target."""
    from tilec.target import TARGETS
    c, taps = op.dim("C"), op.dim("R") * op.dim("S")
    rate = 4 if elem == 4 else 1
    moving = (taps - tiles(c, taps)) * k_tiles * op.dim("Wo") * rate
    copied = taps * c * op.stride[0] * cols * elem
    return all(moving / t.tensor_ghz > copied / (t.dma_engines * t.dma_engine_bw) for t in TARGETS.values())


def segments(b: _ConvBuilder) -> list[tuple[int, int, int, int, int]]:
    """(copy j, tile t, first partition, first channel, channels) of each piece of each copy: copy j's rows
    j * C .. (j + 1) * C cut at the tiles' boundaries."""
    out = []
    for j in range(len(b.shifts)):
        c0 = 0
        while c0 < b.C:
            row = j * b.C + c0
            n = min(b.C - c0, PMAX - row % PMAX)
            out.append((j, row // PMAX, row % PMAX, c0, n))
            c0 += n
    return out


def tile_parts(b: _ConvBuilder, t: int) -> int:
    """Partitions of tile t that hold contraction rows (the last tile's are fewer)."""
    return min(PMAX, len(b.shifts) * b.C - t * PMAX)


def x_band(b: _ConvBuilder, xb: Buf) -> list[Stmt]:
    """The band once from HBM into the base: copy 0's place (tile 0, partitions 0..C, the first tap's shift is 0),
    C partitions with the halo (zeroed); then each other segment of each copy from it by an SBUF -> SBUF DMA: with
    the halo columns in the base, copy j (X shifted by r0 rows and s0 columns) is the base's flat run from element
    r0 * cols + s0 on, one descriptor per partition, where loading each copy from HBM took one descriptor per row
    (conv_odd: 9 x 67 x 15 rows of 112 B per band, ~8 us of descriptors on the 16 DMA engines). A copy's flat run
    ends where the base does: its last elements, past what the matmuls read (the band's last output row at its last
    column), are not written. (A base of its own, copied whole into copy 0's place, moved one copy more per band:
    fp32 conv_odd batch 1 19.41 -> 18.78 us run, batch 8 101.30 -> 100.18.)"""
    p, line, V = b.p, b.L["update"], b.var
    rows, cols = b.in_rows(), b.in_cols()
    top, bottom = b.band_clip(b.yb[1]) if b.yb[0] is None else (0, 0)
    left, right = b.clip(b.col0, cols, b.W)
    n_rows, n_cols = rows - top - bottom, cols - left - right
    start = b.y_at(p.band * b.sy, b.cn["band"] if b.sy == 1 else "").plus(b.oy + top)
    out: list[Stmt] = []
    if p.x_bufs != 1:
        out.append(Alloc(xb, line=line))
    assert b.shifts[0] == (0, 0), b.shifts  # (copy 0 is the base itself)
    base = (full(b.C) if b.C == xb.shape[0] else sl(0, b.C), a(0))
    out.append(Dma(View(xb, base + (sl(top, n_rows), sl(left, n_cols))),
                   View(b.x4, (a(V["n"]), full(b.C), sl(start, n_rows), sl(b.col0 + left, n_cols))), line))
    if b.zero_rows is not None:  # after the load: the halo columns interleave with its rows, so the model (a
        # region's bounding range) orders the two, and the load comes first
        boxes = region_boxes(0, b.C, rows, cols, (top, bottom, left, right))
        out += [ir.Copy(View(xb, base + (sl(r0, n), sl(c0, m))),
                        View(b.zero_rows, (full(b.C), sl(0, n), sl(0, m))), line, "gpsimd")
                for _, _, _, r0, n, c0, m in boxes]
    band = Buf(b.fresh(f"{xb.name}_flat"), "sbuf", xb.dtype, (xb.shape[0], b.mixed * rows * cols))
    out.append(ir.Reshape(band, xb, line))
    b.base_flat = View(band, (sl(0, b.C), sl(0, rows * cols)))
    if conv_spread.spreads(b, b.KR):  # the one-channel remainder's first stage, on the base band (conv_spread)
        out += conv_spread.taps(b)
    for j, t, p0, c0, n in segments(b):
        r0, s0 = b.shifts[j]
        shift = r0 * cols + s0
        if j == 0:  # the base
            continue
        out.append(Dma(View(band, (sl(p0, n), sl(t * rows * cols, rows * cols - shift))),
                       View(band, (sl(c0, n), sl(shift, rows * cols - shift))), line))
    return out


def zero_tile(b: _ConvBuilder) -> Buf | None:
    """A zero tile of the base band's shape, made once before the loops, when the read is padded: each band's halo
    rows and columns are GpSimdE copies from it, on other elements than the band's load, so the load does not
    wait for a memset of the base (conv_odd f32: its first load waited 3.4 us for GpSimdE, busy with the weights,
    and its memset)."""
    if b.oy >= 0 and b.ox >= 0 and b.in_rows() * b.sy <= b.H and b.in_cols() <= b.W:
        return None
    return Buf(b.fresh(f"{b.op.x}_zeros"), "sbuf", b.hbm[b.op.x].dtype, (b.C, b.in_rows(), b.in_cols()))


def weights(b: _ConvBuilder, wt: Buf, kv: str | None, ks: int, local: bool) -> list[Stmt]:
    """The stationary of each tile: row p of tile t holds W[k, c, tap j] for j * C + c = 128 t + p. A part of few
    out-channels (K = 129's remainder) is read straight into that layout, one element per descriptor (603 for one
    channel: ~0.5 us over the DMA engines, where gathering and transposing it took ~2.5 us of VectorE copies of
    one partition); a whole part's rows in one contiguous DMA (k-major), gathered per tap into [k, tiles x 128]
    (one copy per tap, alternating VectorE and GpSimdE) and transposed per tile on TensorE."""
    p, line, C = b.p, b.L["update"], b.C
    if kv is None and conv_spread.spreads(b, ks):  # the one-channel remainder: its taps on the output partitions
        return conv_spread.weights(b)
    kslice = sl(b.k_start(kv), ks)
    kdst = b.part(ks, p.tile_k) if local else kslice
    if ks * len(b.shifts) * C <= DIRECT:
        return [Dma(View(wt, (sl(p0, n), a(t), kdst)),
                    replace(conv_weights.w_view(b, (kslice, sl(c0, n), a(r), a(s))), perm=(1, 0)), line)
                for j, t, p0, c0, n in segments(b) for r, s in [b.groups[0][j]]]
    kp = b.part(ks, p.tile_k)
    nt = b.mixed
    rows = Buf(b.fresh(f"{b.op.w}_rows"), "sbuf", wt.dtype, (p.tile_k, C, b.R, b.S))
    raw = Buf(b.fresh(f"{b.op.w}_taps"), "sbuf", wt.dtype, (p.tile_k, nt * PMAX))
    tp = Buf(b.fresh(f"{b.op.w}_tp"), "psum", wt.dtype, (PMAX, p.tile_k))
    whole_w = (full(C), full(b.R), full(b.S))
    out: list[Stmt] = [Alloc(rows, line=line),
                       Dma(View(rows, (kp,) + whole_w), conv_weights.w_view(b, (kslice,) + whole_w), line),
                       Alloc(raw, zero=nt * PMAX > len(b.shifts) * C, line=line)]
    out += [ir.Copy(View(raw, (kp, sl(j * C, C))), View(rows, (kp, full(C), a(r), a(s))), line,
                    "gpsimd" if j % 2 else "") for j, (r, s) in enumerate(b.groups[0])]
    tv = b.fresh("tap_t")
    tpv = View(tp, (full(PMAX), kp))
    body: list[Stmt] = [Alloc(tp, line=line),
                        ir.Transpose(tpv, View(raw, (kp, sl(a(term(tv, PMAX)), PMAX))), "pe", line),
                        ir.Copy(View(wt, (full(PMAX), a(tv), kdst)), tpv, line)]
    return out + loop(tv, nt, body, note="contraction tiles of mixed taps", line=line)


def matmuls(b: _ConvBuilder, accv: View, wt: Buf, kidx) -> list[Stmt]:
    """One matmul per contraction tile, every copy read at the first tap's rows and columns."""
    p, V, sy, sx = b.p, b.var, b.sy, b.sx
    first = a(b.step(V["g"], p.rows, b.cn["rows"], sy))
    rows = sl(first, p.rows, sy, b.cn["rows"] if sy == 1 else "")
    cols = sl(a(b.step(V["x"], p.tile_x, b.cn["x"], sx)), p.tile_x, sx, b.cn["x"] if sx == 1 else "")
    if b.kv is None and conv_spread.spreads(b, b.ks):
        return conv_spread.matmul(b, accv, rows, cols)
    out: list[Stmt] = []
    for t in range(b.mixed):
        parts = sl(0, tile_parts(b, t))
        out.append(Matmul(accv, View(wt, (parts, a(t), kidx)), View(b.x_band_buf(), (parts, a(t), rows, cols)),
                          b.L["update"]))
    return out
