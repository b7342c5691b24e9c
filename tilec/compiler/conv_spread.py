"""A ragged K's one-channel remainder with mixed taps, its taps spread over the output partitions: K = 129 (conv_odd)
leaves one out-channel for a second part, whose matmuls each stream the whole band for one column of the
stationary (5 mixed tiles x 392 columns per band of fp32 conv_odd, as long as the 128-channel part's). Instead:

1. one matmul over the base band of C partitions (conv_mixed.x_band: X with its halo columns, so a tap's shift is a
   flat offset) with the channel's weights as a stationary of one column per tap: S[j, f] = sum_c W[c, tap j] *
   base[c, f], every flat position f of the band, the taps on the partitions of the result;
2. S evicted to SBUF and each tap's row shifted by its offset by an SBUF -> SBUF DMA (one descriptor per tap):
   T[j, f] = S[j, f + shift_j], so T holds, at the band's flat positions, what copy j of the band would give;
3. one matmul summing the taps: a stationary column of ones over T's partitions, read at the same rows and columns
   as the mixed tiles' matmuls read the band copies.

Two moving passes (the base band's flat run, then the output's) instead of one per contraction tile: fp32 conv_odd
480 + 392 columns against 5 x 392 per band. Functions of the builder `b`, as conv_mixed.py.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tilec.compiler import conv_weights, ir
from tilec.compiler.build_util import a, sl
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Buf, Dma, Matmul, Reshape, Stmt, View, full
from tilec.compiler.schedule import PMAX, PSUM_BANK

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder


def spreads(b: _ConvBuilder, ks: int) -> bool:
    """Whether the out-channel part of `ks` channels is built spread: the one-channel remainder of mixed taps, one
    matmul group and one column tile per band (stage 1 covers the whole band), stride 1, resident weights, the band
    made once before the parts (the parts innermost: the remainder reads the base band the shared band made), the
    band's flat run within one PSUM bank of fp32, and two moving passes shorter than the tiles' passes."""
    p = b.p
    flat, out = b.in_rows() * b.in_cols(), p.rows * p.tile_x
    rate = 4 if DTYPE_BYTES[b.hbm[b.op.x].dtype] == 4 else 1  # fp32 matmuls at a quarter rate (nki-spec §2.3)
    return (b.mixed > 0 and ks == 1 and b.KR == 1 and len(b.shifts) <= PMAX and b.sy == b.sx == 1 and b.G == 1
            and b.XT == 1 and b.NXB == 1 and b.dup == 1 and b.pair == 1 and b.src_chip is None
            and b.op.w_relu is None and p.hoist_w == "root" and p.order[-1] == "k"
            and flat * 4 <= PSUM_BANK and flat * rate + out * 4 < b.mixed * out * rate)


def weights(b: _ConvBuilder) -> list[Stmt]:
    """The remainder channel's weights as a [C, taps] stationary (column j: tap j, one DMA per tap) and the ones
    column that sums the taps (a zeroed tile plus 1)."""
    line, taps = b.L["update"], len(b.shifts)
    w = b.hbm[b.op.w]
    b.spread_w = Buf(b.fresh(f"{b.op.w}_spread"), "sbuf", w.dtype, (b.C, taps))
    b.spread_ones = Buf(b.fresh("tap_ones"), "sbuf", "f32", (taps, 1))
    kslice = sl(b.k_start(None), 1)
    out: list[Stmt] = [Alloc(b.spread_w, line=line)]
    out += [Dma(View(b.spread_w, (full(b.C), sl(j, 1))),
                replace(conv_weights.w_view(b, (kslice, full(b.C), a(r), a(s))), perm=(1, 0)), line)
            for j, (r, s) in enumerate(b.groups[0])]
    ones = View(b.spread_ones, (full(taps), full(1)))
    return out + [Alloc(b.spread_ones, zero=True, line=line), ir.Scalar(ones, ones, "add", 1.0, line)]


def taps(b: _ConvBuilder) -> list[Stmt]:
    """Stage 1 (the taps' sums on their partitions), its eviction and the taps' shifts, made with the band before
    the out-channel parts (conv_mixed.x_band): TensorE runs in order, so the 128-channel part's matmuls come
    between stage 1 and stage 2 and the eviction and the shifts' DMAs run under them (placed beside stage 2, they
    held TensorE for a DMA latency every band: fp32 conv_odd batch 8 135.2 -> 160.8 us)."""
    line, n_taps, C = b.L["update"], len(b.shifts), b.C
    n_rows, n_cols = b.in_rows(), b.in_cols()
    flat = n_rows * n_cols
    dtype = "f32"  # the taps' partial sums kept in fp32 (stage 2 reads them with the fp32 ones)
    s_ps = Buf(b.fresh("taps_acc"), "psum", "f32", (n_taps, flat))
    s_sb = Buf(b.fresh("taps_sb"), "sbuf", dtype, (n_taps, flat))
    b.spread_t = Buf(b.fresh("taps_shifted"), "sbuf", dtype, (n_taps, n_rows, n_cols))
    t_flat = Buf(b.fresh("taps_shifted_flat"), "sbuf", dtype, (n_taps, flat))
    out: list[Stmt] = [Alloc(s_ps, zero=True, line=line),
                       Matmul(View(s_ps, (full(n_taps), full(flat))), View(b.spread_w, (full(C), full(n_taps))),
                              View(b.base_flat, (full(C), full(flat))), line),
                       Alloc(s_sb, line=line), ir.Copy(View(s_sb, (full(n_taps), full(flat))),
                                                       View(s_ps, (full(n_taps), full(flat))), line),
                       Alloc(b.spread_t, line=line), Reshape(t_flat, b.spread_t, line)]
    for j, (r0, s0) in enumerate(b.shifts):
        shift = r0 * n_cols + s0
        out.append(Dma(View(t_flat, (sl(j, 1), sl(0, flat - shift))), View(s_sb, (sl(j, 1), sl(shift, flat - shift))),
                       line))
    return out


def matmul(b: _ConvBuilder, accv: View, rows, cols) -> list[Stmt]:
    """Stage 2: the ones column sums the shifted taps into accv, at the band copies' rows and columns."""
    n_taps = len(b.shifts)
    return [Matmul(accv, View(b.spread_ones, (full(n_taps), full(1))), View(b.spread_t, (full(n_taps), rows, cols)),
                   b.L["update"])]
