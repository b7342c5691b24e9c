"""A strided folded 3x3 conv's three lone taps paired down the rows: 5 matmuls per band instead of 6.

The strided folded plan of a 3x3 stride-2 conv over 64 channels holds two copies of the band on the partitions
(copy 1 shifted one column: X's run from column 1, read flat, conv_fold.FlatLoads), so that the taps (r, 1) and
(r, 2) share a matmul of 128 contraction rows; the taps (r, 0) reach output columns 1.. only and take a matmul of
64 rows each (conv_fold.column_groups). A matmul's time is its moving columns whatever its contraction rows, so the
band costs 6 matmuls for 4.5 of work: fp32 conv3x3s2 batch 8 is TensorE-bound (80 % busy, 1.70x its floor).

Here a second band buffer pairs (0, 0) with (1, 0): its copy 0 is the band's copy 0, its copy 1 the band one row
down, so one matmul of 128 rows covers both and only (2, 0) is left alone: 5 matmuls. The buffer is made on chip,
no DMA (the DMA queues carry two copies of X per band already): copy 0 by GpSimdE, copy 1 by VectorE from the band's
copy 1, which is X read flat from one element on: X one row down is the same run from W - 1 elements further. Both
engines are idle in these kernels; the pair's matmul is the band's last, so the copies have the others' time
(families conv3x3s2 f32 batch 1 14.97 -> 13.32 us, batch 8 80.10 -> 67.86 us).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tilec.compiler import ir
from tilec.compiler.build_util import a, sl
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Buf, Matmul, Reshape, Stmt, View, full
from tilec.compiler.schedule import PMAX

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder

LONE = [[(0, 0)], [(1, 0)], [(2, 0)]]  # conv_fold.column_groups' lone taps of a 3x3 stride-2 band
PAIRED = [[(0, 0), (1, 0)], [(2, 0)]]


def applies(b: _ConvBuilder, groups: list[list[tuple[int, int]]]) -> bool:
    """fp32 (TensorE-bound; 16-bit strided convs wait on the DMA queues, which this does not relieve: bf16 conv3x3s2
    batch 8 25.90 -> 28.39 us with it), 3x3 taps at stride 2 without dilation over 64 channels in two copies 64
    partitions apart (copy 1 one column over, loaded flat), the column groups of conv_fold with the lone taps
    last, no band halves (which take band slots), X from HBM."""
    from tilec.compiler.conv_fold import flat_rows
    return (DTYPE_BYTES[b.hbm[b.op.x].dtype] == 4 and b.R == b.S == 3 and b.sy == b.sx == 2 and b.dy == b.dx == 1
            and b.C == PMAX // 2 and b.shifts == [(0, 0), (0, 1)] and b.fold == 2 and not b.mixed
            and b.pair == 1 and not b.halves and b.src_chip is None and b.dst_chip is None and b.op.groups == 1
            and b.col0 == 0 and groups[-3:] == LONE and len(groups) == 6 and flat_rows(b))


def paired(groups: list[list[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
    return groups[:-3] + PAIRED


def band(b: _ConvBuilder, xb: Buf) -> list[Stmt]:
    """The second buffer of band xb: copy 0 = xb's copy 0, copy 1 = X one row below copy 0 (xb's copy 1 read flat
    W - 1 elements on), over the rows the paired matmul reads (the band's first output row's to its last's; a
    row's last element comes from the next row's first, which xb's copy 1 holds there, its last row excepted)."""
    if not b.vpair:
        return []
    line, C, W = b.L["update"], b.C, b.in_cols()
    x2 = b.x_down = Buf(b.fresh(f"{xb.name}_down"), "sbuf", xb.dtype, xb.shape)
    rows = (b.p.band - 1) * b.sy + 1
    flat = Buf(b.fresh(f"{xb.name}_run"), "sbuf", xb.dtype, (xb.shape[0], xb.shape[2] * W))
    flat2 = Buf(b.fresh(f"{x2.name}_run"), "sbuf", xb.dtype, (xb.shape[0], xb.shape[2] * W))
    return [Alloc(x2, line=line),
            ir.Copy(View(x2, (sl(0, C), a(0), sl(0, rows), full(W))), View(xb, (sl(0, C), a(0), sl(0, rows), full(W))),
                    line, "gpsimd"),
            Reshape(flat, xb, line), Reshape(flat2, x2, line),
            ir.Copy(View(flat2, (sl(C, C), sl(0, rows * W - 1))), View(flat, (sl(C, C), sl(W - 1, rows * W - 1))),
                    line)]


def matmuls(b: _ConvBuilder, mms: list[Stmt]) -> list[Stmt]:
    """conv_fold.matmuls_folded's matmuls with the paired group's (the one before last) reading the second buffer,
    issued last: it waits for the on-chip copies, the others only for the band's loads."""
    if not b.vpair:
        return mms
    assert b.x_down is not None
    g = len(b.groups) - 2
    pair = [m for m in mms if isinstance(m, Matmul) and m.stationary.idx[1] == a(g)]
    assert len(pair) == 1
    m = pair[0]
    moved = dataclasses.replace(m, moving=View(b.x_down, m.moving.idx))
    return [s for s in mms if s is not m] + [moved]
